"""An onset re-split that weighs the next interval's rent (issue #19, 2026-12-08; not part of the package, not
tested).

Traced on the README table's first heavy episode at 4 x 1 (seed 4242; `falcon-early` 0.9889, the oracle 0.9951),
the largest losses are onsets `falcon-early` saw and did not act on:

- a 3.7x straggler from 4 s: the decision at 12.2 s read its tail at 3.58x (the interval's mean 2.87x), but the
  onset re-split needs three ended slowdowns in the run's history (none had ended) and the interval after it ran
  at half speed for 10 s;
- a 9.05x slowdown at 495 s: the decision at 499.9 s read a tail of 3.83x on stage 1 (mean 1.82x) and kept; the
  next interval of 10 iterations took 33.9 s instead of 5 (efficiency 0.23), the slowdown's whole life. Two
  tests held it: two slowdowns had ended (not three), and the interval was not `transient`, which is judged on
  the most loaded device only (the 3.7x straggler's stage, steady), and the onset test compares the tail's most
  loaded device with the estimate's (3.83 against 3.72: under 5%).

A decision commits the job to the next interval: K iterations at whatever speed holds. Where the tail's speed
would make that interval lose many stalls against the plan that fits it, waiting to learn more costs more than a
wasted round trip (3 stalls). The variant `rent` re-splits at such a tail (a tuple decision, the plan `_fit_tail`
fits) where `falcon-early` keeps, where:
- some device's tail is ``ONSET_WORSENING`` over its own estimate (``any=1``; ``any=0``: the encoder's test,
  the most loaded device's tail over the largest estimate, and the interval `transient`);
- the re-split gains more than the rules' least gain and three times the tail's noise;
- one more interval at the tail's speed would lose ``stalls`` (12) of its stalls;
- the run's timers are steady (`timers_steady`);
- where the run's history judges the imbalance (``expected_remaining_iterations`` not None), the encoder's own
  tests (survival, ``ONSET_LASTING``, the round trip) pass as well; where it does not, ``history=0`` moves on the
  rent alone (``history=1``: never without history).

Run from the repository root (the table of `onset_blind.py`):

    .venv/bin/python docs/experiments/onset_rent.py 4x1 "falcon-early,rent,rent:any=0,rent:history=1,oracle" \
        10 4242 heavy,drift,persistent,mixed

Measured 2026-12-08 01:10 (the table's episodes, 10 a preset, 4 x 1), minus `falcon-early`: every variant
(`rent`, `rent:any=0`, `rent:history=1`, `rent:stalls=24`) within 0.0001 on heavy, drift, persistent and mixed. On
heavy's episodes one by one, `rent` gained +0.0005 and +0.0010 on two (the 9.05x slowdown above is one), lost
-0.0018 on one, and was within 0.0001 on seven. The efficiency is a mean over decisions, and an interval of 34 s
at 0.23 is one decision of some 700; and at the run's start, where the 3.7x straggler's onset was, `timers_steady`
(40 device intervals first) holds it. Not pursued.
"""
import math
import sys

import numpy as np
import onset_blind

from rlpipe.agents.heuristics import KEEP, EarlyFalconPolicy
from rlpipe.observation import EARLY_RESPLIT_STALLS, ONSET_LASTING, ONSET_WORSENING, RULE_MIN_SURVIVAL, round_trip_pays
from rlpipe.stats import tail_iterations


def rent_onset(encoder, stalls: float, any_device: bool, history: bool):
    """The plan (partition, split) to re-split to at this interval's tail, or None (see the module)."""
    stats, planner = encoder.latest, encoder.planner
    if stats is None or stats.tail_load is None or not encoder.timers_steady:
        return None
    tail = planner.clip_load(np.asarray(stats.tail_load, dtype=np.float64).reshape(planner.replicas,
                                                                                   planner.num_stages))
    worst = tail.max(axis=0)
    if any_device:
        if not bool(np.any(worst > encoder.slowdown_estimate * (1.0 + ONSET_WORSENING))):
            return None
    elif not encoder.transient or float(worst.max()) <= float(encoder.slowdown_estimate.max()) * (1 + ONSET_WORSENING):
        return None
    current, split = tuple(stats.boundaries), encoder.split
    plan, now_ms, after_ms = encoder._fit_tail(current, split, tail, worst)
    if plan[0] == current or now_ms <= 0 or after_ms <= 0:
        return None
    age = float(tail_iterations(stats.iterations))
    tail_noise = encoder.noise_level * math.sqrt(stats.iterations / age)
    if now_ms / after_ms - 1.0 <= max(encoder.lost_time.min_gain, encoder.lost_time.noise_multiple * tail_noise):
        return None
    stall_s = planner.change_stall_s((current, split), plan, stats.iteration_ms)
    rent_s = stats.iterations * (now_ms - after_ms) / 1e3
    if rent_s < max(stalls, EARLY_RESPLIT_STALLS) * stall_s:
        return None
    remaining = encoder.expected_remaining_iterations(age)
    if remaining is None:
        return None if history else plan
    if encoder.imbalance_survival() < RULE_MIN_SURVIVAL:
        return None
    past = encoder._past_sorted
    outlasted = len(past) - int(np.searchsorted(past, age, side="right"))
    lasted = len(past) - int(np.searchsorted(past, age + 2 * stats.iterations, side="right"))
    if (lasted + 0.5) / (outlasted + 1.0) < ONSET_LASTING:
        return None
    saving = (1.0 - after_ms / now_ms) * remaining * now_ms / 1e3
    if not encoder.at_launch(*plan) and not round_trip_pays((saving, stall_s)):
        return None
    return plan


class RentFalcon(EarlyFalconPolicy):
    """`falcon-early`, and where it keeps, the rent onset re-split (see the module)."""

    def __init__(self, stalls: float = 12.0, any_device: bool = True, history: bool = False):
        super().__init__()
        self.stalls, self.any_device, self.history = stalls, any_device, history

    def act(self, observation, mask, context):
        action = super().act(observation, mask, context)
        if action != KEEP:
            return action
        plan = rent_onset(context.encoder, self.stalls, self.any_device, self.history)
        return KEEP if plan is None else plan


_plain_build = onset_blind.build


def build(name):
    """A policy by name: ``rent`` or ``rent:stalls=S;any=0|1;history=0|1``, else onset_blind's names."""
    if name == "rent" or name.startswith("rent:"):
        options = dict(p.split("=") for p in name[len("rent:"):].split(";") if p) if ":" in name else {}
        return RentFalcon(float(options.get("stalls", 12)), options.get("any", "1") == "1",
                          options.get("history", "0") == "1")
    return _plain_build(name)


if __name__ == "__main__":
    onset_blind.build = build
    onset_blind.main(sys.argv)
