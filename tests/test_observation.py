import numpy as np
import pytest

from rlpipe.observation import GLOBAL_FEATURES, KEEP, REPLAN, ActionLayout, ObservationEncoder
from rlpipe.planning import Planner, StatsError
from rlpipe.profile import load_profile
from rlpipe.stats import IntervalStats, StageStats


def stats_for(planner: Planner, boundaries, load, stall_s=0.0, iterations=50) -> IntervalStats:
    """Statistics of an interval in which each device ran ``load`` times slower than profiled."""
    edges = list(boundaries) + [planner.num_layers]
    compute = planner.profile.compute_ms()
    stages = tuple(StageStats(float(compute[a:b].sum() * stage_load), 0.1, 1.0, b - a, 1e6, float(stage_load))
                   for a, b, stage_load in zip(edges, edges[1:], load))
    return IntervalStats.from_stages(iterations, iterations, 0.2 * iterations + stall_s, stall_s, tuple(boundaries),
                                     stages)


@pytest.fixture
def planner():
    return Planner(load_profile("transformer16"), 4, "1f1b", 8)


def test_action_layout_round_trips():
    layout = ActionLayout(8)
    assert layout.num_actions == 16
    for action in range(2, 16):
        assert layout.move_action(*layout.move(action)) == action
    assert layout.describe(KEEP) == "keep" and layout.describe(REPLAN) == "replan"


def test_observation_is_fixed_size_padded_and_scale_free(planner):
    encoder = ObservationEncoder(planner, s_max=8, history=4)
    obs = encoder.observe(stats_for(planner, planner.ideal_boundaries, [1, 1, 1, 1]))
    assert obs.shape == (encoder.size,) and obs.dtype == np.float32
    per_stage = obs[: 8 * 10].reshape(8, 10)
    assert np.all(per_stage[:4, 0] == 1) and np.all(per_stage[4:] == 0)  # stage mask and padding
    # scaling every time by 10x (a 10x faster machine's profile and stats) gives the same observation
    fast = Planner(load_profile("transformer16"), 4, "1f1b", 8)
    assert np.allclose(obs, ObservationEncoder(fast).observe(stats_for(fast, fast.ideal_boundaries, [1] * 4)))


def test_a_slow_device_shows_and_replanning_is_offered(planner):
    encoder = ObservationEncoder(planner)
    balanced = planner.ideal_boundaries
    encoder.observe(stats_for(planner, balanced, [1, 1, 1, 1]))
    mask_before = encoder.action_mask(balanced)
    obs = encoder.observe(stats_for(planner, balanced, [1, 1, 2.5, 1]))
    assert not mask_before[REPLAN]  # nothing to gain: re-plan is masked
    assert encoder.action_mask(balanced)[REPLAN]
    replanned = encoder.decode(REPLAN, balanced)
    sizes = np.diff(list(replanned) + [16])
    assert sizes[2] < np.diff(list(balanced) + [16])[2]  # the slow stage loses layers
    assert obs[-GLOBAL_FEATURES + 1] > 0.2  # predicted re-plan gain
    assert obs[-GLOBAL_FEATURES + 2] > 0  # and its cost
    assert obs[2 * 10 + 6] > 0  # the slow device is marked as loaded


def test_moves_that_would_empty_a_stage_are_masked(planner):
    encoder = ObservationEncoder(planner)
    boundaries = (0, 1, 2, 3)
    encoder.observe(stats_for(planner, boundaries, [1] * 4))
    mask = encoder.action_mask(boundaries)
    layout = encoder.layout
    assert not mask[layout.move_action(1, -1)] and not mask[layout.move_action(1, +1)]
    assert mask[layout.move_action(3, +1)]
    assert not mask[layout.move_action(5, +1)]  # a padded boundary
    assert encoder.decode(layout.move_action(1, -1), boundaries) is None


def test_bad_statistics_are_refused(planner):
    encoder = ObservationEncoder(planner)
    with pytest.raises(StatsError):
        encoder.observe(stats_for(planner, planner.ideal_boundaries, [1, float("nan"), 1, 1]))
    with pytest.raises(StatsError):
        encoder.observe(stats_for(planner, planner.ideal_boundaries[:3], [1, 1, 1]))
    with pytest.raises(StatsError):
        ObservationEncoder(Planner(load_profile("transformer16"), 9), s_max=8)


def test_the_observation_is_the_same_for_the_same_iterations_whatever_the_interval(planner):
    """Durations count iterations: 20 intervals of 10 iterations read as 4 intervals of 50 (both with
    their load history full)."""
    short, long = ObservationEncoder(planner), ObservationEncoder(planner)
    slow = [1, 1, 2.0, 1]
    for _ in range(20):
        by_tens = short.observe(stats_for(planner, planner.ideal_boundaries, slow, iterations=10))
    for _ in range(4):
        by_fifties = long.observe(stats_for(planner, planner.ideal_boundaries, slow, iterations=50))
    assert np.allclose(by_tens, by_fifties)
    stalled = [e.observe(stats_for(planner, planner.ideal_boundaries, slow, stall_s=0.5, iterations=k))
               for e, k in ((short, 10), (long, 50))]
    assert np.allclose(stalled[0][-10:-3], stalled[1][-10:-3])  # a stall reads in iterations too


def test_the_timer_noise_is_measured(planner):
    encoder = ObservationEncoder(planner)
    rng = np.random.default_rng(0)
    for _ in range(300):
        observation = encoder.observe(stats_for(planner, planner.ideal_boundaries, np.exp(rng.normal(0, 0.04, 4))))
    assert encoder.noise_level == pytest.approx(0.04, rel=0.2) and observation[-3] == pytest.approx(encoder.noise_level)


def test_a_congested_link_is_seen_through_communication_wait():
    planner = Planner(load_profile("cnn16"), 4, "1f1b", 8, bandwidth_gbps=10.0)
    encoder = ObservationEncoder(planner)
    boundaries = planner.ideal_boundaries
    edges = list(boundaries) + [16]
    compute = planner.profile.compute_ms()
    transfer_ms = 8 * planner.costs.activation_bytes[edges[2] - 1] * 8e-6 / 10.0 * 8  # link 1 at 1/8 bandwidth
    stages = [StageStats(float(compute[a:b].sum()), 0.0, 1.0, b - a, 1e6, 1.0) for a, b in zip(edges, edges[1:])]
    stages[1] = StageStats(stages[1].compute_ms, transfer_ms, 1.0, stages[1].num_layers, 1e6, 1.0)
    stages[2] = StageStats(stages[2].compute_ms, transfer_ms, 1.0, stages[2].num_layers, 1e6, 1.0)
    observation = encoder.observe(IntervalStats.from_stages(50, 50, 10.0, 0.0, boundaries, stages))
    assert encoder.link_estimate[1] == pytest.approx(1 / 8, rel=0.01) and encoder.link_estimate[0] == 1.0
    moves = observation[8 * 10:8 * 10 + 3 * 7].reshape(7, 3)
    assert moves[1, 2] == pytest.approx(7, rel=0.01) and moves[0, 2] == 0.0
