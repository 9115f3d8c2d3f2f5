"""Device time: what a stage's compute chunk costs, ``real`` or ``emulated``.

Real: whatever the host gives the chunk (on a CPU box with more stage processes than cores that is
contention, not a pipeline); injected interference stretches it (``throttle``) or competes with it
(``colocate``). Emulated: the chunk runs for real, then the stage sleeps (never spins) until it has
taken the profile's time for its layers x a scale x the injected slowdown, as a host waits on its GPU;
that time is the chunk's device time, whenever the host wakes.
A chunk whose real compute overran its emulated time is counted: if more than 5% do, the emulation
did not hold and the run says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from rlpipe.runlog import INVALID_OVERRUN_FRACTION
from rlpipe.runtime.config import DEVICE_TIME_MODES
from rlpipe.runtime.injection import Injector

__all__ = ["DEVICE_TIME_MODES", "INVALID_OVERRUN_FRACTION", "DeviceClock", "comparison_scale", "default_scale"]

EMULATION_MARGIN = 3.0  # emulated time this many times the real compute expected under contention: room for an
# ordinarily busy machine (2x left 2 of 5 runs on a busy 2-core box overrunning more than 5% of their chunks)


def default_scale(profile_ms: float, real_ms: float, processes: int, cores: int) -> float:
    """A device-time scale at which emulation holds here: the emulated time of a chunk exceeds its real
    compute with a margin, even when ``processes`` stages share ``cores`` cores.

    Args:
        profile_ms: the emulation profile's forward + backward time of the whole model, ms per micro-batch.
        real_ms: the same measured on this machine in one process, ms.
        processes: stage processes on this machine.
        cores: cores they may run on.
    """
    contention = max(1.0, processes / max(cores, 1))
    scale = EMULATION_MARGIN * contention * real_ms / max(profile_ms, 1e-9)
    return max(math.ceil(scale * 10) / 10, 0.1)


def comparison_scale(stages: int, cores: int) -> float:
    """One device-time scale for runs that will be compared with each other (a profile measured here):
    the default scale for a profile of this machine, fixed, so that every run emulates the same devices
    whatever the machine's load when each one starts."""
    return default_scale(1.0, 1.0, stages, cores)


class DeviceClock:
    """Times one stage's compute chunks and accounts its device time.

    Args:
        mode: ``real`` or ``emulated``.
        injector: the injected interference of this stage's device (``None``: none).
        device: the stage's device: on a GPU a chunk is over when the device has finished it, so the
            clock waits for the device before it reads the time.
    """

    def __init__(self, mode: str, injector: Injector | None = None, device: torch.device | None = None):
        self.mode, self.injector = mode, injector
        self.synchronise = (lambda: torch.cuda.synchronize(device)) if device is not None and device.type == "cuda" \
            else (lambda: None)
        self.forward_ms = self.backward_ms = 0.0  # emulated device time of one chunk of the current stage
        self.compute_s = 0.0
        self.staging_s = 0.0  # copies across the host boundary inside chunks (host-staged transport): communication
        self.chunks = self.overran = 0
        self.slowed_s = self.undisturbed_s = 0.0  # emulated: chunks' device time with and without the injection
        self.oversleep_s = 0.0  # how much longer than asked a sleep lasts here (running mean), taken off the next

    def set_stage(self, forward_ms: float, backward_ms: float) -> None:
        """The emulated device time of one forward and one backward chunk of the stage's layers, ms."""
        self.forward_ms, self.backward_ms = forward_ms, backward_ms

    def timed(self, chunk: Callable[..., Any], backward: bool, microbatch: int, *args: Any, **kwargs: Any) -> Any:
        """Run one compute chunk (of micro-batch ``microbatch`` of the job's batch) and account its device
        time; copies across the host boundary inside it (``staging_s``) are not device time."""
        self.synchronise()
        start, staged_before = time.perf_counter(), self.staging_s
        try:
            return chunk(*args, **kwargs)
        finally:
            self.synchronise()
            staged_s = self.staging_s - staged_before
            real_s = time.perf_counter() - start - staged_s
            if self.mode == "emulated":
                began, device_s = start + staged_s, (self.backward_ms if backward else self.forward_ms) / 1e3
                done = self.injector.finish_time(began, device_s) if self.injector is not None else began + device_s
                self.chunks += 1
                self.slowed_s, self.undisturbed_s = self.slowed_s + done - began, self.undisturbed_s + device_s
                if real_s > done - began:
                    self.overran += 1
                else:
                    self._sleep_until(done)
                # the device's time is the emulated one (or the real compute that overran it): a host that wakes
                # late from its sleep delays the next launch, as a busy host does a GPU's, without the device
                # having been slower (read as its load, one late wake-up showed a phantom 1.5x straggler)
                self.compute_s += max(real_s, done - began)
            else:
                if self.injector is not None:
                    self.injector.stretch(start, real_s)
                self.compute_s += time.perf_counter() - start - staged_s

    def take_met_slowdown(self) -> float:
        """The injected slowdown as this device's chunks since the last call met it: their emulated time over
        their undisturbed time (NaN with real device time, or where no chunk ran). A pipeline stage is idle
        for part of an iteration, so a slowdown that starts or ends inside one slows a share of its work
        that the iteration's span does not tell."""
        met = self.slowed_s / self.undisturbed_s if self.undisturbed_s > 0 else math.nan
        self.slowed_s = self.undisturbed_s = 0.0
        return met

    def _sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` (a perf_counter time), asking for less by the usual oversleep."""
        asked = deadline - time.perf_counter() - self.oversleep_s
        if asked > 0:
            before = time.perf_counter()
            time.sleep(asked)
            self.oversleep_s += 0.1 * ((time.perf_counter() - before - asked) - self.oversleep_s)
