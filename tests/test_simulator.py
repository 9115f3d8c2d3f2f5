import numpy as np
import pytest
from conftest import make_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpipe.errors import InputError
from rlpipe.partition import Partition
from rlpipe.simulator import MigrationCost, simulate, simulate_schedule


@pytest.mark.parametrize("stages, microbatches", [(1, 1), (2, 4), (4, 8), (8, 32), (3, 2)])
def test_gpipe_equal_stages_take_m_plus_s_minus_1_slots(stages, microbatches):
    fwd, bwd = np.full(stages, 1.5), np.full(stages, 2.5)
    timing = simulate_schedule(fwd, bwd, np.zeros(stages - 1), "gpipe", microbatches)
    assert timing.iteration_ms == pytest.approx((microbatches + stages - 1) * 4.0)


@pytest.mark.parametrize("stages, microbatches", [(2, 4), (4, 8), (8, 32), (4, 4)])
def test_1f1b_matches_gpipe_on_equal_stages(stages, microbatches):
    # Theory: with equal stages and free communication both have the same bubble, (S-1)(f+b).
    fwd, bwd = np.full(stages, 1.0), np.full(stages, 2.0)
    gpipe = simulate_schedule(fwd, bwd, np.zeros(stages - 1), "gpipe", microbatches)
    one_f_one_b = simulate_schedule(fwd, bwd, np.zeros(stages - 1), "1f1b", microbatches)
    assert one_f_one_b.iteration_ms == pytest.approx(gpipe.iteration_ms)


def test_hand_computed_two_stage_case():
    fwd, bwd = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    gpipe = simulate_schedule(fwd, bwd, np.zeros(1), "gpipe", 2)
    assert gpipe.iteration_ms == 16.0
    one_f_one_b = simulate_schedule(fwd, bwd, np.zeros(1), "1f1b", 2)
    assert one_f_one_b.iteration_ms == 16.0
    np.testing.assert_allclose(one_f_one_b.compute_ms, [8.0, 12.0])
    np.testing.assert_allclose(one_f_one_b.idle_ms, [8.0, 4.0])
    # A 0.5 ms link: stage 1 waits 0.5 for its first activation, stage 0 0.5 for each gradient.
    with_link = simulate_schedule(fwd, bwd, np.array([0.5]), "gpipe", 2)
    assert with_link.iteration_ms == 17.0
    np.testing.assert_allclose(with_link.comm_ms, [1.0, 0.5])
    np.testing.assert_allclose(with_link.compute_ms + with_link.comm_ms + with_link.idle_ms, 17.0)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), stages=st.integers(1, 6), microbatches=st.integers(1, 12),
       schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_slowing_a_device_never_shortens_an_iteration(data, stages, microbatches, schedule):
    times = st.lists(st.floats(0.01, 10.0), min_size=stages, max_size=stages)
    fwd, bwd = np.array(data.draw(times)), np.array(data.draw(times))
    links = np.array(data.draw(st.lists(st.floats(0.0, 2.0), min_size=stages - 1, max_size=stages - 1)))
    device = data.draw(st.integers(0, stages - 1))
    factor = data.draw(st.floats(1.0, 4.0))
    base = simulate_schedule(fwd, bwd, links, schedule, microbatches)
    slow_fwd, slow_bwd = fwd.copy(), bwd.copy()
    slow_fwd[device] *= factor
    slow_bwd[device] *= factor
    slowed = simulate_schedule(slow_fwd, slow_bwd, links, schedule, microbatches)
    assert slowed.iteration_ms >= base.iteration_ms - 1e-9
    # every stage's time adds up to the iteration
    np.testing.assert_allclose(slowed.compute_ms + slowed.comm_ms + slowed.idle_ms, slowed.iteration_ms)
    # no schedule beats the busiest stage's own work
    assert slowed.iteration_ms >= microbatches * (slow_fwd + slow_bwd).max() - 1e-9


def test_simulate_a_profile_partition_with_slowdown():
    profile = make_profile([3.0] * 8)
    partition = Partition((0, 2, 4, 6), 8)
    base = simulate(profile, partition, "1f1b", 8)
    slowed = simulate(profile, partition, "1f1b", 8, slowdown=[1, 1, 2, 1])
    assert base.iteration_ms == pytest.approx((8 + 3) * 6.0)
    assert slowed.compute_ms[2] == pytest.approx(2 * base.compute_ms[2])
    assert slowed.iteration_ms > base.iteration_ms
    with pytest.raises(InputError, match="--slowdown"):
        simulate(profile, partition, "1f1b", 8, slowdown=[1, 1])


def test_migration_stall_counts_moved_state_over_bandwidth():
    state = np.array([1e9, 2e9, 3e9, 4e9])
    cost = MigrationCost(bandwidth_gbps=8.0, overhead_s=0.25)
    assert cost.stall_s(state, (0, 2), (0, 2)) == 0.0
    assert cost.bytes_moved(state, (0, 2), (0, 1)) == 2e9  # layer 1 moves
    assert cost.stall_s(state, (0, 2), (0, 1)) == pytest.approx(0.25 + 2e9 * 8 / 8e9)
    assert cost.bytes_moved(state, (0, 2), (0, 3)) == 3e9
