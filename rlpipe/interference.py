"""Interference: how much slower each device computes, and each link transfers, over time.

Everything is a trace: a list of change events ``(time_s, target, value)``. A device target
(``0``, ``1``, ...) gets a slowdown factor (>= 1.0: 2.0 computes twice as slowly) from ``time_s`` on;
a link target ``link:i`` (between device i and i+1) gets a bandwidth factor (<= 1.0); the target
``seqlen`` sets how unequal the micro-batches of one iteration are (the longest up to that many times
the shortest, on every stage, drawn afresh each iteration: sequence-length imbalance, with no lasting
change; 1.0: equal). Presets are seeded generators of such traces, so a preset written to CSV
(``rlpipe scenario``) and replayed (``trace:FILE.csv``) is the same scenario.

In a hybrid job (D replicas of an S-stage pipeline) device ``r x S + s`` is replica r's stage s, and
``link:i`` joins devices i and i + 1 of the same replica (a link between two replicas' devices is no
pipeline link, and slows nothing).

Slowdown magnitudes follow published co-location measurements of DNN jobs sharing a device: median
about 1.08x, one pair in ten slower than about 1.25x, a tail to about 2.3x. Durations and the rest
follow what large training jobs meet in shared clusters:

- Alibaba, a shared cluster of more than 10,000 GPUs (Greyhound/FALCON, USENIX ATC'25): compute
  fail-slows (CPU contention, thermal throttling) last ~10 minutes on average, from under a minute to
  hours; network congestion lasts from under 1 to over 100 minutes (24 on average) and hit ~40% of
  4-node probe jobs; compound events cut throughput by 80-90%.
- ByteDance, 3,079 jobs on >= 128 GPUs (OSDI'25): slowdowns are mostly persistent; per-iteration
  compute varies +-10-15% with sequence length and garbage-collection pauses, with no lasting change;
  a single bad worker is rare but ~3x slower.

``heavy`` has those fail-slow stragglers and rare compound events; ``persistent``, ``seqlen``,
``network`` and ``mixed`` follow the second list (see each generator).
"""

from __future__ import annotations

import bisect
import csv
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from rlpipe.errors import InputError
from rlpipe.files import read_text

MAX_COLOCATION_SLOWDOWN = 2.3
SEQLEN_TARGET = "seqlen"  # the trace target of the micro-batch spread
MAX_MICROBATCH_SPREAD = 10.0

Event = tuple[float, str, float]  # (time_s, "3" or "link:2", value)


@dataclass(frozen=True)
class InterferenceTrace:
    """Piecewise-constant conditions: row k of ``slowdown`` / ``link_factor`` holds from ``change_s[k]`` on.

    Attributes:
        change_s: times (s) at which conditions change, increasing, starting at 0.
        slowdown: (changes, devices) compute slowdown factor of each device, >= 1.
        link_factor: (changes, devices - 1) bandwidth factor of each link, in (0, 1].
        duration_s: length of the scenario, s (conditions hold after the last change until then).
        name: where it came from (a preset name or a file).
        microbatch_spread: (changes,) the longest micro-batch of an iteration over the shortest (1: equal;
            ``None``: always 1).
    """

    change_s: np.ndarray
    slowdown: np.ndarray
    link_factor: np.ndarray
    duration_s: float
    name: str = "trace"
    microbatch_spread: np.ndarray | None = None

    @property
    def num_devices(self) -> int:
        return self.slowdown.shape[1]

    def spread_at_row(self, row: int) -> float:
        """How unequal an iteration's micro-batches are under row ``row`` (1.0: equal)."""
        return 1.0 if self.microbatch_spread is None else float(self.microbatch_spread[row])

    def replica_links(self, row: int, replicas: int) -> np.ndarray:
        """(replicas, S - 1): each replica's pipeline links' bandwidth factors under row ``row`` (the trace
        covers ``replicas x S`` devices)."""
        stages = self.num_devices // replicas
        padded = np.append(self.link_factor[row], 1.0)  # the last device has no link after it
        return padded.reshape(replicas, stages)[:, :stages - 1]

    @classmethod
    def from_events(cls, events: list[Event], num_devices: int, duration_s: float, name: str = "trace",
                    source: str = "trace") -> InterferenceTrace:
        """Build from change events (at one instant the last value wins); ``source`` names the file in
        error messages."""
        if num_devices < 1:
            raise InputError(f"{source}: needs at least one device")
        num_links = max(num_devices - 1, 0)
        events = sorted(events, key=lambda event: event[0])
        times = np.array([0.0] + [event[0] for event in events])
        columns = np.empty(len(events), dtype=np.int64)  # devices first, then links, then the spread
        for k, (_, target, _) in enumerate(events):
            if target == SEQLEN_TARGET:
                columns[k] = num_devices + num_links
            elif target.startswith("link:"):
                link = int(target[5:])
                if not 0 <= link < num_links:
                    raise InputError(f"{source}: device 'link:{link}' does not exist with {num_devices} devices")
                columns[k] = num_devices + link
            else:
                device = int(target)
                if not 0 <= device < num_devices:
                    raise InputError(f"{source}: device {device} does not exist with {num_devices} devices")
                columns[k] = device
        change_s = np.unique(times)
        table = np.full((len(change_s), num_devices + num_links + 1), np.nan)
        table[0] = 1.0
        if events:
            rows = np.searchsorted(change_s, times[1:])
            keys = rows * table.shape[1] + columns
            _, first_from_end = np.unique(keys[::-1], return_index=True)
            last = len(keys) - 1 - first_from_end  # the last event for each (instant, target)
            table[rows[last], columns[last]] = np.array([event[2] for event in events])[last]
        filled = np.where(np.isnan(table), 0, np.arange(len(change_s))[:, None])
        table = table[np.maximum.accumulate(filled, axis=0), np.arange(table.shape[1])]  # values hold until changed
        spread = table[:, -1] if np.any(table[:, -1] != 1.0) else None
        return cls(change_s, table[:, :num_devices], table[:, num_devices:-1], float(max(duration_s, change_s[-1])),
                   name, spread)

    def for_devices(self, num_devices: int) -> InterferenceTrace:
        """The same trace on a pipeline of ``num_devices`` stages: extra devices run undisturbed;
        a trace that slows a device the pipeline does not have is an error."""
        if num_devices == self.num_devices:
            return self
        if num_devices < self.num_devices:
            used = np.any(self.slowdown[:, num_devices:] != 1.0) or np.any(self.link_factor[:, num_devices - 1:] != 1.0)
            if used:
                raise InputError(f"{self.name}: the trace disturbs device {self.num_devices - 1}, "
                                 f"but the pipeline has only {num_devices} stages")
            return InterferenceTrace(self.change_s, self.slowdown[:, :num_devices],
                                     self.link_factor[:, :num_devices - 1], self.duration_s, self.name,
                                     self.microbatch_spread)
        pad = num_devices - self.num_devices
        return InterferenceTrace(self.change_s, np.pad(self.slowdown, ((0, 0), (0, pad)), constant_values=1.0),
                                 np.pad(self.link_factor, ((0, 0), (0, pad)), constant_values=1.0),
                                 self.duration_s, self.name, self.microbatch_spread)

    @cached_property
    def _change_times(self) -> list[float]:
        """``change_s`` as a list: a bisection there costs a fraction of ``np.searchsorted``'s call, and the
        environment looks up the row in force several times a step."""
        return self.change_s.tolist()

    def index_at(self, time_s: float) -> int:
        """Row of the conditions in force at ``time_s``."""
        return bisect.bisect_right(self._change_times, time_s) - 1

    def at(self, time_s: float) -> tuple[np.ndarray, np.ndarray]:
        """(device slowdowns, link factors) at ``time_s``."""
        row = self.index_at(time_s)
        return self.slowdown[row], self.link_factor[row]

    def span_at(self, time_s: float) -> tuple[int, float]:
        """(row in force at ``time_s``, the time it ends: the next change, or ``inf`` if none)."""
        row, times = self.index_at(time_s), self._change_times
        return row, times[row + 1] if row + 1 < len(times) else math.inf

    def effective_slowdown(self, start_s: float, end_s: float) -> np.ndarray:
        """Each device's slowdown over ``[start_s, end_s)`` as a device busy throughout meets it: the span
        over the nominal work done in it (the time-harmonic mean of its slowdowns); the slowdown at
        ``start_s`` for an empty span. A 1x device that turns 3x halfway through did 2/3 of the span's
        work: 1.5x, where the mean of the two, 2x, would predict it a third slower than it ran."""
        if end_s <= start_s:
            return self.at(start_s)[0].copy()
        work_s = sum((until - since) / self.slowdown[row] for row, since, until in self.segments(start_s, end_s))
        return (end_s - start_s) / work_s

    def finish_s(self, device: int, start_s: float, work_s: float) -> float:
        """When ``work_s`` seconds of undisturbed work begun at ``start_s`` are done on ``device``, each
        stretch of constant conditions running it at its own slowdown (before 0: the first conditions)."""
        row, until = self.span_at(max(start_s, 0.0))
        time_s, work_left_s = start_s, work_s
        while work_left_s * self.slowdown[row, device] > until - time_s:
            work_left_s -= (until - time_s) / self.slowdown[row, device]
            time_s = until
            row, until = self.span_at(time_s)
        return time_s + work_left_s * self.slowdown[row, device]

    def segments(self, start_s: float, end_s: float) -> Iterator[tuple[int, float, float]]:
        """The stretches of constant conditions that cover ``[start_s, end_s)``: (row, from, until)."""
        time_s = start_s
        while time_s < end_s - 1e-12:
            row, until = self.span_at(time_s)
            until = min(until, end_s)
            yield row, time_s, until
            time_s = until

    def to_events(self) -> list[Event]:
        """The change events that rebuild this trace (one row per changed device or link)."""
        events: list[Event] = []
        previous_slow = np.ones(self.num_devices)
        previous_link = np.ones(self.num_devices - 1)
        previous_spread = 1.0
        for row, (time_s, slow, link) in enumerate(zip(self.change_s, self.slowdown, self.link_factor)):
            events += [(float(time_s), str(d), float(slow[d])) for d in np.nonzero(slow != previous_slow)[0]]
            events += [(float(time_s), f"link:{i}", float(link[i])) for i in np.nonzero(link != previous_link)[0]]
            if self.spread_at_row(row) != previous_spread:
                events.append((float(time_s), SEQLEN_TARGET, self.spread_at_row(row)))
            previous_slow, previous_link, previous_spread = slow, link, self.spread_at_row(row)
        return events

    def save_csv(self, path: str | Path) -> None:
        """Write the trace as ``time_s,device,slowdown`` rows (creating its folder)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["time_s", "device", "slowdown"])
            for time_s, target, value in self.to_events():
                writer.writerow([f"{time_s:.3f}", target, f"{value:.4f}"])
            # A closing row marks the scenario's end, so the duration survives the round trip.
            writer.writerow([f"{self.duration_s:.3f}", "0", f"{self.slowdown[-1, 0]:.4f}"])


TRACE_COLUMNS = ("time_s", "device", "slowdown")


MAX_SLOWDOWN = 1000.0  # a device this much slower is as good as lost: larger factors only overflow the arithmetic


def load_trace_csv(path: str | Path) -> InterferenceTrace:
    """Read a ``time_s,device,slowdown`` CSV; every problem is a one-line :class:`InputError`."""
    path = Path(path)
    text = read_text(path, "trace file")
    reader = csv.DictReader(text.splitlines())
    missing = [column for column in TRACE_COLUMNS if column not in (reader.fieldnames or [])]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)} (header must be time_s,device,slowdown)")
    events: list[Event] = []
    max_device, last_time = 0, 0.0
    for row_number, row in enumerate(reader, start=2):
        where = f"{path}: line {row_number}"
        try:
            time_s = float(row["time_s"])
        except (TypeError, ValueError):
            raise InputError(f"{where}: time_s: not a number ({row['time_s']!r})") from None
        if not math.isfinite(time_s) or time_s < 0:
            raise InputError(f"{where}: time_s: must be a finite number >= 0, got {row['time_s']}")
        if time_s < last_time:
            raise InputError(f"{where}: time_s: goes backwards ({time_s} after {last_time})")
        last_time = time_s
        try:
            value = float(row["slowdown"])
        except (TypeError, ValueError):
            raise InputError(f"{where}: slowdown: not a number ({row['slowdown']!r})") from None
        target = (row["device"] or "").strip()
        if target == SEQLEN_TARGET:
            if not (math.isfinite(value) and 1.0 <= value <= MAX_MICROBATCH_SPREAD):
                raise InputError(f"{where}: slowdown: a seqlen spread must be in [1, {MAX_MICROBATCH_SPREAD:g}], "
                                 f"got {value}")
        elif target.startswith("link:") and target[5:].isdigit():
            if not (math.isfinite(value) and 1.0 / MAX_SLOWDOWN <= value <= 1.0):
                raise InputError(f"{where}: slowdown: a link's bandwidth factor must be in "
                                 f"[{1.0 / MAX_SLOWDOWN:g}, 1], got {value}")
            max_device = max(max_device, int(target[5:]) + 1)
        elif target.isdigit():
            if not (math.isfinite(value) and 1.0 <= value <= MAX_SLOWDOWN):
                raise InputError(f"{where}: slowdown: must be a number in [1, {MAX_SLOWDOWN:g}], got {value}")
            max_device = max(max_device, int(target))
        else:
            raise InputError(f"{where}: device: unknown device {target!r} (expected 0, 1, ..., link:i or seqlen)")
        events.append((time_s, target, value))
    return InterferenceTrace.from_events(events, max_device + 1, last_time, name=f"trace:{path.name}",
                                         source=str(path))


# --- presets ---------------------------------------------------------------------------------

def colocation_slowdown(rng: np.random.Generator) -> float:
    """One co-location slowdown: median ~1.08x, ~1 in 10 above 1.25x, capped at 2.3x."""
    return float(min(1.0 + rng.lognormal(math.log(0.08), 0.9), MAX_COLOCATION_SLOWDOWN))


Interval = tuple[float, float, float]  # (start_s, end_s, value)


def _episodes(rng: np.random.Generator, duration_s: float, mean_gap_s: float,
              draw_length_s: Callable[[], float], draw_value: Callable[[], float]) -> list[Interval]:
    """A renewal process on one device or link: an exponential quiet gap, an episode, a gap, ..."""
    intervals: list[Interval] = []
    time_s = rng.exponential(mean_gap_s)
    while time_s < duration_s:
        length = max(draw_length_s(), 1.0)
        intervals.append((time_s, min(time_s + length, duration_s), draw_value()))
        time_s += length + rng.exponential(mean_gap_s)
    return intervals


def _to_events(intervals: list[Interval], target: str, worst: Callable[..., float]) -> list[Event]:
    """Change events of one device or link; where episodes overlap the ``worst`` value (``max`` or
    ``min``) holds."""
    if not intervals:
        return []
    quiet = 1.0
    edges = np.unique(np.array([t for start, end, _ in intervals for t in (start, end)]))
    combine = np.fmax if worst is max else np.fmin  # both ignore the NaN of "nothing active yet"
    values = np.full(len(edges), np.nan)
    spans = np.array(intervals)
    firsts, stops = np.searchsorted(edges, spans[:, 0]), np.searchsorted(edges, spans[:, 1])
    for first, stop, value in zip(firsts.tolist(), stops.tolist(), spans[:, 2].tolist()):
        values[first:stop] = combine(values[first:stop], value)
    values = np.where(np.isnan(values), quiet, values)
    previous = np.concatenate([[quiet], values[:-1]])
    return [(float(t), target, float(v)) for t, v in zip(edges[values != previous], values[values != previous])]


def _link_jitter(rng: np.random.Generator, num_devices: int, duration_s: float, mean_gap_s: float) -> list[Event]:
    """Links dropping to 20-80% of their bandwidth for ~20 s at a time."""
    events: list[Event] = []
    for link in range(num_devices - 1):
        intervals = _episodes(rng, duration_s, mean_gap_s, lambda: rng.lognormal(math.log(20.0), 1.0),
                              lambda: float(rng.uniform(0.2, 0.8)))
        events += _to_events(intervals, f"link:{link}", min)
    return events


# Each preset draws, from a seeded generator, episodes on every device and other change events (links,
# the micro-batch spread).
PresetDraw = tuple[list[list[Interval]], list[Event]]


def _light(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Occasional co-location: about one episode per device every 15 minutes, ~1 minute long."""
    per_device = [_episodes(rng, duration_s, 900.0, lambda: rng.lognormal(math.log(60.0), 1.0),
                            lambda: colocation_slowdown(rng)) for _ in range(num_devices)]
    return per_device, []


def _fail_slows(rng: np.random.Generator, duration_s: float, mean_gap_s: float) -> list[Interval]:
    """Compute fail-slows on one device: 3-4x for ~10 minutes on average (median 7 min, a long tail)."""
    return _episodes(rng, duration_s, mean_gap_s, lambda: rng.lognormal(math.log(420.0), 0.85),
                     lambda: float(rng.uniform(3.0, 4.0)))


def _compound(rng: np.random.Generator, duration_s: float, mean_gap_s: float) -> list[Interval]:
    """Rare compound events on one device: throughput cut by 80-90% (5-10x) for a few minutes."""
    return _episodes(rng, duration_s, mean_gap_s, lambda: rng.lognormal(math.log(150.0), 0.8),
                     lambda: float(rng.uniform(5.0, 10.0)))


def _heavy(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Frequent, long co-location; rare fail-slow stragglers (~10 min, 3-4x) and rarer compound
    events (5-10x); link jitter."""
    per_device = []
    for _ in range(num_devices):
        intervals = _episodes(rng, duration_s, 300.0, lambda: rng.lognormal(math.log(180.0), 1.0),
                              lambda: colocation_slowdown(rng))
        intervals += _fail_slows(rng, duration_s, 2400.0)
        intervals += _compound(rng, duration_s, 4 * 3600.0)
        per_device.append(intervals)
    return per_device, _link_jitter(rng, num_devices, duration_s, 900.0)


def _bursty(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Co-location with Pareto durations (shape 1.1, minimum 5 s): median ~9 s, mean ~55 s, a few last
    many minutes; some link jitter."""
    per_device = [_episodes(rng, duration_s, 90.0, lambda: 5.0 * (1.0 + rng.pareto(1.1)),
                            lambda: colocation_slowdown(rng)) for _ in range(num_devices)]
    return per_device, _link_jitter(rng, num_devices, duration_s, 1200.0)


def _drift(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """One device degrades in six equal steps to 2.2x by the end; the others see rare co-location."""
    victim = int(rng.integers(num_devices))
    per_device: list[list[Interval]] = []
    for device in range(num_devices):
        per_device.append([] if device == victim else _episodes(
            rng, duration_s, 1800.0, lambda: rng.lognormal(math.log(60.0), 1.0), lambda: colocation_slowdown(rng)))
    steps = 6
    per_device[victim] += [(duration_s * step / (steps + 1), duration_s, 1.0 + step * 1.2 / steps)
                           for step in range(1, steps + 1)]
    return per_device, []


def _periodic(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Every device 1.3-1.8x slower for a third of every 10 minutes, each at its own phase."""
    period_s, per_device = 600.0, []
    for _ in range(num_devices):
        phase, magnitude = rng.uniform(0, period_s), float(rng.uniform(1.3, 1.8))
        starts = np.arange(phase - period_s, duration_s, period_s)
        per_device.append([(max(s, 0.0), min(s + period_s / 3, duration_s), magnitude)
                           for s in starts if s + period_s / 3 > 0])
    return per_device, []


def _jitter(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Links only: frequent drops to 20-80% of their bandwidth."""
    return [[] for _ in range(num_devices)], _link_jitter(rng, num_devices, duration_s, 120.0)


def _persistent(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """One device slower (1.3-3x) from the first second to the end, the others with rare co-location:
    a rule whose baseline is measured under the straggler never fires."""
    victim = int(rng.integers(num_devices))
    per_device = [[(0.0, duration_s, float(rng.uniform(1.3, 3.0)))] if device == victim else _episodes(
        rng, duration_s, 1800.0, lambda: rng.lognormal(math.log(60.0), 1.0), lambda: colocation_slowdown(rng))
        for device in range(num_devices)]
    return per_device, []


SEQLEN_SPREAD = 1.3  # ByteDance (OSDI'25): per-iteration compute +-10-15% with sequence length


def _gc_pauses(rng: np.random.Generator, duration_s: float) -> list[Interval]:
    """A garbage-collection pause on one device (2-4x for 1-2 s) about once a minute."""
    return _episodes(rng, duration_s, 60.0, lambda: float(rng.uniform(1.0, 2.0)), lambda: float(rng.uniform(2.0, 4.0)))


def _seqlen(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Sequence-length imbalance: every iteration's micro-batches differ (the longest up to 1.3x the
    shortest, on every stage), and garbage-collection pauses on every device; nothing lasts: hold."""
    return [_gc_pauses(rng, duration_s) for _ in range(num_devices)], [(0.0, SEQLEN_TARGET, SEQLEN_SPREAD)]


def _congestion(rng: np.random.Generator, num_devices: int, duration_s: float, mean_gap_s: float) -> list[Event]:
    """Network congestion on one link at a time: 5-30% of its bandwidth for 1 to 100+ minutes (lognormal,
    median 10 minutes, mean ~24)."""
    if num_devices < 2:
        return []
    intervals = _episodes(rng, duration_s, mean_gap_s, lambda: rng.lognormal(math.log(620.0), 1.3),
                          lambda: float(rng.uniform(0.05, 0.3)))
    events: list[Event] = []
    for start, end, factor in intervals:
        link = int(rng.integers(num_devices - 1))
        events += [(start, f"link:{link}", factor), (end, f"link:{link}", 1.0)]
    return events


def _network(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Long congestion on one link (most hours see one), which a planner sees in communication time,
    not in compute; rare co-location on the devices."""
    per_device = [_episodes(rng, duration_s, 1800.0, lambda: rng.lognormal(math.log(60.0), 1.0),
                            lambda: colocation_slowdown(rng)) for _ in range(num_devices)]
    return per_device, _congestion(rng, num_devices, duration_s, 1200.0)


def _mixed(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """All of the above in one run: co-location, fail-slows, rare compound events, a persistent
    straggler in a third of runs, sequence-length and garbage-collection noise, link congestion."""
    victim = int(rng.integers(num_devices)) if rng.random() < 1 / 3 else -1
    per_device = []
    for device in range(num_devices):
        intervals = _episodes(rng, duration_s, 900.0, lambda: rng.lognormal(math.log(120.0), 1.0),
                              lambda: colocation_slowdown(rng))
        intervals += _fail_slows(rng, duration_s, 3600.0) + _compound(rng, duration_s, 6 * 3600.0)
        intervals += _gc_pauses(rng, duration_s)
        if device == victim:
            intervals.append((0.0, duration_s, float(rng.uniform(1.3, 3.0))))
        per_device.append(intervals)
    return per_device, _congestion(rng, num_devices, duration_s, 3600.0) + [(0.0, SEQLEN_TARGET, SEQLEN_SPREAD)]


def _mild_noise(rng: np.random.Generator, duration_s: float) -> list[Interval]:
    """Every 60-240 s a new mild slowdown of 1.00-1.08: timer-scale noise that nothing should chase."""
    intervals: list[Interval] = []
    time_s = 0.0
    while time_s < duration_s:
        length = float(rng.uniform(60.0, 240.0))
        intervals.append((time_s, min(time_s + length, duration_s), 1.0 + float(rng.uniform(0.0, 0.08))))
        time_s += length
    return intervals


def _calm(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Mild noise alone (no slowdown above 1.08): the right answer is to hold."""
    return [_mild_noise(rng, duration_s) for _ in range(num_devices)], []


def _window(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """The demo's and the live benchmark's window, for both lessons: mild noise everywhere; a short 2x
    burst on one stage from 10% to 14% of the window; from 25% to the end a 3x straggler on another
    (after a baseline has been measured, so that a trigger rule can fire)."""
    per_device = [_mild_noise(rng, duration_s) for _ in range(num_devices)]
    burst = int(rng.integers(num_devices))
    per_device[burst].append((0.10 * duration_s, 0.14 * duration_s, 2.0))
    if num_devices > 1:
        straggler = (burst + 1 + int(rng.integers(num_devices - 1))) % num_devices
        per_device[straggler].append((0.25 * duration_s, duration_s, 3.0))
    return per_device, []


PRESET_GENERATORS: dict[str, Callable[[np.random.Generator, int, float], PresetDraw]] = {
    "none": lambda rng, num_devices, duration_s: ([[] for _ in range(num_devices)], []),
    "light": _light,
    "heavy": _heavy,
    "bursty": _bursty,
    "drift": _drift,
    "periodic": _periodic,
    "jitter": _jitter,
    "persistent": _persistent,
    "seqlen": _seqlen,
    "network": _network,
    "mixed": _mixed,
    "calm": _calm,
    "window": _window,
}
"""Every preset by name. A preset's position seeds its generator: append new ones at the end."""
PRESETS = tuple(PRESET_GENERATORS)


def generate_scenario(name: str, num_devices: int, duration_s: float = 3600.0, seed: int = 0) -> InterferenceTrace:
    """A seeded preset from :data:`PRESETS`."""
    if name not in PRESETS:
        check_scenario(name)  # says what is wrong with the name
    if num_devices < 1:
        raise InputError(f"--devices: must be >= 1, got {num_devices}")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise InputError(f"--duration-s: must be a finite number > 0, got {duration_s}")
    rng = np.random.default_rng([seed, PRESETS.index(name)])
    per_device, link_events = PRESET_GENERATORS[name](rng, num_devices, duration_s)
    events = [e for device, intervals in enumerate(per_device) for e in _to_events(intervals, str(device), max)]
    events = [e for e in events + link_events if e[0] < duration_s]  # episodes cut off by the end
    return InterferenceTrace.from_events(events, num_devices, duration_s, name=name)


def check_scenario(spec: str, min_devices: int | None = None) -> None:
    """Refuse an unknown preset or a malformed trace file before any work starts; with ``min_devices``,
    also a trace that disturbs a device a pipeline of that many stages lacks."""
    if spec.startswith("trace:"):
        trace = load_trace_csv(spec[len("trace:"):])
        if min_devices is not None:
            try:
                trace.for_devices(min_devices)
            except InputError as err:
                raise InputError(f"{err} (pipelines here may have as few as {min_devices} stages: "
                                 f"ask for at least {trace.num_devices} with --stages)") from None
    elif spec not in PRESETS:
        raise InputError(f"scenario '{spec}': unknown (presets: {', '.join(PRESETS)}; or trace:FILE.csv)")


def load_scenario(spec: str, num_devices: int, duration_s: float = 3600.0, seed: int = 0) -> InterferenceTrace:
    """A preset by name or ``trace:FILE.csv``, fitted to ``num_devices`` stages."""
    if spec.startswith("trace:"):
        return load_trace_csv(spec[len("trace:"):]).for_devices(num_devices)
    return generate_scenario(spec, num_devices, duration_s, seed)
