"""The one observation encoder, action layout and action mask, shared by simulator and live runtime.

Observation (version 2), a float32 vector for up to ``s_max`` stages, scale-free in the pipeline's
speed and in the decision interval K: times are ratios, and durations count iterations in units of
``ITERATIONS_UNIT`` (10), so a policy trained at one K runs at another.

- per stage slot (``STAGE_FEATURES + history - 1`` values; zeros for padded slots):
  present (1/0), share of the model's layers, compute per micro-batch over the interference-free
  optimal stage time, estimated slowdown - 1 (recent loads averaged back to the last change), idle
  share of the iteration, communication share, how long the device has been loaded (log-scaled),
  measured device load - 1 in each earlier interval;
- per boundary (``s_max - 1`` x 3): the bottleneck after shifting it by -1 / +1 layer over the
  current bottleneck, minus 1 (0 where invalid), under the estimated device and link speeds; and the
  link's estimated slowdown - 1 (a link is estimated from the communication wait of the two stages it
  joins: each receives over it once per micro-batch);
- global: time since the last repartition (log-scaled), what the best re-plan would gain (predicted
  iteration time now / after - 1) and cost (its stall), throughput over the interference-free
  optimum, stages / s_max, the last interval's stall, a one-layer move's stall, the timer noise
  measured so far (stalls in units of ``ITERATIONS_UNIT`` iterations at the current speed), and the
  ski-rental count (:class:`LostTime`): time lost to the current imbalance over the re-plan's stall,
  and how long the imbalance has held (log-scaled).

Actions (Discrete): 0 keep; 1 re-plan to the partition optimal for the estimated device speeds;
``2 + 2 (i - 1)`` shift boundary i by -1 (stage i gets stage i-1's last layer), ``3 + 2 (i - 1)``
shift it by +1 (stage i-1 gets stage i's first layer), for i = 1..s_max-1.

The arithmetic of one observation runs in one compiled kernel (:func:`_encode`): the environment
calls it every step of training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from rlpipe.partition import bottleneck_dp, link_transfer_ms, stage_edges
from rlpipe.planning import MAX_SLOWDOWN_ESTIMATE, Planner, StatsError, move_bottlenecks_kernel
from rlpipe.simulator import operation_graph, simulate_kernel
from rlpipe.stats import IntervalStats

OBSERVATION_VERSION = 2
DEFAULT_S_MAX = 8  # stage slots of the shipped policy's observation
DEFAULT_HISTORY = 4  # intervals of device load it carries, the current one included
OBSERVATION_CLIP = 10.0  # every feature lies in [-OBSERVATION_CLIP, OBSERVATION_CLIP]
STAGE_FEATURES = 7
BOUNDARY_FEATURES = 3
GLOBAL_FEATURES = 10
CONGESTED_LINK = 1.2  # a link counts as slowed when its estimated transfer takes this much longer
ITERATIONS_UNIT = 10.0  # durations and stalls are counted in this many iterations
ELEVATED_LOAD = 1.1  # a device counts as disturbed above this load
CHANGE_TOLERANCE = 0.1  # loads within 10% of the newest count as the same conditions
LOG_SPAN = math.log1p(100.0)  # log-scaled durations reach 1.0 at 100 units
NOISE_MEMORY = 0.05  # the timer-noise estimate is a running mean with this weight on each interval
MEDIAN_ABS_DIFF_TO_SIGMA = 1 / (0.6745 * math.sqrt(2))  # sigma from the median |log l1 - log l0| of two readings
KEEP, REPLAN = 0, 1


@dataclass
class LostTime:
    """The ski-rental count (Greyhound, USENIX ATC'25): how much time the current imbalance has cost.

    Each interval whose re-plan gain (predicted iteration time now over after, minus 1) exceeds
    ``max(min_gain, noise_multiple x the timer noise)`` adds its wall time x the share the re-plan would
    save; an interval below that starts the count again. The threshold policy re-plans once the count
    reaches the re-plan's stall; the observation carries it.

    Args:
        min_gain: the smallest gain that counts (0.03: 3%).
        noise_multiple: the gain must also exceed this many times the measured timer noise (sigma).
    """

    min_gain: float = 0.03
    noise_multiple: float = 3.0
    lost_s: float = 0.0
    held_intervals: int = 0
    held_iterations: int = 0

    def reset(self) -> None:
        self.lost_s, self.held_intervals, self.held_iterations = 0.0, 0, 0

    def update(self, now_ms: float, after_ms: float, noise_level: float, stats: IntervalStats,
               replannable: bool) -> None:
        """Count one interval, given the re-plan's predicted iteration times (ms) now and after it."""
        gain = now_ms / after_ms - 1.0 if after_ms > 0 else 0.0
        if not replannable or gain <= max(self.min_gain, self.noise_multiple * noise_level):
            self.reset()
            return
        self.lost_s += (stats.wall_s - stats.stall_s) * (1.0 - after_ms / now_ms)
        self.held_intervals += 1
        self.held_iterations += stats.iterations


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
        costs = planner.costs
        self._one_layer_stall_s = planner.migration.overhead_s + float(
            link_transfer_ms(costs.state_bytes.mean(), planner.migration.bandwidth_gbps)) / 1e3
        self._graph = operation_graph(planner.num_stages, planner.microbatches, planner.schedule)
        self._prefix_fwd = np.concatenate([[0.0], np.cumsum(planner.profile.fwd_ms())])
        self._prefix_bwd = np.concatenate([[0.0], np.cumsum(planner.profile.bwd_ms())])
        self._link_ms_after = np.asarray(link_transfer_ms(costs.activation_bytes, planner.bandwidth_gbps),
                                         dtype=np.float64)  # one-way, if a stage ends after the layer
        self._memory_cap = np.inf if planner.memory_cap_bytes is None else float(planner.memory_cap_bytes)
        self.reset()

    @staticmethod
    def size_for(s_max: int, history: int) -> int:
        """Length of the observation vector."""
        return s_max * (STAGE_FEATURES + history - 1) + BOUNDARY_FEATURES * (s_max - 1) + GLOBAL_FEATURES

    def reset(self) -> None:
        num_stages = self.planner.num_stages
        self._loads = np.ones((self.history, num_stages))  # newest first
        self._state = np.zeros(3)  # intervals recorded, iterations since repartition, timer-noise estimate
        self.elevated_iterations = np.zeros(num_stages)
        self.latest: IntervalStats | None = None
        self.slowdown_estimate = np.ones(num_stages)
        self.link_estimate = np.ones(max(num_stages - 1, 1))  # each link's bandwidth over its nominal
        self.replan_boundaries: tuple[int, ...] = self.planner.ideal_boundaries
        self.replan_figures = np.zeros(3)  # predicted iteration ms now and after the re-plan, its stall s
        self.lost_time = LostTime()
        self._mask_cache: tuple | None = None

    @property
    def loads(self) -> np.ndarray:
        """The measured device loads of the recorded intervals, newest first, one row each."""
        return self._loads[:int(min(self._state[0], self.history))]

    @property
    def intervals_since_repartition(self) -> float:
        """Time since the last repartition, in decision intervals of the latest length."""
        latest_iterations = self.latest.iterations if self.latest is not None else 1
        return self._state[1] / max(latest_iterations, 1)

    @property
    def noise_level(self) -> float:
        """The timer noise measured so far (lognormal sigma of one interval's loads)."""
        return float(self._state[2])

    def observe(self, stats: IntervalStats) -> np.ndarray:
        """Record one interval and return its observation. Raises :class:`StatsError` on bad statistics."""
        planner, num_stages = self.planner, self.planner.num_stages
        if stats.num_stages != num_stages:
            raise StatsError(f"statistics for {stats.num_stages} stages, the pipeline has {num_stages}")
        load = stats.device_load
        if not (load.min() > 0 and np.isfinite(load.max())):  # also catches NaN: comparisons are False
            raise StatsError(f"non-finite or non-positive device load {load.tolist()}")
        total = stats.compute_ms.sum() + stats.comm_ms.sum() + stats.idle_ms.sum() + stats.num_layers.sum()
        if not math.isfinite(total):  # a NaN or an infinity anywhere makes the sum non-finite
            raise StatsError("non-finite stage times")
        if not (math.isfinite(stats.wall_s) and stats.wall_s > 0 and math.isfinite(stats.stall_s)):
            raise StatsError("non-finite interval wall time")
        self.latest = stats
        observation = np.zeros(self.size)
        replan = np.empty(num_stages, dtype=np.int64)
        current = np.asarray(stats.boundaries, dtype=np.int64)
        self.slowdown_estimate = _encode(  # type: ignore[call-arg]
            observation, replan, self.link_estimate, self.replan_figures, self._loads, self._state,
            self.elevated_iterations,
            load, stats.compute_ms, stats.comm_ms, stats.idle_ms, stats.num_layers,
            max(stats.iteration_ms, 1e-9), float(stats.iterations), float(stats.stall_s), current,
            float(planner.microbatches),
            self.s_max, self.history, planner.num_layers, planner.ideal_stage_ms, planner.ideal_iteration_ms,
            planner.layer_compute_ms, planner.prefix_compute_ms, planner.roundtrip_ms, planner.roundtrip_by_stage,
            planner.costs.state_bytes, planner.costs.activation_bytes, planner.inflight.astype(np.float64),
            self._memory_cap, *self._graph, self._prefix_fwd, self._prefix_bwd, self._link_ms_after,
            planner.migration.overhead_s, planner.migration.bandwidth_gbps, self._one_layer_stall_s)
        if replan[0] < 0:
            raise StatsError(f"no partition into {num_stages} stages fits the memory cap")
        self.replan_boundaries = tuple(replan.tolist())
        now_ms, after_ms, stall_s = self.replan_figures
        self.lost_time.update(now_ms, after_ms, self.noise_level, stats, self.replan_boundaries != stats.boundaries)
        observation[-2] = self.lost_time.lost_s / max(stall_s, 1e-9) if self.lost_time.lost_s else 0.0
        observation[-1] = math.log1p(self.lost_time.held_iterations / ITERATIONS_UNIT) / LOG_SPAN
        return np.minimum(np.maximum(observation, -OBSERVATION_CLIP), OBSERVATION_CLIP).astype(np.float32)

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


# --- the compiled kernel --------------------------------------------------------------------------

@njit(cache=True)
def _stage_times(prefix, roundtrip, boundaries, slowdown, num_layers, link_factor):  # pragma: no cover
    """Each stage's time per micro-batch under the partitioner's cost model, ms."""
    num_stages = boundaries.shape[0]
    times = np.empty(num_stages)
    for s in range(num_stages):
        end = boundaries[s + 1] if s + 1 < num_stages else num_layers
        times[s] = (prefix[end] - prefix[boundaries[s]]) * slowdown[s]
        if s + 1 < num_stages:
            times[s] += roundtrip[end - 1] / link_factor[s]
    return times


@njit(cache=True)
def _estimate_links(link_estimate, comm_ms, current, link_ms_after, microbatches):  # pragma: no cover
    """Each link's bandwidth over its nominal, from the communication wait of the two stages it joins:
    waiting on every transfer, stage s waits one transfer over each of its links per micro-batch, so
    the smaller wait of a link's two stages bounds its transfer time (1: not seen slowed)."""
    for link in range(current.shape[0] - 1):
        nominal_ms = link_ms_after[current[link + 1] - 1]
        observed_ms = min(comm_ms[link], comm_ms[link + 1]) / microbatches
        link_estimate[link] = 1.0
        if nominal_ms > 0 and observed_ms > CONGESTED_LINK * nominal_ms:
            link_estimate[link] = nominal_ms / observed_ms


@njit(cache=True)
def _predict_ms(op_stage, op_backward, op_producer, op_link, op_microbatch, prefix_fwd, prefix_bwd, link_ms_after,
                boundaries, slowdown, num_layers, link_factor):  # pragma: no cover
    """The simulated iteration time of ``boundaries`` under ``slowdown`` and ``link_factor``, ms."""
    num_stages = boundaries.shape[0]
    fwd, bwd = np.empty(num_stages), np.empty(num_stages)
    links = np.zeros(max(num_stages - 1, 1))
    for s in range(num_stages):
        end = boundaries[s + 1] if s + 1 < num_stages else num_layers
        fwd[s] = (prefix_fwd[end] - prefix_fwd[boundaries[s]]) * slowdown[s]
        bwd[s] = (prefix_bwd[end] - prefix_bwd[boundaries[s]]) * slowdown[s]
        if s + 1 < num_stages:
            links[s] = link_ms_after[end - 1] / link_factor[s]
    ones = np.ones(op_microbatch.max() + 1)
    return simulate_kernel(op_stage, op_backward, op_producer, op_link, op_microbatch, fwd, bwd, links, 0.0, ones)[0]


@njit(cache=True)
def _stall_s(state_bytes, old, new, num_layers, overhead_s, bandwidth_gbps):  # pragma: no cover
    """Seconds a repartition from ``old`` to ``new`` stops training (0 when they are equal)."""
    moved, stage_old, stage_new = 0.0, 0, 0
    for layer in range(num_layers):
        while stage_old + 1 < old.shape[0] and old[stage_old + 1] <= layer:
            stage_old += 1
        while stage_new + 1 < new.shape[0] and new[stage_new + 1] <= layer:
            stage_new += 1
        if stage_old != stage_new:
            moved += state_bytes[layer]
    if moved == 0.0:
        return 0.0
    return overhead_s + moved * 8e-6 / bandwidth_gbps / 1e3


@njit(cache=True)
def _record_loads(loads, state, elevated, load, iterations, stall_s, history):  # pragma: no cover
    """Shift one interval's loads into the history and update the timer-noise estimate, the time since
    the last repartition and how long each device has been loaded; returns the slowdown estimate:
    each device's loads averaged back to the last change."""
    num_stages = load.shape[0]
    clipped = np.minimum(np.maximum(load, 1.0 / MAX_SLOWDOWN_ESTIMATE), MAX_SLOWDOWN_ESTIMATE)
    for row in range(history - 1, 0, -1):  # newest first
        loads[row] = loads[row - 1]
    loads[0] = clipped
    state[0] += 1.0
    recorded = int(min(state[0], history))
    if recorded > 1:  # timer noise: the median change of a stage's log load (a real change moves few stages)
        sample = np.median(np.abs(np.log(clipped / loads[1]))) * MEDIAN_ABS_DIFF_TO_SIGMA
        weight = max(1.0 / (state[0] - 1.0), NOISE_MEMORY)  # a plain mean at first, then a running one
        state[2] += weight * (sample - state[2])
    slowdown = np.empty(num_stages)
    for s in range(num_stages):
        total, count = 0.0, 0
        for row in range(recorded):
            if abs(loads[row, s] - clipped[s]) > CHANGE_TOLERANCE * clipped[s]:
                break
            total += loads[row, s]
            count += 1
        slowdown[s] = total / count
        elevated[s] = elevated[s] + iterations if slowdown[s] > ELEVATED_LOAD else 0.0
    state[1] = 0.0 if stall_s > 0 else state[1] + iterations
    return slowdown


@njit(cache=True)
def _replan_target(replan, current, slowdown, link_factor, num_layers, compute, prefix, roundtrip, roundtrip_by_stage,
                   state_bytes, activation_bytes, inflight, memory_cap):  # pragma: no cover
    """Fill ``replan`` with the bottleneck-optimal partition for ``slowdown``, or the current one if it
    is as good (``replan[0] = -1``: none fits); returns (whether it moves, the current bottleneck ms)."""
    num_stages = current.shape[0]
    by_stage = roundtrip_by_stage.copy()
    for s in range(num_stages - 1):
        by_stage[s] /= link_factor[s]
    found, _, feasible = bottleneck_dp(compute, by_stage, state_bytes, activation_bytes, 1.0 / slowdown,
                                       memory_cap, inflight)
    current_worst = _stage_times(prefix, roundtrip, current, slowdown, num_layers, link_factor).max()
    if not feasible:
        replan[0] = -1
        return False, current_worst
    moved = False
    for s in range(num_stages):
        moved = moved or found[s] != current[s]
    found_worst = _stage_times(prefix, roundtrip, found, slowdown, num_layers, link_factor).max()
    moved = moved and current_worst > found_worst * (1 + 1e-9)
    replan[:] = found if moved else current
    return moved, current_worst


@njit(cache=True)
def _encode(observation, replan, link_estimate, figures, loads, state, elevated, load, compute_ms, comm_ms, idle_ms,
            num_layers_held, iteration_ms, iterations, stall_s, current, microbatches, s_max, history, num_layers,
            ideal_stage_ms,
            ideal_iteration_ms, compute, prefix, roundtrip, roundtrip_by_stage, state_bytes, activation_bytes,
            inflight, memory_cap, op_stage, op_backward, op_producer, op_link, op_microbatch, prefix_fwd, prefix_bwd,
            link_ms_after, overhead_s, bandwidth_gbps, one_layer_stall_s):  # pragma: no cover
    """Record one interval in the encoder's state and fill ``observation``, ``replan`` (the re-plan
    target; ``replan[0] = -1`` if none fits), ``link_estimate`` and ``figures`` (predicted iteration
    ms now and after the re-plan, its stall s). Returns the slowdown estimate."""
    num_stages = current.shape[0]
    slowdown = _record_loads(loads, state, elevated, load, iterations, stall_s, history)
    _estimate_links(link_estimate, comm_ms, current, link_ms_after, microbatches)
    moved, current_worst = _replan_target(replan, current, slowdown, link_estimate, num_layers, compute, prefix,
                                          roundtrip, roundtrip_by_stage, state_bytes, activation_bytes, inflight,
                                          memory_cap)
    if replan[0] < 0:
        return slowdown
    recorded = int(min(state[0], history))
    width = STAGE_FEATURES + history - 1
    for s in range(num_stages):
        base = s * width
        observation[base] = 1.0
        observation[base + 1] = num_layers_held[s] / num_layers
        observation[base + 2] = compute_ms[s] / ideal_stage_ms
        observation[base + 3] = slowdown[s] - 1.0
        observation[base + 4] = idle_ms[s] / iteration_ms
        observation[base + 5] = comm_ms[s] / iteration_ms
        observation[base + 6] = math.log1p(elevated[s] / ITERATIONS_UNIT) / LOG_SPAN
        for row in range(1, recorded):
            observation[base + STAGE_FEATURES + row - 1] = loads[row, s] - 1.0
    moves = move_bottlenecks_kernel(prefix, roundtrip, current, slowdown, num_layers, link_estimate)
    base = s_max * width
    for b in range(num_stages - 1):
        for k in range(2):
            value = moves[b, k] / current_worst - 1.0
            observation[base + BOUNDARY_FEATURES * b + k] = 0.0 if np.isnan(value) else value
        observation[base + BOUNDARY_FEATURES * b + 2] = 1.0 / link_estimate[b] - 1.0

    unit_s = ITERATIONS_UNIT * iteration_ms / 1e3  # the duration unit's length now, s
    predicted_now = _predict_ms(op_stage, op_backward, op_producer, op_link, op_microbatch, prefix_fwd, prefix_bwd,
                                link_ms_after, current, slowdown, num_layers, link_estimate)
    predicted_replan, replan_stall_s = predicted_now, 0.0
    if moved:
        predicted_replan = _predict_ms(op_stage, op_backward, op_producer, op_link, op_microbatch, prefix_fwd,
                                       prefix_bwd, link_ms_after, replan, slowdown, num_layers, link_estimate)
        replan_stall_s = _stall_s(state_bytes, current, replan, num_layers, overhead_s, bandwidth_gbps)
    figures[0], figures[1], figures[2] = predicted_now, predicted_replan, replan_stall_s
    g = observation.shape[0] - GLOBAL_FEATURES
    observation[g] = math.log1p(state[1] / ITERATIONS_UNIT) / LOG_SPAN
    observation[g + 1] = predicted_now / predicted_replan - 1.0
    observation[g + 2] = replan_stall_s / unit_s
    observation[g + 3] = ideal_iteration_ms / iteration_ms
    observation[g + 4] = num_stages / s_max
    observation[g + 5] = stall_s / unit_s
    observation[g + 6] = one_layer_stall_s / unit_s
    observation[g + 7] = state[2]
    return slowdown
