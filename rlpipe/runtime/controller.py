"""The controller on rank 0: every interval, statistics -> the shared observation encoder -> a policy
-> the partition to run next. The same encoder and action decoder as the simulator."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rlpipe.agents import make_policy
from rlpipe.decision import DecisionContext
from rlpipe.observation import DEFAULT_HISTORY, DEFAULT_S_MAX, KEEP, ObservationEncoder
from rlpipe.planning import Planner, StatsError
from rlpipe.profile import LayerProfile
from rlpipe.simulator import MigrationCost
from rlpipe.stats import IntervalStats

log = logging.getLogger("rlpipe.controller")


@dataclass(frozen=True)
class Decision:
    """What the job runs next: the partition (first layer of each stage) and each replica's micro-batches."""

    boundaries: tuple[int, ...]
    split: tuple[int, ...]


class Controller:
    """Decides repartitions for a live pipeline.

    The observation is laid out as the policy was trained (the artifact's ``s_max`` and history);
    a policy without an artifact gets the defaults.

    Args:
        policy_spec: ``static``, ``greedy``, ``dynpipe``, ``threshold``, ``ppo`` or ``ppo:PATH``.
        profile: the per-layer profile the run started from.
        num_stages, schedule, microbatches: the pipeline.
        migration: the stall model (fixed overhead and the measured point-to-point bandwidth).
        fallback: the heuristic that decides for ``ppo`` when its actor cannot.
    """

    def __init__(self, policy_spec: str, profile: LayerProfile, num_stages: int, schedule: str, microbatches: int,
                 migration: MigrationCost, fallback: str = "dynpipe"):
        self.policy = make_policy(policy_spec, live=True, fallback=fallback)
        s_max, history = self.policy.observation_layout or (DEFAULT_S_MAX, DEFAULT_HISTORY)
        planner = Planner(profile, num_stages, schedule, microbatches, migration=migration)
        self.encoder = ObservationEncoder(planner, max(s_max, num_stages), history)
        self.decisions: Counter[str] = Counter()
        self.last_decision: dict[str, Any] = {}

    @property
    def fallbacks(self) -> dict[str, int]:
        """Decisions the policy handed to its fallback, by reason."""
        return dict(self.policy.fallbacks)

    def decide(self, stats: IntervalStats) -> Decision:
        """The partition and the micro-batch split for the next interval; what to log about the decision
        is ``last_decision``."""
        split = stats.split or (self.encoder.planner.microbatches,)
        return Decision(self._partition(stats), tuple(split))

    def _partition(self, stats: IntervalStats) -> tuple[int, ...]:
        start = time.perf_counter()
        boundaries = tuple(stats.boundaries)
        try:
            observation = self.encoder.observe(stats)
        except StatsError as err:  # unusable statistics: hold the partition, and say why
            log.warning("statistics unusable (%s): keeping the partition", err)
            self.decisions["unusable statistics"] += 1
            self.last_decision = {"action": "keep", "reason": str(err),
                                  "latency_ms": (time.perf_counter() - start) * 1e3}
            return boundaries
        mask = self.encoder.action_mask(boundaries)
        action = self.policy.act(observation, mask, DecisionContext(self.encoder, boundaries))
        target = self.encoder.decode(int(action), boundaries) or boundaries  # type: ignore[arg-type]
        latency_ms = (time.perf_counter() - start) * 1e3
        name = self.encoder.layout.describe(int(action)) if target != boundaries or action == KEEP else "keep"  # type: ignore[arg-type]
        self.decisions[name.split(" ")[0]] += 1
        self.last_decision = {"action": name, "latency_ms": latency_ms}
        if self.policy.last_fallback:
            self.last_decision["fallback"] = self.policy.last_fallback
        return target
