"""What every decision-maker implements, and what it may read: the Policy protocol and its context.

It lies below the environment and the agents, so that the episode loop (``rlpipe.envs.evaluation``),
the heuristics and the learned policy (``rlpipe.agents``) and the live controller all share it
without importing one another.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rlpipe.observation import ObservationEncoder


@dataclass
class DecisionContext:
    """What a policy may read besides the observation.

    Attributes:
        encoder: the observation encoder, holding the latest decoded statistics
            (``encoder.latest``), the device slowdown estimates and what each lever would do.
        boundaries: the partition in force.
        future: simulation only: a view of the true future conditions (the oracle's crystal ball).
        split: the micro-batch split in force (``None``: the encoder's latest).
    """

    encoder: ObservationEncoder
    boundaries: tuple[int, ...]
    future: Any = None
    split: tuple[int, ...] | None = None


@runtime_checkable
class Policy(Protocol):
    """A decision-maker: an action index from the observation, the mask and the context.

    A simulation-only policy may return a target plan instead: ``(boundaries, split)``.

    Attributes:
        name: what logs and tables call it.
        live: whether it can run on a live pipeline (the oracle needs the simulator's future).
        fallbacks: decisions handed to a fallback policy, by reason (empty for policies without one).
        last_fallback: why the latest decision fell back (``None``: it did not).
        observation_layout: the ``(s_max, history, d_max)`` the policy was trained to read (``None``: any).
    """

    name: str
    live: bool
    fallbacks: Counter[str]
    last_fallback: str | None
    observation_layout: tuple[int, int, int] | None

    def reset(self) -> None:
        """Forget everything about the previous episode or run."""

    def act(self, observation: np.ndarray, mask: np.ndarray,
            context: DecisionContext) -> int | tuple[tuple[int, ...], tuple[int, ...]]:
        """Decide for the interval that starts now."""


@dataclass
class PolicyBase:
    """The bookkeeping every policy shares; a policy with a fallback fills it in."""

    live: bool = field(default=True, init=False)
    observation_layout: tuple[int, int, int] | None = field(default=None, init=False)
    fallbacks: Counter[str] = field(default_factory=Counter, init=False, repr=False)
    last_fallback: str | None = field(default=None, init=False, repr=False)
