"""The compiled ski-rental arithmetic, against what Python's own expressions give."""

import math

import numpy as np

from rlpipe.ski_rental import (
    NOT_JUDGED,
    counted,
    first_max,
    first_min,
    pays,
    reached,
    remaining_iterations,
    saving_s,
    survival,
)


def test_first_max_and_min_keep_the_first_of_equals_as_python_does():
    for a, b in ((-0.0, 0.0), (0.0, -0.0), (1.0, 2.0), (2.0, 1.0), (3.0, 3.0)):
        assert math.copysign(1.0, first_max(a, b)) == math.copysign(1.0, max(a, b)) and first_max(a, b) == max(a, b)
        assert math.copysign(1.0, first_min(a, b)) == math.copysign(1.0, min(a, b)) and first_min(a, b) == min(a, b)


def test_a_count_grows_on_a_gain_pauses_on_a_transient_interval_and_ends_below_the_bar():
    # 20 ms now, 10 after: a gain of 1, over the bar; 9 s of the interval's 10 ran (1 s stalled): half is lost
    grown = counted(2.0, 1, 30, 20.0, 10.0, 0.01, 0.03, 3.0, True, False, 10.0, 1.0, 10)
    assert grown == (2.0 + 9.0 * 0.5, 2.0, 40.0)
    assert counted(2.0, 1, 30, 20.0, 10.0, 0.01, 0.03, 3.0, True, True, 10.0, 1.0, 10) == (2.0, 1.0, 30.0)
    assert counted(2.0, 1, 30, 20.0, 19.9, 0.01, 0.03, 3.0, True, False, 10.0, 1.0, 10) == (0.0, 0.0, 0.0)  # 0.5%
    assert counted(2.0, 1, 30, 20.0, 10.0, 0.5, 0.03, 3.0, True, False, 10.0, 1.0, 10) == (0.0, 0.0, 0.0)  # noise
    assert counted(2.0, 1, 30, 20.0, 10.0, 0.01, 0.03, 3.0, False, False, 10.0, 1.0, 10) == (0.0, 0.0, 0.0)


def test_the_count_test_waits_for_its_intervals_unless_one_already_lost_enough():
    assert reached(3.0, 2, 1.0, 2, 0.0) and not reached(3.0, 1, 1.0, 2, 0.0) and not reached(0.5, 2, 1.0, 2, 0.0)
    assert reached(4.0, 1, 1.0, 2, 4.0) and not reached(3.9, 1, 1.0, 2, 4.0)


def test_remaining_life_and_survival_from_the_slowdowns_seen_end():
    past = np.array([10.0, 20.0, 20.0, 40.0, 100.0])
    assert remaining_iterations(past, 15.0, 3) == (20 + 20 + 40 + 100) / 4 - 15  # four outlasted 15
    assert remaining_iterations(past, 30.0, 3) == max((40 + 100) / 2 - 30, 30.0 - 20.0)  # two: the history's limit
    assert remaining_iterations(past, 200.0, 3) == 200.0 - 20.0  # beyond all: as long again beyond the third-longest
    assert math.isnan(remaining_iterations(past[:2], 5.0, 3))  # two seen: too few to judge
    # of the 3 that outlasted 20 iterations (strictly), those that lasted 40 (strictly): 1, with a half-count prior
    assert survival(past, 20.0) == (1 + 0.5) / (2 + 1.0)
    assert survival(np.zeros(0), 1.0) == 0.5


def test_saving_and_its_round_trip_test():
    past = np.array([10.0, 20.0, 20.0, 40.0, 100.0])
    # an imbalance 15 iterations old (its count has held 12): 45 - 15 = 30 more; from 20 to 10 ms saves half of each
    assert saving_s(past, 15.0, 12.0, 20.0, 10.0, 3) == 0.5 * 30.0 * 20.0 / 1e3
    assert saving_s(past, 5.0, 15.0, 20.0, 10.0, 3) == 0.5 * 30.0 * 20.0 / 1e3  # the count's age if longer
    assert math.isnan(saving_s(past[:2], 15.0, 12.0, 20.0, 10.0, 3))
    assert pays(0.3, 0.09, 3.0) and not pays(0.3, 0.11, 3.0)
    assert pays(NOT_JUDGED, 100.0, 3.0) and pays(0.0, 100.0, 0.0)  # not judged, or the test off: it passes
