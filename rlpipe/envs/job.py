"""The simulated truth of one episode: a job of D replicas of an S-stage pipeline under the scenario's
conditions, as the simulator runs it.

It answers what the environment needs and a policy never sees: how long an iteration of a partition
and micro-batch split takes under a row of the trace (and, where micro-batches are unequal, under one
of a bank of drawn micro-batch patterns), what the best partition and split for those conditions
would give, and what each stage really computed over an interval of K iterations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from rlpipe.interference import InterferenceTrace
from rlpipe.partition import bottleneck_dp
from rlpipe.simulator import Overheads, PipelineCosts, operation_graph, simulate_kernel
from rlpipe.split import greedy_split, minimum_per_replica

PATTERNS = 4  # micro-batch patterns drawn per episode; each iteration of unequal micro-batches draws one


@dataclass(frozen=True)
class JobTiming:
    """One iteration of the job, in ms.

    Attributes:
        iteration_ms: the slowest replica's pipeline, then the slowest stage group's gradient sync.
        compute_ms: (D, S) each device's forward + backward per micro-batch.
        comm_ms: (D, S) each device's communication wait per iteration.
        idle_ms: (D, S) each device's idle time per iteration (bubbles, waiting for the slowest replica).
        sync_ms: (S,) each stage group's gradient all-reduce.
    """

    iteration_ms: float
    compute_ms: np.ndarray
    comm_ms: np.ndarray
    idle_ms: np.ndarray
    sync_ms: np.ndarray


@dataclass(frozen=True)
class Interval:
    """What K iterations of the job really did (the environment adds timer noise before anyone sees it).

    Attributes:
        end_s: when they ended, scenario time, s.
        compute_ms: (K, D, S) each iteration's compute per micro-batch of each device.
        comm_ms, idle_ms: (D, S) the mean per iteration.
        sync_ms: (S,) the mean gradient sync per iteration.
    """

    end_s: float
    compute_ms: np.ndarray
    comm_ms: np.ndarray
    idle_ms: np.ndarray
    sync_ms: np.ndarray


class SimulatedJob:
    """The truth of one episode.

    Args:
        costs: the profile's costs.
        trace: the scenario, over D x S devices.
        replicas, num_stages, microbatches, schedule: the job (M micro-batches per replica at the even split).
        bandwidth_gbps: the nominal bandwidth of every link, pipeline and data-parallel, Gbit/s.
        overheads: the host overheads every iteration pays.
        ideal_boundaries: the partition optimal without interference (a candidate of the reference).
        rng: draws the episode's micro-batch patterns.
    """

    def __init__(self, costs: PipelineCosts, trace: InterferenceTrace, replicas: int, num_stages: int,
                 microbatches: int, schedule: str, bandwidth_gbps: float, overheads: Overheads,
                 ideal_boundaries: tuple[int, ...], rng: np.random.Generator):
        self.costs, self.trace = costs, trace
        self.replicas, self.num_stages, self.microbatches, self.schedule = replicas, num_stages, microbatches, schedule
        self.bandwidth_gbps, self.overheads, self.ideal_boundaries = bandwidth_gbps, overheads, ideal_boundaries
        self.minimum = minimum_per_replica(schedule, num_stages)
        self.even = (microbatches,) * replicas
        self.patterns = rng.random((PATTERNS, replicas * microbatches))
        # every micro-batch's compute factor when equal, for as many micro-batches as any split runs
        self._equal_factors = np.ones(replicas * max(microbatches, self.minimum + 1))
        self.unequal = trace.microbatch_spread is not None and bool(np.any(trace.microbatch_spread > 1.0))
        self._activation_bits = costs.activation_bytes * 8e-6
        self._layer_compute = costs.profile.compute_ms()
        self._one_inflight = np.ones(num_stages)  # the reference plans without a memory cap
        self._partition_cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._timing_cache: dict[tuple, JobTiming] = {}
        self._reference_cache: dict[tuple[tuple[int, ...], tuple[int, ...], int], float] = {}
        self._graph_cache: dict[tuple[int, ...], tuple[np.ndarray, ...]] = {}
        self._probe_microbatches = max(microbatches, self.minimum + 1)  # where best() times a replica
        self._most_microbatches = self._probe_microbatches  # graphs held in the bank at least (it grows as needed)
        self._best_cache: dict[int, tuple[tuple[int, ...], tuple[int, ...], float]] = {}
        self._options_cache: dict[tuple[tuple[int, ...], ...], tuple[np.ndarray, ...]] = {}
        self._roundtrip_cache: dict[bytes, np.ndarray] = {}
        self._conditions_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._same_row: dict[int, int] = {}  # _same_conditions: a row -> the first row seen with its conditions
        self._row_by_conditions: dict[tuple[bytes, bytes, float], int] = {}

    # --- one iteration ------------------------------------------------------------------------

    def _partition(self, boundaries: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A partition's interference-free forward and backward ms per stage, one-way link ms and gradient
        sync ms per stage group (cached)."""
        found = self._partition_cache.get(boundaries)
        if found is None:
            fwd, bwd = self.costs.stage_fwd_bwd_ms(boundaries)
            links = self.costs.link_ms(boundaries, self.bandwidth_gbps) if len(boundaries) > 1 else np.zeros(1)
            sync = self.costs.sync_ms(boundaries, self.replicas, self.bandwidth_gbps)
            found = self._partition_cache[boundaries] = (fwd, bwd, links, sync)
        return found

    def _same_conditions(self, row: int) -> int:
        """The first row met with row ``row``'s conditions (slowdowns, link factors, micro-batch spread), whose
        cached results it shares: a burst that ends returns to the conditions before it, and every result
        here is a function of the conditions alone."""
        found = self._same_row.get(row)
        if found is None:
            trace = self.trace
            conditions = (trace.slowdown[row].tobytes(), trace.link_factor[row].tobytes(), trace.spread_at_row(row))
            found = self._same_row[row] = self._row_by_conditions.setdefault(conditions, row)
        return found

    def _conditions(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """(D, S) slowdowns and (D, S - 1) link factors of trace row ``row`` (cached)."""
        found = self._conditions_cache.get(row)
        if found is None:
            slowdown = np.ascontiguousarray(self.trace.slowdown[row].reshape(self.replicas, self.num_stages))
            links = (np.ones((self.replicas, 1)) if self.num_stages == 1
                     else np.ascontiguousarray(self.trace.replica_links(row, self.replicas)))
            found = self._conditions_cache[row] = (slowdown, links)
        return found

    def _factors(self, row: int, pattern: int) -> np.ndarray | None:
        """Every micro-batch's compute factor under row ``row`` and pattern ``pattern`` (``None``: equal)."""
        spread = self.trace.spread_at_row(row)
        if pattern < 0 or spread == 1.0:
            return None
        return 1.0 + (spread - 1.0) * self.patterns[pattern]

    def timing(self, boundaries: tuple[int, ...], split: tuple[int, ...], row: int, pattern: int = -1) -> JobTiming:
        """One iteration of ``boundaries`` and ``split`` under trace row ``row`` (and micro-batch pattern
        ``pattern``; -1: equal micro-batches), cached."""
        row = self._same_conditions(row)
        key = (boundaries, split, row, pattern)
        timing = self._timing_cache.get(key)
        if timing is None:
            if len(self._timing_cache) > 50_000:
                self._timing_cache.clear()
            factors = self._factors(row, pattern)
            pipelines, compute, comm, idle = self._run(boundaries, split, row, factors)
            sync = self._partition(boundaries)[3]
            iteration = max(pipelines.tolist()) + (max(sync.tolist()) if self.replicas > 1 else 0.0)
            timing = self._timing_cache[key] = JobTiming(iteration, compute, comm, idle, sync)
        return timing

    def _run(self, boundaries: tuple[int, ...], split: tuple[int, ...], row: int,
             factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every replica's pipeline under row ``row`` in one compiled call: (D,) pipeline ms, and (D, S)
        compute per micro-batch, communication wait and idle ms."""
        slowdown, links = self._conditions(row)
        fwd, bwd, link_ms, _ = self._partition(boundaries)
        return job_timing_kernel(  # type: ignore[call-arg]
            *self._graphs(split), fwd, bwd, link_ms, slowdown, links,
            self._equal_factors if factors is None else factors,
            float(self.overheads.op_ms), float(self.overheads.iteration_ms))

    def _graphs(self, split: tuple[int, ...]) -> tuple[np.ndarray, ...]:
        """The bank of operation graphs (:func:`graph_bank`), where each replica's graph for its micro-batches
        starts and ends in it, and its micro-batches (cached)."""
        found = self._graph_cache.get(split)
        if found is None:
            counts = np.asarray(split, dtype=np.int64)
            *bank, starts = self._bank(int(counts.max()))
            found = self._graph_cache[split] = (*bank, starts[counts], starts[counts + 1], counts)
        return found

    def _bank(self, most: int) -> tuple[np.ndarray, ...]:
        """The graph bank for this job's pipeline, holding replicas of up to ``most`` micro-batches at least."""
        self._most_microbatches = max(most, self._most_microbatches)
        return graph_bank(self.num_stages, self._most_microbatches, self.schedule)

    def mean_ms(self, boundaries: tuple[int, ...], split: tuple[int, ...], row: int) -> float:
        """The mean iteration time under row ``row``, over the micro-batch patterns where they differ."""
        return self.stretch(boundaries, split, row).iteration_ms

    # --- the reference: the best partition and split for the true conditions --------------------

    def _optimal(self, slowdown: np.ndarray, links: np.ndarray) -> tuple[int, ...]:
        """The bottleneck-optimal partition for one pipeline's true slowdowns and link factors."""
        key = links.tobytes()  # most rows leave every link at full bandwidth
        roundtrip = self._roundtrip_cache.get(key)
        if roundtrip is None:
            if self.num_stages > 1:
                roundtrip = 2 * (self._activation_bits[None, :] / (self.bandwidth_gbps * links)[:, None])
            else:
                roundtrip = np.zeros((1, self.costs.num_layers))
            self._roundtrip_cache[key] = roundtrip
        found, _, _ = bottleneck_dp(self._layer_compute, roundtrip, self.costs.state_bytes,
                                    self.costs.activation_bytes, 1.0 / slowdown, np.inf, self._one_inflight)
        return tuple(found.tolist())

    def best(self, row: int) -> tuple[tuple[int, ...], tuple[int, ...], float]:
        """The best partition and split for the true conditions of row ``row`` and its iteration time with
        equal micro-batches, ms: for one pipeline, the bottleneck-optimal partition or the interference-free
        one if that simulates faster; for replicas, also each of the most slowed replicas' own optimum and
        the partition optimal for every stage's worst device, each with its balanced split (and the even
        one)."""
        row = self._same_conditions(row)
        best = self._best_cache.get(row)
        if best is None:
            slowdown, links = self._conditions(row)
            worst, narrowest, slowest = _worst_devices(slowdown, links)
            # distinct partitions only: the first ones (for every stage's worst device, the launch plan) are tried
            # with the even split too
            candidates = list(dict.fromkeys([self._optimal(worst, narrowest), self.ideal_boundaries]))
            with_even = len(candidates)
            if self.replicas > 1:
                candidates = list(dict.fromkeys([*candidates, self._optimal(slowdown[slowest], links[slowest])]))
            # every option simulated in one compiled call (this runs at every change of conditions in training)
            pick = -self._most_microbatches
            while pick < 0:  # a balanced split wanted more micro-batches than the graph bank held: grow it
                pick, split, iteration_ms = best_kernel(  # type: ignore[call-arg]
                    *self._bank(-pick), *self._options(tuple(candidates)), slowdown, links, self._equal_factors,
                    float(self.overheads.op_ms), float(self.overheads.iteration_ms),
                    np.asarray(self.even, dtype=np.int64), with_even, self.minimum, self._probe_microbatches,
                    self.replicas * self.microbatches, self.replicas > 1)
            best = self._best_cache[row] = (candidates[pick], tuple(split.tolist()), iteration_ms)
        return best

    def _options(self, candidates: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, ...]:
        """The reference's candidate partitions as :func:`best_kernel` takes them: one row each, with their
        stages' and links' interference-free ms and their sync ms (cached: the same few recur)."""
        found = self._options_cache.get(candidates)
        if found is None:
            parts = [self._partition(b) for b in candidates]
            fwd, bwd, link_ms = (np.array([part[k] for part in parts]) for k in range(3))
            sync = np.array([max(part[3].tolist()) if self.replicas > 1 else 0.0 for part in parts])
            found = self._options_cache[candidates] = (np.array(candidates, dtype=np.int64), fwd, bwd, link_ms, sync)
        return found

    # --- an interval ----------------------------------------------------------------------------

    def stretch(self, boundaries: tuple[int, ...], split: tuple[int, ...], row: int) -> JobTiming:
        """An iteration under row ``row`` as a stretch of iterations sees it: its mean time, communication,
        idle and sync over the micro-batch patterns (where micro-batches are unequal), and every pattern's
        compute, ``(patterns, D, S)`` (cached)."""
        row = self._same_conditions(row)
        key = (boundaries, split, row, "stretch")
        found = self._timing_cache.get(key)
        if found is None:
            if not self.unequal or self.trace.spread_at_row(row) == 1.0:
                one = self.timing(boundaries, split, row)
                found = JobTiming(one.iteration_ms, one.compute_ms[None], one.comm_ms, one.idle_ms, one.sync_ms)
            else:
                bank = [self.timing(boundaries, split, row, p) for p in range(PATTERNS)]
                found = JobTiming(_mean([t.iteration_ms for t in bank]), np.array([t.compute_ms for t in bank]),
                                  _mean([t.comm_ms for t in bank]), _mean([t.idle_ms for t in bank]),
                                  _mean([t.sync_ms for t in bank]))
            self._timing_cache[key] = found
        return found

    def run_interval(self, boundaries: tuple[int, ...], split: tuple[int, ...], start_s: float, iterations: int,
                     rng: np.random.Generator) -> Interval:
        """Run ``iterations`` iterations from ``start_s`` through the trace's piecewise-constant conditions
        (an iteration that spans a change is split between the rows, in proportion); where micro-batches
        are unequal, each iteration's compute is that of a pattern it draws, its time the patterns' mean."""
        trace, shape = self.trace, (self.replicas, self.num_stages)
        row, until = trace.span_at(start_s)
        first = self.stretch(boundaries, split, row)
        end_s = start_s + iterations * first.iteration_ms / 1e3
        if end_s <= until:  # most intervals: one stretch of constant conditions
            return Interval(end_s, self._draw(first.compute_ms, iterations, rng), first.comm_ms, first.idle_ms,
                            first.sync_ms)
        comm, idle, sync = np.zeros(shape), np.zeros(shape), np.zeros(self.num_stages)
        ends, banks = [], []  # each stretch run: iterations done at its end, its compute
        time_s, done = start_s, 0.0
        while done < iterations - 1e-9:
            row, until = trace.span_at(time_s)
            timing = self.stretch(boundaries, split, row)
            take = min(iterations - done, (until - time_s) * 1e3 / timing.iteration_ms)
            take = max(take, min(iterations - done, 1e-6))  # never stall on a change that falls exactly now
            comm += take * timing.comm_ms
            idle += take * timing.idle_ms
            sync += take * timing.sync_ms
            time_s += take * timing.iteration_ms / 1e3
            done += take
            ends.append(done)
            banks.append(timing.compute_ms)
        # each iteration's compute: that of the stretch its middle fell in
        which = np.minimum(np.searchsorted(np.array(ends), np.arange(iterations) + 0.5), len(ends) - 1)
        per_iteration = np.empty((iterations, *shape))
        for iteration, w in enumerate(which.tolist()):  # a pattern drawn for each iteration, as _draw draws it
            bank = banks[w]
            per_iteration[iteration] = bank[0] if len(bank) == 1 else bank[rng.integers(len(bank), size=1)[0]]
        return Interval(time_s, per_iteration, comm / iterations, idle / iterations, sync / iterations)

    @staticmethod
    def _draw(bank: np.ndarray, iterations: int, rng: np.random.Generator) -> np.ndarray:
        """Each of ``iterations`` iterations' compute, ``(iterations, D, S)``: a pattern of the bank each."""
        if len(bank) == 1:
            return np.repeat(bank, iterations, axis=0)
        return bank[rng.integers(len(bank), size=iterations)]

    def reference_iterations(self, boundaries: tuple[int, ...], split: tuple[int, ...], start_s: float,
                             end_s: float) -> float:
        """Iterations the best partition and split for the true conditions would run in [start_s, end_s)
        (the partition and split in use count too, so that the reference is never beaten)."""
        total = 0.0
        for row, since, until in self.trace.segments(start_s, end_s):
            total += (until - since) * 1e3 / self.reference_ms(boundaries, split, row)
        return max(total, 1e-12)

    def prefetch_reference(self, boundaries: tuple[int, ...], split: tuple[int, ...], row: int) -> bool:
        """Work out :meth:`reference_ms` now (cached): whether it was not cached yet."""
        cached = len(self._reference_cache)
        self.reference_ms(boundaries, split, row)
        return len(self._reference_cache) > cached

    def reference_ms(self, boundaries: tuple[int, ...], split: tuple[int, ...], row: int) -> float:
        """The reference iteration time under row ``row``: the best for the true conditions or the plan in
        use, whichever is faster. Where micro-batches are unequal, the best is taken to suffer what the
        plan in use suffers from them (every partition meets the same micro-batches). Cached: every step asks."""
        key = (boundaries, split, self._same_conditions(row))
        found = self._reference_cache.get(key)
        if found is None:
            current = self.mean_ms(boundaries, split, row)
            best = self.best(row)[2]
            if self.unequal and self.trace.spread_at_row(row) > 1.0:
                best *= current / self.timing(boundaries, split, row).iteration_ms
            found = self._reference_cache[key] = min(best, current)
        return found


def _mean(values: list) -> Any:
    """The mean of a few floats or arrays, summed in order: bit for bit what ``np.mean(values, axis=0)`` gives
    for fewer than 8, without its conversions."""
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total / len(values)


@njit(cache=True)
def job_timing_kernel(op_stage, op_backward, op_producer, op_link, op_microbatch, op_starts, op_ends, split, fwd_ms,
                      bwd_ms, link_ms, slowdown, links, factors, op_ms, iteration_overhead_ms):  # pragma: no cover
    """One iteration of every replica (replica r: operations ``op_starts[r]:op_ends[r]`` of the graphs,
    ``split[r]`` micro-batches, ``slowdown[r]`` on the stages' interference-free ``fwd_ms`` and
    ``bwd_ms``, ``links[r]`` on the links' ``link_ms``, its micro-batches' compute ``factors``), then the
    job's: (each replica's pipeline ms, and per device compute per micro-batch, communication wait and idle
    ms, a replica that finished early waiting for the slowest). A replica under the same
    conditions as an earlier one is not simulated again."""
    replicas, stages = slowdown.shape
    pipeline = np.empty(replicas)
    compute, comm, idle = np.empty((replicas, stages)), np.empty((replicas, stages)), np.empty((replicas, stages))
    first_microbatch = np.zeros(replicas + 1, dtype=np.int64)
    for r in range(replicas):
        first_microbatch[r + 1] = first_microbatch[r] + split[r]
    for r in range(replicas):
        mine = factors[first_microbatch[r]:first_microbatch[r + 1]]
        same = -1
        for q in range(r):
            if (split[q] == split[r] and np.array_equal(slowdown[q], slowdown[r]) and np.array_equal(links[q], links[r])
                    and np.array_equal(factors[first_microbatch[q]:first_microbatch[q + 1]], mine)):
                same = q
                break
        if same >= 0:
            pipeline[r], compute[r], comm[r], idle[r] = pipeline[same], compute[same], comm[same], idle[same]
            continue
        replica_link_ms = link_ms / links[r] if link_ms.shape[0] == links.shape[1] else link_ms
        start, end = op_starts[r], op_ends[r]
        iteration, stage_compute, stage_comm, stage_idle = simulate_kernel(
            op_stage[start:end], op_backward[start:end], op_producer[start:end], op_link[start:end],
            op_microbatch[start:end], fwd_ms * slowdown[r], bwd_ms * slowdown[r], replica_link_ms, op_ms, mine)
        if iteration_overhead_ms != 0.0:
            iteration, stage_idle = iteration + iteration_overhead_ms, stage_idle + iteration_overhead_ms
        pipeline[r], compute[r], comm[r], idle[r] = iteration, stage_compute, stage_comm, np.maximum(stage_idle, 0.0)
    pipeline_ms = pipeline.max()
    for r in range(replicas):
        compute[r] /= split[r]
        idle[r] += pipeline_ms - pipeline[r]
    return pipeline, compute, comm, idle


_GRAPH_BANKS: dict[tuple[int, str], tuple[np.ndarray, ...]] = {}


def graph_bank(num_stages: int, most_microbatches: int, schedule: str) -> tuple[np.ndarray, ...]:
    """The operation graphs (:func:`~rlpipe.simulator.operation_graph`) of a replica of 1, 2, ... micro-batches
    end to end, at least up to ``most_microbatches``, and where each starts: the graph of m micro-batches is
    ``starts[m]:starts[m + 1]``, whatever split the replica is part of. One bank per pipeline shape, shared by
    every job; it grows (doubling) when a job needs more micro-batches than it holds."""
    bank = _GRAPH_BANKS.get((num_stages, schedule))
    held = 0 if bank is None else len(bank[-1]) - 2
    if held < most_microbatches:
        most = max(most_microbatches, 2 * held)
        graphs = [operation_graph(num_stages, m, schedule) for m in range(1, most + 1)]
        starts = np.zeros(most + 2, dtype=np.int64)
        starts[2:] = np.cumsum([len(graph[0]) for graph in graphs])
        bank = _GRAPH_BANKS[(num_stages, schedule)] = (
            *(np.concatenate(parts) for parts in zip(*graphs, strict=True)), starts)
    assert bank is not None
    return bank


@njit(cache=True)
def _job_ms(op_stage, op_backward, op_producer, op_link, op_microbatch, bank_starts, split, fwd_ms, bwd_ms, link_ms,
            sync_ms, slowdown, links, factors, op_ms, iteration_overhead_ms):  # pragma: no cover
    """Every replica's pipeline ms with ``split`` (graphs from the bank), and the job's iteration: the slowest
    replica, then the gradient sync ``sync_ms`` (as :meth:`SimulatedJob.timing` adds them)."""
    pipeline = job_timing_kernel(op_stage, op_backward, op_producer, op_link, op_microbatch, bank_starts[split],
                                 bank_starts[split + 1], split, fwd_ms, bwd_ms, link_ms, slowdown, links, factors,
                                 op_ms, iteration_overhead_ms)[0]
    return pipeline, pipeline.max() + sync_ms


@njit(cache=True)
def _worst_devices(slowdown, links):  # pragma: no cover
    """Of (D, S) ``slowdown`` and (D, S - 1) ``links``: every stage's worst slowdown and every link's lowest
    bandwidth factor over the replicas, and the most slowed replica (the first of equals, as ``np.argmax``)."""
    worst, narrowest = slowdown[0].copy(), links[0].copy()
    slowest, slowest_worst = 0, slowdown[0].max()
    for r in range(1, slowdown.shape[0]):
        for s in range(slowdown.shape[1]):
            worst[s] = max(worst[s], slowdown[r, s])
        for s in range(links.shape[1]):
            narrowest[s] = min(narrowest[s], links[r, s])
        replica_worst = slowdown[r].max()
        if replica_worst > slowest_worst:
            slowest, slowest_worst = r, replica_worst
    return worst, narrowest, slowest


@njit(cache=True)
def _precedes(ms, boundaries, split, best_ms, best_boundaries, best_split):  # pragma: no cover
    """Whether (ms, boundaries, split) sorts before the best so far, as Python orders such tuples."""
    if ms != best_ms:
        return ms < best_ms
    for a, b in zip(boundaries, best_boundaries):
        if a != b:
            return a < b
    for a, b in zip(split, best_split):
        if a != b:
            return a < b
    return False


@njit(cache=True)
def best_kernel(op_stage, op_backward, op_producer, op_link, op_microbatch, bank_starts, candidates, fwd_ms, bwd_ms,
                link_ms, sync_ms, slowdown, links, factors, op_ms, iteration_overhead_ms, even, with_even, minimum,
                probe, total, rebalance):  # pragma: no cover
    """The reference's choice among its options (:meth:`SimulatedJob.best`). Row c of ``candidates`` is a
    distinct partition, with its stages' and links' interference-free ``fwd_ms[c]``, ``bwd_ms[c]``,
    ``link_ms[c]`` and its sync. Options: the first ``with_even`` candidates with the ``even`` split; and where
    ``rebalance`` (replicas), every candidate with the split that best fits the replicas' true speeds (each
    replica's time taken as linear in its micro-batches between ``minimum`` and ``probe`` of them,
    :func:`~rlpipe.split.greedy_split` sharing ``total``). Returns (the chosen candidate, its split, its
    iteration ms): the fastest, ties ordered as Python orders (ms, partition, split) tuples; or (-m, ...) when a
    split needs graphs of m micro-batches that the bank does not hold."""
    best, best_split, best_ms = 0, even, np.inf
    replicas = slowdown.shape[0]
    # the even split's runs, kept: a probe or a balanced split equal to it is that run again (with 8 replicas
    # of 8 stages a run is ~40 us, and a step of long iterations meets dozens of new rows of conditions)
    even_pipelines, even_ms = np.empty((with_even, replicas)), np.empty(with_even)
    for c in range(with_even):
        even_pipelines[c], even_ms[c] = _job_ms(
            op_stage, op_backward, op_producer, op_link, op_microbatch, bank_starts, even, fwd_ms[c], bwd_ms[c],
            link_ms[c], sync_ms[c], slowdown, links, factors, op_ms, iteration_overhead_ms)
        if _precedes(even_ms[c], candidates[c], even, best_ms, candidates[best], best_split):
            best, best_split, best_ms = c, even, even_ms[c]
    if rebalance:
        low, high = np.full(replicas, minimum), np.full(replicas, probe)
        high_is_even = np.all(high == even)
        for c in range(candidates.shape[0]):
            at_low = _job_ms(op_stage, op_backward, op_producer, op_link, op_microbatch, bank_starts, low, fwd_ms[c],
                             bwd_ms[c], link_ms[c], 0.0, slowdown, links, factors, op_ms, iteration_overhead_ms)[0]
            if c < with_even and high_is_even:
                at_high = even_pipelines[c]
            else:
                at_high = _job_ms(op_stage, op_backward, op_producer, op_link, op_microbatch, bank_starts, high,
                                  fwd_ms[c], bwd_ms[c], link_ms[c], 0.0, slowdown, links, factors, op_ms,
                                  iteration_overhead_ms)[0]
            step = (at_high - at_low) / (probe - minimum)
            split = greedy_split(at_low - (minimum - 1) * step, step, total, minimum)
            if split.max() + 1 >= bank_starts.shape[0]:
                return -split.max(), split, np.inf
            if c < with_even and np.all(split == even):
                ms = even_ms[c]
            else:
                ms = _job_ms(op_stage, op_backward, op_producer, op_link, op_microbatch, bank_starts, split,
                             fwd_ms[c], bwd_ms[c], link_ms[c], sync_ms[c], slowdown, links, factors, op_ms,
                             iteration_overhead_ms)[1]
            if _precedes(ms, candidates[c], split, best_ms, candidates[best], best_split):
                best, best_split, best_ms = c, split, ms
    return best, best_split, best_ms
