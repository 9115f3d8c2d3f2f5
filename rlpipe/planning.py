"""The pipeline model a decision-maker reasons with: stage times under estimated device slowdowns,
predicted iteration times, the best partition to re-plan to, the price of a migration.

It knows only what a live controller knows (the profile, the schedule, the measured StageStats),
never the simulator's true conditions, so the environment and the live runtime share it unchanged.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from rlpipe.partition import Partition, bottleneck_dp, inflight_microbatches, link_transfer_ms, stage_edges
from rlpipe.profile import LayerProfile
from rlpipe.simulator import MigrationCost, PipelineCosts
from rlpipe.split import balanced_split, even_split, minimum_per_replica

MAX_SLOWDOWN_ESTIMATE = 20.0


class StatsError(ValueError):
    """Statistics that cannot be trusted (missing, non-finite, wrong stage count)."""


class Planner:
    """Plans for one job: a profile on ``replicas`` x ``num_stages`` devices under a schedule.

    Args:
        profile: per-layer costs.
        num_stages: pipeline stages (devices per replica).
        schedule: ``"1f1b"`` or ``"gpipe"``.
        microbatches: micro-batches per replica per iteration at the even split (M).
        bandwidth_gbps: link bandwidth between stages and between replicas, Gbit/s (``inf``: free).
        migration: the cost model of moving layers.
        memory_cap_bytes: per-stage memory cap, bytes (``None``: uncapped).
        replicas: data-parallel replicas of the pipeline (D).
    """

    def __init__(self, profile: LayerProfile, num_stages: int, schedule: str = "1f1b", microbatches: int = 8,
                 bandwidth_gbps: float = math.inf, migration: MigrationCost | None = None,
                 memory_cap_bytes: float | None = None, replicas: int = 1):
        self.profile = profile
        self.costs = PipelineCosts(profile)
        self.num_layers = profile.num_layers
        self.num_stages = num_stages
        self.schedule = schedule
        self.microbatches = microbatches
        self.replicas = replicas
        self.minimum = minimum_per_replica(schedule, num_stages)
        self.even = even_split(replicas, microbatches)
        self.bandwidth_gbps = bandwidth_gbps
        self.migration = migration or MigrationCost()
        self.memory_cap_bytes = memory_cap_bytes
        self.layer_compute_ms = profile.compute_ms()
        self.prefix_compute_ms = np.concatenate([[0.0], np.cumsum(self.layer_compute_ms)])
        self.roundtrip_ms = 2 * np.asarray(link_transfer_ms(profile.activation_bytes(), bandwidth_gbps))
        self.inflight = inflight_microbatches(num_stages, microbatches, schedule)
        self.inflight_float = self.inflight.astype(np.float64)  # as the compiled partitioner takes it
        self._plan_cache: dict[bytes, tuple[int, ...]] = {}  # keyed by the rounded slowdowns' bytes
        self._stall_cache: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
        self.roundtrip_by_stage = np.tile(self.roundtrip_ms, (max(num_stages - 1, 1), 1))
        self._memory_cap = np.inf if memory_cap_bytes is None else float(memory_cap_bytes)
        self.ideal_boundaries = self.plan(np.ones(num_stages))
        self.ideal_iteration_ms = self.predict_iteration_ms(self.ideal_boundaries, np.ones(num_stages))
        self.ideal_stage_ms = float(self.stage_ms(self.ideal_boundaries, np.ones(num_stages)).max())

    @staticmethod
    def clip_load(load: np.ndarray) -> np.ndarray:
        """Validated device loads as slowdown estimates."""
        if not (load.min() > 0 and np.isfinite(load.max())):  # also catches NaN: comparisons are False
            raise StatsError(f"non-finite or non-positive device load {load.tolist()}")
        return np.minimum(np.maximum(load, 1.0 / MAX_SLOWDOWN_ESTIMATE), MAX_SLOWDOWN_ESTIMATE)

    def plan(self, slowdown: np.ndarray, current: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The partition minimising the bottleneck for ``slowdown``; ``current`` when it is as good."""
        # Estimates are rounded to 0.1% so that repeated conditions reuse a plan.
        rounded = np.asarray(slowdown, dtype=np.float64).round(3)
        key = rounded.tobytes()
        boundaries = self._plan_cache.get(key)
        if boundaries is None:
            if len(self._plan_cache) > 4096:
                self._plan_cache.clear()
            boundaries = self._plan_cache[key] = self._optimal(rounded)
        if current is not None and tuple(current) != boundaries:
            if self.stage_ms(current, slowdown).max() <= self.stage_ms(boundaries, slowdown).max() * (1 + 1e-9):
                return tuple(current)
        return boundaries

    def _optimal(self, slowdown: np.ndarray) -> tuple[int, ...]:
        boundaries, _, feasible = bottleneck_dp(self.layer_compute_ms, self.roundtrip_by_stage, self.costs.state_bytes,
                                                 self.costs.activation_bytes, 1.0 / slowdown, self._memory_cap,
                                                 self.inflight_float)
        if not feasible:
            raise StatsError(f"no partition into {self.num_stages} stages fits the memory cap")
        return tuple(boundaries.tolist())

    def stage_ms(self, boundaries: tuple[int, ...], slowdown: np.ndarray) -> np.ndarray:
        """Each stage's time per micro-batch (the partitioner's cost model), ms."""
        edges = stage_edges(boundaries, self.num_layers)
        times = np.diff(self.prefix_compute_ms[edges]) * slowdown
        times[:-1] += self.roundtrip_ms[edges[1:-1] - 1]
        return times

    def move_bottlenecks(self, boundaries: tuple[int, ...], slowdown: np.ndarray) -> np.ndarray:
        """Bottleneck stage time (ms) after shifting each boundary by -1 / +1: shape (stages - 1, 2);
        ``nan`` where the move would empty a stage."""
        return move_bottlenecks_kernel(self.prefix_compute_ms, self.roundtrip_ms,
                                       np.asarray(boundaries, dtype=np.int64), np.asarray(slowdown, dtype=np.float64),
                                       self.num_layers, np.ones(max(len(boundaries) - 1, 1)))

    def predict_iteration_ms(self, boundaries: tuple[int, ...], slowdown: np.ndarray) -> float:
        """Simulated iteration time of ``boundaries`` if devices run ``slowdown`` times slower, ms."""
        return self.costs.simulate(boundaries, self.schedule, self.microbatches, slowdown,
                                   self.bandwidth_gbps).iteration_ms

    def stall_s(self, old: tuple[int, ...], new: tuple[int, ...]) -> float:
        """Seconds a repartition from ``old`` to ``new`` stops training (cached: the environment and the
        observation ask for the same few pairs every interval)."""
        key = (tuple(old), tuple(new))
        found = self._stall_cache.get(key)
        if found is None:
            if len(self._stall_cache) > 4096:
                self._stall_cache.clear()
            found = self._stall_cache[key] = self.migration.stall_s(self.costs.state_bytes, old, new)
        return found

    def rebalance_stall_s(self, old: tuple[int, ...], new: tuple[int, ...], iteration_ms: float) -> float:
        """Seconds a new micro-batch split stops training: no state moves, but every stage is rebuilt and
        its first iteration infers shapes again, about one more iteration (of ``iteration_ms``)."""
        return 0.0 if tuple(old) == tuple(new) else iteration_ms / 1e3

    def change_stall_s(self, old: tuple[tuple[int, ...], tuple[int, ...]], new: tuple[tuple[int, ...], tuple[int, ...]],
                       iteration_ms: float) -> float:
        """Seconds going from one plan (partition, split) to another stops training: a repartition's stall
        covers the rebuild a new split needs too."""
        return max(self.stall_s(old[0], new[0]), self.rebalance_stall_s(old[1], new[1], iteration_ms))

    def predict_job_ms(self, boundaries: tuple[int, ...], split: tuple[int, ...], slowdown: np.ndarray,
                       links: np.ndarray | None = None) -> float:
        """Simulated iteration time of the job: ``boundaries`` in every replica, replica r running
        ``split[r]`` micro-batches on devices ``slowdown[r]`` times slower (shape (D, S)), with pipeline
        link factors ``links`` ((D, S - 1); ``None``: nominal), then the gradient sync, ms."""
        return self.costs.simulate_hybrid(boundaries, self.schedule, split, slowdown, self.bandwidth_gbps,
                                          links).iteration_ms

    def balanced_split(self, boundaries: tuple[int, ...], slowdown: np.ndarray,
                       links: np.ndarray | None = None) -> tuple[int, ...]:
        """The micro-batch split that best fits the replicas' estimated speeds: each replica's pipeline
        time taken as linear in its micro-batches (two simulated points), the slowest minimised."""
        if self.replicas == 1:
            return self.even
        low, high = self.minimum, max(self.microbatches, self.minimum + 1)
        points = np.array([[self.costs.simulate(boundaries, self.schedule, m, slowdown[r], self.bandwidth_gbps,
                                                None if links is None else links[r]).iteration_ms for m in (low, high)]
                           for r in range(self.replicas)])
        step = (points[:, 1] - points[:, 0]) / (high - low)
        return balanced_split(points[:, 0] - (low - 1) * step, step, self.replicas * self.microbatches,
                              self.minimum)

    def fits_memory(self, boundaries: tuple[int, ...]) -> bool:
        if self.memory_cap_bytes is None:
            return True
        firsts = np.asarray(boundaries)
        state = np.add.reduceat(self.costs.state_bytes, firsts)
        activation = np.add.reduceat(self.costs.activation_bytes, firsts)
        return bool(np.all(state + self.inflight * activation <= self.memory_cap_bytes))

    def partition(self, boundaries: tuple[int, ...]) -> Partition:
        return Partition(tuple(boundaries), self.num_layers)


@njit(cache=True)
def move_bottlenecks_kernel(prefix, roundtrip_ms, boundaries, slowdown, num_layers, link_factor):  # pragma: no cover
    """Compiled core of :meth:`Planner.move_bottlenecks`; ``link_factor[s]`` divides the bandwidth of the
    link after stage s (1: nominal)."""
    num_stages = boundaries.shape[0]
    edges = np.empty(num_stages + 1, dtype=np.int64)
    edges[:num_stages] = boundaries
    edges[num_stages] = num_layers
    base = np.empty(num_stages)
    for s in range(num_stages):
        base[s] = (prefix[edges[s + 1]] - prefix[edges[s]]) * slowdown[s]
        if s < num_stages - 1:
            base[s] += roundtrip_ms[edges[s + 1] - 1] / link_factor[s]
    result = np.full((max(num_stages - 1, 0), 2), np.nan)
    for boundary in range(1, num_stages):
        for k in range(2):
            new = edges[boundary] + (2 * k - 1)
            if new <= edges[boundary - 1] or new >= edges[boundary + 1]:
                continue
            before = ((prefix[new] - prefix[edges[boundary - 1]]) * slowdown[boundary - 1]
                      + roundtrip_ms[new - 1] / link_factor[boundary - 1])
            after = (prefix[edges[boundary + 1]] - prefix[new]) * slowdown[boundary]
            if boundary < num_stages - 1:
                after += roundtrip_ms[edges[boundary + 1] - 1] / link_factor[boundary]
            worst = max(before, after)
            for s in range(num_stages):
                if s != boundary - 1 and s != boundary and base[s] > worst:
                    worst = base[s]
            result[boundary - 1, k] = worst
    return result
