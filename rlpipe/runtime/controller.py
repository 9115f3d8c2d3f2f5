"""The controller on rank 0: every interval, statistics -> the shared observation encoder -> a policy
-> the partition to run next. The same encoder and action decoder as the simulator."""

from __future__ import annotations

import logging
import time
from collections import Counter

from rlpipe.agents import DecisionContext, make_policy
from rlpipe.observation import KEEP, ObservationEncoder
from rlpipe.planning import Planner, StatsError
from rlpipe.profile import LayerProfile
from rlpipe.simulator import MigrationCost
from rlpipe.stats import IntervalStats

log = logging.getLogger("rlpipe.controller")


class Controller:
    """Decides repartitions for a live pipeline.

    Args:
        policy_spec: ``static``, ``greedy``, ``dynpipe``, ``ppo`` or ``ppo:PATH``.
        profile: the per-layer profile the run started from.
        num_stages, schedule, microbatches: the pipeline.
        migration: the stall model (fixed overhead and the measured point-to-point bandwidth).
    """

    def __init__(self, policy_spec: str, profile: LayerProfile, num_stages: int, schedule: str, microbatches: int,
                 migration: MigrationCost, s_max: int = 8):
        self.policy = make_policy(policy_spec, strict=False)
        if self.policy.name == "oracle":
            raise ValueError("the oracle needs the future: it runs in simulation only")
        planner = Planner(profile, num_stages, schedule, microbatches, migration=migration)
        self.encoder = ObservationEncoder(planner, max(s_max, num_stages), history=4)
        self.decisions: Counter[str] = Counter()
        self.last_info: dict = {}

    def decide(self, stats: IntervalStats) -> tuple[tuple[int, ...], dict]:
        """The partition for the next interval and what to log about the decision."""
        start = time.perf_counter()
        boundaries = tuple(stats.boundaries)
        try:
            observation = self.encoder.observe(stats)
        except StatsError as err:  # unusable statistics: hold the partition, and say why
            log.warning("statistics unusable (%s): keeping the partition", err)
            self.decisions["unusable statistics"] += 1
            return boundaries, {"action": "keep", "reason": str(err), "latency_ms": (time.perf_counter() - start) * 1e3}
        mask = self.encoder.action_mask(boundaries)
        action = self.policy.act(observation, mask, DecisionContext(self.encoder, boundaries))
        target = self.encoder.decode(int(action), boundaries) or boundaries
        latency_ms = (time.perf_counter() - start) * 1e3
        name = self.encoder.layout.describe(int(action)) if target != boundaries or action == KEEP else "keep"
        self.decisions[name.split(" ")[0]] += 1
        info = {"action": name, "latency_ms": latency_ms}
        fallback = getattr(self.policy, "last_reason", None)
        if fallback:
            info["fallback"] = fallback
        return target, info
