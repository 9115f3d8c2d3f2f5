"""The episode's job: its compiled timing of D replicas is the simulator's hybrid iteration."""

import numpy as np
import pytest
from conftest import make_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpipe.envs.job import PATTERNS, SimulatedJob
from rlpipe.interference import InterferenceTrace
from rlpipe.simulator import Overheads, PipelineCosts

BANDWIDTH_GBPS = 0.5  # slow links: the transfers shape the schedule


def job_under(slowdown: np.ndarray, link_factor: np.ndarray, spread: float, schedule: str,
              overheads: Overheads) -> SimulatedJob:
    """A job of ``slowdown.shape[0]`` replicas of a 3-stage pipeline of 9 layers under one row of conditions."""
    replicas, stages = slowdown.shape
    costs = PipelineCosts(make_profile([1.0, 3.0, 2.0, 2.5, 1.5, 4.0, 1.0, 2.0, 3.0],
                                       activation_bytes=[40_000] * 9))
    trace = InterferenceTrace(np.array([0.0]), slowdown.reshape(1, -1), link_factor.reshape(1, -1), 60.0,
                              microbatch_spread=np.array([spread]))
    return SimulatedJob(costs, trace, replicas, stages, 4, schedule, BANDWIDTH_GBPS, overheads, (0, 3, 6),
                        np.random.default_rng(0))


@settings(max_examples=40, deadline=None)
@given(slowdowns=st.lists(st.sampled_from([1.0, 1.5, 3.0]), min_size=12, max_size=12),
       links=st.lists(st.sampled_from([1.0, 0.25]), min_size=11, max_size=11),
       shift=st.integers(0, 2), pattern=st.integers(-1, PATTERNS - 1), schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_the_jobs_timing_is_the_simulators_hybrid_iteration(slowdowns, links, shift, pattern, schedule):
    """Four replicas, some under the same conditions (simulated once), with an unequal micro-batch split,
    unequal micro-batches and host overheads: every figure equals the simulator's, replica by replica."""
    slowdown = np.array(slowdowns).reshape(4, 3)
    slowdown[3] = slowdown[1]  # replicas 1 and 3 alike: the kernel reuses replica 1's pipeline
    overheads = Overheads(op_ms=0.05, iteration_ms=0.4)
    job = job_under(slowdown, np.array(links), 1.3, schedule, overheads)
    split = (4 - shift, 4, 4 + shift, 4)
    found = job.timing((0, 2, 5), split, 0, pattern)

    factors = None if pattern < 0 else 1.0 + 0.3 * job.patterns[pattern]
    expected = job.costs.simulate_hybrid((0, 2, 5), schedule, split, slowdown, BANDWIDTH_GBPS,
                                         job.trace.replica_links(0, 4), overheads, microbatch_factor=factors)
    assert found.iteration_ms == pytest.approx(expected.iteration_ms, rel=1e-12)
    pipeline_ms = max(r.iteration_ms for r in expected.replicas)
    for r, replica in enumerate(expected.replicas):
        np.testing.assert_allclose(found.compute_ms[r], replica.compute_ms / split[r], rtol=1e-12)
        np.testing.assert_allclose(found.comm_ms[r], replica.comm_ms, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(found.idle_ms[r], replica.idle_ms + pipeline_ms - replica.iteration_ms,
                                   rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(found.sync_ms, expected.sync_ms)


def test_one_pipeline_waits_for_no_replica_and_syncs_nothing():
    job = job_under(np.array([[1.0, 2.0, 1.0]]), np.ones(2), 1.0, "1f1b", Overheads())
    found = job.timing((0, 3, 6), (4,), 0)
    expected = job.costs.simulate((0, 3, 6), "1f1b", 4, np.array([1.0, 2.0, 1.0]), BANDWIDTH_GBPS)
    assert found.iteration_ms == expected.iteration_ms
    np.testing.assert_array_equal(found.idle_ms[0], expected.idle_ms)
