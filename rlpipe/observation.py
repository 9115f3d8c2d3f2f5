"""The one observation encoder, action layout and action mask, shared by simulator and live runtime.

Observation (version 1), a float32 vector for up to ``s_max`` stages, scale-free:

- per stage slot (``STAGE_FEATURES + history - 1`` values; zeros for padded slots):
  present (1/0), share of the model's layers, compute per micro-batch over the interference-free
  optimal stage time, estimated slowdown - 1 (recent loads averaged back to the last change), idle
  share of the iteration, communication share, how long the device has been loaded (log-scaled
  intervals), measured device load - 1 in each earlier interval;
- per boundary (``s_max - 1`` x 2): the bottleneck after shifting it by -1 / +1 layer over the
  current bottleneck, minus 1 (0 where invalid), under the estimated device speeds;
- global: intervals since the last repartition (log-scaled), what the best re-plan would gain
  (predicted iteration time now / after - 1) and cost (its stall in intervals), throughput over the
  interference-free optimum, stages / s_max, stall share of the last interval, one-layer move cost
  in intervals.

Actions (Discrete): 0 keep; 1 re-plan to the partition optimal for the estimated device speeds;
``2 + 2 (i - 1)`` shift boundary i by -1 (stage i gets stage i-1's last layer), ``3 + 2 (i - 1)``
shift it by +1 (stage i-1 gets stage i's first layer), for i = 1..s_max-1.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from rlpipe.partition import link_transfer_ms, stage_edges
from rlpipe.planning import Planner, StatsError
from rlpipe.stats import IntervalStats

OBSERVATION_VERSION = 1
DEFAULT_S_MAX = 8  # stage slots of the shipped policy's observation
DEFAULT_HISTORY = 4  # intervals of device load it carries, the current one included
OBSERVATION_CLIP = 10.0  # every feature lies in [-OBSERVATION_CLIP, OBSERVATION_CLIP]
STAGE_FEATURES = 7
GLOBAL_FEATURES = 7
ELEVATED_LOAD = 1.1  # a device counts as disturbed above this load
CHANGE_TOLERANCE = 0.1  # loads within 10% of the newest count as the same conditions (timer noise ~3%)
LOG_INTERVALS = math.log1p(100.0)
KEEP, REPLAN = 0, 1


@dataclass(frozen=True)
class ActionLayout:
    """Meaning of each discrete action for pipelines of up to ``s_max`` stages."""

    s_max: int

    @property
    def num_actions(self) -> int:
        return 2 + 2 * (self.s_max - 1)

    def move(self, action: int) -> tuple[int, int]:
        """``(boundary, delta)`` of a move action (``action >= 2``)."""
        return 1 + (action - 2) // 2, -1 if (action - 2) % 2 == 0 else +1

    def move_action(self, boundary: int, delta: int) -> int:
        return 2 + 2 * (boundary - 1) + (0 if delta < 0 else 1)

    def describe(self, action: int) -> str:
        if action == KEEP:
            return "keep"
        if action == REPLAN:
            return "replan"
        boundary, delta = self.move(action)
        return f"move boundary {boundary} {'+1' if delta > 0 else '-1'}"


class ObservationEncoder:
    """Turns each interval's statistics into an observation; masks and decodes actions.

    Args:
        planner: the pipeline model (profile, schedule, migration cost).
        s_max: the largest stage count the observation has room for.
        history: intervals of device load the observation carries (the current one included).
    """

    def __init__(self, planner: Planner, s_max: int = DEFAULT_S_MAX, history: int = DEFAULT_HISTORY):
        if planner.num_stages > s_max:
            raise StatsError(f"{planner.num_stages} stages do not fit an observation for at most {s_max}")
        self.planner = planner
        self.s_max = s_max
        self.history = history
        self.layout = ActionLayout(s_max)
        self.size = self.size_for(s_max, history)
        self._one_layer_stall_s = planner.migration.overhead_s + float(
            link_transfer_ms(planner.costs.state_bytes.mean(), planner.migration.bandwidth_gbps)) / 1e3
        self.reset()

    @staticmethod
    def size_for(s_max: int, history: int) -> int:
        """Length of the observation vector."""
        return s_max * (STAGE_FEATURES + history - 1) + 2 * (s_max - 1) + GLOBAL_FEATURES

    def reset(self) -> None:
        self.loads: deque[np.ndarray] = deque(maxlen=self.history)
        self.elevated_intervals = np.zeros(self.planner.num_stages)
        self.intervals_since_repartition = 0
        self.latest: IntervalStats | None = None
        self.slowdown_estimate = np.ones(self.planner.num_stages)
        self.replan_boundaries: tuple[int, ...] = self.planner.ideal_boundaries
        self._mask_cache: tuple | None = None

    def observe(self, stats: IntervalStats) -> np.ndarray:
        """Record one interval and return its observation. Raises :class:`StatsError` on bad statistics."""
        planner, num_stages = self.planner, self.planner.num_stages
        if len(stats.stages) != num_stages:
            raise StatsError(f"statistics for {len(stats.stages)} stages, the pipeline has {num_stages}")
        values = np.array([(s.compute_ms, s.comm_ms, s.idle_ms, s.num_layers, s.device_load) for s in stats.stages],
                          dtype=np.float64)
        load = planner.clip_load(values[:, 4])
        if not np.all(np.isfinite(values)) or not math.isfinite(stats.wall_s) or stats.wall_s <= 0:
            raise StatsError("non-finite stage times or interval wall time")
        self.latest = stats
        self.loads.appendleft(load)
        self.slowdown_estimate = slowdown = self._estimate(load)
        self.elevated_intervals = np.where(slowdown > ELEVATED_LOAD, self.elevated_intervals + 1, 0)
        self.intervals_since_repartition = 0 if stats.stall_s > 0 else self.intervals_since_repartition + 1
        current = tuple(stats.boundaries)
        self.replan_boundaries = planner.plan(slowdown, current)

        iteration_ms = max(stats.iteration_ms, 1e-9)
        observation = np.zeros(self.size)  # filled through views: per stage, per move, global
        stage_size = self.s_max * (STAGE_FEATURES + self.history - 1)
        stage = observation[:stage_size].reshape(self.s_max, STAGE_FEATURES + self.history - 1)
        moves = observation[stage_size:stage_size + 2 * (self.s_max - 1)].reshape(self.s_max - 1, 2)
        stage[:num_stages, 0] = 1.0
        stage[:num_stages, 1] = values[:, 3] / planner.num_layers
        stage[:num_stages, 2] = values[:, 0] / planner.ideal_stage_ms
        stage[:num_stages, 3] = slowdown - 1.0
        stage[:num_stages, 4] = values[:, 2] / iteration_ms
        stage[:num_stages, 5] = values[:, 1] / iteration_ms
        stage[:num_stages, 6] = np.log1p(self.elevated_intervals) / LOG_INTERVALS
        if len(self.loads) > 1:
            past = np.array(self.loads)[1:]  # earlier intervals, newest first
            stage[:num_stages, STAGE_FEATURES:STAGE_FEATURES + len(past)] = past.T - 1.0

        bottleneck = planner.stage_ms(current, slowdown).max()
        after_move = planner.move_bottlenecks(current, slowdown) / bottleneck - 1.0
        moves[:num_stages - 1] = np.where(np.isnan(after_move), 0.0, after_move)

        interval_s = stats.wall_s
        predicted_now = planner.predict_iteration_ms(current, slowdown)
        predicted_replan = (predicted_now if self.replan_boundaries == current
                            else planner.predict_iteration_ms(self.replan_boundaries, slowdown))
        replan_stall_s = planner.stall_s(current, self.replan_boundaries) if self.replan_boundaries != current else 0.0
        observation[-GLOBAL_FEATURES:] = (
            math.log1p(self.intervals_since_repartition) / LOG_INTERVALS,
            predicted_now / predicted_replan - 1.0,
            replan_stall_s / interval_s,
            planner.ideal_iteration_ms / iteration_ms,
            num_stages / self.s_max,
            stats.stall_s / interval_s,
            self._one_layer_stall_s / interval_s,
        )
        return np.minimum(np.maximum(observation, -OBSERVATION_CLIP), OBSERVATION_CLIP).astype(np.float32)

    def _estimate(self, load: np.ndarray) -> np.ndarray:
        """Each device's slowdown: the mean of its recent loads back to the last change (a load more
        than ``CHANGE_TOLERANCE`` away from the newest), so that timer noise averages out while a new
        slowdown shows at once."""
        history = np.array(self.loads)  # newest first
        since_change = np.cumprod(np.abs(history - load) <= CHANGE_TOLERANCE * load, axis=0)
        return (history * since_change).sum(axis=0) / since_change.sum(axis=0)

    def action_mask(self, boundaries: tuple[int, ...]) -> np.ndarray:
        """Valid actions: keep always; re-plan when it changes the partition; moves that keep every
        stage non-empty and within the memory cap, on boundaries the pipeline has."""
        key = (tuple(boundaries), self.replan_boundaries)
        if self._mask_cache is not None and self._mask_cache[0] == key:
            return self._mask_cache[1].copy()
        mask = self._compute_mask(boundaries)
        self._mask_cache = (key, mask)
        return mask.copy()

    def _compute_mask(self, boundaries: tuple[int, ...]) -> np.ndarray:
        mask = np.zeros(self.layout.num_actions, dtype=bool)
        mask[KEEP] = True
        mask[REPLAN] = tuple(self.replan_boundaries) != tuple(boundaries)
        edges = stage_edges(boundaries, self.planner.num_layers).tolist()
        for boundary in range(1, len(boundaries)):
            for delta in (-1, +1):
                moved = edges[boundary] + delta
                if edges[boundary - 1] < moved < edges[boundary + 1]:
                    fits = self.planner.memory_cap_bytes is None or self.planner.fits_memory(
                        tuple(edges[:boundary]) + (moved,) + tuple(edges[boundary + 1:-1]))
                    mask[self.layout.move_action(boundary, delta)] = fits
        return mask

    def decode(self, action: int, boundaries: tuple[int, ...]) -> tuple[int, ...] | None:
        """The partition an action asks for, or ``None`` if it is invalid here."""
        if not 0 <= action < self.layout.num_actions or not self.action_mask(boundaries)[action]:
            return None
        if action == KEEP:
            return tuple(boundaries)
        if action == REPLAN:
            return tuple(self.replan_boundaries)
        boundary, delta = self.layout.move(action)
        moved = list(boundaries)
        moved[boundary] += delta
        return tuple(moved)
