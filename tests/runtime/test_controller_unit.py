import math
import time

from rlpipe.profile import load_profile
from rlpipe.runtime.controller import Controller
from rlpipe.simulator import MigrationCost
from rlpipe.stats import IntervalStats, StageStats


def interval(boundaries, loads, num_layers=16):
    compute = load_profile("transformer16").compute_ms()
    edges = list(boundaries) + [num_layers]
    stages = tuple(StageStats(float(compute[a:b].sum() * load), 0.0, 1.0, b - a, 1e6, load)
                   for a, b, load in zip(edges, edges[1:], loads))
    return IntervalStats.from_stages(10, 10, 2.0, 0.0, tuple(boundaries), stages)


def test_dynpipe_controller_replans_off_a_straggler_and_logs_latency():
    controller = Controller("dynpipe", load_profile("transformer16"), 4, "1f1b", 8, MigrationCost(10.0, 0.1))
    start = controller.encoder.planner.ideal_boundaries
    before = time.perf_counter()
    decision = controller.decide(interval(start, [1.0, 1.0, 1.0, 1.0]))
    call_ms = (time.perf_counter() - before) * 1e3
    info = controller.last_decision
    assert decision.boundaries == start and decision.split == (8,) and info["action"] == "keep"
    assert 0 < info["latency_ms"] <= call_ms  # the decision's own time, inside the call's
    for _ in range(4):  # DynPipe checks every 50 iterations: 40 in, it has not looked yet
        assert controller.decide(interval(start, [1.0, 3.0, 1.0, 1.0])).boundaries == start
    target = controller.decide(interval(start, [1.0, 3.0, 1.0, 1.0])).boundaries
    assert target != start and controller.last_decision["action"] == "replan"
    sizes = [b - a for a, b in zip(target, list(target[1:]) + [16])]
    assert sizes[1] < [b - a for a, b in zip(start, list(start[1:]) + [16])][1]


def test_unusable_statistics_keep_the_partition():
    controller = Controller("greedy", load_profile("transformer16"), 4, "1f1b", 8, MigrationCost())
    start = controller.encoder.planner.ideal_boundaries
    target = controller.decide(interval(start, [1.0, math.nan, 1.0, 1.0])).boundaries
    assert target == start and "non-finite" in controller.last_decision["reason"]
