"""Could any causal policy take half of the oracle's lead? A yardstick that knows more than any causal policy
can and is still not told the future (issue #19, 2026-12-07; not part of the package, not tested).

`onset-blind` (the package's) knows how each slowdown under way goes on and when it ends: more than a causal
policy can. This yardstick, `known-hazard`, knows instead what a causal policy could know at best, and a little
more:

- the present exactly: every device's true slowdown now, and each slowdown episode under way on it (when it
  began, its factor; where episodes overlap, each of them, which the timers cannot tell apart);
- the preset's true law of episodes (its generator, run 300 times on runs four times as long), from which it
  draws how long each episode under way lasts, given how long it has lasted, its factor (nearest 40 in log
  factor) and whether it began with the run (a straggler from the first second is the persistent kind);
- links as `onset-blind` knows them (the true course of a congestion under way: more than a causal policy).

It draws `samples` futures (each episode under way ends at its drawn time; no new onset), plans each with the
oracle's dynamic program, and takes the plan whose mean work over the draws is largest (a sample average with
recourse: within each draw the program acts on that draw's future, so this leans to moves that pay in some
futures). It is not a proven bound: it is the oracle's planner fed the best guess of the future that the
scenario's own law allows. `kh:law=all` draws from the training distribution's law instead (every preset's
episodes together), as a policy not told the preset would have to; `kh:links=held` holds each link at its
bandwidth now. `kh:true_ends=1` draws each episode's true end instead (one draw): it should score near
`onset-blind` (heavy at 4 x 1, 5 episodes: 0.9928 against 0.9931; `onset-blind` also knows where an episode below
another takes over when the upper one ends).

`hazard-planner` (`hp:` with `law=`, `samples=`, `min_gain=`, `hold_mild=0|1`, `present=estimates|truth`) is a
causal prototype of the same planner: the present from the encoder's estimates (see its class).

Run from the repository root, as `docs/experiments/onset_blind.py` (whose table it prints):

    .venv/bin/python docs/experiments/known_hazard.py 4x2 \
        "falcon-early,oracle,onset-blind,known-hazard,kh:law=all" 10 4242 heavy,drift,persistent,mixed

(4 x 1 and 4 x 2 at once, 4 processes on 2 cores: 44 minutes, most of it `known-hazard`'s draws on mixed.)

Results (2026-12-07 22:32-23:16, the table's episodes), each minus `falcon-early`, moves an hour in brackets:

    4x1        falcon-early       oracle           onset-blind      known-hazard     kh:law=all
    heavy      0.9874 (19.7/h)    +0.0071 (20.0)   +0.0062 (21.2)   +0.0059 (23.3)   +0.0051 (23.9)
    drift      0.9976 (4.6/h)     +0.0014 (5.9)    +0.0014 (6.0)    +0.0014 (6.4)    +0.0013 (6.3)
    persistent 0.9979 (3.3/h)     +0.0015 (3.7)    +0.0015 (3.7)    +0.0015 (4.0)    +0.0014 (4.4)
    mixed      0.9575 (73.3/h)    +0.0121 (12.0)   +0.0107 (11.7)   +0.0098 (15.3)   +0.0100 (16.5)
    4x2
    heavy      0.9711 (45.9/h)    +0.0189 (41.7)   +0.0156 (49.7)   +0.0155 (70.0)   +0.0147 (71.1)
    drift      0.9928 (10.4/h)    +0.0055 (11.5)   +0.0055 (13.5)   +0.0054 (18.0)   +0.0054 (16.9)
    persistent 0.9946 (8.7/h)     +0.0043 (8.0)    +0.0042 (7.7)    +0.0041 (9.2)    +0.0040 (10.0)
    mixed      0.9128 (191.8/h)   +0.0313 (41.0)   +0.0273 (33.6)   +0.0264 (43.1)   +0.0262 (42.0)

Told the law and the present, a planner takes 0.85-0.99 of the oracle's lead over the best rule in every cell
(README, Results: "A planner told the present and the law of slowdowns"). The causal prototype does not: on heavy at
4 x 1 (5 episodes, raw estimates) `falcon-early` 0.9863, `hazard-planner` 0.9825, `hp:present=truth` 0.9864,
`kh:law=all` 0.9920, `kh:law=all;links=held` 0.9920; over the 4 presets at 4 x 1 (10 episodes, estimates on the 1%
grid, 2026-12-08 00:12-00:20) minus `falcon-early`: heavy -0.0033 (23.3 moves/h), drift -0.0082 (4.3), persistent
-0.0015 (3.3), mixed -0.0120 (84.2).
"""
import sys
from dataclasses import dataclass, field

import numpy as np
import onset_blind

import rlpipe.envs.situation as situation_module
from rlpipe.agents.heuristics import OraclePolicy, _future, _running
from rlpipe.envs.known_future import KnownConditions, KnownFutureView
from rlpipe.interference import PRESET_GENERATORS, PRESETS

POOL_RUNS, POOL_STRETCH, NEAREST = 300, 4.0, 40
_build_other = onset_blind.build

# Each preset trace the environment loads, by id: (preset, devices, duration s, seed), so that the yardstick
# can draw the same episodes again.
_origins: dict[int, tuple[str, int, float, int]] = {}
_load_scenario = situation_module.load_scenario


def _recording_load(spec, num_devices, duration_s=3600.0, seed=0):
    trace = _load_scenario(spec, num_devices, duration_s, seed)
    _origins[id(trace)] = (spec, num_devices, duration_s, seed)
    return trace


situation_module.load_scenario = _recording_load


def episodes_of(spec: str, num_devices: int, duration_s: float, seed: int) -> list[np.ndarray]:
    """Each device's episodes as the preset drew them: rows (start s, end s, factor)."""
    rng = np.random.default_rng([seed, PRESETS.index(spec)])
    per_device, _ = PRESET_GENERATORS[spec](rng, num_devices, duration_s)
    return [np.array([(s, min(e, duration_s), f) for s, e, f in device if s < duration_s]).reshape(-1, 3)
            for device in per_device]


_pools: dict[tuple[str, int, float], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def law_of(spec: str, num_devices: int, duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The preset's episodes over ``POOL_RUNS`` runs ``POOL_STRETCH`` times as long (so that few are cut off by
    the end): log factors, lengths s and whether each began with the run."""
    key = (spec, num_devices, duration_s)
    if key not in _pools:
        rows = np.vstack([rows for k in range(POOL_RUNS) for rows in
                          episodes_of(spec, num_devices, POOL_STRETCH * duration_s, 10**6 + k)])
        _pools[key] = _sorted(np.log(rows[:, 2]), rows[:, 1] - rows[:, 0], rows[:, 0] == 0.0)
    return _pools[key]


def law_of_all(num_devices: int, duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The law of the training distribution, which draws each episode's preset at random: every preset's
    episodes, a third of ``POOL_RUNS`` runs each (a policy not told the preset knows at most this)."""
    key = ("all", num_devices, duration_s)
    if key not in _pools:
        rows = np.vstack([rows for spec in PRESETS for k in range(POOL_RUNS // 3) for rows in
                          episodes_of(spec, num_devices, POOL_STRETCH * duration_s, 10**6 + k)])
        _pools[key] = _sorted(np.log(rows[:, 2]), rows[:, 1] - rows[:, 0], rows[:, 0] == 0.0)
    return _pools[key]


def drawn_remaining_s(law, rng: np.random.Generator, factor: float, age_s: float, from_start: bool) -> float:
    """A remaining length, s, for an episode of ``factor`` that has lasted ``age_s``: one of the ``NEAREST``
    episodes of the law nearest in log factor among those that lasted longer and began alike."""
    log_factor, length, began_with_run = law  # sorted by log factor (``_sorted``)
    key = (id(law), factor, age_s, from_start)
    nearest = _nearest.get(key)
    if nearest is None:
        middle = int(np.searchsorted(log_factor, np.log(factor)))
        for half_width in (1000, 10000, len(log_factor)):  # a window around the factor first: the law is large
            low = max(middle - half_width, 0)
            window = slice(low, middle + half_width)
            alike = low + np.flatnonzero((length[window] > age_s) & (began_with_run[window] == from_start))
            if len(alike) >= NEAREST or half_width >= len(log_factor):
                break
        nearest = _nearest[key] = alike[np.argsort(np.abs(log_factor[alike] - np.log(factor)))[:NEAREST]]
    if len(nearest) == 0:
        return np.inf  # longer than anything the law drew: treat as lasting
    return float(length[rng.choice(nearest)] - age_s)


_nearest: dict[tuple, np.ndarray] = {}  # the episodes nearest a query, kept for one decision's draws


def _sorted(log_factor: np.ndarray, length: np.ndarray, began_with_run: np.ndarray):
    order = np.argsort(log_factor, kind="stable")
    return log_factor[order], length[order], began_with_run[order]


def drawn_view(env, known: KnownConditions, base_slowdown: np.ndarray, under_way: list[tuple[int, float, float]],
               links_at, change_times: list[float], now_s: float, end_s: float) -> KnownFutureView:
    """A future as rows of ``known``: each device at ``base_slowdown``, raised by the episodes ``under_way``
    ((device, factor, end s)) until their ends; ``links_at(t)`` gives the links' factors and the spread at ``t``,
    which change only at ``change_times``."""
    times = sorted({now_s, *(u for _, _, u in under_way if u < end_s), *change_times})
    segments: list[tuple[int, float, float]] = []
    for k, since in enumerate(times):
        slowdown = base_slowdown.copy()
        for device, factor, until in under_way:
            if until > since:
                slowdown[device] = max(slowdown[device], factor)
        row = known.row(slowdown, *links_at(since))
        until = times[k + 1] if k + 1 < len(times) else end_s
        if segments and segments[-1][0] == row:
            segments[-1] = (row, segments[-1][1], until)
        else:
            segments.append((row, since, until))
    view = KnownFutureView.__new__(KnownFutureView)  # its segments are drawn here, not read off the trace
    view.env, view._known, view._segments = env, known, segments
    return view


@dataclass
class KnownHazardOraclePolicy(OraclePolicy):
    """The oracle's planner over futures drawn from the preset's own law for the episodes under way."""

    samples: int = 8
    true_ends: bool = False
    law: str = "preset"  # or "all": the training distribution's, every preset's episodes together
    links: str = "known"  # or "held": each link's bandwidth now, held (a causal policy's view)
    min_gain: float = 0.0  # a move must win this share of the mean work over keeping
    name: str = "known-hazard"
    _episodes: tuple[int, list[np.ndarray], KnownConditions] | None = field(default=None, init=False)
    _drawn: KnownFutureView | None = field(default=None, init=False)

    def reset(self) -> None:
        self._episodes = None

    def future(self, context):
        return self._drawn

    def act(self, observation, mask, context):
        truth = _future(context)
        env = truth.env
        trace = env.situation.trace
        if self._episodes is None or self._episodes[0] != id(trace):
            origin = _origins[id(trace)]
            self._episodes = (id(trace), episodes_of(*origin), KnownConditions(env.job))
            self._law = law_of(*origin[:3]) if self.law == "preset" else law_of_all(*origin[1:3])
            self._rng = np.random.default_rng(origin[3])
        _nearest.clear()
        self._links_view = None  # built by the first draw that needs it, shared by the decision's draws
        now_s, end_s = truth.now_s, min(truth.now_s + self.horizon_s, truth.end_s)
        draws = [self._draw(context, now_s, end_s) for _ in range(1 if self.true_ends else self.samples)]
        current = _running(context)
        candidates = [current]
        for draw in draws:
            for plan in draw.candidates(self.horizon_s, self.max_candidates):
                if plan not in candidates and len(candidates) < self.max_candidates + 2:
                    candidates.append(plan)
        work = np.zeros(len(candidates))
        for draw in draws:
            self._drawn = draw
            work += self.work_if_switched(context, candidates, len(candidates))
        choice = int(np.argmax(work))
        if work[choice] <= work[0] * (1.0 + self.min_gain):
            return current
        return candidates[choice]

    def _draw(self, context, now_s: float, end_s: float) -> KnownFutureView:
        """One future: each episode under way ends at a drawn time (its true one with ``true_ends``)."""
        _, per_device, known = self._episodes
        env = context.future.env
        under_way = []  # (device, factor, end s)
        for device, rows in enumerate(per_device):
            for start, end, factor in rows[(rows[:, 0] <= now_s) & (rows[:, 1] > now_s)]:
                if self.true_ends:
                    until = end
                else:
                    until = now_s + drawn_remaining_s(self._law, self._rng, factor, now_s - start, start == 0.0)
                under_way.append((device, factor, until))
        # the links as onset-blind knows them: their true course until they next get worse (or held at now's)
        if self._links_view is None:
            self._links_view = KnownFutureView(env, known, self.horizon_s)
        links_view = self._links_view
        link_changes = [] if self.links == "held" else [s for _, s, _ in links_view._segments if now_s < s < end_s]

        def links_at(time_s):
            row = links_view._row_at(now_s if self.links == "held" else time_s)
            return known._links[row], known._spread[row]

        return drawn_view(env, known, np.ones(env.situation.trace.num_devices), under_way, links_at, link_changes,
                          now_s, end_s)


@dataclass
class HazardPlannerPolicy(KnownHazardOraclePolicy):
    """A causal version of the yardstick: the present from the observation's estimates, not the truth. Each
    device the encoder counts as disturbed (``elevated_iterations`` > 0) is an episode under way at its steady
    estimate, as old as the encoder says it is (iterations at the latest interval's pace), begun with the run if
    it has been disturbed since the first interval; every other device holds its estimate (``hold_mild``; or
    runs at 1). Its end is drawn from the training distribution's law (or the preset's, ``law=preset``); links
    and the micro-batch spread hold what they are now (the truth's, which the encoder's link estimate
    approaches). It moves only where the mean work beats keeping by ``min_gain`` (the estimates are noisy).
    Plans are timed with the simulated job's costs."""

    law: str = "all"
    min_gain: float = 0.002
    hold_mild: bool = True  # the devices not counted as disturbed hold their estimate (else run at 1)
    present: str = "estimates"  # or "truth": each device's true slowdown now in place of its estimate
    name: str = "hazard-planner"

    def reset(self) -> None:
        super().reset()
        self._iterations_seen = 0.0

    def act(self, observation, mask, context):
        self._iterations_seen += context.encoder.latest.iterations
        return super().act(observation, mask, context)

    def _draw(self, context, now_s: float, end_s: float) -> KnownFutureView:
        encoder, env, known = context.encoder, context.future.env, self._episodes[2]
        trace = env.situation.trace
        latest = encoder.latest
        seconds_per_iteration = max(latest.wall_s - latest.stall_s, 1e-9) / max(latest.iterations, 1)
        now_row = trace.index_at(now_s)
        estimates = trace.slowdown[now_row] if self.present == "truth" else encoder.device_estimate
        # on a 1% grid (in log): every distinct vector of conditions is a new row of the known-conditions table,
        # which rebuilds its trace and re-simulates each plan for it; raw estimates made a new row each decision
        estimates = np.exp(np.round(np.log(np.maximum(estimates, 1e-9)) / 0.01) * 0.01)
        held = np.maximum(estimates, 1.0) if self.hold_mild else np.ones(trace.num_devices)
        under_way = []
        for device, (estimate, elevated) in enumerate(zip(estimates, encoder.elevated_iterations)):
            if elevated > 0 and estimate > 1.0:
                held[device] = 1.0
                age_s = elevated * seconds_per_iteration
                from_start = elevated >= self._iterations_seen
                under_way.append((device, float(estimate), now_s + drawn_remaining_s(
                    self._law, self._rng, float(estimate), age_s, bool(from_start))))
        links, spread = trace.link_factor[now_row], trace.spread_at_row(now_row)
        return drawn_view(env, known, held, under_way, lambda _: (links, spread), [], now_s, end_s)


def build(name):
    if name == "known-hazard":
        return KnownHazardOraclePolicy()
    if name == "hazard-planner":
        return HazardPlannerPolicy()
    if name.startswith("hp:"):
        arguments = dict(p.split("=") for p in name[3:].split(";"))
        typed = {"law": str, "samples": int, "min_gain": float, "hold_mild": lambda v: v == "1", "present": str}
        return HazardPlannerPolicy(**{k: typed[k](v) for k, v in arguments.items()})
    if name.startswith("kh:"):
        arguments = dict(p.split("=") for p in name[3:].split(";"))
        typed = {"true_ends": lambda v: v == "1", "law": str, "samples": int, "links": str}
        return KnownHazardOraclePolicy(**{k: typed[k](v) for k, v in arguments.items()})
    return _build_other(name)


if __name__ == "__main__":
    onset_blind.build = build
    onset_blind.main(sys.argv)
