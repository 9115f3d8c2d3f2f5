"""The future as the best-informed causal policy could know it: every slowdown already under way, with
its true course and end, and nothing that has not begun.

A causal policy cannot see an onset coming: at best it learns of a slowdown once the slowdown has begun,
and must then guess how long it will last. :class:`KnownFutureView` answers a clairvoyant planner's
questions (:class:`~rlpipe.envs.repartition.FutureView`'s) with that knowledge and no more: each device's
slowdown and each link's bandwidth follow the truth ahead until they next get worse (a new onset on that
device or link), and hold what they were just before it from then on. A slowdown that ends is known to
end, and when; one that starts later is not known at all. The oracle planning with this view
(``onset-blind``) bounds what knowing how long slowdowns last can take of the oracle's lead: the rest of
that lead is foresight of onsets, which no causal policy has.
"""

from __future__ import annotations

import numpy as np

from rlpipe.envs.job import SimulatedJob
from rlpipe.envs.repartition import FutureView, Plan, RepartitionEnv
from rlpipe.interference import InterferenceTrace

Segment = tuple[int, float, float]  # (row of the known conditions, from s, until s)


class KnownConditions:
    """The condition rows that known futures are made of in one episode, and a job that times plans under
    them. Rows are added as decisions meet new conditions; the job's caches are keyed by row, and a row
    once added never changes, so they stay valid as the table grows.

    Args:
        truth: the episode's simulated job (its costs, layout, overheads and micro-batch patterns are shared).
    """

    def __init__(self, truth: SimulatedJob):
        self.truth = truth
        trace = truth.trace
        self._rows: dict[bytes, int] = {}
        self._slowdown: list[np.ndarray] = []
        self._links: list[np.ndarray] = []
        self._spread: list[float] = []
        self.job = SimulatedJob(truth.costs, trace, truth.replicas, truth.num_stages, truth.microbatches,
                                truth.schedule, truth.bandwidth_gbps, truth.overheads, truth.ideal_boundaries,
                                np.random.default_rng(0))
        self.job.patterns = truth.patterns  # the same micro-batches as the truth

    def row(self, slowdown: np.ndarray, links: np.ndarray, spread: float) -> int:
        """The row of these conditions (device slowdowns, link factors, micro-batch spread), added if new."""
        key = slowdown.tobytes() + links.tobytes() + np.float64(spread).tobytes()
        found = self._rows.get(key)
        if found is None:
            found = self._rows[key] = len(self._slowdown)
            self._slowdown.append(slowdown.copy())
            self._links.append(links.copy())
            self._spread.append(spread)
            truth = self.truth.trace
            count = len(self._slowdown)
            self.job.trace = InterferenceTrace(  # the job reads its rows from here
                np.arange(count, dtype=float), np.array(self._slowdown), np.array(self._links),
                truth.duration_s, truth.name, None if truth.microbatch_spread is None else np.array(self._spread))
        return found

    def segments(self, now_s: float, end_s: float, known_until_s: float | None = None) -> list[Segment]:
        """The known conditions from ``now_s`` to ``end_s``: stretches of constant conditions as rows of this
        table. Each device's slowdown and link's factor follow the true trace until their first worsening
        after ``known_until_s`` (default ``now_s``; a change at that very instant is not yet known, nor is the
        trace's first row at time 0 before any interval has been seen) and hold the value before it from then
        on."""
        trace = self.truth.trace
        known_until_s = now_s if known_until_s is None else min(known_until_s, now_s)
        first, last = trace.index_at(now_s), trace.index_at(max(end_s - 1e-9, now_s))
        # the conditions known to hold before the unknown stretch begins: nominal before the run starts
        before = trace.index_at(known_until_s - 1e-9) if known_until_s > 0 else -1
        rows = list(range(max(before, 0), last + 1))
        slowdown, links = trace.slowdown[rows], trace.link_factor[rows]
        if before < 0:
            slowdown = np.vstack([np.ones(trace.num_devices), slowdown])
            links = np.vstack([np.ones(trace.link_factor.shape[1]), links])
        else:
            slowdown, links = slowdown.copy(), links.copy()
        _hold_before_first_worsening(slowdown, worse=np.greater)
        _hold_before_first_worsening(links, worse=np.less)
        skip = len(slowdown) - (last + 1 - first)  # the rows before the one in force now
        times = trace.change_s[first:last + 1].tolist()
        times[0] = now_s
        segments: list[Segment] = []
        for k in range(len(times)):
            row = self.row(slowdown[skip + k], links[skip + k], trace.spread_at_row(first + k))
            until = times[k + 1] if k + 1 < len(times) else end_s
            if segments and segments[-1][0] == row:  # a change the view does not know of
                segments[-1] = (row, segments[-1][1], until)
            else:
                segments.append((row, times[k], until))
        return segments


def _hold_before_first_worsening(values: np.ndarray, worse: np.ufunc) -> None:
    """In place, per column of ``values`` (rows in time order, the first in force now): from the first row
    where the column gets ``worse`` than the row before, every row holds the value before it."""
    if len(values) < 2:
        return
    worsened = worse(values[1:], values[:-1])
    for column in np.flatnonzero(worsened.any(axis=0)):
        onset = int(np.argmax(worsened[:, column])) + 1
        values[onset:, column] = values[onset - 1, column]


class KnownFutureView(FutureView):
    """A clairvoyant planner's view of the future, limited to what :class:`KnownConditions` knows at the
    decision: the next ``horizon_s`` seconds, the last known conditions held after that. The stall of a
    change is the truth's (the conditions now are known).

    Args:
        env: the environment at the decision.
        known: the episode's known-conditions table.
        horizon_s: how far ahead the planner asks, s.
        lag_s: a worsening is known only once it is this old, s (0: as soon as it has begun).
    """

    def __init__(self, env: RepartitionEnv, known: KnownConditions, horizon_s: float, lag_s: float = 0.0):
        super().__init__(env)
        self._known = known
        self._segments = known.segments(self.now_s, min(self.now_s + horizon_s, self.end_s), self.now_s - lag_s)

    def candidates(self, horizon_s: float, limit: int) -> list[Plan]:
        """The best partitions and splits for the known conditions now and at each known change within
        ``horizon_s``."""
        found: list[Plan] = []
        for row, since, _ in self._segments:
            if since > self.now_s + horizon_s or len(found) >= limit:
                break
            boundaries, split, _ = self._known.job.best(row)
            if (boundaries, split) not in found:
                found.append((boundaries, split))
        return found

    def _row_at(self, time_s: float) -> int:
        return next((row for row, _, until in self._segments if time_s < until), self._segments[-1][0])

    def iterations_per_s(self, plan: Plan, time_s: float) -> float:
        """Iterations per second ``plan`` runs at ``time_s`` under the known conditions."""
        return 1e3 / self._known.job.mean_ms(plan[0], plan[1], self._row_at(time_s))

    def iterations_between(self, plan: Plan, start_s: float, end_s: float) -> float:
        """Iterations ``plan`` would run from ``start_s`` to ``end_s`` under the known conditions (the last
        known ones held past the horizon)."""
        job, total = self._known.job, 0.0
        last = len(self._segments) - 1
        for k, (row, since, until) in enumerate(self._segments):
            since, until = max(since, start_s), (end_s if k == last else min(until, end_s))
            if until > since:
                total += (until - since) * 1e3 / job.mean_ms(plan[0], plan[1], row)
        return total
