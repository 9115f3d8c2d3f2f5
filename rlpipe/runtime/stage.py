"""One rank's pipeline stage: its layers, its optimizer, the timed PipelineStage and schedule that
train them, and its part in a live repartition."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

import rlpipe.runtime.layers as layers
import rlpipe.runtime.migration as migration
from rlpipe.partition import stage_edges
from rlpipe.runtime.device_time import DeviceClock
from rlpipe.runtime.mesh import GradientSync, Mesh
from rlpipe.runtime.split import BatchPlan
from rlpipe.runtime.transport import Transport, staged_loss, staged_module

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


class NoParameters(torch.optim.Optimizer):
    """The optimizer of a stage whose layers hold no parameters (activation layers only), which
    ``torch.optim`` refuses to build: it has no state and its step does nothing."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(0, requires_grad=True)], {})

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        return None


def build_optimizer(factory: OptimizerFactory, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The user's optimizer over ``params``, or :class:`NoParameters` when there are none."""
    return factory(params) if params else NoParameters()


class TimedStage(PipelineStage):
    """A PipelineStage whose forward and backward chunks run under a :class:`DeviceClock`, which
    accounts their device time (real, or emulated from the profile) and applies injected interference;
    ``first_microbatch`` is the index in the job's batch of this replica's first micro-batch (what a
    per-micro-batch slowdown is keyed by)."""

    clock: DeviceClock
    first_microbatch: int = 0

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        return self.clock.timed(super().forward_one_chunk, False, self.first_microbatch + fwd_chunk_id,
                                fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        return self.clock.timed(super().backward_one_chunk, True, self.first_microbatch + bwd_chunk_id,
                                bwd_chunk_id, *args, **kwargs)


@dataclass
class Repartition:
    """What one repartition did.

    Attributes:
        iteration: the iteration it happened before.
        old, new: boundaries before and after.
        committed: whether every rank switched (``False``: all kept ``old``).
        bytes_moved: parameters, buffers and optimizer state sent, summed over ranks.
        stall_s: seconds training stood still for it.
    """

    iteration: int
    old: tuple[int, ...]
    new: tuple[int, ...]
    committed: bool
    bytes_moved: int
    stall_s: float

    def to_dict(self) -> dict:
        return {"iteration": self.iteration, "from": list(self.old), "to": list(self.new), "committed": self.committed,
                "bytes_moved": self.bytes_moved, "stall_s": self.stall_s}


class StageWorker:
    """One rank's stage of its replica's pipeline: its layers, optimizer, PipelineStage and schedule.

    Args:
        modules: every layer of the model, in order; the rank trains those its stage owns.
        loss_fn: ``loss_fn(output, target)``, a scalar averaged over the micro-batch.
        boundaries: the first layer of each stage (the same partition in every replica).
        mesh: where the rank sits (replica, stage) and its process groups.
        schedule: a name from :data:`rlpipe.partition.SCHEDULES`.
        optimizer: builds the stage's optimizer from its parameters (any ``torch.optim`` optimizer:
            its per-parameter state moves with the layers).
        clock: times the stage's compute (real or emulated device time, injected interference).
        transport: where the stage's layers, activations and optimizer state live (``compute``) and how
            tensors reach the other ranks (through the host when staged).
        emulated_ms: per layer, the emulated device time of a forward and of a backward, ms per
            micro-batch (used in emulated mode).
        drop_moved_optimizer_state: forget moved layers' optimizer state (the correctness control test only).

    The layers the stage owns must hold their values on the compute device; the others are freed (kept as
    structure on the meta device) and materialised only when a repartition brings them here. The
    PipelineStage and schedule are built for a batch plan (micro-batches of this replica, rows per
    micro-batch) and rebuilt when a batch needs another.
    """

    def __init__(self, modules: list[nn.Module], loss_fn: Callable, boundaries: tuple[int, ...], mesh: Mesh,
                 schedule: str, optimizer: OptimizerFactory, clock: DeviceClock, transport: Transport,
                 emulated_ms: tuple[np.ndarray, np.ndarray] | None = None, drop_moved_optimizer_state: bool = False):
        self.modules = modules
        self.loss_fn = loss_fn
        self.mesh = mesh
        self.num_stages = mesh.dims.stages
        self.schedule_class = get_schedule_class(schedule)
        self.optimizer_factory = optimizer
        self.clock = clock
        self.transport = transport
        self.device, self.wire = transport.compute, transport.wire
        self.emulated_ms = emulated_ms
        self.drop_moved_optimizer_state = drop_moved_optimizer_state
        self.sync = GradientSync(mesh.dp_group, mesh.dims.replicas, transport.staging_wire)
        self.boundaries = tuple(boundaries)
        owned = self.owned_layers()
        for index, layer in enumerate(modules):
            if index in owned:
                if not layers.is_materialised(layer):
                    raise ValueError(f"layer {index} is on the meta device but stage {mesh.stage} owns it: build "
                                     f"it for real (or give an init_layer) before the stage starts")
                layer.to(self.device)
            else:
                layers.free(layer)
        self.optimizer = build_optimizer(optimizer, self.owned_params())
        self.timed_microbatches, self.warmup_compute_s, self.sync_s = 0, 0.0, 0.0
        self.iteration_compute_ms: list[float] = []  # compute per micro-batch of each timed iteration
        self.built_for: tuple[int, int] | None = None  # (this replica's micro-batches, rows per micro-batch)
        self.stage: TimedStage | None = None
        self.warm = False

    def owned_layers(self) -> range:
        edges = stage_edges(self.boundaries, len(self.modules))
        return range(int(edges[self.mesh.stage]), int(edges[self.mesh.stage + 1]))

    def owned_params(self) -> list[nn.Parameter]:
        return [p for i in self.owned_layers() for p in self.modules[i].parameters()]

    def memory_bytes(self) -> float:
        """Parameters and optimizer state held on this rank, bytes."""
        state = sum(t.numel() * t.element_size() for s in self.optimizer.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor))
        return float(self.resident_param_bytes() + state)

    def resident_param_bytes(self) -> int:
        """Bytes of the parameters that hold storage on this rank (only its stage's, once freed)."""
        return layers.resident_param_bytes(self.modules)

    def _build(self, plan: BatchPlan) -> None:
        """A new stage and schedule for the current layers and ``plan`` (swapping an old stage's module
        breaks when the tensors between stages change shape, and a stage's buffers fit one micro-batch
        shape and count)."""
        mesh = self.mesh
        last = mesh.stage == self.num_stages - 1
        submodule = staged_module(nn.Sequential(*[self.modules[i] for i in self.owned_layers()]), self.transport,
                                  last, self.clock)
        self.stage = TimedStage(submodule, mesh.stage, self.num_stages, self.wire, group=mesh.pp_group)
        self.stage.clock = self.clock
        self.stage.first_microbatch = sum(plan.split[:mesh.replica])
        if self.emulated_ms is not None:
            owned = self.owned_layers()
            self.clock.set_stage(float(self.emulated_ms[0][owned.start:owned.stop].sum()),
                                 float(self.emulated_ms[1][owned.start:owned.stop].sum()))
        self.warm = False  # the first step of a new stage infers shapes: its time is not compute
        # the schedule leaves the sum of the micro-batches' gradients; the sync weights them (mesh.GradientSync)
        self.schedule = self.schedule_class(self.stage, plan.split[mesh.replica], loss_fn=staged_loss(self.loss_fn),
                                            scale_grads=False)
        self.built_for = (plan.split[mesh.replica], plan.microbatch_rows)

    def rescale(self, factor: float) -> None:
        """Emulate devices ``factor`` times slower from now on (emulated device time only)."""
        if self.emulated_ms is not None:
            self.emulated_ms = (self.emulated_ms[0] * factor, self.emulated_ms[1] * factor)
            owned = self.owned_layers()
            self.clock.set_stage(float(self.emulated_ms[0][owned.start:owned.stop].sum()),
                                 float(self.emulated_ms[1][owned.start:owned.stop].sum()))

    def take_compute(self) -> tuple[float, int, list[float]]:
        """(compute seconds, timed micro-batches, compute ms per micro-batch of each timed iteration) since
        the last call, and start counting afresh. An interval that only held a warm-up step reports that
        step rather than nothing."""
        compute_s, timed, per_iteration = self.clock.compute_s, self.timed_microbatches, self.iteration_compute_ms
        if timed == 0:
            compute_s, timed, per_iteration = self.warmup_compute_s, max(self.built_for[0] if self.built_for else 1,
                                                                          1), []
        self.clock.compute_s, self.timed_microbatches, self.iteration_compute_ms = 0.0, 0, []
        return compute_s, timed, per_iteration

    def take_sync_s(self) -> float:
        """Seconds of gradient sync since the last call."""
        sync_s, self.sync_s = self.sync_s, 0.0
        return sync_s

    def take_staging_s(self) -> float:
        """Seconds of copies across the host boundary in compute chunks since the last call (host-staged
        transport only, else 0)."""
        staging_s, self.clock.staging_s = self.clock.staging_s, 0.0
        return staging_s

    def take_overruns(self) -> tuple[int, int]:
        """(timed chunks, chunks that overran their emulated time) since the last call."""
        counts = (self.clock.chunks, self.clock.overran)
        self.clock.chunks = self.clock.overran = 0
        return counts

    def train_step(self, inputs: torch.Tensor | None, target: torch.Tensor | None, plan: BatchPlan) -> list[float]:
        """One iteration on this replica's share of a batch (``inputs`` on its first stage, ``target`` on its
        last; ``None`` elsewhere); returns the micro-batch losses (on the last stage, else [])."""
        if self.built_for != (plan.split[self.mesh.replica], plan.microbatch_rows):
            self._build(plan)
        assert self.stage is not None
        self.optimizer.zero_grad(set_to_none=True)
        before = (self.clock.compute_s, self.clock.chunks, self.clock.overran)
        losses: list[torch.Tensor] = []
        first, last = self.mesh.stage == 0, self.mesh.stage == self.num_stages - 1
        if first and last:
            self.schedule.step(inputs, target=target, losses=losses)
        elif first:
            self.schedule.step(inputs)
        elif last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        self.sync_s += self.sync(self.owned_params(), plan.gradient_scale)
        self.optimizer.step()
        microbatches = plan.split[self.mesh.replica]
        if self.warm:
            self.timed_microbatches += microbatches
            self.iteration_compute_ms.append((self.clock.compute_s - before[0]) / microbatches * 1e3)
        else:  # keep the warm-up step (shape inference) out of the statistics, unless nothing else is timed
            self.warmup_compute_s = self.clock.compute_s - before[0]
            self.clock.compute_s, self.clock.chunks, self.clock.overran = before
            self.warm = True
        return [float(loss.detach()) for loss in losses]

    def repartition(self, new: tuple[int, ...], iteration: int, corrupt: bool = False) -> Repartition:
        """Move layers to their new owners, in every replica at once; all ranks of the job commit together
        or all keep the old partition."""
        start = time.perf_counter()
        old = self.boundaries
        plan = migration.transfer_plan(old, new, len(self.modules))
        received, ok, bytes_sent = migration.exchange(plan, self.mesh.stage, self.mesh.pipeline_ranks, self.modules,
                                                      self.optimizer, self.device, self.transport.staging_wire,
                                                      corrupt)
        committed = migration.all_agree(ok, self.wire)
        if committed:
            moved_state = {p: state for receipt in received for p, state in receipt.optimizer_states().items()}
            kept = {p: s for p, s in self.optimizer.state.items() if s}
            before = self.owned_layers()
            self.boundaries = tuple(new)
            for index in set(before) - set(self.owned_layers()):  # their new owners hold them now
                layers.free(self.modules[index])
            self.optimizer = build_optimizer(self.optimizer_factory, self.owned_params())
            for p in self.owned_params():
                if p in kept:
                    self.optimizer.state[p] = kept[p]
                elif p in moved_state and not self.drop_moved_optimizer_state:
                    self.optimizer.state[p] = moved_state[p]
            self.built_for = None  # the next step builds the stage anew
        else:  # the copies that arrived are nobody's: free them again
            for receipt in received:
                for layer in receipt.layers:
                    layers.free(layer)
        totals = torch.tensor([float(bytes_sent)], dtype=torch.float64, device=self.wire)
        dist.all_reduce(totals)
        dist.barrier()
        return Repartition(iteration, old, tuple(new), committed, int(totals.item()), time.perf_counter() - start)

    def gather_parameters(self) -> dict[str, torch.Tensor]:
        """Every layer's current parameters on rank 0, from replica 0's stages (every replica holds the
        same values); other ranks return {}."""
        if self.mesh.replica != 0:
            return {}
        edges = stage_edges(self.boundaries, len(self.modules)).tolist()
        plan = {(src, 0): list(range(edges[src], edges[src + 1])) for src in range(1, self.num_stages)}
        migration.exchange(plan, self.mesh.stage, self.mesh.pipeline_ranks, self.modules, self.optimizer,
                           self.device, self.transport.staging_wire)  # into rank 0's copies
        if self.mesh.rank != 0:
            return {}
        return {f"{i}.{name}": p.detach().clone() for i, module in enumerate(self.modules)
                for name, p in module.named_parameters()}
