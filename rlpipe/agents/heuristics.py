"""Hand-written policies: the yardstick and the fallback of the learned one.

- :class:`StaticPolicy`: the launch partition forever (GPipe, PipeDream, DeepSpeed).
- :class:`GreedyPolicy`: one layer off the slowest stage toward its faster neighbour.
- :class:`DynPipePolicy`: DynPipe's trigger-and-replan rule.
- :class:`ThresholdPolicy`: the ski-rental rule: re-plan once the lost time pays the stall.
- :class:`FalconPolicy`: FALCON's escalation for replicated jobs: micro-batches first, then layers.
- :class:`EarlyFalconPolicy`: FALCON's escalation acting an interval sooner after a large loss (ours; the
  learned policy's teacher).
- :class:`OraclePolicy`: simulation only; sees the future and prices migrations and rebalances.
- :class:`HindsightPolicy`: simulation only; the oracle's timing with the learned policy's actions (its teacher).
- :class:`OnsetBlindOraclePolicy`: simulation only; the oracle told of each slowdown only once it has begun.

``threshold``, ``dynpipe`` and ``greedy`` act on layers only, as their papers do; ``falcon`` and the
oracle also move micro-batches between data-parallel replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlpipe.decision import DecisionContext, PolicyBase
from rlpipe.envs.known_future import KnownConditions, KnownFutureView
from rlpipe.envs.repartition import FutureView, Plan
from rlpipe.observation import (
    BOTH,
    EARLY_REBALANCE_STALLS,
    EARLY_RESPLIT_STALLS,
    EXPECTED_LIFE_STALLS,
    KEEP,
    ONSET,
    OUTLIVED_MIN_GAIN,
    REBALANCE,
    REPLAN,
    ROUND_TRIP_STALLS,
    RULE_CONFIRM_INTERVALS,
    RULE_MIN_GAIN,
    RULE_MIN_SURVIVAL,
    LostTime,
    ObservationEncoder,
    round_trip_pays,
)


@dataclass
class StaticPolicy(PolicyBase):
    """Never repartitions."""

    name: str = "static"

    def reset(self) -> None:
        pass

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> int:
        return KEEP


@dataclass
class GreedyPolicy(PolicyBase):
    """Move one layer off the slowest stage toward its faster neighbour.

    Args:
        threshold: act when the slowest stage is this much slower than the stage mean (0.15: 15%).
        release: once acting, keep acting until the imbalance falls below this (hysteresis).
        min_gain: a move must shrink the predicted bottleneck by at least this fraction.
        cooldown: intervals to wait after a move before the next one.
        smoothing: intervals of device load averaged, so that timer noise does not trigger moves.
        reverse_factor: undoing the previous move needs this many times ``min_gain`` (no ping-pong).
    """

    threshold: float = 0.15
    release: float = 0.05
    min_gain: float = 0.08
    cooldown: int = 2
    smoothing: int = 4
    reverse_factor: float = 2.0
    name: str = "greedy"
    _active: bool = field(default=False, init=False)
    _wait: int = field(default=0, init=False)
    _last_move: tuple[int, int] | None = field(default=None, init=False)

    def reset(self) -> None:
        self._active, self._wait, self._last_move = False, 0, None

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> int:
        if self._wait > 0:
            self._wait -= 1
            return KEEP
        encoder, boundaries = context.encoder, context.boundaries
        loads = list(encoder.loads)[: self.smoothing]
        slowdown = np.mean(loads, axis=0)
        stage_ms = encoder.planner.stage_ms(boundaries, slowdown)
        imbalance = stage_ms.max() / stage_ms.mean() - 1.0
        if imbalance < (self.release if self._active else self.threshold):
            self._active = False
            return KEEP
        slowest = int(np.argmax(stage_ms))
        moves = encoder.planner.move_bottlenecks(boundaries, slowdown)  # (boundary-1, [-1, +1])
        options = []
        if slowest + 1 < len(boundaries):  # give the slowest stage's last layer to the next stage
            options.append((stage_ms[slowest + 1], slowest + 1, -1))
        if slowest > 0:  # give its first layer to the previous stage
            options.append((stage_ms[slowest - 1], slowest, +1))
        for _, boundary, delta in sorted(options):  # faster neighbour first
            after = moves[boundary - 1, 0 if delta < 0 else 1]
            action = encoder.layout.move_action(boundary, delta)
            needed = self.min_gain * (self.reverse_factor if self._last_move == (boundary, -delta) else 1.0)
            if mask[action] and after < stage_ms.max() * (1.0 - needed):
                self._active, self._wait, self._last_move = True, self.cooldown, (boundary, delta)
                return action
        self._active = False
        return KEEP


@dataclass
class DynPipePolicy(PolicyBase):
    """DynPipe (TPDS 2025): when a stage's compute time drifts past a ratio of its baseline, re-plan
    to the partition that minimises the pipeline time for the estimated slowdowns.

    The baseline is each device's load (measured compute over profiled compute of its layers, so
    that it survives layers moving) in the first interval after the last (re)plan; every
    ``check_every_iterations`` iterations the mean load since the last check is compared with it.

    Args:
        high: trigger when a stage's load is at least this multiple of its baseline (DynPipe: 2.0).
        low: trigger when it is at most this multiple (DynPipe: 0.5).
        check_every_iterations: iterations between checks (DynPipe: 50), whatever the decision interval.
    """

    high: float = 2.0
    low: float = 0.5
    check_every_iterations: int = 50
    name: str = "dynpipe"
    _baseline: np.ndarray | None = field(default=None, init=False)
    _window: np.ndarray | None = field(default=None, init=False)  # iteration-weighted load since the last check
    _window_iterations: int = field(default=0, init=False)

    def reset(self) -> None:
        self._baseline, self._window, self._window_iterations = None, None, 0

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> int:
        encoder = context.encoder
        load = encoder.loads[0]  # this interval's measured load, as DynPipe's monitor reports it
        if self._baseline is None or encoder.intervals_since_repartition == 0:
            self._baseline, self._window, self._window_iterations = load.copy(), None, 0
            return KEEP
        iterations = encoder.latest.iterations if encoder.latest is not None else 1
        self._window = load * iterations + (0.0 if self._window is None else self._window)
        self._window_iterations += iterations
        if self._window_iterations < self.check_every_iterations:
            return KEEP
        ratio = self._window / self._window_iterations / self._baseline
        self._window, self._window_iterations = None, 0
        if (np.any(ratio >= self.high) or np.any(ratio <= self.low)) and mask[REPLAN]:
            self._baseline = None  # re-measured in the interval after the re-plan
            return REPLAN
        return KEEP


@dataclass
class ThresholdPolicy(PolicyBase):
    """The ski-rental rule (Greyhound, USENIX ATC'25): re-plan once the time already lost to the
    current imbalance reaches the re-plan's stall, for a gain the estimates can vouch for, and only for an
    imbalance this run's history says is likely to last.

    The count is :class:`~rlpipe.observation.LostTime` (the observation carries the same count with
    the default arguments): while the re-plan's predicted gain exceeds ``max(min_gain, noise_multiple x
    the noise of the slowdown estimates)`` (the timer noise over the square root of the intervals behind
    them, so a small lasting loss is acted on once it is sure), each interval adds the time it lost. Once
    that reaches the re-plan's stall, the gain has held for ``confirm_intervals`` intervals in a row (one
    noisy interval among many stages is no imbalance; an interval whose conditions changed within it, as
    its compute's dispersion shows, neither counts nor breaks the run; on the launch plan, pauses hopping from
    device to device start it again: ``ObservationEncoder.imbalance_moved``), and the slowdowns this run has
    seen end say the imbalance is at least ``min_survival`` likely to last as long again (short pauses, such as garbage
    collection, that always end soon are held through), re-plan. Against a clairvoyant that knows how
    long the imbalance lasts, paying at most the stall twice is the classic 2-competitive bound.

    That bound prices the move alone. A move away from the launch plan has a way back: once the imbalance
    ends, the job runs a plan fitted to it until the count brings it home (up to a stall's worth of time
    lost, by the same count) and then pays the stall back. So such a move must also pay for its round trip
    (:func:`pays_round_trip`): over the imbalance's expected remaining life, judged by the slowdowns this
    run has seen end, it must save ``round_trip`` times its stall. Pauses of a second or two on iterations
    of milliseconds (``seqlen`` on a small model) otherwise cost a stall there and one back, every time.

    Args:
        min_gain: the smallest predicted gain acted on (0.03: 3%).
        noise_multiple: the gain must also exceed this many times the noise of the estimates.
        confirm_intervals: intervals in a row the gain must hold before a re-plan.
        min_survival: the least likelihood (the encoder's ``imbalance_survival``) that the imbalance lasts
            as long again (0.3; with no slowdown ended yet it is 0.5).
        round_trip: stalls a move away from the launch plan must save over the imbalance's expected
            remaining life (3: its own, the time lost after the imbalance ends, the stall back; 0: no test).
    """

    min_gain: float = RULE_MIN_GAIN
    noise_multiple: float = 3.0
    confirm_intervals: int = RULE_CONFIRM_INTERVALS
    min_survival: float = RULE_MIN_SURVIVAL
    round_trip: float = ROUND_TRIP_STALLS
    name: str = "threshold"
    _count: LostTime = field(default_factory=LostTime, init=False)
    _running: JobPlan = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._count = LostTime(self.min_gain, self.noise_multiple)

    def reset(self) -> None:
        self._count.reset()
        self._running = None

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> int:
        encoder = context.encoder
        if encoder.latest is None:
            return KEEP
        self._running = restart_on_change(self._running, context, self._count)
        fires = ski_rental_fires(self._count, encoder.replan_figures, encoder, bool(mask[REPLAN]),
                                 self.confirm_intervals, self.min_survival)
        pays = fires and pays_round_trip(self._count, encoder.replan_figures, encoder,
                                         (encoder.targets.replan, encoder.split), self.round_trip)
        return REPLAN if pays else KEEP


JobPlan = tuple[tuple[int, ...], tuple[int, ...]] | None  # (partition, split) a rule last saw running


def restart_on_change(running: JobPlan, context: DecisionContext, *counts: LostTime) -> JobPlan:
    """Restart ``counts`` when the partition or split in force differs from the one last seen; returns the
    one in force. The counts follow the job that runs rather than the rule's own advice: acting changes the
    job, so under its own control a rule restarts exactly as if it reset on acting, and a rule that only
    advises (labelling another policy's states, or a refused change) keeps counting what is still lost."""
    now = (tuple(context.boundaries), tuple(context.split or context.encoder.split))
    if running is not None and now != running:
        for count in counts:
            count.reset()
    return now


def ski_rental_fires(count: LostTime, figures: np.ndarray, encoder: ObservationEncoder, possible: bool,
                     confirm_intervals: int, min_survival: float, early_stalls: float = 0.0) -> bool:
    """Count one interval for an action with ``figures`` (predicted iteration ms now, after it, its stall s);
    whether the action pays now: its lost time has reached its stall, its gain held ``confirm_intervals``
    intervals (or, ``early_stalls`` > 0, one interval lost that many stalls) and the imbalance is likely
    enough to last."""
    now_ms, after_ms, stall_s = figures
    assert encoder.latest is not None
    if encoder.imbalance_moved:
        count.reset()
    count.update(now_ms, after_ms, encoder.estimate_noise, encoder.latest, possible, encoder.transient,
                 encoder.plan_outlived)
    return (possible and count.reached(stall_s, confirm_intervals, early_stalls)
            and encoder.imbalance_survival() >= min_survival)


def pays_round_trip(count: LostTime, figures: np.ndarray, encoder: ObservationEncoder,
                    plan: tuple[tuple[int, ...], tuple[int, ...]], round_trip: float) -> bool:
    """Whether a move to ``plan`` (partition, split), with ``figures`` (predicted iteration ms now, after it,
    its stall s), pays for its round trip: the time it saves over the imbalance's expected remaining life
    (:meth:`ObservationEncoder.round_trip_saving`, the imbalance's age at least how long ``count`` has held)
    must reach ``round_trip`` stalls. Home to the launch plan it always pays; with too little history to
    judge, too: the ski-rental count alone decides."""
    if round_trip <= 0:  # off: no need to estimate the saving
        return True
    return round_trip_pays(encoder.round_trip_saving(count.held_iterations, figures, plan), round_trip)


def outlives_wait(count: LostTime, figures: np.ndarray, encoder: ObservationEncoder, possible: bool,
                  plan: tuple[tuple[int, ...], tuple[int, ...]], min_survival: float, stalls: float) -> bool:
    """Whether a move to ``plan`` (partition, split), with ``figures`` (predicted iteration ms now, after it, its
    stall s), pays before the ski rental's wait ends: its gain has cleared the count's bar for one whole interval
    (``count``, already counted this interval), it would save ``stalls`` of its stalls over the imbalance's
    expected remaining life (:meth:`ObservationEncoder.round_trip_saving`), the imbalance is likely enough to
    last, and this run's timers are steady (:attr:`ObservationEncoder.timers_steady`: one interval of evidence
    cannot tell a slowdown from a timer outlier, which reads a device's whole interval long). ``stalls`` <= 0:
    off."""
    if stalls <= 0 or not possible or count.held_intervals < 1 or not encoder.timers_steady:
        return False
    saving = encoder.round_trip_saving(count.held_iterations, figures, plan)
    return saving is not None and saving[0] >= stalls * saving[1] and encoder.imbalance_survival() >= min_survival


@dataclass
class FalconPolicy(PolicyBase):
    """FALCON (Alibaba, USENIX ATC'25): mitigate a straggler in a replicated job with the cheap lever
    first, the costly one once the slowdown lasts.

    Two ski-rental counts (:class:`~rlpipe.observation.LostTime`) run side by side: the time lost to the
    replicas' imbalance, against a rebalance of micro-batches (its stall: stages rebuilt, no state moved),
    and the time lost to every imbalance, against a re-split of the layers in every replica with the split
    that fits it (its stall: the layers' parameters and optimizer state moved). Each acts once its count
    reaches its stall, its gain has held ``confirm_intervals`` intervals in a row and the imbalance is
    likely to last (as the threshold rule judges them). A rebalance costs less, so it fires first, and the
    counts start again from the rebalanced job (from any change of partition or split); the re-split
    follows when what is still lost outlasts its larger stall. Either lever, away from the launch plan, must
    also pay for its round trip, as in the threshold rule. On one pipeline it is the threshold rule.

    Args (the threshold rule's, same defaults): min_gain (0.03), noise_multiple (3), confirm_intervals (2),
    min_survival (0.3), round_trip (3); and early_stalls: a re-split may fire after one interval once the
    time lost reaches this many of its stalls (0: off, as FALCON; see :class:`EarlyFalconPolicy`);
    early_rebalance_stalls: the same for the rebalance (0: off); escalation: a re-split pays its round trip
    with what it saves beyond the rebalance's plan, not beyond the plan running (False, as the rule always
    was); onset: a re-split may also fire at a slowdown's onset interval, where the encoder's onset test
    passes (the ``ONSET`` action; False, as FALCON; ``ObservationEncoder._onset``); outlived_gain: the
    smallest gain both counts take while the plan in force outlived the slowdown it was fitted to (None:
    ``min_gain``, as FALCON; ``ObservationEncoder.plan_outlived``); expected_life_stalls: a re-split may also
    fire after one interval once it saves this many of its stalls over the imbalance's expected remaining life,
    where the timers are steady (:func:`outlives_wait`; 0: off, as FALCON).
    """

    min_gain: float = RULE_MIN_GAIN
    noise_multiple: float = 3.0
    confirm_intervals: int = RULE_CONFIRM_INTERVALS
    min_survival: float = RULE_MIN_SURVIVAL
    round_trip: float = ROUND_TRIP_STALLS
    early_stalls: float = 0.0
    early_rebalance_stalls: float = 0.0
    escalation: bool = False
    onset: bool = False
    outlived_gain: float | None = None
    expected_life_stalls: float = 0.0
    name: str = "falcon"
    _rebalance: LostTime = field(default_factory=LostTime, init=False)
    _replan: LostTime = field(default_factory=LostTime, init=False)
    _running: JobPlan = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._rebalance = LostTime(self.min_gain, self.noise_multiple, self.outlived_gain)
        self._replan = LostTime(self.min_gain, self.noise_multiple, self.outlived_gain)

    def reset(self) -> None:
        self._rebalance.reset()
        self._replan.reset()
        self._running = None

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> int:
        encoder = context.encoder
        if encoder.latest is None:
            return KEEP
        # the escalation starts again from a changed job (the rebalanced one, say)
        self._running = restart_on_change(self._running, context, self._rebalance, self._replan)
        targets = encoder.targets
        if encoder.planner.replicas == 1:  # one pipeline: the threshold rule
            fires = ski_rental_fires(self._replan, encoder.replan_figures, encoder, bool(mask[REPLAN]),
                                     self.confirm_intervals, self.min_survival, self.early_stalls) or outlives_wait(
                self._replan, encoder.replan_figures, encoder, bool(mask[REPLAN]), (targets.replan, encoder.split),
                self.min_survival, self.expected_life_stalls)
            pays = fires and pays_round_trip(self._replan, encoder.replan_figures, encoder,
                                             (targets.replan, encoder.split), self.round_trip)
            return REPLAN if pays else ONSET if self.onset and mask[ONSET] else KEEP
        rebalance = ski_rental_fires(self._rebalance, encoder.rebalance_figures, encoder, bool(mask[REBALANCE]),
                                     self.confirm_intervals, self.min_survival, self.early_rebalance_stalls)
        rebalance = rebalance and pays_round_trip(self._rebalance, encoder.rebalance_figures, encoder,
                                                  (context.boundaries, targets.rebalance), self.round_trip)
        # the re-split comes with the split that fits it: which action reaches it
        both_action = next((action for action, plan in ((REPLAN, (targets.replan, encoder.split)),
                                                        (REBALANCE, (context.boundaries, targets.rebalance)))
                            if plan == targets.both and mask[action]), BOTH)
        resplit = ski_rental_fires(self._replan, encoder.both_figures, encoder, bool(mask[both_action]),
                                   self.confirm_intervals, self.min_survival, self.early_stalls) or (
            targets.both[0] != tuple(context.boundaries)  # a re-split, not a rebalance under its name
            and outlives_wait(self._replan, encoder.both_figures, encoder, bool(mask[both_action]), targets.both,
                              self.min_survival, self.expected_life_stalls))
        if resplit and pays_round_trip(self._replan, encoder.both_figures, encoder, targets.both, self.round_trip) and (
                not self.escalation
                or pays_round_trip(self._replan, encoder.escalation_figures, encoder, targets.both, self.round_trip)):
            return both_action
        if self.onset and mask[ONSET]:
            return ONSET
        return REBALANCE if rebalance else KEEP


@dataclass
class EarlyFalconPolicy(FalconPolicy):
    """FALCON's escalation whose re-split skips the second confirming interval when the first already lost
    ``early_stalls`` (4) of its stalls: ours, not FALCON's, and the learned policy's teacher.

    Confirming an imbalance for a second interval guards against a move that will not pay; once a single
    interval has lost more than the move's round trip (its stall there and back, with the time lost in
    between: ``round_trip``, 3 stalls), waiting to confirm risks more than a wrong move costs. Only large
    slowdowns lose that much in one interval, and those, in the presets, are mostly lasting ones (co-location
    and fail-slow stragglers of minutes): FALCON then re-splits an interval later than it could. A rebalance
    confirmed after one interval whatever the loss lost on replicated ``mixed`` and ``persistent`` jobs
    (``docs/experiments/early_resplit.py``); it skips the second only after a large loss, as the re-split (below).
    Every other test (survival, round trip, rebalance first) is FALCON's.

    It also re-splits at the onset interval itself, where the interval's last iterations show a large worsening
    that this run's history says will last (``ObservationEncoder._onset``, the ``ONSET`` action): the rules skip
    that interval, whose mean mixes two conditions, and on ``heavy`` acting a whole interval after the onset
    leaves most of the oracle's lead (``docs/experiments/onset_blind.py``).

    On a replicated job its escalation is strict: a re-split must also pay its round trip with what it adds to
    the rebalance, for the stall it costs beyond the rebalance's (:attr:`ObservationEncoder.escalation_figures`).
    FALCON re-splits wherever both levers' tests pass, and on small models with pauses of a second (``seqlen``,
    4 x 4, mlp16) it paid a re-split's stall there and back for a plan the rebalance nearly reached, 8 to 12
    times an hour. Its rebalance may then also fire after one interval that lost ``early_rebalance_stalls`` (4)
    of its stalls, as the re-split may: the pauses there are over before a second interval confirms them.

    Once the plan in force has outlived the slowdown it was fitted to (a stage then slowed has recovered), both
    counts take gains from ``outlived_gain`` (1%) rather than 3%: the way back to the plan that fits is often a
    smaller step than the way out was, and a slowdown that ended is a known cause, not noise. FALCON held a plan
    fitted to a co-location of two minutes for the remaining 40 minutes of a run, 2.1% slow.

    The ski rental's wait is the worst-case answer, 2-competitive whatever the slowdowns' lengths; this run's
    ended slowdowns say how long the imbalance is likely to go on. So a re-split also fires after one interval
    whose gain cleared the count's bar, once it would save ``expected_life_stalls`` (12) of its stalls over the
    imbalance's expected remaining life, where the run's timers are steady (:func:`outlives_wait`; on the README
    table's episodes heavy +0.0007 at 4 x 1 and +0.0032 at 4 x 2, mixed -0.0016 there; on held-out episodes with
    realistic timers +0.0002, where without the timers' test outliers cost -0.0043:
    ``docs/experiments/expected_life.py``).
    """

    early_stalls: float = EARLY_RESPLIT_STALLS
    early_rebalance_stalls: float = EARLY_REBALANCE_STALLS
    escalation: bool = True
    onset: bool = True
    outlived_gain: float | None = OUTLIVED_MIN_GAIN
    expected_life_stalls: float = EXPECTED_LIFE_STALLS
    name: str = "falcon-early"


@dataclass
class OraclePolicy(PolicyBase):
    """Clairvoyant (simulation only): plans the next ``horizon_s`` seconds of the true future, both levers.

    The horizon is cut into decision epochs as long as the last interval (at most ``max_epochs``
    of them; with shorter intervals an epoch spans several). A dynamic program over
    (epoch, plan) finds the sequence of plans (partition and micro-batch split) that runs the most
    iterations, each switch paying its stall; the first decision of that plan is taken, and the plan is
    redone at the next interval (receding horizon). Candidates: the current plan and the best plan for
    the true conditions at now and at each change within the horizon.
    """

    horizon_s: float = 600.0
    max_candidates: int = 8
    max_epochs: int = 40  # longer epochs than an interval when intervals are short: bounded planning cost
    samples_per_epoch: int = 0  # 0: integrate every change of conditions; k: k instants per epoch (cheaper)
    name: str = "oracle"
    live: bool = field(default=False, init=False)

    def reset(self) -> None:
        pass

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> Plan:
        current = _running(context)
        candidates = [current] + [c for c in self.future(context).candidates(self.horizon_s, self.max_candidates)
                                  if c != current]
        return candidates[int(np.argmax(self.work_if_switched(context, candidates, len(candidates))))]

    def future(self, context: DecisionContext) -> FutureView:
        """What this planner knows of the future: all of it."""
        return _future(context)

    def work_if_switched(self, context: DecisionContext, candidates: list[Plan], first_choices: int) -> np.ndarray:
        """For each of the first ``first_choices`` candidates (``candidates[0]`` the plan running now): the
        iterations the horizon holds if the job switches to it now (paying the stall) and then follows the
        best sequence of candidates (the dynamic program). All zero when the run is over."""
        future = self.future(context)
        latest = context.encoder.latest
        assert latest is not None  # a decision always follows an observed interval
        epoch_s = max(latest.wall_s - latest.stall_s, self.horizon_s / self.max_epochs)
        end_s = min(future.now_s + self.horizon_s, future.end_s)
        starts = np.arange(future.now_s, end_s, epoch_s)
        starts = starts[starts < end_s - 1e-6]  # no zero-length last epoch
        if len(starts) == 0:
            return np.zeros(first_choices)
        ends = np.append(starts[1:], end_s)
        rate = self._rates(future, candidates, starts, ends)
        stall = np.array([[future.stall_s(a, b) for b in candidates] for a in candidates])
        lengths = ends - starts
        value = np.zeros(len(candidates))  # best work from the next epoch on, by plan held
        for epoch in range(len(starts) - 1, 0, -1):
            # work[a, b]: in epoch ``epoch``, holding a, switch to b (b == a: no stall) and go on
            work = np.maximum(lengths[epoch] - stall, 0.0) * rate[:, epoch][None, :] + value[None, :]
            value = work.max(axis=1)
        chosen = slice(0, first_choices)
        return np.maximum(lengths[0] - stall[0, chosen], 0.0) * rate[chosen, 0] + value[chosen]

    def _rates(self, future: FutureView, candidates: list[Plan], starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """rate[c, e]: iterations per second of candidate c during epoch e: over every change of conditions
        in the epoch, or (``samples_per_epoch`` > 0) the mean of that many evenly spaced instants."""
        if not self.samples_per_epoch:
            return np.array([[future.iterations_between(c, a, b) / (b - a) for a, b in zip(starts, ends)]
                             for c in candidates])
        fractions = (np.arange(self.samples_per_epoch) + 0.5) / self.samples_per_epoch
        instants = starts[:, None] + (ends - starts)[:, None] * fractions[None, :]
        return np.array([[np.mean([future.iterations_per_s(c, t) for t in row]) for row in instants]
                         for c in candidates])


@dataclass
class HindsightPolicy(OraclePolicy):
    """The oracle restricted to the learned policy's own actions (simulation only): of keep, re-plan,
    rebalance and both, as the observation's estimates would carry them out, the one the true future
    rewards most (the oracle's dynamic program over the horizon, any plan allowed after this decision).

    Its timing is clairvoyant (it moves at a slowdown's onset only if the slowdown will last, and holds
    through bursts), its plans are the ones the learned policy would get: a teacher (``imitate:
    hindsight``), and a yardstick of how much of the oracle's lead is timing rather than plans. Its
    defaults plan a shorter horizon than the oracle's, with fewer candidates and the conditions sampled
    within an epoch, so that labelling training decisions keeps pace.
    """

    horizon_s: float = 300.0
    max_candidates: int = 6
    max_epochs: int = 20
    samples_per_epoch: int = 3  # conditions that change every second (seqlen) cost 3 rows an epoch, not 15
    min_gain: float = 0.002  # a move must win this share of the horizon's work: sampled conditions are noisy
    name: str = "hindsight"

    def act(self, observation: np.ndarray, mask: np.ndarray,  # type: ignore[override]
            context: DecisionContext) -> int:
        current = _running(context)
        targets: dict[int, Plan] = {}  # action -> the plan it leads to, each plan once
        for action in (REPLAN, REBALANCE, BOTH):
            target = context.encoder.decode(action, context.boundaries, current[1]) if mask[action] else None
            if target is not None and target != current and target not in targets.values():
                targets[action] = target
        if not targets:
            return KEEP
        firsts = [current, *targets.values()]
        candidates = firsts + [c for c in self.future(context).candidates(self.horizon_s, self.max_candidates)
                               if c not in firsts]
        work = self.work_if_switched(context, candidates, len(firsts))
        choice = int(np.argmax(work))
        if choice == 0 or work[choice] <= work[0] * (1.0 + self.min_gain):
            return KEEP
        return list(targets)[choice - 1]


@dataclass
class OnsetBlindOraclePolicy(OraclePolicy):
    """The oracle told of each slowdown only once it has begun (simulation only): it knows how every slowdown
    already under way goes on and when it ends, and nothing of one that has not started
    (:class:`~rlpipe.envs.known_future.KnownFutureView`); it plans both levers as the oracle does.

    It is the yardstick for issue #19's "where a causal policy cannot": a causal policy never knows more than
    this (it must guess the durations this planner is told, and where onsets come at random it cannot
    foresee them either), so the part of the oracle's lead this planner misses is foresight of onsets, out of
    a causal policy's reach. Not a proven bound: the oracle's plan is a receding-horizon program, and where
    onsets follow a pattern (``periodic``, ``drift``'s steps) a causal policy could learn to expect them.

    Args (the oracle's, and): lag_intervals: a worsening becomes known this many decision intervals (of the
    latest interval's length) after it began (0: at the first decision after its onset; 1: once a whole
    interval has shown it, as early as the rules' count can start).
    """

    lag_intervals: float = 0.0
    name: str = "onset-blind"
    _known: KnownConditions | None = field(default=None, init=False)
    _view: tuple[float, KnownFutureView] | None = field(default=None, init=False)

    def reset(self) -> None:
        self._known, self._view = None, None

    def future(self, context: DecisionContext) -> FutureView:
        """The future as known at the decision: slowdowns under way, none to come."""
        env = _future(context).env
        if self._known is None or self._known.truth is not env.job:  # a new episode
            self._known, self._view = KnownConditions(env.job), None
        if self._view is None or self._view[0] != env.time_s:
            latest = context.encoder.latest
            lag_s = self.lag_intervals * (latest.wall_s if latest is not None else 0.0)
            self._view = (env.time_s, KnownFutureView(env, self._known, self.horizon_s, lag_s))
        return self._view[1]


def _running(context: DecisionContext) -> Plan:
    """The partition and split the job runs now."""
    return tuple(context.boundaries), tuple(context.split or context.encoder.split)


def _future(context: DecisionContext) -> FutureView:
    """The simulator's view of the true future."""
    if context.future is None:
        raise RuntimeError("a clairvoyant policy needs the simulator's future (it cannot run live)")
    return context.future
