"""Interference: how much slower each device computes, and each link transfers, over time.

Everything is a trace: a list of change events ``(time_s, target, value)``. A device target
(``0``, ``1``, ...) gets a slowdown factor (>= 1.0: 2.0 computes twice as slowly) from ``time_s`` on;
a link target ``link:i`` (between device i and i+1) gets a bandwidth factor (<= 1.0). Presets are
seeded generators of such traces, so a preset written to CSV (``rlpipe scenario``) and replayed
(``trace:FILE.csv``) is the same scenario.

Slowdown magnitudes follow published co-location measurements of DNN jobs sharing a device: median
about 1.08x, one pair in ten slower than about 1.25x, a tail to about 2.3x; ``heavy`` adds rarer
3-4x stragglers. Episode durations are heavy-tailed (``bursty``: Pareto, many short, a few very long).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlpipe.errors import InputError

MAX_COLOCATION_SLOWDOWN = 2.3

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
    """

    change_s: np.ndarray
    slowdown: np.ndarray
    link_factor: np.ndarray
    duration_s: float
    name: str = "trace"

    @property
    def num_devices(self) -> int:
        return self.slowdown.shape[1]

    @classmethod
    def from_events(cls, events: list[Event], num_devices: int, duration_s: float, name: str = "trace",
                    source: str = "trace") -> InterferenceTrace:
        """Build from change events; ``source`` names the file in error messages."""
        if num_devices < 1:
            raise InputError(f"{source}: needs at least one device")
        events = sorted(events, key=lambda event: event[0])
        current_slow = np.ones(num_devices)
        current_link = np.ones(max(num_devices - 1, 0))
        times, slows, links = [0.0], [current_slow.copy()], [current_link.copy()]
        for time_s, target, value in events:
            if target.startswith("link:"):
                link = int(target[5:])
                if not 0 <= link < num_devices - 1:
                    raise InputError(f"{source}: device 'link:{link}' does not exist with {num_devices} devices")
                current_link[link] = value
            else:
                device = int(target)
                if not 0 <= device < num_devices:
                    raise InputError(f"{source}: device {device} does not exist with {num_devices} devices")
                current_slow[device] = value
            if time_s > times[-1]:
                times.append(time_s)
                slows.append(current_slow.copy())
                links.append(current_link.copy())
            else:  # same instant: the last value wins
                slows[-1], links[-1] = current_slow.copy(), current_link.copy()
        return cls(np.array(times), np.array(slows), np.array(links).reshape(len(times), -1),
                   float(max(duration_s, times[-1])), name)

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
                                     self.link_factor[:, :num_devices - 1], self.duration_s, self.name)
        pad = num_devices - self.num_devices
        return InterferenceTrace(self.change_s, np.pad(self.slowdown, ((0, 0), (0, pad)), constant_values=1.0),
                                 np.pad(self.link_factor, ((0, 0), (0, pad)), constant_values=1.0),
                                 self.duration_s, self.name)

    def index_at(self, time_s: float) -> int:
        """Row of the conditions in force at ``time_s``."""
        return int(np.searchsorted(self.change_s, time_s, side="right")) - 1

    def at(self, time_s: float) -> tuple[np.ndarray, np.ndarray]:
        """(device slowdowns, link factors) at ``time_s``."""
        row = self.index_at(time_s)
        return self.slowdown[row], self.link_factor[row]

    def span_at(self, time_s: float) -> tuple[int, float]:
        """(row in force at ``time_s``, the time it ends: the next change, or ``inf`` if none)."""
        row = self.index_at(time_s)
        return row, float(self.change_s[row + 1]) if row + 1 < len(self.change_s) else math.inf

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
        for time_s, slow, link in zip(self.change_s, self.slowdown, self.link_factor):
            events += [(float(time_s), str(d), float(slow[d])) for d in np.nonzero(slow != previous_slow)[0]]
            events += [(float(time_s), f"link:{i}", float(link[i])) for i in np.nonzero(link != previous_link)[0]]
            previous_slow, previous_link = slow, link
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


def load_trace_csv(path: str | Path) -> InterferenceTrace:
    """Read a ``time_s,device,slowdown`` CSV; every problem is a one-line :class:`InputError`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such trace file") from None
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
        if target.startswith("link:") and target[5:].isdigit():
            if not (math.isfinite(value) and 0 < value <= 1.0):
                raise InputError(f"{where}: slowdown: a link's bandwidth factor must be in (0, 1], got {value}")
            max_device = max(max_device, int(target[5:]) + 1)
        elif target.isdigit():
            if not (math.isfinite(value) and value >= 1.0):
                raise InputError(f"{where}: slowdown: must be a finite number >= 1.0, got {value}")
            max_device = max(max_device, int(target))
        else:
            raise InputError(f"{where}: device: unknown device {target!r} (expected 0, 1, ... or link:i)")
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
    """Change events of one device or link; where episodes overlap the ``worst`` value holds."""
    quiet = 1.0
    edges = sorted({t for start, end, _ in intervals for t in (start, end)})
    events: list[Event] = []
    current = quiet
    for time_s in edges:
        active = [value for start, end, value in intervals if start <= time_s < end]
        value = worst(active) if active else quiet
        if value != current:
            events.append((time_s, target, value))
            current = value
    return events


def _link_jitter(rng: np.random.Generator, num_devices: int, duration_s: float, mean_gap_s: float) -> list[Event]:
    """Links dropping to 20-80% of their bandwidth for ~20 s at a time."""
    events: list[Event] = []
    for link in range(num_devices - 1):
        intervals = _episodes(rng, duration_s, mean_gap_s, lambda: rng.lognormal(math.log(20.0), 1.0),
                              lambda: float(rng.uniform(0.2, 0.8)))
        events += _to_events(intervals, f"link:{link}", min)
    return events


# Each preset draws, from a seeded generator, episodes on every device and change events on links.
PresetDraw = tuple[list[list[Interval]], list[Event]]


def _light(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Occasional co-location: about one episode per device every 15 minutes, ~1 minute long."""
    per_device = [_episodes(rng, duration_s, 900.0, lambda: rng.lognormal(math.log(60.0), 1.0),
                            lambda: colocation_slowdown(rng)) for _ in range(num_devices)]
    return per_device, []


def _heavy(rng: np.random.Generator, num_devices: int, duration_s: float) -> PresetDraw:
    """Frequent, long co-location, rare 3-4x stragglers for minutes, and link jitter."""
    per_device = []
    for _ in range(num_devices):
        intervals = _episodes(rng, duration_s, 300.0, lambda: rng.lognormal(math.log(180.0), 1.0),
                              lambda: colocation_slowdown(rng))
        # Rare stragglers on top: the device 3-4x slower for minutes.
        intervals += _episodes(rng, duration_s, 2400.0, lambda: rng.lognormal(math.log(300.0), 0.7),
                               lambda: float(rng.uniform(3.0, 4.0)))
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


PRESET_GENERATORS: dict[str, Callable[[np.random.Generator, int, float], PresetDraw]] = {
    "none": lambda rng, num_devices, duration_s: ([[] for _ in range(num_devices)], []),
    "light": _light,
    "heavy": _heavy,
    "bursty": _bursty,
    "drift": _drift,
    "periodic": _periodic,
    "jitter": _jitter,
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
