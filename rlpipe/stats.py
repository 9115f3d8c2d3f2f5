"""What a pipeline reports each decision interval, simulated or live: the StageStats contract."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

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

    Attributes:
        iteration: the training iteration at the interval's end.
        iterations: iterations run in the interval.
        wall_s: wall time of the interval, s, repartition stall included.
        stall_s: time training stood still for a repartition in this interval, s.
        boundaries: the partition the interval ran with.
        compute_ms, comm_ms, idle_ms, num_layers, memory_bytes, device_load: per stage, as in StageStats.
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

    @classmethod
    def from_stages(cls, iteration: int, iterations: int, wall_s: float, stall_s: float,
                    boundaries: Sequence[int], stages: Sequence[StageStats]) -> IntervalStats:
        """Build from one StageStats record per stage."""
        columns = {name: np.array([getattr(s, name) for s in stages], dtype=np.float64) for name in STAGE_FIELDS}
        return cls(iteration, iterations, wall_s, stall_s, tuple(boundaries), **columns)

    @property
    def num_stages(self) -> int:
        return len(self.boundaries)

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
