"""What an iteration costs after its pipeline, measured at start-up for the simulator's prediction: the
stage groups' gradient sync and the optimizer step.

Both run on the host as they do in training, one stage group at a time, on stand-ins shaped like this
rank's parameters, so that the real parameters, gradients and optimizer state are never touched. Neither
is device time: with emulated device time they are what the host really spends, and without them the
prediction of a hybrid job ran 3-13% under the live iteration (an Adam step over a stage of 1M parameters
took 16 ms on this CPU, and the all-reduce of its gradients 2-4x the point-to-point estimate).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from rlpipe.runlog import MEBIBYTE
from rlpipe.runtime.mesh import GradientSync, Mesh
from rlpipe.runtime.stage import OptimizerFactory

STAND_IN_BYTES = 64 * MEBIBYTE  # the measurement copies at most this much of a stage's parameters (x3 with Adam's
# state); the costs are read per byte, so a larger stage is timed on part of it


@dataclass(frozen=True)
class StepCosts:
    """The end of an iteration, as the median rank measured it.

    Attributes:
        sync_gbps: the stage groups' gradient all-reduce as a ring over links of this bandwidth (what it
            took for its bytes, copies into and out of the bucket included), Gbit/s; ``None`` with one replica.
        optimizer_ms_per_mb: the optimizer step per MiB (2**20 bytes) of a stage's parameters, ms
            (0 where the step could not be timed: an optimizer whose step needs a closure).
    """

    sync_gbps: float | None
    optimizer_ms_per_mb: float

    def optimizer_ms(self, stage_param_bytes: float) -> float:
        """The optimizer step of a stage holding ``stage_param_bytes`` of parameters, ms."""
        return self.optimizer_ms_per_mb * stage_param_bytes / MEBIBYTE


def measure_step_costs(params: list[nn.Parameter], optimizer_factory: OptimizerFactory, sync: GradientSync,
                       mesh: Mesh, wire: torch.device, repeats: int = 5) -> StepCosts:
    """Time the gradient sync and the optimizer step of this rank's stage on stand-ins of its parameters,
    one stage group at a time (collective: every rank of the job calls it; each learns the median over
    the ranks). One group at a time because that is how an iteration ends: the stage that finishes its
    pipeline last (the first, in 1F1B) syncs and steps while the others wait on it; timed all at once,
    four processes on two cores measured each step twice as long as training spends on it."""
    stand_ins = stand_ins_of(params)
    stand_in_bytes = sum(p.numel() * p.element_size() for p in stand_ins)
    replicas = mesh.dims.replicas
    sync_s = step_s = 0.0
    for stage in range(mesh.dims.stages):
        dist.barrier()
        if stage == mesh.stage:
            if replicas > 1:  # one replica has no gradients to sum
                sync(stand_ins, 1.0)  # warm: the group's first collective of this size
                sync_s = float(np.median([sync(stand_ins, 1.0) for _ in range(repeats)]))
            step_s = optimizer_step_s(stand_ins, optimizer_factory, repeats)
    ring_gbit = stand_in_bytes * 2 * (replicas - 1) / replicas * 8 / 1e9
    rates = torch.tensor([ring_gbit / sync_s if sync_s > 0 else math.nan,
                          step_s * 1e3 / (stand_in_bytes / MEBIBYTE) if stand_in_bytes else math.nan],
                         dtype=torch.float64, device=wire)
    everyone = [torch.zeros_like(rates) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, rates)
    # the median over ranks of what each measured (a rank with no parameters, or one replica, gives NaN)
    sync_gbps, optimizer_ms_per_mb = (float(np.median(rank_rates[np.isfinite(rank_rates)]))
                                      if np.isfinite(rank_rates).any() else math.nan
                                      for rank_rates in torch.stack(everyone).cpu().numpy().T)
    return StepCosts(float(sync_gbps) if replicas > 1 and np.isfinite(sync_gbps) else None,
                     float(optimizer_ms_per_mb) if np.isfinite(optimizer_ms_per_mb) else 0.0)


def stand_ins_of(params: list[nn.Parameter]) -> list[nn.Parameter]:
    """Zero parameters (with zero gradients) shaped like the first ``STAND_IN_BYTES`` of ``params``."""
    stand_ins, total = [], 0
    for p in params:
        if total >= STAND_IN_BYTES:
            break
        stand_in = nn.Parameter(torch.zeros_like(p, requires_grad=True))
        stand_in.grad = torch.zeros_like(p)
        stand_ins.append(stand_in)
        total += p.numel() * p.element_size()
    return stand_ins


def optimizer_step_s(stand_ins: list[nn.Parameter], optimizer_factory: OptimizerFactory, repeats: int) -> float:
    """One optimizer step over ``stand_ins``, s: the median of ``repeats`` (the first step, which builds the
    state, left out)."""
    if not stand_ins:
        return 0.0
    optimizer = optimizer_factory(stand_ins)
    synchronise = (lambda: torch.cuda.synchronize(stand_ins[0].device)) if stand_ins[0].is_cuda else (lambda: None)
    try:
        optimizer.step()
    except TypeError:  # a step that needs a closure (LBFGS): not timed
        return 0.0
    synchronise()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        synchronise()
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))
