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
from rlpipe.observation import DEFAULT_D_MAX, DEFAULT_HISTORY, DEFAULT_S_MAX, KEEP, ObservationEncoder
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
    """Decides repartitions and micro-batch splits for a live job.

    The observation is laid out as the policy was trained (the artifact's ``s_max``, history and
    ``d_max``); a policy without an artifact gets the defaults.

    Args:
        policy_spec: ``static``, ``greedy``, ``dynpipe``, ``threshold``, ``falcon``, ``falcon-early``, ``ppo`` or
            ``ppo:PATH``.
        profile: the per-layer profile the run started from.
        num_stages, schedule, microbatches: the pipeline (M micro-batches per replica at the even split).
        migration: the stall model (fixed overhead and the measured point-to-point bandwidth).
        fallback: the heuristic that decides for ``ppo`` when its actor cannot.
        replicas: the job's data-parallel replicas (D).
    """

    def __init__(self, policy_spec: str, profile: LayerProfile, num_stages: int, schedule: str, microbatches: int,
                 migration: MigrationCost, fallback: str = "dynpipe", replicas: int = 1):
        self.policy = make_policy(policy_spec, live=True, fallback=fallback)
        s_max, history, d_max = self.policy.observation_layout or (DEFAULT_S_MAX, DEFAULT_HISTORY, DEFAULT_D_MAX)
        planner = Planner(profile, num_stages, schedule, microbatches, migration=migration, replicas=replicas)
        self.encoder = ObservationEncoder(planner, max(s_max, num_stages), history, max(d_max, replicas))
        self.decisions: Counter[str] = Counter()
        self.last_decision: dict[str, Any] = {}

    @property
    def fallbacks(self) -> dict[str, int]:
        """Decisions the policy handed to its fallback, by reason."""
        return dict(self.policy.fallbacks)

    def decide(self, stats: IntervalStats) -> Decision:
        """The partition and the micro-batch split for the next interval; what to log about the decision
        is ``last_decision``."""
        start = time.perf_counter()
        boundaries = tuple(stats.boundaries)
        split = tuple(stats.split) if stats.split is not None else self.encoder.planner.even
        try:
            observation = self.encoder.observe(stats)
        except StatsError as err:  # unusable statistics: hold the partition and split, and say why
            log.warning("statistics unusable (%s): keeping the partition", err)
            self.decisions["unusable statistics"] += 1
            self.last_decision = {"action": "keep", "reason": str(err),
                                  "latency_ms": (time.perf_counter() - start) * 1e3}
            return Decision(boundaries, split)
        mask = self.encoder.action_mask(boundaries, split)
        action = int(self.policy.act(observation, mask, DecisionContext(self.encoder, boundaries, split=split)))  # type: ignore[arg-type]
        target = self.encoder.decode(action, boundaries, split) or (boundaries, split)
        latency_ms = (time.perf_counter() - start) * 1e3
        name = self.encoder.layout.describe(action) if target != (boundaries, split) or action == KEEP else "keep"
        self.decisions[name.split(" ")[0]] += 1
        self.last_decision = {"action": name, "latency_ms": latency_ms}
        if self.policy.last_fallback:
            self.last_decision["fallback"] = self.policy.last_fallback
        return Decision(*target)
