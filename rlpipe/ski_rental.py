"""The ski-rental counts' arithmetic and the rules' round-trip test, compiled.

One implementation for every reader: :class:`~rlpipe.observation.LostTime` (the rules' counts) and
:meth:`~rlpipe.observation.ObservationEncoder.expected_remaining_iterations`, ``round_trip_saving`` and
:func:`~rlpipe.observation.round_trip_pays` call these one at a time, and the observation's global block runs them
all in one call every step (``rlpipe.observation._fill_counts``; in training that step is the environment's).
Python's ``max`` and ``min`` keep the first of equal values (a zero keeps its sign); ``first_max`` and ``first_min``
do the same, so that each figure here is the Python expression's bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

NOT_JUDGED = math.nan  # where too few slowdowns have ended to judge a round trip (None in Python's readers)


@njit(cache=True)
def first_max(a, b):  # pragma: no cover
    """Python's ``max(a, b)``."""
    return b if b > a else a


@njit(cache=True)
def first_min(a, b):  # pragma: no cover
    """Python's ``min(a, b)``."""
    return b if b < a else a


@njit(cache=True)
def counted(lost_s, held_intervals, held_iterations, now_ms, after_ms, noise_level, min_gain, noise_multiple,
            possible, transient, wall_s, stall_s, iterations):  # pragma: no cover
    """A ski-rental count after one interval (:meth:`~rlpipe.observation.LostTime.update`): its (lost_s,
    held_intervals, held_iterations), given the action's predicted iteration ms now and after it, the noise
    level its gain must clear ``noise_multiple`` times (and ``min_gain``), whether the action is possible, a
    ``transient`` interval (neither counts nor ends the count), and the interval's wall, stall (s) and
    iterations."""
    gain = now_ms / after_ms - 1.0 if after_ms > 0 else 0.0
    if not possible or gain <= first_max(min_gain, noise_multiple * noise_level):
        return 0.0, 0.0, 0.0
    if transient:
        return lost_s, float(held_intervals), float(held_iterations)
    return (lost_s + (wall_s - stall_s) * (1.0 - after_ms / now_ms), held_intervals + 1.0,
            held_iterations + float(iterations))


@njit(cache=True)
def reached(lost_s, held_intervals, stall_s, confirm_intervals, early_stalls):  # pragma: no cover
    """The rules' count test (:meth:`~rlpipe.observation.LostTime.reached`)."""
    early = early_stalls > 0 and held_intervals >= 1 and lost_s >= early_stalls * stall_s
    return lost_s >= stall_s and (held_intervals >= confirm_intervals or early)


@njit(cache=True)
def remaining_iterations(past_sorted, age, min_seen):  # pragma: no cover
    """:meth:`~rlpipe.observation.ObservationEncoder.expected_remaining_iterations` of an imbalance ``age``
    iterations old (at least 1) from the ended slowdowns ``past_sorted`` (shortest first); ``NOT_JUDGED``
    where fewer than ``min_seen`` have ended."""
    count = past_sorted.shape[0]
    first = np.searchsorted(past_sorted, age, side="right")
    longer, total = count - first, 0.0
    for k in range(first, count):  # in order, as Python's sum
        total += past_sorted[k]
    if longer >= min_seen:
        return total / longer - age
    if count < min_seen:
        return NOT_JUDGED
    further = total / longer - age if longer > 0 else 0.0
    return first_max(further, age - past_sorted[count - min_seen])


@njit(cache=True)
def survival(past_sorted, age):  # pragma: no cover
    """:meth:`~rlpipe.observation.ObservationEncoder.imbalance_survival` at ``age`` iterations (at least 1)."""
    count = past_sorted.shape[0]
    outlasted = count - np.searchsorted(past_sorted, age, side="right")
    doubled = count - np.searchsorted(past_sorted, 2 * age, side="right")
    return (doubled + 0.5) / (outlasted + 1.0)


@njit(cache=True)
def saving_s(past_sorted, imbalance_age, held_iterations, now_ms, after_ms, min_seen):  # pragma: no cover
    """What a move from ``now_ms`` to ``after_ms`` an iteration saves over the imbalance's expected remaining
    life, s (:meth:`~rlpipe.observation.ObservationEncoder.round_trip_saving`): its age is the larger of the
    most slowed device's and the count's ``held_iterations``; ``NOT_JUDGED`` where too few slowdowns ended."""
    remaining = remaining_iterations(past_sorted, first_max(first_max(held_iterations, imbalance_age), 1.0),
                                     min_seen)
    if math.isnan(remaining):
        return NOT_JUDGED
    return saving_over(remaining, now_ms, after_ms)


@njit(cache=True)
def saving_over(remaining, now_ms, after_ms):  # pragma: no cover
    """What a move from ``now_ms`` to ``after_ms`` an iteration saves over ``remaining`` iterations, s (at the
    iteration time now)."""
    return (1.0 - after_ms / now_ms) * remaining * now_ms / 1e3


@njit(cache=True)
def pays(saving, stall_s, round_trip):  # pragma: no cover
    """The rules' round-trip test (:func:`~rlpipe.observation.round_trip_pays`): the saving (s) reaches
    ``round_trip`` stalls; it passes where not judged, or where the test is off (``round_trip`` <= 0)."""
    return round_trip <= 0 or math.isnan(saving) or saving >= round_trip * stall_s
