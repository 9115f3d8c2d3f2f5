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
    injector.stretch(time.perf_counter() - 0.01, 0.01)
    assert asked == []  # undisturbed: no sleep
    injector.start -= 0.12  # 0.12 s of run time later: trace time 12 s
    assert injector.slowdown() == 3.0
    injector.stretch(time.perf_counter() - 0.01, 0.01)
    assert asked == [pytest.approx(0.02, abs=0.002)]  # (3 - 1) x 10 ms


def test_a_chunk_that_a_slowdown_starts_inside_is_slowed_for_the_part_it_holds():
    trace = InterferenceTrace(np.array([0.0, 10.0, 20.0]), np.array([[1.0], [3.0], [1.0]]), np.ones((3, 0)), 60.0)
    injector = Injector(trace, device=0, time_scale=1.0)
    # 2 s of work from 9 s: 1 s at 1x, then the second at 3x (3 s): done at 13 s, where the slowdown at
    # the chunk's end (3x for all of it) would say 15 s
    assert injector.finish_time(injector.start + 9.0, 2.0) == pytest.approx(injector.start + 13.0)
    # 6 s of work from 8 s: 2 s, then 10 s at 3x (3.33 s of work), then the rest at 1x again: 20.67 s
    assert injector.finish_time(injector.start + 8.0, 6.0) == pytest.approx(injector.start + 20.0 + 6.0 - 2.0 - 10 / 3)
    assert injector.finish_time(injector.start + 30.0, 2.0) == pytest.approx(injector.start + 32.0)  # after it: 1x


def test_colocate_starts_and_stops_a_competing_process():
    trace = InterferenceTrace(np.array([0.0]), np.array([[2.0]]), np.ones((1, 0)), 60.0)
    injector = Injector(trace, device=0, time_scale=1.0, mode="colocate")
    injector.stretch(time.perf_counter(), 0.0)
    competitor = injector._competitor
    assert competitor is not None and competitor.poll() is None
    injector.close()
    assert competitor.poll() is not None
