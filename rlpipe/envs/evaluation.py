"""The episode loop: one policy through one seeded episode of the environment, as a result record; and the
bootstrap interval that episodes are compared by.

It sits next to the environment and below the agents (as stable-baselines3's
``common/evaluation.evaluate_policy`` does): anything with the :class:`~rlpipe.decision.Policy`
methods can be scored here, a heuristic, the deployed PPO actor or a model still in training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlpipe.decision import DecisionContext, Policy
from rlpipe.envs.repartition import RepartitionEnv

SECONDS_PER_HOUR = 3600.0
BOOTSTRAP_RESAMPLES = 2000


@dataclass
class EpisodeResult:
    """One policy on one episode.

    Attributes:
        efficiency: mean reward: throughput over the clairvoyant bound (1.0 = the bound).
        iterations_per_s: training iterations per simulated second, migration stalls included.
        repartitions_per_hour: repartitions per simulated hour.
        stall_s_per_hour: seconds of migration stall per simulated hour.
        rebalances_per_hour: new micro-batch splits per simulated hour.
        timeline: when recorded, the episode's profile, stages, replicas and schedule, the model's
            num_layers, and per interval: start_s and time_s (its start and end, simulated s), boundaries,
            split, slowdown (of every device, at its end), stage_compute_ms, efficiency.
    """

    efficiency: float
    iterations_per_s: float
    repartitions_per_hour: float
    stall_s_per_hour: float
    timeline: dict[str, Any] = field(default_factory=dict)
    rebalances_per_hour: float = 0.0


def run_episode(env: RepartitionEnv, policy: Policy, seed: int, scenario: str | None,
                record: bool = False) -> EpisodeResult:
    """Run ``policy`` for one episode of ``scenario`` seeded by ``seed`` (None: the scenario the environment
    draws from the seed, as in training)."""
    observation, info = env.reset(seed=seed, options={"scenario": scenario} if scenario else None)
    policy.reset()
    efficiencies: list[float] = []
    situation = env.situation
    timeline: dict[str, Any] = {"num_layers": env.planner.num_layers, "profile": situation.profile.name,
                                "stages": situation.num_stages, "replicas": situation.replicas,
                                "schedule": situation.schedule, "microbatches": situation.microbatches,
                                "start_s": [], "time_s": [], "boundaries": [], "split": [], "slowdown": [],
                                "stage_compute_ms": [], "efficiency": []}
    done = False
    while not done:
        start_s = env.time_s
        context = DecisionContext(env.encoder, env.boundaries, env.future(), env.split)
        decision = policy.act(observation, env.action_masks(), context)
        if isinstance(decision, tuple):
            observation, _, terminated, truncated, info = env.step_to(*decision)
        else:
            observation, _, terminated, truncated, info = env.step(int(decision))
        efficiencies.append(info["efficiency"])
        done = terminated or truncated
        if record:
            timeline["start_s"].append(start_s)
            timeline["time_s"].append(info["time_s"])
            timeline["boundaries"].append(list(info["boundaries"]))
            timeline["split"].append(list(info["split"]))
            timeline["slowdown"].append(info["slowdown"].tolist())
            latest = env.encoder.latest
            assert latest is not None  # every step observes an interval
            timeline["stage_compute_ms"].append([s.compute_ms for s in latest.stages])
            timeline["efficiency"].append(info["efficiency"])
    hours = env.time_s / SECONDS_PER_HOUR
    return EpisodeResult(float(np.mean(efficiencies)), env.iteration / env.time_s, env.repartitions / hours,
                         env.stall_total_s / hours, timeline if record else {}, env.rebalances / hours)


def bootstrap_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean (seeded, so a report is reproducible): it lies within
    the values' own range, so efficiencies' never pass the unreachable 1.0 (a normal interval around the
    mean of two episodes can)."""
    if len(values) < 2:
        return float(values.mean()), float(values.mean())
    rng = np.random.default_rng(0)
    means = values[rng.integers(len(values), size=(BOOTSTRAP_RESAMPLES, len(values)))].mean(axis=1)
    return float(np.quantile(means, (1 - level) / 2)), float(np.quantile(means, (1 + level) / 2))
