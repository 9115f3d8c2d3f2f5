"""Interference injected into live stages from a scenario or trace, on the simulator's clock.

The run's elapsed time, times ``time_scale``, is the trace time: with ``time_scale = 12`` a five-
minute run replays an hour of the scenario. ``throttle`` stretches each forward and backward chunk
with a sleep until it would be done on the slowed device (its measured time x the slowdown:
reproducible); ``colocate`` runs a real competing busy loop on the stage's CPU core while the slowdown
is on (honest, not exact).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rlpipe.interference import InterferenceTrace, load_scenario
from rlpipe.runtime.processes import die_with_parent

INJECTION_MODES = ("throttle", "colocate")


class Injector:
    """The slowdown of one device over a live run.

    Args:
        trace: the scenario (already fitted to the pipeline's stage count).
        device: this stage's device index (its rank).
        time_scale: trace seconds per second of run time.
        mode: ``throttle`` or ``colocate``.
    """

    def __init__(self, trace: InterferenceTrace, device: int, time_scale: float, mode: str = "throttle"):
        self.trace, self.device, self.time_scale, self.mode = trace, device, time_scale, mode
        self.start = time.perf_counter()
        self._competitor: subprocess.Popen | None = None

    @classmethod
    def from_spec(cls, spec: str, num_devices: int, device: int, time_scale: float, mode: str, seed: int) -> Injector:
        duration_s = 3600.0
        return cls(load_scenario(spec, num_devices, duration_s, seed), device, time_scale, mode)

    def trace_time_s(self) -> float:
        return (time.perf_counter() - self.start) * self.time_scale

    def slowdown(self) -> float:
        return float(self.trace.at(self.trace_time_s())[0][self.device])

    def finish_time(self, started: float, work_s: float) -> float:
        """When a chunk that began at ``started`` (a ``time.perf_counter`` time) and needs ``work_s`` s of
        undisturbed device time is done on this device, its speed following the trace as the chunk runs:
        a slowdown that starts or ends inside the chunk slows the part of it that it holds, as the
        simulator runs an iteration through each stretch of constant conditions at that stretch's rate."""
        trace_s = (started - self.start) * self.time_scale
        return self.start + self.trace.finish_s(self.device, trace_s, work_s * self.time_scale) / self.time_scale

    def stretch(self, started: float, elapsed_s: float) -> None:
        """Called after each compute chunk that began at ``started`` (a ``time.perf_counter`` time) and
        took ``elapsed_s``: ``throttle`` sleeps until the chunk would be done on the slowed device."""
        if self.mode == "throttle":
            delay_s = self.finish_time(started, elapsed_s) - time.perf_counter()
            if delay_s > 0:
                time.sleep(delay_s)
        else:
            self._colocate(self.slowdown() > 1.0)

    def _colocate(self, on: bool) -> None:
        if on and self._competitor is None:
            core = self.device % (os.cpu_count() or 1)
            self._competitor = subprocess.Popen(
                [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"],
                preexec_fn=die_with_parent)
        elif not on and self._competitor is not None:
            self.close()

    def close(self) -> None:
        if self._competitor is not None:
            self._competitor.kill()
            self._competitor.wait()
            self._competitor = None
