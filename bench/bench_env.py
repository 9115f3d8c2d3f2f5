"""Environment speed (steps per second, S = 8, one process) and policy decision latency."""

from __future__ import annotations

import time

import numpy as np

from rlpipe.agents import DecisionContext, make_policy
from rlpipe.envs import RepartitionEnv


def env_steps_per_s(seconds: float = 3.0) -> float:
    env = RepartitionEnv(min_stages=8, max_stages=8)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    env.step(1)  # compile the JIT kernels outside the timing
    steps, episode, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.reset(seed=episode)
        episode += 1
        done = False
        while not done:
            mask = env.action_masks()
            action = 0 if rng.random() < 0.9 else int(rng.choice(np.flatnonzero(mask)))
            _, _, terminated, truncated, _ = env.step(action)
            steps += 1
            done = terminated or truncated
    return steps / (time.perf_counter() - start)


def decision_latency_ms(policy_name: str, decisions: int = 2000) -> float:
    """Median time of encoder.observe + policy.act, as the live controller pays it."""
    env = RepartitionEnv(min_stages=8, max_stages=8)
    policy = make_policy(policy_name)
    env.reset(seed=1)
    timings = []
    while len(timings) < decisions:
        env.reset(seed=len(timings))
        done = False
        while not done and len(timings) < decisions:
            stats = env.encoder.latest
            start = time.perf_counter()
            observation = env.encoder.observe(stats)
            action = policy.act(observation, env.encoder.action_mask(env.boundaries),
                                DecisionContext(env.encoder, env.boundaries))
            timings.append(time.perf_counter() - start)
            _, _, terminated, truncated, _ = env.step(int(action))
            done = terminated or truncated
    return float(np.median(timings) * 1e3)


def run() -> dict:
    figures = {"env_steps_per_s_S8": env_steps_per_s(), "env_target_steps_per_s": 5000}
    for name in ["static", "greedy", "dynpipe", "ppo"]:
        figures[f"decision_latency_ms_{name}"] = decision_latency_ms(name)
    return figures
