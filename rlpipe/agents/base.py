"""The one interface every decision-maker implements, in simulation and live."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rlpipe.observation import ObservationEncoder


@dataclass
class DecisionContext:
    """What a policy may read besides the observation.

    Attributes:
        encoder: the observation encoder, holding the latest decoded statistics
            (``encoder.latest``), the device slowdown estimate and the re-plan target.
        boundaries: the partition in force.
        future: simulation only: a view of the true future conditions (the oracle's crystal ball).
    """

    encoder: ObservationEncoder
    boundaries: tuple[int, ...]
    future: Any = None


@runtime_checkable
class Policy(Protocol):
    """A decision-maker: an action index from the observation, the mask and the context.

    A simulation-only policy may return a target partition (a tuple of boundaries) instead.
    """

    name: str

    def reset(self) -> None:
        """Forget everything about the previous episode or run."""

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> int | tuple[int, ...]:
        """Decide for the interval that starts now."""
