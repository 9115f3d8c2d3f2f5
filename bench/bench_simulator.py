"""Simulator and partitioner speed: evaluations per second in one process."""

from __future__ import annotations

import time

import numpy as np

from rlpipe.partition import Partition, optimal_boundaries
from rlpipe.profile import LayerCost, LayerProfile
from rlpipe.simulator import PipelineCosts


def _synthetic_profile(num_layers: int, seed: int = 0) -> LayerProfile:
    rng = np.random.default_rng(seed)
    forward_ms = rng.uniform(0.5, 2, num_layers)
    return LayerProfile("bench", 4, tuple(LayerCost(f"{i}", float(f), float(2 * f), 131072, 10**6, 2 * 10**6)
                                          for i, f in enumerate(forward_ms)))


def _rate(fn, min_seconds: float = 1.0) -> float:
    """Calls per second of ``fn``, timed over at least ``min_seconds``."""
    fn()  # warm-up (JIT compilation, caches)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_seconds:
        for _ in range(100):
            fn()
        calls += 100
    return calls / elapsed


def run() -> dict:
    profile = _synthetic_profile(64)
    costs = PipelineCosts(profile)
    boundaries = Partition.even(64, 8).boundaries
    rng = np.random.default_rng(1)
    slowdowns = 1.0 + rng.random((1000, 8))
    index = iter(range(10**9))

    def simulate_fresh_conditions():
        costs.simulate(boundaries, "1f1b", 32, slowdowns[next(index) % 1000], 10.0)

    big = _synthetic_profile(1000)
    start = time.perf_counter()
    optimal_boundaries(big.compute_ms(), big.activation_bytes(), big.state_bytes(), np.ones(16), np.full(15, np.inf))
    partition_1000x16_s = time.perf_counter() - start
    small = _synthetic_profile(32)
    return {
        "simulator_evals_per_s_S8_M32_L64": _rate(simulate_fresh_conditions),
        "simulator_target_per_s": 10_000,
        "partitioner_1000_layers_16_stages_s": partition_1000x16_s,
        "partitioner_calls_per_s_L32_S8": _rate(lambda: optimal_boundaries(
            small.compute_ms(), small.activation_bytes(), small.state_bytes(), np.ones(8), np.full(7, 10.0))),
    }
