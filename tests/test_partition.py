import itertools
import math

import numpy as np
import pytest
from conftest import make_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpipe.errors import InputError
from rlpipe.partition import Partition, optimal_partition, stage_memory_bytes, stage_times_ms


def test_partition_invariants_are_enforced():
    assert Partition((0, 3, 5), 8).stage_sizes() == [3, 2, 3]
    for bad in [(1, 3), (0, 3, 3), (0, 5, 2), (0, 8)]:
        with pytest.raises(InputError):
            Partition(bad, 8)


def test_moves_shift_one_layer_and_keep_stages_non_empty():
    p = Partition((0, 3, 5), 8)
    assert p.move(1, +1).boundaries == (0, 4, 5)
    assert p.move(1, -1).boundaries == (0, 2, 5)
    assert p.move(1, +1).moved_layers(p) == [(3, 0, 1)]
    assert not p.move(1, +1).can_move(1, +1)  # stage 1 would become empty
    assert not p.can_move(0, 1) and not p.can_move(3, -1)
    assert list(p.stage_of_layer()) == [0, 0, 0, 1, 1, 2, 2, 2]


def test_parse_reports_the_argument():
    with pytest.raises(InputError, match="--boundaries"):
        Partition.parse("0,a", 4)


def brute_force(profile, stages, speeds, bandwidth, link_cap, microbatches):
    best = math.inf
    for cut in itertools.combinations(range(1, profile.num_layers), stages - 1):
        partition = Partition((0, *cut), profile.num_layers)
        if link_cap is not None and stage_memory_bytes(profile, partition, microbatches).max() > link_cap:
            continue
        best = min(best, stage_times_ms(profile, partition, speeds, bandwidth).max())
    return best


@settings(max_examples=150, deadline=None)
@given(data=st.data(), num_layers=st.integers(1, 9), stages=st.integers(1, 4))
def test_optimal_partition_matches_brute_force(data, num_layers, stages):
    stages = min(stages, num_layers)
    compute = data.draw(st.lists(st.floats(0.0, 10.0), min_size=num_layers, max_size=num_layers))
    activation = data.draw(st.lists(st.integers(0, 10**6), min_size=num_layers, max_size=num_layers))
    state = data.draw(st.lists(st.integers(0, 10**6), min_size=num_layers, max_size=num_layers))
    speeds = data.draw(st.lists(st.floats(0.2, 2.0), min_size=stages, max_size=stages))
    bandwidth = data.draw(st.sampled_from([math.inf, 1.0, 0.1]))
    cap = data.draw(st.sampled_from([None, 3e6, 1e7]))
    profile = make_profile(compute, activation, state)
    expected = brute_force(profile, stages, speeds, bandwidth, cap, 4)
    if math.isinf(expected):
        with pytest.raises(InputError, match="no partition"):
            optimal_partition(profile, stages, speeds, bandwidth, memory_cap_bytes=cap, microbatches=4)
        return
    plan = optimal_partition(profile, stages, speeds, bandwidth, memory_cap_bytes=cap, microbatches=4)
    assert plan.bottleneck_ms == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # what it reports is what the cost model says of the partition it returns
    np.testing.assert_allclose(plan.stage_ms, stage_times_ms(profile, plan.partition, speeds, bandwidth), atol=1e-9)
    if cap is not None:
        assert stage_memory_bytes(profile, plan.partition, 4).max() <= cap


def test_slow_device_gets_fewer_layers(uniform_profile):
    plan = optimal_partition(uniform_profile, 3, speeds=[1.0, 0.5, 1.0])
    assert plan.partition.stage_sizes() == [5, 2, 5]


def test_large_problem_is_solved():
    rng = np.random.default_rng(0)
    profile = make_profile(rng.uniform(0.1, 2.0, 1000))
    plan = optimal_partition(profile, 16)
    assert plan.partition.num_stages == 16
    assert plan.bottleneck_ms <= profile.compute_ms().sum() / 16 + 2.0


def test_more_stages_than_layers_is_an_input_error(uniform_profile):
    with pytest.raises(InputError, match="more stages than"):
        optimal_partition(uniform_profile, 13)
