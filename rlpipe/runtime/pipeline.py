"""AdaptivePipeline: one rank's share of a pipeline-parallel model that repartitions itself as it trains.

Every rank builds it with the model's layers in order and the loss. ``train_step(inputs, targets)``
trains one batch. A job may run D data-parallel replicas of the pipeline (``data_parallel=D``; see
:mod:`rlpipe.runtime.mesh`): each replica trains its share of the batch (:mod:`rlpipe.runtime.split`)
and every stage group averages its gradients. Every ``interval`` steps the ranks exchange their
statistics; rank 0 passes them through the shared observation encoder to its policy and every rank
carries out the decision: a live repartition that moves layers with their optimizer state (in every
replica at once), or a new micro-batch split. Rank 0 logs every interval, with the simulator's
prediction for it beside the measurement.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import rlpipe.runtime.checkpoint as checkpoint
from rlpipe.agents import make_policy
from rlpipe.errors import InputError
from rlpipe.partition import SCHEDULES, Partition
from rlpipe.runtime.config import PipelineConfig
from rlpipe.runtime.controller import Controller
from rlpipe.runtime.device_time import DEVICE_TIME_MODES, INVALID_OVERRUN_FRACTION, DeviceClock
from rlpipe.runtime.injection import Injector
from rlpipe.runtime.interval import (
    IntervalMeter,
    StageReport,
    compute_dispersion,
    exchange_reports,
    interval_statistics,
    log_record,
    tail_compute,
)
from rlpipe.runtime.layers import initialise, is_materialised
from rlpipe.runtime.mesh import Mesh, ParallelDims
from rlpipe.runtime.publisher import Publisher
from rlpipe.runtime.split import BatchPlan, plan_batch
from rlpipe.runtime.stage import OptimizerFactory, StageWorker
from rlpipe.runtime.startup import (
    ProfileInfo,
    gpu_load,
    local_processes_and_cores,
    measure_op_overhead_ms,
    measure_p2p_bandwidth_gbps,
    plan_launch,
    process_rss_bytes,
    start_process_group,
)
from rlpipe.runtime.step_costs import measure_step_costs
from rlpipe.simulator import MigrationCost, Overheads, PipelineCosts
from rlpipe.split import check_split, even_split, minimum_per_replica
from rlpipe.stats import IntervalStats


def _checked_config(layers: Sequence[nn.Module], loss_fn: Callable, optimizer: OptimizerFactory | None,
                    config: PipelineConfig | None, overrides: dict[str, Any]) -> PipelineConfig:
    """The pipeline's config, every argument checked: a mistake is one exception naming the argument."""
    if isinstance(layers, nn.Module) and not isinstance(layers, (nn.Sequential, nn.ModuleList)):
        raise TypeError(f"AdaptivePipeline: layers: expected the model's modules in order (a list or "
                        f"nn.Sequential), got one {type(layers).__name__}")
    if not layers or not all(isinstance(layer, nn.Module) for layer in layers):
        raise TypeError("AdaptivePipeline: layers: expected a non-empty list (or nn.Sequential) of nn.Module")
    if not callable(loss_fn):
        raise TypeError(f"AdaptivePipeline: loss_fn: expected loss_fn(output, target), got {type(loss_fn).__name__}")
    if optimizer is not None and not callable(optimizer):
        raise TypeError("AdaptivePipeline: optimizer: expected a function from a list of parameters to a "
                        "torch.optim optimizer, e.g. lambda params: torch.optim.AdamW(params, lr=3e-4)")
    unknown = set(overrides) - {f.name for f in fields(PipelineConfig)}
    if unknown:
        raise TypeError(f"AdaptivePipeline: unknown option(s) {', '.join(sorted(unknown))} (options: "
                        f"{', '.join(f.name for f in fields(PipelineConfig))})")
    checked = replace(config or PipelineConfig(), **overrides)
    if checked.schedule not in SCHEDULES:
        raise ValueError(f"AdaptivePipeline: schedule: {checked.schedule!r} is none of {', '.join(SCHEDULES)}")
    for name in ("microbatches", "interval", "data_parallel"):
        value = getattr(checked, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"AdaptivePipeline: {name}: must be an integer >= 1, got {value!r}")
    if checked.device_time not in DEVICE_TIME_MODES:
        raise ValueError(f"AdaptivePipeline: device_time: {checked.device_time!r} is none of "
                         f"{', '.join(DEVICE_TIME_MODES)}")
    if checked.policy is not None:
        try:
            make_policy(checked.policy, live=True, fallback=checked.fallback)
        except InputError as err:
            raise ValueError(f"AdaptivePipeline: policy: {err}") from None
    return checked


ADAPT_OVERRUN = 0.02  # an interval with more of its chunks overrunning their emulated time ...
ADAPT_FACTOR = 1.25  # ... makes the default device-time scale this much larger


def default_optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """Adam at a learning rate of 1e-3."""
    return torch.optim.Adam(params, lr=1e-3)



class AdaptivePipeline:
    """This rank's stage of a pipeline that repartitions itself while it trains (the library API).

    Every rank of a job (``torchrun --nproc-per-node D*S script.py``, or ``rlpipe run``) builds one with
    the same arguments::

        pipe = AdaptivePipeline(layers, loss_fn, optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4),
                                microbatches=8, schedule="1f1b", policy="ppo", interval=10, data_parallel=2)
        for inputs, targets in loader:            # the same batches on every rank
            loss = pipe.train_step(inputs, targets)

    Args:
        layers: the model's modules in order (a stage is a contiguous run of them), built on the CPU or
            on the ``meta`` device (structure only: a rank then initialises just the layers it owns).
            A rank keeps only its stage's layers; the others are freed.
        loss_fn: ``loss_fn(output, target)``, a scalar averaged over the micro-batch.
        optimizer: builds an optimizer from a list of parameters (any ``torch.optim`` optimizer; default
            Adam at 1e-3); its per-parameter state moves with the layers.
        config: how the pipeline runs (:class:`~rlpipe.runtime.config.PipelineConfig`); keyword
            arguments override its fields (``microbatches``, ``schedule``, ``policy``, ``interval``,
            ``data_parallel``, ...).
        init_layer: ``init_layer(index, layer)`` gives a meta layer this rank owns its values (default:
            storage on the device, then each submodule's ``reset_parameters`` seeded by the index).
    """

    def __init__(self, layers: Sequence[nn.Module], loss_fn: Callable, optimizer: OptimizerFactory | None = None,
                 config: PipelineConfig | None = None, init_layer: Callable[[int, nn.Module], None] | None = None,
                 **overrides: Any):
        self.config = _checked_config(layers, loss_fn, optimizer, config, overrides)
        self.layers, self.loss_fn = list(layers), loss_fn
        self.optimizer_factory = optimizer or default_optimizer
        try:
            self.transport = start_process_group(self.config.transport)
        except InputError as err:
            raise ValueError(f"AdaptivePipeline: {err}") from None
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        try:
            self.dims = ParallelDims.of_world(self.world, self.config.data_parallel)
            self.split = check_split(self.config.microbatch_split or even_split(self.config.data_parallel,
                                                                                 self.config.microbatches),
                                     self.dims.replicas, self.config.microbatches, self.config.schedule,
                                     self.dims.stages, "AdaptivePipeline: microbatch_split")
        except InputError as err:
            raise ValueError(f"AdaptivePipeline: {err}") from None
        self.device, self.wire = self.transport.compute, self.transport.wire
        self.mesh = Mesh(self.dims, self.rank, self.wire.type)
        self.init_layer = init_layer or (lambda index, layer: initialise(layer, index, self.config.seed, self.device))
        self.processes, self.cores = local_processes_and_cores(self.world)  # before pinning narrows the cores
        # what the stage processes of this host share for their compute: its cores, or its GPUs
        self.compute_units = torch.cuda.device_count() if self.device.type == "cuda" else self.cores
        self.oversubscribed = self._place_process()
        self.injector: Injector | None = None
        if self.config.interference:  # device r x S + s of the trace is replica r's stage s: this rank
            self.injector = Injector.from_spec(self.config.interference, self.world, self.rank, self.config.time_scale,
                                               self.config.inject, self.config.seed)
        self.clock = DeviceClock(self.config.device_time, self.injector, self.device)
        self.bandwidth_gbps = measure_p2p_bandwidth_gbps(self.rank, self.world, self.transport)
        self.stage: StageWorker | None = None
        self.controller: Controller | None = None
        self.publisher: Publisher | None = None
        self.iteration = self.config.first_iteration
        self._pending_state: dict[str, Any] | None = None
        self._pending_split: tuple[int, ...] | None = None
        self._last_plan: tuple | None = None
        self.meter = IntervalMeter()
        self.start = time.perf_counter()
        self.training_start: float | None = None

    @property
    def boundaries(self) -> tuple[int, ...]:
        """The partition in force: the first layer of each stage (the same in every replica)."""
        if self.stage is None:
            raise ValueError("boundaries: the pipeline is laid out by its first train_step (and gone after close)")
        return self.stage.boundaries

    @property
    def microbatch_split(self) -> tuple[int, ...]:
        """Micro-batches each replica runs per iteration (a rebalance shows from its next iteration)."""
        return self.split

    def _place_process(self) -> bool:
        """Pin this rank to a core of its own where the cores suffice (real device time measures the
        host then); returns whether its device is oversubscribed: stage processes outnumber cores, or
        share a GPU (real device time then measures time-slicing between them)."""
        processes, cores = self.processes, self.cores
        if self.transport.shared_device:
            if self.rank == 0 and self.config.device_time == "real":
                print(f"rlpipe run: warning: {processes} stage processes share {torch.cuda.device_count()} GPU(s): "
                      f"real device time measures their time-slicing, not a pipeline (the log says "
                      f"oversubscribed; consider --device-time emulated)", flush=True)
            if processes <= cores:
                self._pin_to_own_core()
            return True
        if processes > cores:
            if self.rank == 0 and self.config.device_time == "real":
                print(f"rlpipe run: warning: {processes} stage processes share {cores} cores: real device time "
                      f"measures contention, not a pipeline (the log says oversubscribed; consider "
                      f"--device-time emulated)", flush=True)
            return True
        self._pin_to_own_core()
        return False

    def _pin_to_own_core(self) -> None:
        local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[local_rank % self.cores]})

    # --- set-up ---------------------------------------------------------------------------------

    def set_up(self, example: torch.Tensor, target: torch.Tensor) -> None:
        """Decide the launch partition (rank 0 profiles on one micro-batch of ``example`` unless a
        profile was given), give this rank's layers their values and build its stage; ``train_step``
        calls it on its first batch."""
        config, dims = self.config, self.dims
        self.overheads = Overheads(op_ms=measure_op_overhead_ms(self.mesh, config.schedule, config.microbatches,
                                                                self.transport))
        plan, profile = plan_launch(config, self.layers, example, target, self.loss_fn, self.rank, dims.stages,
                                    self.processes, self.compute_units, self.transport, self.init_layer)
        self.profile_info = profile
        self.plan = plan
        owned = Partition(plan.boundaries, len(self.layers)).stage_ranges()[self.mesh.stage]
        for index in range(*owned):
            if not is_materialised(self.layers[index]):
                self.init_layer(index, self.layers[index])
        self.stage = StageWorker(self.layers, self.loss_fn, plan.boundaries, self.mesh, config.schedule,
                                 self.optimizer_factory, self.clock, self.transport,
                                 (plan.forward_ms, plan.backward_ms) if config.device_time == "emulated" else None,
                                 config.drop_moved_optimizer_state)
        if self._pending_state is not None:
            self._apply_state(self._pending_state)
            self._pending_state = None
        self.step_costs = measure_step_costs(self.stage.owned_params(), self.optimizer_factory, self.stage.sync,
                                             self.mesh, self.wire)
        if self.rank == 0:
            assert profile is not None
            device_profile = profile.device
            if config.policy:
                migration = MigrationCost(bandwidth_gbps=self.bandwidth_gbps or 10.0,
                                          overhead_s=config.migration_overhead_s)
                self.controller = Controller(config.policy, device_profile, dims.stages, config.schedule,
                                             config.microbatches, migration, config.fallback, dims.replicas)
            self.publisher = Publisher(config, dims, PipelineCosts(device_profile), self._run_header(profile),
                                       self.overheads, self.bandwidth_gbps, self.step_costs)
            emulation = (f"; device time emulated at {plan.device_time_scale:g} x the profile"
                         if config.device_time == "emulated" else "; device time real")
            layout = f"{dims.replicas} replicas x " if dims.replicas > 1 else ""
            print(f"rlpipe run: {layout}{dims.stages} stages {list(plan.boundaries)}, {config.schedule}, "
                  f"{config.microbatches} micro-batches{' per replica' if dims.replicas > 1 else ''}; "
                  f"p2p {self.bandwidth_gbps:.2f} Gbit/s{emulation}", flush=True)

    def _run_header(self, profile: ProfileInfo) -> dict[str, Any]:
        """What the log's first record says of the whole run (see :mod:`rlpipe.runlog`)."""
        config, device_profile = self.config, profile.device
        return {"stages": self.dims.stages, "data_parallel": self.dims.replicas, "schedule": config.schedule,
                "microbatches": config.microbatches, "microbatch_split": list(self.split),
                "interval": config.interval, "policy": config.policy, "interference": config.interference,
                "inject": config.inject, "time_scale": config.time_scale, "device_time": config.device_time,
                "device_time_scale": self.plan.device_time_scale, "oversubscribed": self.oversubscribed,
                "processes": self.processes, "cores": self.cores, "p2p_gbps": self.bandwidth_gbps,
                "transport": self.transport.name, "device": str(self.device),
                "op_overhead_ms": self.overheads.op_ms, "sync_gbps": self.step_costs.sync_gbps,
                "optimizer_ms_per_mb": self.step_costs.optimizer_ms_per_mb, "forward_ms": self.plan.forward_ms.tolist(),
                "backward_ms": self.plan.backward_ms.tolist(),
                "activation_bytes": device_profile.activation_bytes().tolist(),
                "param_bytes": [layer.param_bytes for layer in device_profile.layers],
                "profile_id": profile.identity, "profile_source": profile.source,
                "first_iteration": config.first_iteration}

    # --- training -------------------------------------------------------------------------------

    def train_step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float:
        """Train one batch; returns its mean loss (over its samples) on every rank.

        Every rank is handed the same batch: each replica's first stage reads its share of ``inputs``
        and its last stage its share of ``targets`` (a rank may pass ``None`` for what it does not
        read). A batch whose samples do not divide into the job's micro-batches (a short last batch)
        trains in smaller micro-batches. Every ``interval`` steps an interval ends: statistics, a
        decision, maybe a live repartition or a new split.
        """
        first, last = self.mesh.stage == 0, self.mesh.stage == self.dims.stages - 1
        self._check_batch(inputs, "inputs", first)
        self._check_batch(targets, "targets", last)
        if self._pending_split is not None:
            self.split, self._pending_split = self._pending_split, None
        plan = self._plan(inputs, targets)
        if self.stage is None:
            if inputs is None or targets is None:
                raise ValueError("train_step: the first batch sets the pipeline up: give inputs and targets on "
                                 "every rank")
            self.set_up(inputs[:plan.microbatch_rows], targets[:plan.microbatch_rows])
        if self.training_start is None:
            self._start_clocks()
        assert self.stage is not None
        start = time.perf_counter()
        key = (plan.split, plan.microbatch_rows)
        warmup = not self.stage.warm or key != self._last_plan  # a new stage infers shapes first
        self._last_plan = key
        trace_start_s = self.injector.trace_time_s() if self.injector is not None else 0.0
        share = plan.replica_rows(self.mesh.replica)
        # the batch enters where tensors between ranks travel: a host-staged stage copies it to its GPU and
        # counts that copy with the others. Contiguous, since torch 2.11's PipelineStage infers the first
        # stage's input as a dense tensor and then refuses a strided view of one (charlm's shifted windows)
        stage_inputs = inputs[share].to(self.wire).contiguous() if first and inputs is not None else None
        stage_targets = targets[share].to(self.wire).contiguous() if last and targets is not None else None
        losses = self.stage.train_step(stage_inputs, stage_targets, plan)
        total = torch.tensor([sum(losses)], dtype=torch.float64, device=self.wire)
        dist.all_reduce(total)  # every replica's last stage adds its micro-batch losses; every rank learns the mean
        loss = float(total.item()) / plan.total
        self.meter.losses.append(loss)
        elapsed_s = time.perf_counter() - start
        self.meter.busy_s += elapsed_s
        self.meter.warmup_s += elapsed_s if warmup else 0.0
        self.meter.iterations += 1
        self.meter.samples += plan.rows
        self.meter.conditions.append((self.stage.boundaries, self._injected_slowdown(trace_start_s), plan.split,
                                      warmup))
        self.meter.met_slowdowns.append(self.clock.take_met_slowdown())
        self.iteration += 1
        if self.iteration % self.config.interval == 0 or self.iteration == self.config.total_iterations:
            self.end_interval()
        return loss

    def _start_clocks(self) -> None:
        """The run's clocks start at its first iteration, after set-up (which takes each run its own time):
        its wall-time budget and the injected scenario's time."""
        self.training_start = time.perf_counter()
        if self.injector is not None:
            self.injector.start = self.training_start - self.config.trace_start_s / self.config.time_scale

    def out_of_time(self) -> bool:
        """Whether the run's wall-time budget (``duration_s``) is spent: rank 0's clock decides for every
        rank (collective, once per iteration; without a budget, never and without a collective)."""
        if self.config.duration_s is None or self.training_start is None:
            return False
        spent = torch.tensor([time.perf_counter() - self.training_start >= self.config.duration_s],
                             dtype=torch.int64, device=self.wire)
        dist.broadcast(spent, 0)
        return bool(spent.item())

    def _plan(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> BatchPlan:
        """How this batch is trained; every rank learns its size from rank 0 (which reads the inputs)."""
        rows = torch.tensor([inputs.shape[0] if inputs is not None else 0], dtype=torch.int64, device=self.wire)
        dist.broadcast(rows, 0)
        if targets is not None and targets.shape[0] != int(rows.item()):
            raise ValueError(f"train_step: targets: {targets.shape[0]} samples for {int(rows.item())} inputs")
        try:
            return plan_batch(int(rows.item()), self.split, minimum_per_replica(self.config.schedule, self.dims.stages))
        except InputError as err:
            raise ValueError(f"train_step: {err}") from None

    def _check_batch(self, batch: torch.Tensor | None, name: str, needed: bool) -> None:
        if batch is None:
            if needed:
                raise ValueError(f"train_step: {name}: this rank's stage reads them, got None")
            return
        if not isinstance(batch, torch.Tensor) or batch.dim() == 0:
            raise ValueError(f"train_step: {name}: expected a tensor with a batch dimension, "
                             f"got {type(batch).__name__}")

    def _injected_slowdown(self, trace_start_s: float) -> np.ndarray:
        """Every device's injected slowdown over the iteration that started at trace time ``trace_start_s``
        and ends now: the change of conditions inside an iteration counts for the share of it that each
        side held (a long iteration at a large ``time_scale`` spans minutes of the scenario)."""
        if self.injector is None:
            return np.ones(self.world)
        return self.injector.trace.effective_slowdown(trace_start_s, self.injector.trace_time_s())

    def _condition_on_met_slowdowns(self) -> None:
        """Emulated device time: each iteration's injected slowdowns become those every device's chunks met
        (collective), where the trace's over the iteration's span assumed each device busy throughout it.
        Read so, an iteration that a 4x slowdown ended inside was predicted 8-25% fast: the slowed stage, the
        bottleneck, had worked through the slowdown and then waited for its neighbours."""
        own = torch.tensor(self.meter.met_slowdowns, dtype=torch.float64, device=self.wire)
        everyone = [torch.zeros_like(own) for _ in range(self.world)]
        dist.all_gather(everyone, own)
        # (device, iteration); perf_counter's arithmetic leaves ~1e-10 on the ratio: an undisturbed device reads 1.0
        met = np.round(torch.stack(everyone).cpu().numpy(), 6)
        self.meter.conditions = [(boundaries, np.where(np.isnan(met[:, i]), slowdown, met[:, i]), split, warmup)
                                 for i, (boundaries, slowdown, split, warmup) in enumerate(self.meter.conditions)]

    def rebalance(self, split: Sequence[int]) -> None:
        """Give replica r ``split[r]`` micro-batches per iteration from the next one on (collective: every
        rank calls it with the same split). Nothing moves: any split gives the same update."""
        try:
            new = check_split(split, self.dims.replicas, self.config.microbatches, self.config.schedule,
                              self.dims.stages, "rebalance")
        except InputError as err:
            raise ValueError(str(err)) from None
        current = self._pending_split or self.split
        if new != current:
            self.meter.rebalances.append({"iteration": self.iteration, "from": list(current), "to": list(new)})
            self._pending_split = new

    def end_interval(self, final: bool = False) -> None:
        """Gather every rank's report; rank 0 decides the next partition and split (unless the run ends
        here: ``final``, or its last iteration), which every rank then adopts (collective)."""
        assert self.stage is not None
        config, meter = self.config, self.meter
        if meter.iterations == 0:
            return
        owned = self.stage.owned_layers()
        compute_s, timed, per_iteration = self.stage.take_compute()
        chunks, overran = self.stage.take_overruns()
        own = StageReport(compute_s / timed * 1e3, compute_dispersion(per_iteration),
                          tail_compute(per_iteration, compute_s / timed * 1e3), meter.busy_s,
                          self.stage.take_sync_s() / meter.iterations * 1e3,
                          self.stage.take_staging_s() / meter.iterations * 1e3, float(self.split[self.mesh.replica]),
                          float(len(owned)), self.stage.memory_bytes(), float(self.stage.resident_param_bytes()),
                          float(process_rss_bytes()), float(self.plan.compute_ms()[owned.start:owned.stop].sum()),
                          chunks, overran, *gpu_load(self.device),
                          float(torch.cuda.memory_allocated(self.device)) if self.device.type == "cuda" else -1.0)
        reports = exchange_reports(own, self.world, self.wire)
        if self.config.device_time == "emulated" and self.injector is not None:
            self._condition_on_met_slowdowns()
        stats = interval_statistics(reports, meter, self.iteration, self.stage.boundaries, self.dims)
        rescaled = self._hold_emulation(reports)
        decides = bool(config.policy) and not final and self.iteration != config.total_iterations  # a next one?
        target, split = self._broadcast_decision(stats) if decides else (None, None)
        if self.publisher is not None:
            record = log_record(stats, reports, self.dims, list(meter.losses), time.perf_counter() - self.start, meter)
            record.update(self.publisher.prediction(meter))
            self._annotate(record, reports, decides)
            if rescaled:
                record["device_time_scale"] = self.plan.device_time_scale
                self.publisher.rescale(self.plan.device_time_scale, rescaled)
            self.publisher.publish(record)
        self.meter = IntervalMeter()
        if target is not None and target != self.stage.boundaries:
            self.repartition(target)
        if split is not None and split != self.split:
            self.rebalance(split)

    def _hold_emulation(self, reports: list[StageReport]) -> float:
        """With the default device-time scale, keep emulation holding on a machine busier than it was at
        start-up: when more than ``ADAPT_OVERRUN`` of an interval's chunks overran their emulated time,
        every rank (from the same reports) emulates ``ADAPT_FACTOR`` times slower devices from now on, and
        the log says so. A scale the user gave is never changed (compared runs need one). Returns the
        factor applied (0: none)."""
        if self.config.device_time != "emulated" or self.config.device_time_scale is not None:
            return 0.0
        chunks = sum(r.chunks for r in reports)
        if not chunks or sum(r.overran for r in reports) <= ADAPT_OVERRUN * chunks:
            return 0.0
        assert self.stage is not None
        self.plan = replace(self.plan, forward_ms=self.plan.forward_ms * ADAPT_FACTOR,
                            backward_ms=self.plan.backward_ms * ADAPT_FACTOR,
                            device_time_scale=self.plan.device_time_scale * ADAPT_FACTOR)
        self.stage.rescale(ADAPT_FACTOR)
        return ADAPT_FACTOR

    def _annotate(self, record: dict[str, Any], reports: list[StageReport], decided: bool) -> None:
        """Rank 0: what the log adds beside the figures: emulation, injection, the decision (only if one
        was made for the next interval), fallbacks."""
        if self.config.device_time == "emulated":
            record["emulation"] = {"chunks": int(sum(r.chunks for r in reports)),
                                   "overran": int(sum(r.overran for r in reports))}
        if self.injector is not None:  # each device's slowdown, averaged over the interval's iterations
            record["injected_slowdown"] = np.mean([c[1] for c in self.meter.conditions], axis=0).tolist()
            record["trace_time_s"] = self.injector.trace_time_s()
        if self.meter.rebalances:
            record["rebalance"] = self.meter.rebalances[-1]
        if self.controller is not None:
            if decided:
                record["decision"] = self.controller.last_decision
            record["fallbacks"] = self.controller.fallbacks

    def _broadcast_decision(self, stats: IntervalStats) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Rank 0 asks the controller for the next partition and split; every rank learns them."""
        assert self.stage is not None
        boundaries, split = self.stage.boundaries, self.split
        if self.controller is not None:
            decision = self.controller.decide(stats)
            boundaries, split = decision.boundaries, decision.split
        message = torch.tensor([*boundaries, *split], dtype=torch.int64, device=self.wire)
        dist.broadcast(message, 0)
        values = [int(v) for v in message.tolist()]
        return tuple(values[:self.dims.stages]), tuple(values[self.dims.stages:])

    def repartition(self, target: tuple[int, ...], corrupt: bool = False) -> None:
        """Move layers live to ``target``, in every replica at once (collective: every rank calls it); the
        interval records it."""
        assert self.stage is not None
        self.meter.repartitions.append(self.stage.repartition(tuple(target), self.iteration, corrupt))

    # --- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's share of the pipeline: the parameters, buffers and optimizer state of the layers it
        owns, keyed ``"<layer index>.<name>"``, with the partition, the split and the iteration. Save it
        per rank; :meth:`load_state_dict` takes it back (on a pipeline of the same model and layout)."""
        if self.stage is None:
            raise ValueError("state_dict: the pipeline holds nothing before its first train_step")
        owned = self.stage.owned_layers()
        layers = {f"{i}.{name}": t.detach().clone() for i in owned
                  for name, t in [*self.layers[i].named_parameters(), *self.layers[i].named_buffers()]}
        optimizer = {f"{i}.{name}": dict(self.stage.optimizer.state[p]) for i in owned
                     for name, p in self.layers[i].named_parameters() if self.stage.optimizer.state.get(p)}
        return {"boundaries": list(self.stage.boundaries), "split": list(self.split), "iteration": self.iteration,
                "rank": self.rank, "world": self.world, "data_parallel": self.dims.replicas,
                "num_layers": len(self.layers), "layers": layers, "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back this rank's :meth:`state_dict`: before the first step the pipeline starts on the saved
        partition; after it, it repartitions live to the saved partition first (collective)."""
        if not isinstance(state, dict) or not {"world", "num_layers", "rank", "boundaries", "iteration", "layers",
                                                "optimizer"} <= set(state):
            raise ValueError("load_state_dict: expected a dict written by AdaptivePipeline.state_dict")
        if state.get("world") != self.world or state.get("num_layers") != len(self.layers) or \
                state.get("data_parallel", 1) != self.dims.replicas:
            raise ValueError(f"load_state_dict: saved from {state.get('world')} ranks "
                             f"({state.get('data_parallel', 1)} replicas) of a {state.get('num_layers')}-layer model, "
                             f"this pipeline has {self.world} ranks ({self.dims.replicas} replicas) of "
                             f"{len(self.layers)} layers")
        if state.get("rank") != self.rank:
            raise ValueError(f"load_state_dict: this is rank {self.rank}'s pipeline, the state is rank "
                             f"{state.get('rank')}'s")
        self.iteration = int(state["iteration"])
        if state.get("split"):
            self.split = tuple(state["split"])
        if self.stage is None:  # applied by set_up, which starts on the saved partition
            self.config = replace(self.config, boundaries=tuple(state["boundaries"]))
            self._pending_state = state
            return
        if tuple(state["boundaries"]) != self.stage.boundaries:
            self.repartition(tuple(state["boundaries"]))
        self._apply_state(state)

    def _apply_state(self, state: dict[str, Any]) -> None:
        assert self.stage is not None
        with torch.no_grad():
            for i in self.stage.owned_layers():
                for name, t in [*self.layers[i].named_parameters(), *self.layers[i].named_buffers()]:
                    t.copy_(state["layers"][f"{i}.{name}"])
        for i in self.stage.owned_layers():
            for name, p in self.layers[i].named_parameters():
                saved = state["optimizer"].get(f"{i}.{name}")
                if saved:
                    self.stage.optimizer.state[p] = {k: v.to(self.device) if isinstance(v, torch.Tensor)
                                                     and v.dim() > 0 else v for k, v in saved.items()}

    # --- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, directory: str | Path, meta: dict[str, Any], keep: int = 3) -> bool:
        """Collective: replica 0's ranks save the layers they own and their optimizer state (PyTorch's
        distributed checkpoint format; every replica holds the same values, so each layer is saved once);
        rank 0 adds the partition, the split, the iteration, the scenario's clock and ``meta`` (what
        identifies the run), publishes it and keeps the newest ``keep``. A save that fails (a full disk)
        leaves the last checkpoint loadable; the run says so in one line and goes on. Returns whether it
        was published."""
        assert self.stage is not None
        meta = {**meta, "stages": self.dims.stages, "data_parallel": self.dims.replicas,
                "microbatch_split": list(self.split), "num_layers": len(self.layers),
                "boundaries": list(self.stage.boundaries),
                "trace_time_s": self.injector.trace_time_s() if self.injector else 0.0,
                "device_time": self.config.device_time, "device_time_scale": self.plan.device_time_scale}
        files = {}
        if self.profile_info is not None:  # rank 0: the devices this run emulated, for a resumed run
            files[checkpoint.PROFILE_FILE] = json.dumps(self.profile_info.profile.to_dict(), indent=1) + "\n"
            meta["profile_id"] = self.profile_info.identity
        tensors = (checkpoint.tensors_of(self.layers, self.stage.owned_layers(), self.stage.optimizer)
                   if self.mesh.replica == 0 else {})
        error = checkpoint.save(directory, self.iteration, self.rank, tensors, meta, keep, files)
        if error is not None and self.rank == 0:
            message = (f"rlpipe run: warning: the checkpoint at iteration {self.iteration} was not written ({error}); "
                       f"the last one published stays loadable")
            if self.publisher is not None:
                self.publisher.write(message)
            else:
                print(message, flush=True)
        return error is None

    def load_checkpoint(self, folder: Path) -> None:
        """Collective: load the layers this rank owns now, whichever layout wrote them."""
        assert self.stage is not None
        checkpoint.load(folder, self.layers, self.stage.owned_layers(), self.stage.optimizer, self.device)

    # --- the end --------------------------------------------------------------------------------

    def finish(self) -> None:
        """Collective, at the end of training: end a last partial interval and print the run's summary
        (and a warning where the emulation did not hold)."""
        if self.stage is not None and self.meter.iterations:
            self.end_interval(final=True)
        # every rank reaches the end before any tears its process group down: a rank that destroys it
        # while a peer's last transfer is still in gloo's threads aborts that peer ("terminate called")
        dist.all_reduce(torch.zeros(1, device=self.wire))
        if self.publisher is None or self.publisher.progress is None:
            return
        progress = self.publisher.progress
        print(progress.close(), flush=True)
        fraction = progress.overran_fraction()
        if fraction is not None and fraction > INVALID_OVERRUN_FRACTION:
            print(f"rlpipe run: warning: {fraction:.1%} of compute chunks overran their emulated device time "
                  f"(more than {INVALID_OVERRUN_FRACTION:.0%}): the emulation did not hold; raise "
                  f"--device-time-scale", flush=True)
        self.publisher.progress = None

    def close(self) -> None:
        """Tear down (also after a failure: no collective here): the progress bar, the log, any
        competing process, the process groups and this rank's stage (the pipeline trains no more)."""
        if self.publisher is not None:
            self.publisher.close()
        if self.injector is not None:  # a competing process never outlives its stage
            self.injector.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        # The stage and the mesh still hold the replica's and the stage group's process groups (at D = 1
        # the pipeline's group is the world). Released here, they are destroyed now, their gloo worker
        # threads joined while the interpreter is fully alive; left to the interpreter's exit, a worker
        # still letting go of its last tensor aborts the process ("terminate called without an active
        # exception": a decref from a C++ thread during finalization, pytorch issue 190489).
        self.stage = None
        self.mesh.release()
        gc.collect()
