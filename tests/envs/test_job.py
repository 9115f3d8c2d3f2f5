"""The episode's job: its compiled timing of D replicas is the simulator's hybrid iteration."""

import numpy as np
import pytest
from conftest import make_profile
from hypothesis import given, settings
from hypothesis import strategies as st

import rlpipe.envs.job as job_module
from rlpipe.envs.job import PATTERNS, SimulatedJob
from rlpipe.interference import InterferenceTrace
from rlpipe.simulator import Overheads, PipelineCosts
from rlpipe.split import balanced_split

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


def best_one_by_one(job: SimulatedJob, row: int) -> tuple[tuple[int, ...], tuple[int, ...], float]:
    """The reference's choice written out option by option through ``job.timing`` (what ``job.best`` computes
    in one compiled call): the candidates with the even split, then for replicas each with its balanced split;
    the fastest, ties ordered as Python orders the tuples."""
    slowdown, links = job._conditions(row)
    worst = job._optimal(slowdown.max(axis=0), links.min(axis=0))
    options = [(job.timing(b, job.even, row).iteration_ms, b, job.even) for b in (worst, job.ideal_boundaries)]
    if job.replicas > 1:
        slowest = int(np.argmax(slowdown.max(axis=1)))
        low, high = job.minimum, max(job.microbatches, job.minimum + 1)
        for b in (worst, job.ideal_boundaries, job._optimal(slowdown[slowest], links[slowest])):
            at_low = job._run(b, (low,) * job.replicas, row, None)[0]
            at_high = job._run(b, (high,) * job.replicas, row, None)[0]
            step = (at_high - at_low) / (high - low)
            split = balanced_split(at_low - (low - 1) * step, step, job.replicas * job.microbatches, job.minimum)
            options.append((job.timing(b, split, row).iteration_ms, b, split))
    iteration_ms, boundaries, split = min(options)
    return boundaries, split, iteration_ms


@settings(max_examples=40, deadline=None)
@given(slowdowns=st.lists(st.sampled_from([1.0, 1.5, 3.0, 8.0]), min_size=12, max_size=12),
       links=st.lists(st.sampled_from([1.0, 0.25]), min_size=11, max_size=11),
       replicas=st.sampled_from([1, 2, 4]), schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_the_references_compiled_choice_is_the_options_simulated_one_by_one(slowdowns, links, replicas, schedule):
    """Bit for bit: the same partition, split and iteration time, ties included (equal replicas, equal plans)."""
    slowdown = np.array(slowdowns).reshape(4, 3)[:replicas]
    job = job_under(slowdown, np.array(links)[:3 * replicas - 1], 1.0, schedule, Overheads(op_ms=0.05))
    assert job.best(0) == best_one_by_one(job, 0)


def test_the_graph_bank_grows_when_a_balanced_split_needs_more_microbatches(monkeypatch):
    """One replica 8x slower under GPipe (a replica may run 1 micro-batch): the fast one gets more than the 4
    micro-batches the bank starts with, and the reference still equals the options simulated one by one."""
    monkeypatch.setattr(job_module, "_GRAPH_BANKS", {})
    job = job_under(np.array([[8.0, 8.0, 8.0], [1.0, 1.0, 1.0]]), np.ones(5), 1.0, "gpipe", Overheads())
    boundaries, split, iteration_ms = job.best(0)
    assert max(split) > 4 and len(job_module._GRAPH_BANKS[(3, "gpipe")][-1]) - 2 >= max(split)
    assert (boundaries, split, iteration_ms) == best_one_by_one(job, 0)


plans = st.tuples(st.sampled_from([1.0, 2.0]), st.lists(st.integers(0, 2), min_size=3, max_size=3),
                  st.lists(st.integers(1, 3), min_size=2, max_size=2))


@given(plan=plans, best=plans)
def test_the_reference_breaks_ties_as_python_orders_its_options(plan, best):
    """(ms, partition, split) before the best so far exactly when Python's tuple order says so."""
    as_arrays = [(ms, np.array(b, dtype=np.int64), np.array(s, dtype=np.int64)) for ms, b, s in (plan, best)]
    expected = (plan[0], tuple(plan[1]), tuple(plan[2])) < (best[0], tuple(best[1]), tuple(best[2]))
    assert job_module._precedes(*as_arrays[0], *as_arrays[1]) == expected


def test_rows_of_equal_conditions_share_their_results_and_no_others_do():
    """A burst that ends returns to the conditions before it (rows 0 and 2): row 2 reuses row 0's results,
    which equal what a job that never met row 0 computes for row 2; a row that differs only in its
    micro-batch spread (row 3) is computed anew."""
    calm, burst = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0]), np.array([1.0, 3.0, 1.0, 1.0, 1.0, 1.0])
    costs = PipelineCosts(make_profile([1.0, 3.0, 2.0, 2.5, 1.5, 4.0, 1.0, 2.0, 3.0], activation_bytes=[40_000] * 9))

    def job() -> SimulatedJob:
        trace = InterferenceTrace(np.array([0.0, 10.0, 20.0, 30.0]), np.stack([calm, burst, calm, calm]),
                                  np.ones((4, 5)), 60.0, microbatch_spread=np.array([1.3, 1.3, 1.3, 1.0]))
        return SimulatedJob(costs, trace, 2, 3, 4, "1f1b", BANDWIDTH_GBPS, Overheads(), (0, 3, 6),
                            np.random.default_rng(0))

    shared, fresh = job(), job()
    plan = ((0, 2, 5), (5, 3))
    for row in range(4):  # as an episode meets them
        shared.best(row), shared.stretch(*plan, row)
    assert shared.best(2) is shared.best(0) and shared.stretch(*plan, 2) is shared.stretch(*plan, 0)
    assert shared.stretch(*plan, 3) is not shared.stretch(*plan, 0)
    for row in (2, 3, 1):  # the fresh job meets rows 2 and 3 first
        assert shared.best(row) == fresh.best(row)
        assert shared.stretch(*plan, row).iteration_ms == fresh.stretch(*plan, row).iteration_ms
        np.testing.assert_array_equal(shared.stretch(*plan, row).compute_ms, fresh.stretch(*plan, row).compute_ms)
