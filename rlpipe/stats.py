"""What a pipeline reports each decision interval, simulated or live: the StageStats contract."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
    """A pipeline's report for one decision interval.

    Attributes:
        iteration: the training iteration at the interval's end.
        iterations: iterations run in the interval.
        wall_s: wall time of the interval, s, repartition stall included.
        stall_s: time training stood still for a repartition in this interval, s.
        boundaries: the partition the interval ran with.
        stages: one :class:`StageStats` per stage.
    """

    iteration: int
    iterations: int
    wall_s: float
    stall_s: float
    boundaries: tuple[int, ...]
    stages: tuple[StageStats, ...] = field(default_factory=tuple)

    @property
    def iteration_ms(self) -> float:
        """Mean time per iteration, excluding the stall, ms."""
        return (self.wall_s - self.stall_s) / max(self.iterations, 1) * 1e3
