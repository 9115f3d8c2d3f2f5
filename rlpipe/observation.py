"""The one observation encoder, action layout and action mask, shared by simulator and live runtime.

Observation (version 11), a float32 vector for jobs of up to ``d_max`` replicas of up to ``s_max``
stages, scale-free in the pipeline's speed, in the decision interval K and in the replica count D:
times are ratios, and durations count iterations in units of ``ITERATIONS_UNIT`` (10), so a policy
trained at one K runs at another. A stage's figures are its stage group's most loaded member's (the
job waits for its slowest replica); the replica block keeps every device.

- per stage slot (``STAGE_FEATURES + history - 1`` values; zeros for padded slots): present (1/0),
  share of the model's layers, compute per micro-batch over the interference-free optimal stage time,
  estimated slowdown - 1 (recent loads averaged back to the last change), idle share of the iteration,
  communication share, how long the device has been loaded (log-scaled), the dispersion of its compute
  from one iteration to the next within the interval (noise shorter than an interval), measured load - 1
  in each earlier interval;
- per boundary (``s_max - 1`` x 4): the bottleneck after shifting it by -1 / +1 layer over the current
  bottleneck, minus 1 (0 where invalid), under the estimated device and link speeds; the link's
  estimated slowdown - 1 (from the communication wait of the two stages it joins); and how
  communication-bound it is (its estimated transfer over the compute of the slower stage it joins:
  above 1, moving layers cannot help);
- per replica slot (``d_max`` x ``REPLICA_FEATURES + s_max``): present, its micro-batches over the even
  split's minus 1, its slowest device's estimated slowdown - 1, its predicted pipeline time over the
  replicas' mean minus 1, and every device's estimated slowdown - 1;
- global: time since the last repartition (log-scaled), what the best layer re-plan would gain
  (predicted iteration time now / after - 1) and cost (its stall), throughput over the
  interference-free optimum, stages / s_max, the last interval's stall, a one-layer move's stall, the
  timer noise between intervals and the dispersion within them, the ski-rental count (:class:`LostTime`:
  time lost to the current imbalance over the re-plan's stall) and how long the imbalance has held
  (log-scaled), the slowdowns this run has seen end (how many, their median length, and of those that
  outlasted the current imbalance's age, the share that lasted twice as long: a hazard a policy can
  learn), what a rebalance of
  micro-batches would gain and cost and its own ski-rental count, what re-plan and rebalance together
  would gain and cost, replicas / d_max, the most communication-bound link, the gradient sync's
  share of the iteration, the ski-rental count of re-plan and rebalance together, and for each of the
  three counts the intervals in a row its gain has held (up to ``CONFIRMED_SPAN``). The rebalance's and
  the pair's counts start again whenever the partition or the split changes (FALCON's escalation restarts
  from the rebalanced job: version 4), and for each lever (re-plan, rebalance, both) its round-trip
  margin: what it would save over the imbalance's expected remaining life over ``ROUND_TRIP_STALLS`` of its
  stalls (:meth:`ObservationEncoder.round_trip_saving`; the rules' test passes at 1), in [0,
  ``ROUND_TRIP_SPAN``], and ``ROUND_TRIP_SPAN`` where the test does not apply (a move home to the launch
  plan, or too few slowdowns seen end to judge: version 5), and for each lever whether the rules' whole test
  passes (1/0: its count has reached its stall, its gain has held ``RULE_CONFIRM_INTERVALS`` intervals, the
  imbalance's survival is at least ``RULE_MIN_SURVIVAL`` and its round trip pays: version 6; a network fits
  that conjunction of thresholds only approximately from the figures, and moved a little early, where the
  rules would not, on noise that a fast job meets thousands of times an hour), and which action reaches the
  re-plan-and-rebalance plan (1: the re-plan, whose plan it is; -1: the rebalance; 0: its own action; a network
  cannot tell equal figures apart exactly: version 6), and for the two re-split levers (re-plan, both) whether
  ``falcon-early``'s test passes: the rules' whole test, or the same after one interval that already lost
  ``EARLY_RESPLIT_STALLS`` stalls (1/0: version 7), and the onset re-split (version 8): whether its test
  passes (1/0, :meth:`ObservationEncoder._onset`), its gain and its cost (0 where it does not); version 10:
  ``falcon-early``'s re-split of a replicated job passes its early test only where what it adds to the
  rebalance pays its round trip too (:attr:`ObservationEncoder.escalation_figures`), and whether its
  rebalance's test passes, which may fire after one interval that lost ``EARLY_REBALANCE_STALLS`` of its
  stalls (1/0; version 9 was an experiment, never shipped: ``docs/experiments/keen_resplit.py``); version 11:
  ``falcon-early``'s three early tests on its own counts, which take gains from ``OUTLIVED_MIN_GAIN`` while the
  plan in force has outlived the slowdown it was fitted to, and whether it has (1/0,
  :attr:`ObservationEncoder.plan_outlived`); version 12: ``falcon-early``'s re-split tests (re-plan, and both
  where its plan moves layers) also pass after one interval whose move would save ``EXPECTED_LIFE_STALLS`` of its
  stalls over the imbalance's expected remaining life, where the run's timers are steady
  (:attr:`ObservationEncoder.timers_steady`); the re-plan's target is the faster in simulation of two
  bottleneck optima (:func:`_replan_target`; on a replicated job, of one per stage more:
  :meth:`ObservationEncoder._levers`). Stalls are in units of ``ITERATIONS_UNIT`` iterations at the
  current speed.

Actions (Discrete): 0 keep; 1 re-plan layers (every replica) to the partition that fits the estimated
device speeds best; 2 rebalance micro-batches to the split that best fits the estimated replica speeds; 3
both; 4 the onset re-split: at an interval within which a slowdown began, the partition (and, with
replicas, the split) that fits its last iterations' loads (valid only where the onset test passes: version
8); ``5 + 2 (i - 1)`` shift boundary i by -1 (stage i gets stage i-1's last layer), ``6 + 2 (i - 1)``
shift it by +1 (stage i-1 gets stage i's first layer), for i = 1..s_max-1.

The per-stage arithmetic of one observation runs in compiled kernels: the environment calls them every
step of training.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from rlpipe.partition import bottleneck_dp, link_transfer_ms, stage_edges
from rlpipe.planning import MAX_SLOWDOWN_ESTIMATE, Planner, StatsError, move_bottlenecks_kernel
from rlpipe.simulator import operation_graph, simulate_kernel
from rlpipe.ski_rental import (
    NOT_JUDGED,
    counted,
    first_max,
    first_min,
    pays,
    reached,
    remaining_iterations,
    saving_over,
    saving_s,
    survival,
)
from rlpipe.split import greedy_split
from rlpipe.stats import IntervalStats, tail_iterations

OBSERVATION_VERSION = 12
DEFAULT_S_MAX = 8  # stage slots of the shipped policy's observation
DEFAULT_D_MAX = 8  # replica slots
DEFAULT_HISTORY = 4  # intervals of device load it carries, the current one included
OBSERVATION_CLIP = 10.0  # every feature lies in [-OBSERVATION_CLIP, OBSERVATION_CLIP]
STAGE_FEATURES = 8
BOUNDARY_FEATURES = 4
REPLICA_FEATURES = 4
GLOBAL_FEATURES = 40
CONGESTED_LINK = 1.2  # a link counts as slowed when its estimated transfer takes this much longer
ITERATIONS_UNIT = 10.0  # durations and stalls are counted in this many iterations
ELEVATED_LOAD = 1.1  # a device counts as disturbed above this load, and this much above the typical device's
TRANSIENT_DISPERSION = 3.0  # an interval whose most dispersed stage exceeds this many times the usual dispersion
TRANSIENT_FLOOR = 0.2  # (and this much) changed within the interval: its mean is no steady condition
CHANGE_TOLERANCE = 0.1  # a load within 10% of a device's steady mean counts as the same conditions
LOG_SPAN = math.log1p(100.0)  # log-scaled durations reach 1.0 at 100 units
NOISE_MEMORY = 0.05  # the noise estimates are running means with this weight on each interval
MEDIAN_ABS_DIFF_TO_SIGMA = 1 / (0.6745 * math.sqrt(2))  # sigma from the median |log l1 - log l0| of two readings
PAST_SLOWDOWNS = 64  # the ended slowdowns remembered
MIN_SEEN = 3  # an imbalance's remaining life is judged from at least this many ended slowdowns
ROUND_TRIP_STALLS = 3.0  # the rules' round-trip test: a move away from the launch plan saves this many stalls
ROUND_TRIP_SPAN = 2.0  # the round-trip margins' ceiling, and their value where the test does not apply
RULE_CONFIRM_INTERVALS = 2  # the rules' defaults (threshold, falcon): intervals in a row a gain must hold,
RULE_MIN_SURVIVAL = 0.3  # and how likely the imbalance must be to last as long again
RULE_MIN_GAIN = 0.03  # and the smallest predicted gain they count
EARLY_RESPLIT_STALLS = 4.0  # falcon-early (the policy's teacher) re-splits after 1 interval that lost this many stalls
EARLY_REBALANCE_STALLS = 4.0  # and rebalances after 1 interval that lost this many of the rebalance's stalls
OUTLIVED_MIN_GAIN = 0.01  # and counts from this gain once the plan in force outlived the slowdown it was fitted to
EXPECTED_LIFE_STALLS = 12.0  # and re-splits after 1 interval whose move saves this many stalls over the expected life
TIMER_JUMP = 0.15  # a device's load off by this much (log) for one interval and back: a timer outlier or a pause
MAX_JUMP_RATE = 0.005  # timers are steady while at most this share of device intervals were such jumps
MIN_JUMP_INTERVALS = 40  # device intervals judged before the jump rate is trusted
JUMP_INTERVALS = 3  # a jump is judged on a device's last three loads: the encoder keeps at least that many
ONSET_WORSENING = 0.05  # an interval's tail shows a worsening: its most loaded device this much over the estimate
ONSET_LASTING = 0.5  # the onset re-split: the least share of slowdowns seen that lasted 2 intervals beyond the tail
PLAN_MARGIN = 0.05  # the re-plan also tries the plan fitting the most slowed stage (replicas: each) this much slower
KEEP, REPLAN, REBALANCE, BOTH, ONSET = 0, 1, 2, 3, 4
FIRST_MOVE = 5


def round_trip_pays(saving: tuple[float, float] | None, round_trip: float = ROUND_TRIP_STALLS) -> bool:
    """The rules' round-trip test on :meth:`ObservationEncoder.round_trip_saving`'s (saving, stall): the saving
    reaches ``round_trip`` stalls; where the test does not apply (``None``) or is off (``round_trip`` <= 0), it
    passes."""
    saved_s, stall_s = (NOT_JUDGED, 0.0) if saving is None else saving
    return bool(pays(saved_s, stall_s, round_trip))  # the compiled pass's test, for the rules


class G:
    """Positions of the global features, counted from the start of the global block."""

    SINCE_REPARTITION, REPLAN_GAIN, REPLAN_COST, THROUGHPUT, STAGES, LAST_STALL, ONE_LAYER_STALL = range(7)
    NOISE, DISPERSION, LOST, HELD, PAST_COUNT, PAST_MEDIAN, PAST_LONGER = range(7, 14)
    REBALANCE_GAIN, REBALANCE_COST, REBALANCE_LOST, BOTH_GAIN, BOTH_COST, REPLICAS, COMM_BOUND, SYNC = range(14, 22)
    BOTH_LOST, REPLAN_CONFIRMED, REBALANCE_CONFIRMED, BOTH_CONFIRMED = range(22, 26)
    REPLAN_ROUND_TRIP, REBALANCE_ROUND_TRIP, BOTH_ROUND_TRIP = range(26, 29)
    REPLAN_PAYS, REBALANCE_PAYS, BOTH_PAYS, BOTH_VIA = range(29, 33)
    REPLAN_PAYS_EARLY, BOTH_PAYS_EARLY, ONSET, ONSET_GAIN, ONSET_COST, REBALANCE_PAYS_EARLY = range(33, 39)
    PLAN_OUTLIVED = 39


CONFIRMED_SPAN = 4  # the counts' intervals in a row are carried up to this many (rules confirm over 2)
# each lever's global features (re-plan, rebalance, both: rows), as the compiled :func:`_fill_counts` reads them
_LEVER_SLOTS = np.array([
    [G.REPLAN_GAIN, G.REPLAN_COST, G.LOST, G.REPLAN_CONFIRMED, G.REPLAN_ROUND_TRIP, G.REPLAN_PAYS, G.REPLAN_PAYS_EARLY],
    [G.REBALANCE_GAIN, G.REBALANCE_COST, G.REBALANCE_LOST, G.REBALANCE_CONFIRMED, G.REBALANCE_ROUND_TRIP,
     G.REBALANCE_PAYS, G.REBALANCE_PAYS_EARLY],
    [G.BOTH_GAIN, G.BOTH_COST, G.BOTH_LOST, G.BOTH_CONFIRMED, G.BOTH_ROUND_TRIP, G.BOTH_PAYS, G.BOTH_PAYS_EARLY]])
_EARLY_STALLS = np.array([EARLY_RESPLIT_STALLS, EARLY_REBALANCE_STALLS, EARLY_RESPLIT_STALLS])  # falcon-early's tests
_NOISE_SLOT, _DISPERSION_SLOT, _HELD_SLOT, _PAST_COUNT_SLOT = G.NOISE, G.DISPERSION, G.HELD, G.PAST_COUNT
_PAST_MEDIAN_SLOT, _PAST_LONGER_SLOT = G.PAST_MEDIAN, G.PAST_LONGER


class LostTime:
    """The ski-rental count (Greyhound, USENIX ATC'25): how much time the current imbalance has cost.

    Each interval whose gain (predicted iteration time now over after the action, minus 1) exceeds
    ``max(min_gain, noise_multiple x the noise of the estimates)`` adds its wall time x the share the action
    would save; an interval below that starts the count again, and so does a pause hopping to other devices
    while the job runs its launch plan (``ObservationEncoder.imbalance_moved``). A rule acts once the count
    reaches the action's stall; the observation carries the counts of a layer re-plan, of a rebalance and of
    both together.

    Args:
        min_gain: the smallest gain that counts (0.03: 3%).
        noise_multiple: the gain must also exceed this many times the noise of the slowdown estimates
            (the timer noise over the square root of the intervals behind them).
        outlived_gain: the smallest gain that counts while the plan in force has outlived the slowdown it was
            fitted to (:attr:`ObservationEncoder.plan_outlived`; None: ``min_gain``).
        figures, row: where the count's figures live, row ``row`` (lost s, intervals held, iterations held) of
            ``figures``: the encoder's array of counts, which the observation's compiled pass updates every interval
            (None: an array of its own). The array and a row number, not a view of the row: a copy of the encoder
            (``copy.deepcopy``) keeps its counts and their objects on one array.
    """

    def __init__(self, min_gain: float = RULE_MIN_GAIN, noise_multiple: float = 3.0,
                 outlived_gain: float | None = None, figures: np.ndarray | None = None, row: int = 0):
        self.min_gain, self.noise_multiple, self.outlived_gain = min_gain, noise_multiple, outlived_gain
        self.figures: np.ndarray = np.zeros((1, 3)) if figures is None else figures
        self.row = 0 if figures is None else row

    @property
    def lost_s(self) -> float:
        """The time the current imbalance has cost (the intervals' wall time x the share the action saves), s."""
        return float(self.figures[self.row, 0])

    @lost_s.setter
    def lost_s(self, seconds: float) -> None:
        self.figures[self.row, 0] = seconds

    @property
    def held_intervals(self) -> int:
        """Intervals in a row the action's gain has cleared the count's bar."""
        return int(self.figures[self.row, 1])

    @held_intervals.setter
    def held_intervals(self, intervals: int) -> None:
        self.figures[self.row, 1] = intervals

    @property
    def held_iterations(self) -> int:
        """Iterations in those intervals."""
        return int(self.figures[self.row, 2])

    @held_iterations.setter
    def held_iterations(self, iterations: int) -> None:
        self.figures[self.row, 2] = iterations

    def reset(self) -> None:
        self.figures[self.row] = 0.0

    def reached(self, stall_s: float, confirm_intervals: int, early_stalls: float = 0.0) -> bool:
        """The rules' count test: the time lost has reached the action's stall (s) and its gain has held
        ``confirm_intervals`` intervals in a row, or (``early_stalls`` > 0) one interval that lost at least
        ``early_stalls`` stalls already."""
        state = self.figures[self.row]
        return bool(reached(state[0], state[1], stall_s, confirm_intervals, early_stalls))

    def update(self, now_ms: float, after_ms: float, noise_level: float, stats: IntervalStats,
               possible: bool, transient: bool = False, outlived: bool = False) -> None:
        """Count one interval, given the action's predicted iteration times (ms) now and after it; a
        ``transient`` interval (its conditions changed within it) neither adds to the count nor ends it;
        ``outlived``: the plan in force outlived the slowdown it was fitted to (``outlived_gain`` applies)."""
        state = self.figures[self.row]
        state[0], state[1], state[2] = counted(
            state[0], state[1], state[2], now_ms, after_ms, noise_level, self.gain_to_count(outlived),
            self.noise_multiple, possible, transient, stats.wall_s, stats.stall_s, stats.iterations)

    def gain_to_count(self, outlived: bool) -> float:
        """The smallest gain that counts; ``outlived``: the plan in force outlived its slowdown."""
        return self.outlived_gain if outlived and self.outlived_gain is not None else self.min_gain


@dataclass(frozen=True)
class ActionLayout:
    """Meaning of each discrete action for jobs of up to ``s_max`` stages."""

    s_max: int

    @property
    def num_actions(self) -> int:
        return FIRST_MOVE + 2 * (self.s_max - 1)

    def move(self, action: int) -> tuple[int, int]:
        """``(boundary, delta)`` of a move action (``action >= FIRST_MOVE``)."""
        return 1 + (action - FIRST_MOVE) // 2, -1 if (action - FIRST_MOVE) % 2 == 0 else +1

    def move_action(self, boundary: int, delta: int) -> int:
        return FIRST_MOVE + 2 * (boundary - 1) + (0 if delta < 0 else 1)

    def describe(self, action: int) -> str:
        named = {KEEP: "keep", REPLAN: "replan", REBALANCE: "rebalance", BOTH: "replan+rebalance",
                 ONSET: "onset re-split"}
        if action in named:
            return named[action]
        boundary, delta = self.move(action)
        return f"move boundary {boundary} {'+1' if delta > 0 else '-1'}"


@dataclass
class Targets:
    """What each lever would do now: the partitions and splits it would run, their predicted iteration
    times and stalls.

    Attributes:
        replan: the layer re-plan's partition (the current split).
        rebalance: the rebalance's split (the current partition).
        both: the partition and split of both together.
        figures: predicted iteration ms now; after re-plan, rebalance, both; and the stalls s of re-plan,
            rebalance, both.
    """

    replan: tuple[int, ...] = ()
    rebalance: tuple[int, ...] = ()
    both: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    figures: np.ndarray = field(default_factory=lambda: np.zeros(7))


@dataclass(frozen=True)
class Onset:
    """The onset re-split (:meth:`ObservationEncoder._onset`): the plan (partition, split) that fits the
    interval's last iterations, its predicted gain there (iteration time now over after, minus 1) and its
    stall, s."""

    plan: tuple[tuple[int, ...], tuple[int, ...]]
    gain: float
    stall_s: float


class ObservationEncoder:
    """Turns each interval's statistics into an observation; masks and decodes actions.

    Args:
        planner: the job model (profile, schedule, replicas, migration cost).
        s_max: the largest stage count the observation has room for.
        history: intervals of device load the observation carries (the current one included).
        d_max: the largest replica count it has room for.
    """

    def __init__(self, planner: Planner, s_max: int = DEFAULT_S_MAX, history: int = DEFAULT_HISTORY,
                 d_max: int = DEFAULT_D_MAX):
        if planner.num_stages > s_max:
            raise StatsError(f"{planner.num_stages} stages do not fit an observation for at most {s_max}")
        if planner.replicas > d_max:
            raise StatsError(f"{planner.replicas} replicas do not fit an observation for at most {d_max}")
        self.planner = planner
        self.s_max, self.history, self.d_max = s_max, history, d_max
        self.layout = ActionLayout(s_max)
        self.size = self.size_for(s_max, history, d_max)
        costs = planner.costs
        self._one_layer_stall_s = planner.migration.overhead_s + float(
            link_transfer_ms(costs.state_bytes.mean(), planner.migration.bandwidth_gbps)) / 1e3
        self._graph = operation_graph(planner.num_stages, planner.microbatches, planner.schedule)
        self._prefix_fwd = np.concatenate([[0.0], np.cumsum(planner.profile.fwd_ms())])
        self._prefix_bwd = np.concatenate([[0.0], np.cumsum(planner.profile.bwd_ms())])
        self._link_ms_after = np.asarray(link_transfer_ms(costs.activation_bytes, planner.bandwidth_gbps),
                                         dtype=np.float64)  # one-way, if a stage ends after the layer
        self._memory_cap = np.inf if planner.memory_cap_bytes is None else float(planner.memory_cap_bytes)
        width = STAGE_FEATURES + history - 1
        self._boundary_base = s_max * width
        self._replica_base = self._boundary_base + BOUNDARY_FEATURES * (s_max - 1)
        self._global_base = self.size - GLOBAL_FEATURES
        # the replicas' slots, one row each (:meth:`_levers` fills them through a view)
        self._replica_block = slice(self._replica_base,
                                    self._replica_base + (REPLICA_FEATURES + s_max) * planner.replicas)
        self.reset()

    @staticmethod
    def size_for(s_max: int, history: int, d_max: int = DEFAULT_D_MAX) -> int:
        """Length of the observation vector."""
        return (s_max * (STAGE_FEATURES + history - 1) + BOUNDARY_FEATURES * (s_max - 1)
                + d_max * (REPLICA_FEATURES + s_max) + GLOBAL_FEATURES)

    def reset(self) -> None:
        devices = self.planner.replicas * self.planner.num_stages
        # every device's loads, newest first: the observation's history, and at least the jump count's three
        self._loads = np.ones((max(self.history, JUMP_INTERVALS), devices))
        self._state = np.zeros(7)  # intervals recorded, iterations since repartition, noise, dispersion, the
        # fewest intervals behind any device's steady estimate, one-interval jumps and the device intervals judged
        self.elevated_iterations = np.zeros(devices)
        self.imbalance_moved = False  # on the launch plan, the latest interval's disturbed devices replaced the
        # previous ones: the ski-rental counts start again
        self._steady = np.zeros((2, devices))  # each device's mean load since its last change, and the intervals in it
        self.past_slowdowns: list[float] = []  # how long each ended slowdown lasted, iterations
        self._past_sorted = np.zeros(0)  # the same, shortest first
        self._past_median = 0.0
        self.latest: IntervalStats | None = None
        self.device_estimate = np.ones(devices)
        self._imbalance_age = 0.0  # imbalance_age_iterations
        self.slowdown_estimate = np.ones(self.planner.num_stages)
        self._estimate_list = [1.0] * self.planner.num_stages  # the same as plain floats, which every step reads
        self._noise = (0.0, 0.0)  # (noise_level, estimate_noise) of the latest interval
        self._transient = False  # transient, of the latest interval
        self.link_estimate = np.ones(max(self.planner.num_stages - 1, 1))  # each link's bandwidth over its nominal
        self.split: tuple[int, ...] = self.planner.even
        self.targets = Targets(self.planner.ideal_boundaries, self.planner.even,
                               (self.planner.ideal_boundaries, self.planner.even))
        # the six ski-rental counts' figures, a row each (re-plan, rebalance, both; falcon-early's on the same
        # levers): the LostTime objects below read and write them, the compiled :func:`_fill_counts` too
        self._counts = np.zeros((6, 3))
        self.lost_time = LostTime(figures=self._counts, row=0)
        self.rebalance_lost_time = LostTime(figures=self._counts, row=1)  # restarted at every change of plan or split
        self.both_lost_time = LostTime(figures=self._counts, row=2)  # re-plan and rebalance together; restarted too
        # falcon-early's three counts: the same but from OUTLIVED_MIN_GAIN while the plan outlived its slowdown
        self.early_lost_times = tuple(LostTime(outlived_gain=OUTLIVED_MIN_GAIN, figures=self._counts, row=3 + k)
                                      for k in range(3))
        # each count's least gain, its noise multiple and its least gain once the plan in force has outlived its
        # slowdown
        self._count_params = np.array([(count.min_gain, count.noise_multiple, count.gain_to_count(True))
                                       for count in (self.lost_time, self.rebalance_lost_time, self.both_lost_time,
                                                     *self.early_lost_times)])
        self.plan_outlived = False  # the plan in force was fitted to a slowdown that has since ended
        self._fitted_to: list[float] | None = None  # the stage estimates the plan in force was chosen under
        self._running: tuple | None = None  # the (partition, split) of the last interval
        self._mask_cache: tuple | None = None
        self.onset: Onset | None = None  # the latest interval's onset re-split, where its test passed (:meth:`_onset`)

    # --- what the rules read ----------------------------------------------------------------------

    @property
    def replan_boundaries(self) -> tuple[int, ...]:
        """The layer re-plan's partition."""
        return self.targets.replan

    @property
    def replan_figures(self) -> np.ndarray:
        """(predicted iteration ms now, after the layer re-plan, its stall s)."""
        f = self.targets.figures
        return np.array([f[0], f[1], f[4]])

    @property
    def both_figures(self) -> np.ndarray:
        """(predicted iteration ms now, after re-plan and rebalance together, their stall s)."""
        f = self.targets.figures
        return np.array([f[0], f[3], f[6]])

    @property
    def escalation_figures(self) -> np.ndarray:
        """What a re-split of the layers adds to the rebalance, the cheap lever: (predicted iteration ms after
        the rebalance, after re-plan and rebalance together, the stall s the pair costs beyond the rebalance's).
        ``falcon-early`` re-splits a replicated job only where this pays its round trip too: the rebalance alone
        otherwise gets what the re-split would, for less. On one pipeline, or where the split already fits, the
        rebalance changes nothing and these are :attr:`both_figures`."""
        f = self.targets.figures
        return np.array([f[2], f[3], max(f[6] - f[5], 0.0)])

    @property
    def rebalance_figures(self) -> np.ndarray:
        """(predicted iteration ms now, after the rebalance, its stall s)."""
        f = self.targets.figures
        return np.array([f[0], f[2], f[5]])

    @property
    def loads(self) -> np.ndarray:
        """Each stage's measured load (its stage group's most loaded device) of the recorded intervals,
        newest first, one row each."""
        recorded = self._loads[:int(min(self._state[0], self.history))]
        replicas, stages = self.planner.replicas, self.planner.num_stages
        return recorded.reshape(len(recorded), replicas, stages).max(axis=1)

    @property
    def intervals_since_repartition(self) -> float:
        """Time since the last repartition, in decision intervals of the latest length."""
        latest_iterations = self.latest.iterations if self.latest is not None else 1
        return self._state[1] / max(latest_iterations, 1)

    @property
    def noise_level(self) -> float:
        """The timer noise measured so far (lognormal sigma of one interval's loads): the larger of the
        change between intervals and the dispersion within them scaled to an interval's mean."""
        return self._noise[0]

    @property
    def estimate_noise(self) -> float:
        """The noise of the slowdown estimates (what a predicted gain must clear): the timer noise over the
        square root of the intervals behind the least settled device's estimate (its steady mean since its
        last change)."""
        return self._noise[1]

    def _noise_levels(self) -> tuple[float, float]:
        """(noise_level, estimate_noise), as plain floats (:meth:`observe` keeps them: every step reads both)."""
        iterations = self.latest.iterations if self.latest is not None else 1
        between, within, settled_intervals = self._state[2:5].tolist()
        level = max(between, within / math.sqrt(max(iterations, 1)))
        return level, level / math.sqrt(max(settled_intervals, 1.0))

    @property
    def timers_steady(self) -> bool:
        """Whether this run's timers read few one-interval jumps: at most ``MAX_JUMP_RATE`` of the device intervals
        judged (``MIN_JUMP_INTERVALS`` at least) saw a device's load off by over ``TIMER_JUMP`` (log) for one interval
        and back. Timer outliers and pauses make such jumps; a slowdown's onset does not come back. Clean timers of
        3% noise read 0-0.0007 of them, timers with outliers 0.025-0.034, ``mixed``'s pauses 0.04-0.05."""
        judged, jumps = float(self._state[6]), float(self._state[5])
        return judged >= MIN_JUMP_INTERVALS and jumps <= MAX_JUMP_RATE * judged

    @property
    def transient(self) -> bool:
        """Whether the latest interval's conditions changed within it on the most loaded stage (its compute
        dispersed far more than usual from one iteration to the next: a pause, or the onset or end of a
        slowdown), so that its mean load is no steady condition to act on."""
        return self._transient

    def _is_transient(self) -> bool:
        """:attr:`transient`, computed (:meth:`observe` keeps it: every step reads it)."""
        cv = None if self.latest is None else self.latest.compute_cv
        if cv is None or len(cv) == 0:
            return False
        estimate = self._estimate_list
        slowest = estimate.index(max(estimate))  # the first of equals, as np.argmax
        return float(cv[slowest]) > max(TRANSIENT_DISPERSION * float(self._state[3]), TRANSIENT_FLOOR)

    @property
    def dispersion(self) -> float:
        """The running estimate of a stage's compute dispersion from one iteration to the next."""
        return float(self._state[3])

    def imbalance_survival(self) -> float:
        """How likely the current imbalance is to last as long again, judged by the slowdowns this run has
        seen end: of those that outlasted its age, the share that lasted twice as long (a half-count prior:
        0.5 when none outlasted it)."""
        return float(survival(self._past_sorted, max(self.lost_time.held_iterations, 1)))

    @property
    def imbalance_age_iterations(self) -> float:
        """How long the most slowed device has been disturbed, iterations (0 when none is): the current
        imbalance's age, measured as ``past_slowdowns`` are (set by :meth:`observe`)."""
        return self._imbalance_age

    def expected_remaining_iterations(self, age_iterations: float, min_seen: int = MIN_SEEN) -> float | None:
        """How many more iterations an imbalance ``age_iterations`` old is expected to last, judged by the
        slowdowns this run has seen end: the mean further life of those that outlasted its age. Where fewer than
        ``min_seen`` outlasted it, the history judges it only up to the age of its ``min_seen``-th longest
        slowdown; beyond that, it is expected to last as long again as it has gone beyond that age (an imbalance
        older than nearly all a run has seen may be of a new kind, and the further beyond, the likelier), or as
        the few that outlasted it say, if longer. None when fewer than ``min_seen`` slowdowns have ended: too
        little history to judge.

        Why not None beyond the history too (as until 2026-12-04): of garbage-collection pauses of 1-2 s, about
        one a minute on every device, now and then one outlasts all but a few of those seen, and the rules then
        paid a re-plan's stall near the pause's end, and another on the way back (``seqlen``: 3 to 17
        repartitions an hour for ``threshold``, 0.7 or fewer with this judgement)."""
        remaining = remaining_iterations(self._past_sorted, float(max(age_iterations, 1)), min_seen)
        return None if math.isnan(remaining) else float(remaining)

    def round_trip_saving(self, held_iterations: int, figures: np.ndarray | Sequence[float],
                          plan: tuple[tuple[int, ...], tuple[int, ...]]) -> tuple[float, float] | None:
        """What a move to ``plan`` (partition, split), with ``figures`` (predicted iteration ms now, after it,
        its stall s), would save over the imbalance's expected remaining life (at the iteration time now), and
        its stall, both seconds; None where no round trip is to be paid for: home to the launch plan, or too
        few slowdowns seen end to judge (:meth:`expected_remaining_iterations`). The imbalance's age is how
        long the most slowed device has been disturbed, or ``held_iterations`` (how long a ski-rental count
        has held) if longer: a plan fitted to a slowdown that ended."""
        now_ms, after_ms, stall_s = (float(figure) for figure in figures)
        if self.at_launch(*plan):
            return None
        # through the method, not the compiled pass's saving_s: experiments replace the method to try other judgements
        remaining = self.expected_remaining_iterations(max(held_iterations, self._imbalance_age))
        return None if remaining is None else (float(saving_over(remaining, now_ms, after_ms)), stall_s)

    def at_launch(self, boundaries: tuple[int, ...], split: tuple[int, ...]) -> bool:
        """Whether ``boundaries`` and ``split`` are the launch plan: the one that fits the job without slowdowns."""
        return tuple(boundaries) == self.planner.ideal_boundaries and tuple(split) == self.planner.even

    # --- taking a step back -------------------------------------------------------------------------

    def snapshot(self) -> tuple[dict[str, Any], list[tuple[np.ndarray, np.ndarray]]]:
        """The encoder's state now, for :meth:`restore`. Observing an interval writes into the encoder's arrays
        (their contents are copied here, to be written back into the same arrays, which other objects share:
        the ski-rental counts' ``LostTime`` objects each hold a row of ``_counts``) and replaces its other
        attributes, never changing them in place."""
        attributes = dict(vars(self))
        return attributes, [(value, value.copy()) for value in attributes.values() if isinstance(value, np.ndarray)]

    def restore(self, state: tuple[dict[str, Any], list[tuple[np.ndarray, np.ndarray]]]) -> None:
        """Go back to the state of a :meth:`snapshot`."""
        attributes, arrays = state
        for array, contents in arrays:
            np.copyto(array, contents)
        vars(self).clear()
        vars(self).update(attributes)

    # --- observing an interval ----------------------------------------------------------------------

    def _check(self, stats: IntervalStats) -> None:
        planner = self.planner
        if stats.num_stages != planner.num_stages:
            raise StatsError(f"statistics for {stats.num_stages} stages, the pipeline has {planner.num_stages}")
        if stats.replicas != planner.replicas or stats.loads.shape != (planner.replicas, planner.num_stages):
            raise StatsError(f"statistics for {stats.replicas} replicas, the job has {planner.replicas}")
        cv = _NOTHING if stats.compute_cv is None else stats.compute_cv
        problem = _unsound_figures(*(_array(figures) for figures in (stats.loads, stats.compute_ms, stats.comm_ms,
                                                                      stats.idle_ms, stats.num_layers, cv)))
        if problem == 1:
            raise StatsError(f"non-finite or non-positive device load {stats.loads.tolist()}")
        if problem == 2:
            raise StatsError("non-finite stage times")
        if not (math.isfinite(stats.wall_s) and stats.wall_s > 0 and math.isfinite(stats.stall_s)):
            raise StatsError("non-finite interval wall time")

    def observe(self, stats: IntervalStats) -> np.ndarray:
        """Record one interval and return its observation. Raises :class:`StatsError` on bad statistics."""
        self._check(stats)
        planner, replicas, num_stages = self.planner, self.planner.replicas, self.planner.num_stages
        previous_estimate = self._estimate_list  # what a change of plan at the end of the last interval saw
        self.latest = stats
        self.split = tuple(stats.split) if stats.split is not None else planner.even
        ended = np.zeros(replicas * num_stages)
        self.device_estimate, slowdowns_ended, self._imbalance_age = _record_loads(
            self._loads, self._state, self.elevated_iterations, self._steady,
            np.ascontiguousarray(stats.loads.reshape(-1), dtype=np.float64), float(stats.iterations),
            float(stats.stall_s), ended, np.zeros(0) if stats.compute_cv is None else stats.compute_cv)
        # A pause hopping from device to device (garbage collection on many devices): the devices disturbed
        # before have all recovered and others are disturbed now. On the launch plan, what was lost before
        # was lost to another imbalance, which acting on this one would not have recovered. Away from it the
        # loss may be the plan's own (fitted to a slowdown that ended), and the count goes on.
        if slowdowns_ended:
            continuing = self.elevated_iterations > stats.iterations
            self.imbalance_moved = (self.at_launch(stats.boundaries, self.split)
                                    and bool(np.any(self.elevated_iterations > 0)) and not bool(continuing.any()))
            self.past_slowdowns = (self.past_slowdowns + [float(x) for x in ended[ended > 0]])[-PAST_SLOWDOWNS:]
            past_sorted = sorted(self.past_slowdowns)
            self._past_sorted, self._past_median = np.array(past_sorted), statistics.median(past_sorted)
        else:
            self.imbalance_moved = False
        by_device = self.device_estimate.reshape(replicas, num_stages)
        if replicas == 1:  # a stage group of one: its most loaded member is the device itself
            self.slowdown_estimate, history, elevated = (self.device_estimate, self._loads[:self.history],
                                                         self.elevated_iterations)
        else:
            self.slowdown_estimate, history, elevated = _stage_groups(
                by_device, self._loads[:self.history].reshape(self.history, replicas, num_stages),
                self.elevated_iterations.reshape(replicas, num_stages))
        self._estimate_list = self.slowdown_estimate.tolist()
        self._noise, self._transient = self._noise_levels(), self._is_transient()
        observation = np.zeros(self.size)
        replan = np.empty(num_stages, dtype=np.int64)
        figures = np.zeros(3)
        current = np.asarray(stats.boundaries, dtype=np.int64)
        _encode(observation, replan, self.link_estimate, figures, history, self._state, elevated,  # type: ignore[call-arg]
                self.slowdown_estimate, stats.compute_ms, stats.comm_ms, stats.idle_ms, stats.num_layers,
                np.zeros(num_stages) if stats.compute_cv is None else stats.compute_cv,
                max(stats.iteration_ms, 1e-9), float(stats.stall_s), current, float(planner.microbatches),
                self.s_max, self.history, planner.num_layers, planner.ideal_stage_ms, planner.ideal_iteration_ms,
                planner.layer_compute_ms, planner.prefix_compute_ms, planner.roundtrip_ms, planner.roundtrip_by_stage,
                planner.costs.state_bytes, planner.costs.activation_bytes, planner.inflight_float,
                self._memory_cap, *self._graph, self._prefix_fwd, self._prefix_bwd, self._link_ms_after,
                planner.migration.overhead_s, planner.migration.bandwidth_gbps, self._one_layer_stall_s,
                self._global_base)
        if replan[0] < 0:
            raise StatsError(f"no partition into {num_stages} stages fits the memory cap")
        self.targets = self._levers(stats.boundaries, tuple(replan.tolist()), figures, by_device, observation)
        self.onset = self._onset(stats)
        self._count_and_fill(observation, stats, previous_estimate)
        np.maximum(observation, -OBSERVATION_CLIP, out=observation)
        return np.minimum(observation, OBSERVATION_CLIP, out=observation).astype(np.float32)

    def _levers(self, current: tuple[int, ...], replan: tuple[int, ...], figures: np.ndarray, by_device: np.ndarray,
                observation: np.ndarray) -> Targets:
        """What each lever would do now. One pipeline: the kernel's re-plan (exactly simulated). Replicas:
        every lever predicted with each replica's pipeline as its fill plus one bottleneck per further
        micro-batch, the slowest replica then the gradient sync; the re-plan tries the partition optimal for
        every stage's worst device, the most slowed replica's own, and those optimal with each stage in turn
        ``PLAN_MARGIN`` slower (the bottleneck misjudges a replicated pipeline as it does one: on ``persistent``
        at 4 stages x 2 these lifted falcon-early by 0.0018, 10 episodes of seed 4242)."""
        planner, split = self.planner, self.split
        if planner.replicas == 1:
            now_ms, replan_ms, replan_stall = figures
            return Targets(replan, split, (replan, split), np.array([now_ms, replan_ms, now_ms, replan_ms,
                                                                     replan_stall, 0.0, replan_stall]))
        split_counts = np.asarray(split, dtype=np.float64)
        candidates, with_split, balanced, with_balanced, replica_ms, replica_worst = _replicated_levers(
            np.asarray(current, dtype=np.int64), np.asarray(replan, dtype=np.int64), by_device, self.slowdown_estimate,
            self.link_estimate, split_counts, planner.layer_compute_ms, planner.prefix_compute_ms, planner.roundtrip_ms,
            planner.roundtrip_by_stage, planner.costs.state_bytes, planner.costs.activation_bytes, self._memory_cap,
            planner.inflight_float, planner.costs.prefix_param_bytes, planner.bandwidth_gbps, planner.num_layers,
            planner.microbatches, planner.minimum)
        if candidates[0, 0] < 0:
            raise StatsError(f"no partition into {planner.num_stages} stages fits the memory cap")
        # plain floats and tuples from here: this runs at every step of training
        with_split_ms, with_balanced_ms = with_split.tolist(), with_balanced.tolist()
        balanced_splits = balanced.tolist()
        now_ms = with_split_ms[0]
        best = with_split_ms.index(min(with_split_ms))  # the first of equals, as np.argmin
        replan_ms, best_replan = (with_split_ms[best], tuple(candidates[best].tolist())) \
            if with_split_ms[best] < now_ms * (1 - 1e-9) else (now_ms, current)
        rebalanced = tuple(balanced_splits[0])
        rebalance_ms = with_balanced_ms[0]
        pick = with_balanced_ms.index(min(with_balanced_ms))
        both, both_split = tuple(candidates[pick].tolist()), tuple(balanced_splits[pick])
        both_ms = with_balanced_ms[pick]
        iteration_ms = self.latest.iteration_ms if self.latest is not None else now_ms
        replan_stall = planner.stall_s(current, best_replan)
        rebalance_stall = planner.rebalance_stall_s(split, rebalanced, iteration_ms)
        both_stall = planner.change_stall_s((current, split), (both, both_split), iteration_ms)
        # the mean as np.mean sums (pairwise: bit for bit), without its Python wrapper: this runs every step
        _fill_replicas(observation[self._replica_block].reshape(planner.replicas, REPLICA_FEATURES + self.s_max),
                       split_counts / planner.microbatches, replica_worst, replica_ms,
                       np.add.reduce(replica_ms) / planner.replicas, by_device)
        return Targets(best_replan, rebalanced, (both, both_split),
                       np.array([now_ms, replan_ms, rebalance_ms, both_ms, replan_stall, rebalance_stall, both_stall]))

    def _onset(self, stats: IntervalStats) -> Onset | None:
        """The re-split fitted to a slowdown that began within this interval, where the onset test passes
        (the ``ONSET`` action; ``falcon-early`` then re-splits at once, an interval before its count can
        start); None where it does not.

        An interval whose conditions changed within it (:attr:`transient`) mixes two conditions in its mean;
        its last iterations (``stats.tail_load``) show what holds now. The test: the tail shows a worsening
        (the most loaded device ``ONSET_WORSENING`` over the estimate); this run has seen enough slowdowns
        end to judge one (:meth:`expected_remaining_iterations` is not None: a bet on how long a slowdown
        lasts needs a history; without it, early in a ``seqlen`` run, each garbage-collection pause's onset
        looked like a lasting slowdown); the imbalance is likely to last (:meth:`imbalance_survival`, as the
        rules judge it) and, of the slowdowns seen end that outlasted the tail, at least ``ONSET_LASTING``
        lasted two intervals more (waiting for the count would then have paid the stall anyway, an interval
        later); the re-split for the tail's loads gains more than the rules' least gain and three times the
        tail's noise; one interval at those loads would lose ``EARLY_RESPLIT_STALLS`` of its stalls; and, away
        from the launch plan, its round trip pays. On a replicated job the re-split comes with the split that
        fits the tail, and the partition must change."""
        tail_load = stats.tail_load
        if tail_load is None or not self.transient:
            return None
        planner = self.planner
        tail = planner.clip_load(np.asarray(tail_load, dtype=np.float64).reshape(planner.replicas, planner.num_stages))
        worst = tail.max(axis=0)
        if float(worst.max()) <= float(self.slowdown_estimate.max()) * (1.0 + ONSET_WORSENING):
            return None
        age = float(tail_iterations(stats.iterations))
        remaining = self.expected_remaining_iterations(age)
        if remaining is None or self.imbalance_survival() < RULE_MIN_SURVIVAL:
            return None
        past = self._past_sorted
        outlasted = len(past) - int(np.searchsorted(past, age, side="right"))
        lasted = len(past) - int(np.searchsorted(past, age + 2 * stats.iterations, side="right"))
        if (lasted + 0.5) / (outlasted + 1.0) < ONSET_LASTING:
            return None
        current, split = tuple(stats.boundaries), self.split
        plan, now_ms, after_ms = self._fit_tail(current, split, tail, worst)
        if plan[0] == current or now_ms <= 0 or after_ms <= 0:
            return None
        tail_noise = self.noise_level * math.sqrt(stats.iterations / age)
        gain = now_ms / after_ms - 1.0
        if gain <= max(self.lost_time.min_gain, self.lost_time.noise_multiple * tail_noise):
            return None
        stall_s = planner.change_stall_s((current, split), plan, stats.iteration_ms)
        if stats.iterations * (now_ms - after_ms) / 1e3 < EARLY_RESPLIT_STALLS * stall_s:
            return None
        saving = (1.0 - after_ms / now_ms) * remaining * now_ms / 1e3
        if not self.at_launch(*plan) and not round_trip_pays((saving, stall_s)):
            return None
        return Onset(plan, gain, stall_s)

    def _fit_tail(self, current: tuple[int, ...], split: tuple[int, ...], tail: np.ndarray,
                  worst: np.ndarray) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], float, float]:
        """The re-split that fits devices running ``tail`` (D, S) times slower (``worst``: each stage group's
        most loaded), with the predicted iteration ms of the job now and after it: one pipeline, the partition
        for those loads; replicas, the better of the partitions for every stage's worst device and for the most
        slowed replica's own, each with the split that fits it."""
        planner = self.planner
        if planner.replicas == 1:
            partition = planner.plan(worst, current)
            return ((partition, split), planner.predict_iteration_ms(current, worst),
                    planner.predict_iteration_ms(partition, worst))
        slowest = int(np.argmax(tail.max(axis=1)))
        best: tuple[float, tuple[tuple[int, ...], tuple[int, ...]]] | None = None
        for partition in dict.fromkeys([planner.plan(worst), planner.plan(tail[slowest])]):
            fitted = planner.balanced_split(partition, tail)
            ms = planner.predict_job_ms(partition, fitted, tail)
            if best is None or ms < best[0]:
                best = (ms, (partition, fitted))
        assert best is not None
        return best[1], planner.predict_job_ms(current, split, tail), best[0]

    def _outlived(self) -> bool:
        """Whether the plan in force outlived the slowdown it was fitted to: a stage that was slowed by more than
        the rules' 3% when it was chosen has since lost over half of its excess. The plan that fits now is then
        worth a smaller gain (``OUTLIVED_MIN_GAIN``): the cause of the difference is known, a slowdown ended, not
        noise, and the rules otherwise held a plan fitted to a co-location that had ended for the rest of the run,
        2-3% slow (``persistent``: a 2.9x straggler, a 1.14x co-location of two minutes beside it)."""
        if self._fitted_to is None:
            return False
        for fitted, estimate in zip(self._fitted_to, self._estimate_list):  # plain floats: this runs every step
            excess = fitted - 1.0
            if excess > RULE_MIN_GAIN and estimate - 1.0 < excess / 2:
                return True
        return False

    def _count_and_fill(self, observation: np.ndarray, stats: IntervalStats, previous_estimate: list[float]) -> None:
        """The ski-rental counts, the past slowdowns and the levers' figures in the global block."""
        targets, split = self.targets, self.split
        running = (tuple(stats.boundaries), split)
        if running != self._running:
            if self._running is not None:  # the job changed: the escalation starts again, and falcon-early's
                # counts all do, as the rule's own (its re-split count too: since version 12, one interval may fire it)
                for count in (self.rebalance_lost_time, self.both_lost_time, *self.early_lost_times):
                    count.reset()
            self._fitted_to = None if self.at_launch(*running) else previous_estimate
        self._running = running
        self.plan_outlived = self._outlived()
        if self.imbalance_moved:
            self._counts[:] = 0.0
        launch = (self.planner.ideal_boundaries, self.planner.even)
        both = targets.both
        _fill_counts(observation[self._global_base:], self._counts, self._count_params, self.plan_outlived,
                     targets.figures, *self._noise, self._transient, targets.replan != running[0],
                     targets.rebalance != split, both != running, (targets.replan, split) == launch,
                     (running[0], targets.rebalance) == launch, both == launch, float(stats.wall_s),
                     float(stats.stall_s), float(stats.iterations), max(stats.iteration_ms, 1e-9), self._past_sorted,
                     self._past_median, self._imbalance_age, self._state[3], self.timers_steady,
                     both[0] != running[0])
        g = self._global_base
        observation[g + G.REPLICAS] = self.planner.replicas / self.d_max
        observation[g + G.SYNC] = (max(stats.sync_ms.tolist()) / max(stats.iteration_ms, 1e-9)
                                   if stats.sync_ms is not None and len(stats.sync_ms) else 0.0)
        observation[g + G.BOTH_VIA] = (1.0 if targets.both == (targets.replan, split)
                                       else -1.0 if targets.both == (running[0], targets.rebalance) else 0.0)
        observation[g + G.PLAN_OUTLIVED] = float(self.plan_outlived)
        if self.onset is not None:
            unit_s = ITERATIONS_UNIT * max(stats.iteration_ms, 1e-9) / 1e3
            observation[g + G.ONSET] = 1.0
            observation[g + G.ONSET_GAIN] = self.onset.gain
            observation[g + G.ONSET_COST] = self.onset.stall_s / unit_s

    # --- actions ---------------------------------------------------------------------------------

    def action_mask(self, boundaries: tuple[int, ...], split: tuple[int, ...] | None = None) -> np.ndarray:
        """Valid actions: keep always; a re-plan, rebalance or both when it changes what runs; moves that
        keep every stage non-empty and within the memory cap, on boundaries the pipeline has."""
        split = self.split if split is None else tuple(split)
        key = (tuple(boundaries), split, self.targets.replan, self.targets.rebalance, self.targets.both,
               None if self.onset is None else self.onset.plan)
        if self._mask_cache is not None and self._mask_cache[0] == key:
            return self._mask_cache[1].copy()
        mask = self._compute_mask(tuple(boundaries), split)
        self._mask_cache = (key, mask)
        return mask.copy()

    def _compute_mask(self, boundaries: tuple[int, ...], split: tuple[int, ...]) -> np.ndarray:
        mask = np.zeros(self.layout.num_actions, dtype=bool)
        mask[KEEP] = True
        mask[REPLAN] = self.targets.replan != boundaries
        mask[REBALANCE] = self.targets.rebalance != split
        mask[BOTH] = self.targets.both != (boundaries, split) and self.targets.both not in (
            (self.targets.replan, split), (boundaries, self.targets.rebalance))
        mask[ONSET] = self.onset is not None and self.onset.plan != (boundaries, split)
        edges = stage_edges(boundaries, self.planner.num_layers).tolist()
        for boundary in range(1, len(boundaries)):
            for delta in (-1, +1):
                moved = edges[boundary] + delta
                if edges[boundary - 1] < moved < edges[boundary + 1]:
                    fits = self.planner.memory_cap_bytes is None or self.planner.fits_memory(
                        tuple(edges[:boundary]) + (moved,) + tuple(edges[boundary + 1:-1]))
                    mask[self.layout.move_action(boundary, delta)] = fits
        return mask

    def decode(self, action: int, boundaries: tuple[int, ...],
               split: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The partition and split an action asks for, or ``None`` if it is invalid here."""
        split = self.split if split is None else tuple(split)
        if not 0 <= action < self.layout.num_actions or not self.action_mask(boundaries, split)[action]:
            return None
        if action == KEEP:
            return tuple(boundaries), split
        if action == REPLAN:
            return self.targets.replan, split
        if action == REBALANCE:
            return tuple(boundaries), self.targets.rebalance
        if action == BOTH:
            return self.targets.both
        if action == ONSET:
            assert self.onset is not None  # the mask allows it only then
            return self.onset.plan
        boundary, delta = self.layout.move(action)
        moved = list(boundaries)
        moved[boundary] += delta
        return tuple(moved), split


# --- the compiled kernels ---------------------------------------------------------------------------

_NOTHING = np.zeros(0)


def _array(figures: np.ndarray) -> np.ndarray:
    """``figures`` as a numeric array (themselves where they are one already: what every step passes)."""
    return figures if type(figures) is np.ndarray and figures.dtype.kind in "fiu" else np.asarray(figures, dtype=float)


@njit(cache=True)
def _unsound_figures(loads, compute_ms, comm_ms, idle_ms, num_layers, compute_cv):  # pragma: no cover
    """0 if an interval's figures can be read; 1 if a device load is not a finite number > 0 (NaN
    included); 2 if a stage figure is not finite."""
    for load in loads.flat:
        if not (load > 0 and math.isfinite(load)):
            return 1
    finite = _finite(compute_ms) and _finite(comm_ms) and _finite(idle_ms) and _finite(num_layers) and _finite(
        compute_cv)
    return 0 if finite else 2


@njit(cache=True)
def _finite(figures):  # pragma: no cover
    """Whether every value of ``figures`` (an array of any shape) is finite."""
    for value in figures.flat:
        if not math.isfinite(value):
            return False
    return True


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
def _replica_shape(prefix, roundtrip, boundaries, by_device, link_factor, num_layers):  # pragma: no cover
    """Each replica's pipeline as (fill, bottleneck), ms: one micro-batch crosses every stage, each further
    one costs the replica's bottleneck stage time."""
    replicas = by_device.shape[0]
    fill, step = np.empty(replicas), np.empty(replicas)
    for r in range(replicas):
        times = _stage_times(prefix, roundtrip, boundaries, by_device[r], num_layers, link_factor)
        fill[r], step[r] = times.sum(), times.max()
    return fill, step


@njit(cache=True)
def _lever_kernel(prefix, roundtrip, candidates, sync, by_device, link_factor, split, num_layers, total,
                  minimum):  # pragma: no cover
    """For each candidate partition (row 0: the current one): the job's predicted iteration time with the
    current ``split``, the split that best fits the replicas' estimated speeds, the time with it (ms),
    and each replica's pipeline time now. A replica's pipeline is its fill plus one bottleneck per further
    micro-batch; the job waits for the slowest, then the gradient sync ``sync[c]``."""
    count, replicas = candidates.shape[0], by_device.shape[0]
    with_split, with_balanced = np.empty(count), np.empty(count)
    balanced = np.empty((count, replicas), dtype=np.int64)
    now = np.empty(replicas)
    for c in range(count):
        fill, step = _replica_shape(prefix, roundtrip, candidates[c], by_device, link_factor, num_layers)
        times = fill + (split - 1.0) * step
        if c == 0:
            now[:] = times
        with_split[c] = times.max() + sync[c]
        counts = greedy_split(fill, step, total, minimum)
        balanced[c] = counts
        with_balanced[c] = (fill + (counts - 1.0) * step).max() + sync[c]
    return with_split, balanced, with_balanced, now


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
def _replica_worst(by_device):  # pragma: no cover
    """Each replica's most loaded device's load, and the replica with the most loaded (the first of equals,
    as ``np.argmax``)."""
    worst = np.empty(by_device.shape[0])
    for r in range(by_device.shape[0]):
        worst[r] = by_device[r].max()
    return worst, int(np.argmax(worst))


@njit(cache=True)
def _fill_replicas(slots, split_share, replica_worst, replica_ms, mean_ms, by_device):  # pragma: no cover
    """The replicas' slots of the observation, a row each: present (1), the micro-batch split over the even
    one, the most loaded device, the pipeline time over the replicas' mean ``mean_ms``, every device's load
    (each less 1)."""
    for r in range(slots.shape[0]):
        slots[r, 0] = 1.0
        slots[r, 1] = split_share[r] - 1.0
        slots[r, 2] = replica_worst[r] - 1.0
        slots[r, 3] = replica_ms[r] / mean_ms - 1.0
        for s in range(by_device.shape[1]):
            slots[r, REPLICA_FEATURES + s] = by_device[r, s] - 1.0


@njit(cache=True)
def _fill_counts(block, counts, params, outlived, figures, noise_level, noise, transient, replan_possible,
                 rebalance_possible, both_possible, replan_home, rebalance_home, both_home, wall_s, stall_s, iterations,
                 iteration_ms, past_sorted, past_median, imbalance_age, dispersion, timers_steady,
                 both_moves_layers):  # pragma: no cover
    """One interval of the six ski-rental counts, and the global features they and the past slowdowns give
    (:meth:`ObservationEncoder._count_and_fill`), into ``block``, the observation from its global block on.
    Row k of ``counts`` is a count (re-plan, rebalance, both, then falcon-early's three on the same levers): its
    lost s, intervals and iterations held (updated in place); of ``params``, its least gain, its noise multiple
    and its least gain once the plan in force has ``outlived`` its slowdown (falcon-early's). ``figures``: the
    levers' (:attr:`Targets.figures`); per lever, whether its plan differs from what runs (possible), and whether
    it is the launch plan (home); the interval's wall, stall (s), iterations and iteration ms; the ended slowdowns
    (shortest first), their median, the imbalance's age (iterations), the compute dispersion, whether the timers
    are steady (:attr:`ObservationEncoder.timers_steady`) and whether the both lever's plan moves layers."""
    now_ms = figures[0]
    possible, home = (replan_possible, rebalance_possible, both_possible), (replan_home, rebalance_home, both_home)
    for lever in range(3):
        for k in (lever, lever + 3):
            min_gain = params[k, 2] if k >= 3 and outlived else params[k, 0]
            counts[k, 0], counts[k, 1], counts[k, 2] = counted(
                counts[k, 0], counts[k, 1], counts[k, 2], now_ms, figures[1 + lever], noise, min_gain, params[k, 1],
                possible[lever], transient, wall_s, stall_s, iterations)
    unit_s = ITERATIONS_UNIT * iteration_ms / 1e3
    block[_DISPERSION_SLOT], block[_NOISE_SLOT] = dispersion, noise_level
    block[_HELD_SLOT] = math.log1p(counts[0, 2] / ITERATIONS_UNIT) / LOG_SPAN
    if past_sorted.shape[0]:
        block[_PAST_COUNT_SLOT] = math.log1p(past_sorted.shape[0]) / math.log1p(PAST_SLOWDOWNS)
        block[_PAST_MEDIAN_SLOT] = math.log1p(past_median / ITERATIONS_UNIT) / LOG_SPAN
    lasting = survival(past_sorted, first_max(counts[0, 2], 1.0))  # of the ended slowdowns older than it, lasted 2x
    block[_PAST_LONGER_SLOT] = lasting
    for lever in range(3):
        slots, after_ms, stall = _LEVER_SLOTS[lever], figures[1 + lever], figures[4 + lever]
        lost_s, held_intervals, held_iterations = counts[lever, 0], counts[lever, 1], counts[lever, 2]
        block[slots[0]] = now_ms / after_ms - 1.0
        block[slots[1]] = stall / unit_s
        block[slots[2]] = lost_s / first_max(stall, 1e-9) if lost_s else 0.0
        block[slots[3]] = first_min(held_intervals, float(CONFIRMED_SPAN)) / CONFIRMED_SPAN
        saving = NOT_JUDGED if home[lever] else saving_s(past_sorted, imbalance_age, held_iterations, now_ms, after_ms,
                                                         MIN_SEEN)
        block[slots[4]] = ROUND_TRIP_SPAN if math.isnan(saving) else first_min(
            first_max(saving / first_max(ROUND_TRIP_STALLS * stall, 1e-9), 0.0), ROUND_TRIP_SPAN)
        # a count that is not running (lost 0) is a lever not possible now
        block[slots[5]] = 1.0 if (lost_s > 0 and lasting >= RULE_MIN_SURVIVAL
                                  and pays(saving, stall, ROUND_TRIP_STALLS)
                                  and reached(lost_s, held_intervals, stall, RULE_CONFIRM_INTERVALS, 0.0)) else 0.0
        # falcon-early's test, on its own count; its re-split of a replicated job escalates
        early_lost_s, early_intervals, early_iterations = counts[lever + 3, 0], counts[lever + 3, 1], \
            counts[lever + 3, 2]
        if not (early_lost_s > 0 and lasting >= RULE_MIN_SURVIVAL):
            continue  # the flag stays 0 (the observation starts at zeros)
        early_saving = saving if early_iterations == held_iterations or home[lever] else saving_s(
            past_sorted, imbalance_age, early_iterations, now_ms, after_ms, MIN_SEEN)
        escalates = True
        if lever == 2:  # the escalation's figures (:attr:`ObservationEncoder.escalation_figures`)
            escalation = NOT_JUDGED if home[lever] else saving_s(past_sorted, imbalance_age, early_iterations,
                                                                 figures[2], figures[3], MIN_SEEN)
            escalates = pays(escalation, first_max(figures[6] - figures[5], 0.0), ROUND_TRIP_STALLS)
        # or, a re-split (the rebalance is not), after one interval: its saving over the expected remaining life
        sooner = (lever != 1 and (lever == 0 or both_moves_layers) and timers_steady and early_intervals >= 1
                  and not math.isnan(early_saving) and early_saving >= EXPECTED_LIFE_STALLS * stall)
        block[slots[6]] = 1.0 if (pays(early_saving, stall, ROUND_TRIP_STALLS) and escalates and (sooner or reached(
            early_lost_s, early_intervals, stall, RULE_CONFIRM_INTERVALS, _EARLY_STALLS[lever]))) else 0.0


@njit(cache=True)
def _stage_groups(device_estimate, loads, elevated):  # pragma: no cover
    """Per stage, its stage group's most loaded device: the (D, S) ``device_estimate``'s maximum over the
    replicas, the (history, D, S) ``loads``' in every row, and the (D, S) ``elevated`` iterations'."""
    history, replicas, stages = loads.shape
    estimate, loaded, longest = device_estimate[0].copy(), loads[:, 0, :].copy(), elevated[0].copy()
    for r in range(1, replicas):
        for s in range(stages):
            estimate[s] = max(estimate[s], device_estimate[r, s])
            longest[s] = max(longest[s], elevated[r, s])
            for row in range(history):
                loaded[row, s] = max(loaded[row, s], loads[row, r, s])
    return estimate, loaded, longest


@njit(cache=True)
def _record_loads(loads, state, elevated, steady, load, iterations, stall_s, ended,
                  compute_cv):  # pragma: no cover
    """Shift one interval's device loads into the history and update the timer-noise estimate, the
    dispersion estimate (from each stage's ``compute_cv``, the median), the time since the last
    repartition, how long each device has been loaded (``ended[d]``: the length of a slowdown of device d
    that ended now, else 0) and each device's steady estimate (``steady[0]``: its mean load since its last
    change, ``steady[1]``: the intervals in that mean; a load more than ``CHANGE_TOLERANCE`` off the mean
    starts it again), and counts the devices whose load, an interval ago, jumped by over ``TIMER_JUMP`` (log) and
    came back (``state[5]``, of ``state[6]`` device intervals judged: :attr:`ObservationEncoder.timers_steady`).
    Returns the slowdown estimate (each device's steady mean), how many slowdowns ended, and
    how long the most slowed device has been loaded (the imbalance's age)."""
    devices = load.shape[0]
    clipped = np.minimum(np.maximum(load, 1.0 / MAX_SLOWDOWN_ESTIMATE), MAX_SLOWDOWN_ESTIMATE)
    for row in range(loads.shape[0] - 1, 0, -1):  # newest first
        loads[row] = loads[row - 1]
    loads[0] = clipped
    state[0] += 1.0
    if state[0] > 1:  # timer noise: the median change of a device's log load (a real change moves few devices)
        sample = np.median(np.abs(np.log(clipped / loads[1]))) * MEDIAN_ABS_DIFF_TO_SIGMA
        weight = max(1.0 / (state[0] - 1.0), NOISE_MEMORY)  # a plain mean at first, then a running one
        state[2] += weight * (sample - state[2])
    for d in range(devices):
        if steady[1, d] == 0 or abs(clipped[d] - steady[0, d]) > CHANGE_TOLERANCE * steady[0, d]:
            steady[0, d], steady[1, d] = clipped[d], 1.0
        else:
            steady[1, d] += 1.0
            steady[0, d] += (clipped[d] - steady[0, d]) / steady[1, d]
    typical = np.median(steady[0])  # a device is loaded relative to the others: what slows all is no imbalance
    slowdowns_ended = 0
    for d in range(devices):
        if steady[0, d] > ELEVATED_LOAD * max(typical, 1.0):
            elevated[d] += iterations
        else:
            ended[d] = elevated[d]
            elevated[d] = 0.0
            if ended[d] != 0.0:
                slowdowns_ended += 1
    state[1] = 0.0 if stall_s > 0 else state[1] + iterations
    state[4] = steady[1].min()
    if state[0] >= 3:  # the interval before this one: which devices jumped by TIMER_JUMP and came back
        for d in range(devices):
            older = math.log(loads[2, d])
            if abs(math.log(loads[1, d]) - older) > TIMER_JUMP and abs(math.log(loads[0, d]) - older) < TIMER_JUMP / 2:
                state[5] += 1.0
        state[6] += devices
    if compute_cv.shape[0]:
        weight = max(1.0 / state[0], NOISE_MEMORY)  # a plain mean at first, then a running one
        state[3] += weight * (np.median(compute_cv) - state[3])
    return steady[0].copy(), slowdowns_ended, elevated[np.argmax(steady[0])]


@njit(cache=True)
def _replan_target(replan, current, slowdown, link_factor, num_layers, compute, prefix, roundtrip, roundtrip_by_stage,
                   state_bytes, activation_bytes, inflight, memory_cap, op_stage, op_backward, op_producer, op_link,
                   op_microbatch, prefix_fwd, prefix_bwd, link_ms_after):  # pragma: no cover
    """Fill ``replan`` with the layer re-plan's partition (``replan[0] = -1``: none fits); returns (whether it
    moves, the current bottleneck ms, the current partition's and the re-plan's simulated iteration ms).

    The candidates are the partition minimising the bottleneck for ``slowdown`` and the one minimising it with
    the most slowed stage ``PLAN_MARGIN`` slower; the re-plan is the one that simulates fastest, if faster than
    the current partition. The bottleneck alone misjudges a slowed stage: two partitions with bottlenecks within
    a percent of each other can differ by 4% in iteration time (the pipeline's fill and drain pass every stage
    once), and an estimate a little off picks the slower one (``drift`` on cnn16: the 1.8x stage kept three
    layers, 476 ms an iteration, where two simulate at 458)."""
    num_stages = current.shape[0]
    by_stage = roundtrip_by_stage.copy()
    for s in range(num_stages - 1):
        by_stage[s] /= link_factor[s]
    current_worst = _stage_times(prefix, roundtrip, current, slowdown, num_layers, link_factor).max()
    now_ms = _predict_ms(op_stage, op_backward, op_producer, op_link, op_microbatch, prefix_fwd, prefix_bwd,
                         link_ms_after, current, slowdown, num_layers, link_factor)
    replan[:] = current
    best_ms = now_ms
    most_slowed = np.argmax(slowdown)
    for margin in (0.0, PLAN_MARGIN):
        speeds = 1.0 / slowdown
        speeds[most_slowed] /= 1.0 + margin
        found, _, feasible = bottleneck_dp(compute, by_stage, state_bytes, activation_bytes, speeds, memory_cap,
                                           inflight)
        if not feasible:
            replan[0] = -1
            return False, current_worst, now_ms, now_ms
        same = True
        for s in range(num_stages):
            same = same and found[s] == replan[s]
        if same:
            continue
        found_ms = _predict_ms(op_stage, op_backward, op_producer, op_link, op_microbatch, prefix_fwd, prefix_bwd,
                               link_ms_after, found, slowdown, num_layers, link_factor)
        if found_ms < best_ms * (1 - 1e-9):
            replan[:] = found
            best_ms = found_ms
    return best_ms < now_ms, current_worst, now_ms, best_ms


@njit(cache=True)
def _margined_plans(compute, by_stage, state_bytes, activation_bytes, slowdown, memory_cap,
                    inflight):  # pragma: no cover
    """The partitions minimising the bottleneck for ``slowdown`` with each stage in turn ``PLAN_MARGIN`` slower,
    one row each (rounded to 0.1% as :meth:`Planner.plan` rounds; a row of -1 where none fits)."""
    num_stages = slowdown.shape[0]
    plans = np.full((num_stages, num_stages), -1, dtype=np.int64)
    for stage in range(num_stages):
        margined = slowdown.copy()
        margined[stage] *= 1.0 + PLAN_MARGIN
        found, _, feasible = bottleneck_dp(compute, by_stage, state_bytes, activation_bytes,
                                           1.0 / np.round(margined, 3), memory_cap, inflight)
        if feasible:
            plans[stage] = found
    return plans


@njit(cache=True)
def _replicated_levers(current, replan, by_device, slowdown, link_factor, split, compute, prefix, roundtrip, by_stage,
                       state_bytes, activation_bytes, memory_cap, inflight, prefix_param_bytes, bandwidth_gbps,
                       num_layers, microbatches, minimum):  # pragma: no cover
    """The levers of a replicated job (:meth:`ObservationEncoder._levers`) in one compiled call. The candidate
    partitions, distinct, in order: the one running, the re-plan, the bottleneck optimum for the most slowed
    replica's own devices, and those for every stage group's worst device with each stage in turn
    ``PLAN_MARGIN`` slower (:func:`_margined_plans`); each with its slowest stage group's gradient sync (a ring
    all-reduce of the stage's parameters, as :meth:`~rlpipe.simulator.PipelineCosts.sync_ms`). Returns the
    candidates, one row each (a first row of -1: no partition fits the memory cap), :func:`_lever_kernel`'s four
    results for them, and each replica's most loaded device's load."""
    replicas, num_stages = by_device.shape
    replica_worst, slowest = _replica_worst(by_device)
    candidates = np.empty((num_stages + 3, num_stages), dtype=np.int64)
    candidates[0], candidates[1] = current, replan
    count = 1 if _same_row(candidates, 1, replan) else 2
    # rounded to 0.1% as Planner.plan rounds
    found, _, feasible = bottleneck_dp(compute, by_stage, state_bytes, activation_bytes,
                                       1.0 / np.round(by_device[slowest], 3), memory_cap, inflight)
    if not feasible:
        candidates[0, 0] = -1
        return candidates[:1], np.zeros(1), np.zeros((1, replicas), dtype=np.int64), np.zeros(1), np.zeros(replicas), \
            replica_worst
    margined = _margined_plans(compute, by_stage, state_bytes, activation_bytes, slowdown, memory_cap, inflight)
    for row in range(-1, num_stages):
        plan = found if row < 0 else margined[row]
        if plan[0] >= 0 and not _same_row(candidates, count, plan):
            candidates[count] = plan
            count += 1
    sync = np.empty(count)
    for c in range(count):
        sync[c] = 0.0
        for s in range(num_stages):
            end = candidates[c, s + 1] if s + 1 < num_stages else num_layers
            param_bytes = prefix_param_bytes[end] - prefix_param_bytes[candidates[c, s]]
            sync[c] = max(sync[c], param_bytes * 2 * (replicas - 1) / replicas * 8e-6 / bandwidth_gbps)
    with_split, balanced, with_balanced, replica_ms = _lever_kernel(
        prefix, roundtrip, candidates[:count], sync, by_device, link_factor, split, num_layers, replicas * microbatches,
        minimum)
    return candidates[:count], with_split, balanced, with_balanced, replica_ms, replica_worst


@njit(cache=True)
def _same_row(rows, count, row):  # pragma: no cover
    """Whether ``row`` equals one of the first ``count`` rows of ``rows``."""
    for r in range(count):
        same = True
        for k in range(row.shape[0]):
            same = same and rows[r, k] == row[k]
        if same:
            return True
    return False


@njit(cache=True)
def _encode(observation, replan, link_estimate, figures, loads, state, elevated, slowdown, compute_ms, comm_ms,
            idle_ms, num_layers_held, compute_cv, iteration_ms, stall_s, current, microbatches, s_max, history,
            num_layers, ideal_stage_ms, ideal_iteration_ms, compute, prefix, roundtrip, roundtrip_by_stage,
            state_bytes, activation_bytes, inflight, memory_cap, op_stage, op_backward, op_producer, op_link,
            op_microbatch, prefix_fwd, prefix_bwd, link_ms_after, overhead_s, bandwidth_gbps, one_layer_stall_s,
            g):  # pragma: no cover
    """Fill the per-stage and per-boundary parts of ``observation`` and the first global features (from
    position ``g``), ``replan`` (the layer re-plan's target; ``replan[0] = -1`` if none fits),
    ``link_estimate`` and ``figures`` (predicted iteration ms now and after the re-plan, its stall s), from
    each stage's figures, ``slowdown`` estimate and ``loads`` history (newest first)."""
    num_stages = current.shape[0]
    _estimate_links(link_estimate, comm_ms, current, link_ms_after, microbatches)
    moved, current_worst, predicted_now, predicted_replan = _replan_target(
        replan, current, slowdown, link_estimate, num_layers, compute, prefix, roundtrip, roundtrip_by_stage,
        state_bytes, activation_bytes, inflight, memory_cap, op_stage, op_backward, op_producer, op_link,
        op_microbatch, prefix_fwd, prefix_bwd, link_ms_after)
    if replan[0] < 0:
        return
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
        observation[base + 7] = compute_cv[s]
        for row in range(1, recorded):
            observation[base + STAGE_FEATURES + row - 1] = loads[row, s] - 1.0
    moves = move_bottlenecks_kernel(prefix, roundtrip, current, slowdown, num_layers, link_estimate)
    base = s_max * width
    most_bound = 0.0
    for b in range(num_stages - 1):
        for k in range(2):
            value = moves[b, k] / current_worst - 1.0
            observation[base + BOUNDARY_FEATURES * b + k] = 0.0 if np.isnan(value) else value
        observation[base + BOUNDARY_FEATURES * b + 2] = 1.0 / link_estimate[b] - 1.0
        edge = current[b + 1]
        after = current[b + 2] if b + 2 < num_stages else num_layers
        slower = max((prefix[edge] - prefix[current[b]]) * slowdown[b],
                     (prefix[after] - prefix[edge]) * slowdown[b + 1])
        bound = roundtrip[edge - 1] / link_estimate[b] / max(slower, 1e-12)
        observation[base + BOUNDARY_FEATURES * b + 3] = bound
        most_bound = max(most_bound, bound)

    unit_s = ITERATIONS_UNIT * iteration_ms / 1e3  # the duration unit's length now, s
    replan_stall_s = _stall_s(state_bytes, current, replan, num_layers, overhead_s, bandwidth_gbps) if moved else 0.0
    figures[0], figures[1], figures[2] = predicted_now, predicted_replan, replan_stall_s
    observation[g] = math.log1p(state[1] / ITERATIONS_UNIT) / LOG_SPAN
    observation[g + 3] = ideal_iteration_ms / iteration_ms
    observation[g + 4] = num_stages / s_max
    observation[g + 5] = stall_s / unit_s
    observation[g + 6] = one_layer_stall_s / unit_s
    observation[g + 20] = most_bound
