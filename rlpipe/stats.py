"""What a pipeline reports each decision interval, simulated or live: the StageStats contract."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

TAIL_SHARE = 0.3  # ``tail_load`` reads this share of an interval's last iterations


def tail_iterations(iterations: int) -> int:
    """How many of an interval's ``iterations`` (timed iterations, live) its ``tail_load`` reads."""
    return max(1, math.ceil(TAIL_SHARE * iterations - 1e-9))  # 3 of 10, not 4 of float's 3.0000000000000004


STAGE_FIELDS = ("compute_ms", "comm_ms", "idle_ms", "num_layers", "memory_bytes", "device_load")


@dataclass(frozen=True)
class StageStats:
    """One stage over one interval of K iterations.

    Attributes:
        compute_ms: measured forward + backward time per micro-batch, ms.
        comm_ms: communication wait per iteration, ms.
        idle_ms: idle (bubble) time per iteration, ms.
        num_layers: layers the stage holds.
        memory_bytes: memory in use (parameters, optimizer state, activations), bytes.
        device_load: measured compute over the profiled interference-free compute of the same layers
            (1.0: undisturbed; 2.0: the device runs at half speed).
    """

    compute_ms: float
    comm_ms: float
    idle_ms: float
    num_layers: int
    memory_bytes: float
    device_load: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class IntervalStats:
    """A pipeline's report for one decision interval, each stage's figures as arrays (one entry per
    stage, the fields of :class:`StageStats`); ``stages`` gives them as StageStats records.

    In a hybrid job (D replicas of the pipeline) a stage's figures are those of its stage group's most
    loaded member (the job waits for its slowest replica); ``replica_load`` keeps every device's load.

    Attributes:
        iteration: the training iteration at the interval's end.
        iterations: iterations run in the interval.
        wall_s: wall time of the interval, s, repartition stall included.
        stall_s: time training stood still for a repartition (or a rebalance) in this interval, s.
        boundaries: the partition the interval ran with.
        compute_ms, comm_ms, idle_ms, num_layers, memory_bytes, device_load: per stage, as in StageStats.
        compute_cv: per stage, the dispersion (standard deviation over mean) of its compute per
            micro-batch from one iteration to the next within the interval: what noise shorter than an
            interval looks like (``None``: not measured).
        replica_load: (D, S) the measured load of every device (``None``: one pipeline, ``device_load``).
        split: micro-batches each replica ran (``None``: one pipeline).
        sync_ms: per stage group, the gradient sync per iteration, ms (``None``: none).
        tail_load: (D, S) every device's measured load over the interval's last ``TAIL_SHARE`` of its
            iterations (at least one): where conditions changed within the interval, what they are now
            (``None``: not measured).
    """

    iteration: int
    iterations: int
    wall_s: float
    stall_s: float
    boundaries: tuple[int, ...]
    compute_ms: np.ndarray
    comm_ms: np.ndarray
    idle_ms: np.ndarray
    num_layers: np.ndarray
    memory_bytes: np.ndarray
    device_load: np.ndarray
    compute_cv: np.ndarray | None = None
    replica_load: np.ndarray | None = None
    split: tuple[int, ...] | None = None
    sync_ms: np.ndarray | None = None
    tail_load: np.ndarray | None = None

    @classmethod
    def from_stages(cls, iteration: int, iterations: int, wall_s: float, stall_s: float,
                    boundaries: Sequence[int], stages: Sequence[StageStats], **hybrid: Any) -> IntervalStats:
        """Build from one StageStats record per stage (``hybrid``: the optional fields)."""
        compute, comm, idle, layers, memory, load = (np.array([getattr(s, name) for s in stages], dtype=np.float64)
                                                     for name in STAGE_FIELDS)
        return cls(iteration, iterations, wall_s, stall_s, tuple(boundaries), compute, comm, idle, layers, memory, load,
                   **hybrid)

    @property
    def num_stages(self) -> int:
        return len(self.boundaries)

    @property
    def replicas(self) -> int:
        """D: the data-parallel replicas that ran the interval."""
        return 1 if self.split is None else len(self.split)

    @property
    def loads(self) -> np.ndarray:
        """(D, S) every device's measured load."""
        return self.device_load[None, :] if self.replica_load is None else self.replica_load

    @property
    def stages(self) -> tuple[StageStats, ...]:
        """Each stage's figures as a StageStats record."""
        columns = zip(*(getattr(self, name).tolist() for name in STAGE_FIELDS), strict=True)
        return tuple(StageStats(compute, comm, idle, int(layers), memory, load)
                     for compute, comm, idle, layers, memory, load in columns)

    @property
    def iteration_ms(self) -> float:
        """Mean time per iteration, excluding the stall, ms."""
        return (self.wall_s - self.stall_s) / max(self.iterations, 1) * 1e3
