"""How long each phase of a training run took: ``phases.json`` in the run's folder, and a line on the console.

A training run spends its time in phases of very different speed (labelling the teacher's decisions, cloning,
the critic's warm-up, PPO, the held-out evaluations); a run's steps per second end to end says little about any
one of them. ``make bench`` reads the PPO phase's figure from here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PhaseTimes"]


@dataclass
class PhaseTimes:
    """Wall seconds per phase, and environment steps where a phase steps environments.

    Attributes:
        phases: phase name -> {"seconds": wall seconds, "steps": environment steps (0: none),
            "evaluation_seconds": seconds of held-out evaluation inside the phase (0: none)}, in run order.
    """

    phases: dict[str, dict[str, float]] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str, steps: int = 0) -> Iterator[dict[str, float]]:
        """Time the block as phase ``name`` (recorded even if the block raises: an interrupted run says how far
        it got). Yields the phase's record, for figures known only inside the block."""
        record = {"seconds": 0.0, "steps": float(steps), "evaluation_seconds": 0.0}
        start = time.perf_counter()
        try:
            yield record
        finally:
            record["seconds"] = time.perf_counter() - start
            self.phases[name] = record

    def steps_per_s(self, name: str) -> float:
        """Phase ``name``'s environment steps per second, its held-out evaluations left out."""
        record = self.phases[name]
        return record["steps"] / max(record["seconds"] - record["evaluation_seconds"], 1e-9)

    def summary(self) -> str:
        """One line: each phase's duration, and steps/s where it steps environments."""
        parts = []
        for name, record in self.phases.items():
            part = f"{name} {_duration(record['seconds'])}"
            if record["steps"]:
                part += f" ({record['steps']:,.0f} steps, {self.steps_per_s(name):,.0f} steps/s"
                part += (f" not counting {_duration(record['evaluation_seconds'])} of held-out scoring)"
                         if record["evaluation_seconds"] else ")")
            parts.append(part)
        return "training took: " + ", ".join(parts)

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.phases, indent=1))


def _duration(seconds: float) -> str:
    """``seconds`` as a person reads it: seconds under two minutes, minutes beyond."""
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
