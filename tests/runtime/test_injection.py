import time

import numpy as np
import pytest

from rlpipe.interference import InterferenceTrace
from rlpipe.runtime.injection import Injector


def test_throttle_follows_the_trace_on_the_scaled_clock(monkeypatch):
    """The sleeps asked for are recorded, not timed: the claim is what the injector asks of the host."""
    asked: list[float] = []
    monkeypatch.setattr(time, "sleep", asked.append)
    trace = InterferenceTrace(np.array([0.0, 10.0]), np.array([[1.0, 1.0], [1.0, 3.0]]), np.ones((2, 1)), 60.0)
    injector = Injector(trace, device=1, time_scale=100.0)  # 0.1 s of run time = 10 s of trace
    assert injector.slowdown() == 1.0
    injector.stretch(0.01)
    assert asked == []  # undisturbed: no sleep
    injector.start -= 0.12  # 0.12 s of run time later: trace time 12 s
    assert injector.slowdown() == 3.0
    injector.stretch(0.01)
    assert asked == [pytest.approx(0.02)]  # (3 - 1) x 10 ms


def test_colocate_starts_and_stops_a_competing_process():
    trace = InterferenceTrace(np.array([0.0]), np.array([[2.0]]), np.ones((1, 0)), 60.0)
    injector = Injector(trace, device=0, time_scale=1.0, mode="colocate")
    injector.stretch(0.0)
    competitor = injector._competitor
    assert competitor is not None and competitor.poll() is None
    injector.close()
    assert competitor.poll() is not None
