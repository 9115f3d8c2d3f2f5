"""Interference injected into live stages from a scenario or trace, on the simulator's clock.

The run's elapsed time, times ``time_scale``, is the trace time: with ``time_scale = 12`` a five-
minute run replays an hour of the scenario. ``throttle`` stretches each forward and backward chunk
by ``(slowdown - 1) x`` its measured time with a sleep (reproducible); ``colocate`` runs a real
competing busy loop on the stage's CPU core while the slowdown is on (honest, not exact).
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

    def stretch(self, elapsed_s: float) -> None:
        """Called after each compute chunk that took ``elapsed_s``: apply the current slowdown."""
        factor = self.slowdown()
        if self.mode == "throttle":
            if factor > 1.0:
                time.sleep((factor - 1.0) * elapsed_s)
        else:
            self._colocate(factor > 1.0)

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
