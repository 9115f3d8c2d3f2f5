"""Pipeline simulator: the time of one training iteration of a partition under a schedule.

The schedule is simulated operation by operation: every stage runs its forward (F) and backward (B)
micro-batches in the schedule's order; F of micro-batch m on stage s waits for F of m on stage s-1,
B of m on stage s waits for B of m on stage s+1, and each such hand-off crosses the link between
the two stages (activation forward, gradient backward; one transfer at a time per link direction).
Operation durations come from the profile, stretched by each device's slowdown factor and, where
given, by each micro-batch's own factor (sequence-length imbalance: one micro-batch's compute 1.3x
another's, on every stage).

A hybrid job runs D replicas of the pipeline (:meth:`PipelineCosts.simulate_hybrid`): each replica
runs its own micro-batches under its devices' slowdowns, the iteration lasts as long as the slowest
replica, and then every stage group (the D devices holding the same layers) averages its gradients
with a ring all-reduce over the data-parallel links.

Per stage it reports ``compute_ms`` (forward + backward work), ``comm_ms`` (waiting on a transfer
that had already been produced) and ``idle_ms`` (the rest of the iteration: pipeline bubbles).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numba import njit
from numpy.typing import ArrayLike

from rlpipe.errors import InputError
from rlpipe.partition import SCHEDULES, Partition, link_bandwidths, link_transfer_ms, stage_edges, stage_of_layer
from rlpipe.profile import LayerProfile


@dataclass(frozen=True)
class IterationTiming:
    """One simulated iteration: its wall time and each stage's split of it, all in ms."""

    iteration_ms: float
    compute_ms: np.ndarray
    comm_ms: np.ndarray
    idle_ms: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        return {"iteration_ms": self.iteration_ms,
                "stages": [{"compute_ms": float(c), "comm_ms": float(w), "idle_ms": float(i)}
                           for c, w, i in zip(self.compute_ms, self.comm_ms, self.idle_ms)]}


def stage_order(num_stages: int, microbatches: int, schedule: str, stage: int) -> list[tuple[bool, int]]:
    """The ``(is_backward, microbatch)`` operations one stage runs, in its schedule's order."""
    if schedule == "gpipe":
        return [(False, m) for m in range(microbatches)] + [(True, m) for m in range(microbatches)]
    if schedule != "1f1b":
        raise InputError(f"--schedule '{schedule}': expected one of {', '.join(SCHEDULES)}")
    warmup = min(num_stages - stage - 1, microbatches)
    ops = [(False, m) for m in range(warmup)]
    for m in range(microbatches - warmup):  # steady state: one forward, one backward
        ops += [(False, warmup + m), (True, m)]
    ops += [(True, m) for m in range(microbatches - warmup, microbatches)]
    return ops


@lru_cache(maxsize=256)
def operation_graph(num_stages: int, microbatches: int, schedule: str) -> tuple[np.ndarray, ...]:
    """All operations in an order that respects every dependency, as flat arrays for the kernel.

    Returns (stage, is_backward, producer index or -1, link index, micro-batch) per operation.
    """
    orders = [stage_order(num_stages, microbatches, schedule, s) for s in range(num_stages)]
    position = [0] * num_stages
    index_of: dict[tuple[int, bool, int], int] = {}
    stage: list[int] = []
    backward: list[bool] = []
    producer: list[int] = []
    link: list[int] = []
    microbatch: list[int] = []
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for s in range(num_stages):
            while position[s] < len(orders[s]):
                is_bwd, mb = orders[s][position[s]]
                if is_bwd:
                    dep = (s + 1, True, mb) if s < num_stages - 1 else None
                else:
                    dep = (s - 1, False, mb) if s > 0 else None
                if dep is not None and dep not in index_of:
                    break
                index_of[(s, is_bwd, mb)] = len(stage)
                stage.append(s)
                backward.append(is_bwd)
                producer.append(-1 if dep is None else index_of[dep])
                link.append(-1 if dep is None else min(s, dep[0]))
                microbatch.append(mb)
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule} deadlocks with {num_stages} stages, {microbatches} micro-batches")
    return (np.array(stage, dtype=np.int64), np.array(backward, dtype=np.bool_),
            np.array(producer, dtype=np.int64), np.array(link, dtype=np.int64), np.array(microbatch, dtype=np.int64))


@dataclass(frozen=True)
class Overheads:
    """What a real pipeline spends beside compute and transfers (``rlpipe calibrate`` fits them).

    Attributes:
        op_ms: per forward or backward operation, on its stage, not counted as compute: the
            schedule's own Python, point-to-point calls, timer overshoot, ms.
        iteration_ms: per iteration, on every stage at its end: optimizer step, gradient reset, ms.
    """

    op_ms: float = 0.0
    iteration_ms: float = 0.0


NO_OVERHEADS = Overheads()


@njit(cache=True)
def simulate_kernel(op_stage, op_backward, op_producer, op_link, op_microbatch, fwd_ms, bwd_ms, link_ms, op_ms,
                    microbatch_factor):  # pragma: no cover
    """One iteration over the operation graph: (iteration ms, per-stage compute, comm wait, idle).
    ``microbatch_factor[m]`` stretches micro-batch m's compute on every stage (ones: none)."""
    num_stages = fwd_ms.shape[0]
    num_links = max(num_stages - 1, 1)
    end = np.empty(op_stage.shape[0])
    stage_free = np.zeros(num_stages)
    link_free = np.zeros((2, num_links))  # [direction, link]: when the link is next free
    compute = np.zeros(num_stages)
    comm_wait = np.zeros(num_stages)
    for i in range(op_stage.shape[0]):
        s = op_stage[i]
        direction = 1 if op_backward[i] else 0
        duration = (bwd_ms[s] if op_backward[i] else fwd_ms[s]) * microbatch_factor[op_microbatch[i]]
        start = stage_free[s]
        producer = op_producer[i]
        if producer >= 0:
            link = op_link[i]
            produced = end[producer]
            send = max(produced, link_free[direction, link])
            arrival = send + link_ms[link]
            link_free[direction, link] = arrival
            if arrival > start:
                comm_wait[s] += arrival - max(start, produced)
                start = arrival
        end[i] = start + duration + op_ms
        stage_free[s] = end[i]
        compute[s] += duration
    iteration = stage_free.max()
    return iteration, compute, comm_wait, iteration - compute - comm_wait


def simulate_schedule(fwd_ms: np.ndarray, bwd_ms: np.ndarray, link_ms: np.ndarray, schedule: str,
                      microbatches: int, overheads: Overheads = NO_OVERHEADS,
                      microbatch_factor: ArrayLike | None = None) -> IterationTiming:
    """Simulate one iteration from per-stage operation times (ms per micro-batch, slowdowns applied)
    and per-link one-way transfer times (ms per micro-batch; ``len = stages - 1``), plus overheads;
    ``microbatch_factor`` (one per micro-batch) stretches each micro-batch's compute."""
    if microbatches < 1:
        raise InputError(f"--microbatches: must be >= 1, got {microbatches}")
    graph = operation_graph(len(fwd_ms), microbatches, schedule)
    links = np.zeros(1) if len(link_ms) == 0 else np.asarray(link_ms, dtype=np.float64)
    factor = np.ones(microbatches) if microbatch_factor is None else np.asarray(microbatch_factor, dtype=np.float64)
    iteration, compute, comm, idle = simulate_kernel(*graph, np.asarray(fwd_ms, dtype=np.float64),  # type: ignore[call-arg]
                                                      np.asarray(bwd_ms, dtype=np.float64), links,
                                                      float(overheads.op_ms), factor)
    if overheads.iteration_ms:
        iteration, idle = iteration + overheads.iteration_ms, idle + overheads.iteration_ms
    return IterationTiming(float(iteration), compute, comm, np.maximum(idle, 0.0))


def allreduce_ms(num_bytes: np.ndarray | float, replicas: int, bandwidth_gbps: float) -> np.ndarray | float:
    """A ring all-reduce of ``num_bytes`` among ``replicas`` devices: each sends and receives
    2 (D - 1) / D of the bytes over its link, ms (0 for one replica)."""
    if replicas < 2:
        return np.zeros_like(np.asarray(num_bytes, dtype=np.float64))
    return link_transfer_ms(np.asarray(num_bytes, dtype=np.float64) * 2 * (replicas - 1) / replicas, bandwidth_gbps)


@dataclass(frozen=True)
class HybridTiming:
    """One iteration of a hybrid job: D replicas of the pipeline, then the gradient sync.

    Attributes:
        iteration_ms: the slowest replica's pipeline plus the slowest stage group's sync, ms.
        replicas: each replica's pipeline iteration (its own micro-batches and slowdowns).
        sync_ms: each stage group's gradient all-reduce, ms.
    """

    iteration_ms: float
    replicas: tuple[IterationTiming, ...]
    sync_ms: np.ndarray


class PipelineCosts:
    """A profile reduced to the prefix sums the simulator needs, so that per-partition costs are cheap."""

    def __init__(self, profile: LayerProfile):
        self.profile = profile
        self.num_layers = profile.num_layers
        self._prefix_fwd = np.concatenate([[0.0], np.cumsum([layer.fwd_ms for layer in profile.layers])])
        self._prefix_bwd = np.concatenate([[0.0], np.cumsum([layer.bwd_ms for layer in profile.layers])])
        self.prefix_param_bytes = np.concatenate([[0.0], np.cumsum([layer.param_bytes for layer in profile.layers])])
        self.activation_bytes = profile.activation_bytes()
        self.state_bytes = profile.state_bytes()
        self._stage_cache: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def stage_fwd_bwd_ms(self, boundaries: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Interference-free forward and backward ms per micro-batch of each stage."""
        edges = stage_edges(boundaries, self.num_layers)
        return np.diff(self._prefix_fwd[edges]), np.diff(self._prefix_bwd[edges])

    def link_ms(self, boundaries: Sequence[int], bandwidth_gbps: float,
                link_factors: ArrayLike | None = None) -> np.ndarray:
        """One-way transfer ms per micro-batch on each link (the activation leaving each stage)."""
        num_stages = len(boundaries)
        last_layers = np.asarray(boundaries[1:], dtype=np.int64) - 1
        links = link_bandwidths(num_stages, bandwidth_gbps, link_factors)
        return np.asarray(link_transfer_ms(self.activation_bytes[last_layers], links), dtype=np.float64)

    def stage_param_bytes(self, boundaries: Sequence[int]) -> np.ndarray:
        """Parameter bytes of each stage (what its stage group's gradient sync moves)."""
        return np.diff(self.prefix_param_bytes[stage_edges(boundaries, self.num_layers)])

    def sync_ms(self, boundaries: Sequence[int], replicas: int, dp_bandwidth_gbps: float) -> np.ndarray:
        """Each stage group's gradient all-reduce over data-parallel links of ``dp_bandwidth_gbps``, ms."""
        return np.asarray(allreduce_ms(self.stage_param_bytes(boundaries), replicas, dp_bandwidth_gbps))

    def simulate_hybrid(self, boundaries: Sequence[int], schedule: str, split: Sequence[int],
                        slowdown: ArrayLike | None = None, bandwidth_gbps: float = math.inf,
                        link_factors: ArrayLike | None = None, overheads: Overheads = NO_OVERHEADS,
                        dp_bandwidth_gbps: float | None = None,
                        microbatch_factor: ArrayLike | None = None) -> HybridTiming:
        """One iteration of ``len(split)`` replicas: replica r runs ``split[r]`` micro-batches under the
        slowdowns ``slowdown[r]`` (shape (D, S)) and link factors ``link_factors[r]`` (shape (D, S - 1)),
        then each stage group all-reduces its gradients over links of ``dp_bandwidth_gbps`` (default:
        ``bandwidth_gbps``). ``microbatch_factor`` (one per micro-batch of the job, replica 0's first)
        stretches each micro-batch's compute."""
        replicas, num_stages = len(split), len(boundaries)
        slow = np.ones((replicas, num_stages)) if slowdown is None else np.asarray(slowdown, dtype=np.float64)
        links = None if link_factors is None else np.asarray(link_factors, dtype=np.float64)
        factors = None if microbatch_factor is None else np.asarray(microbatch_factor, dtype=np.float64)
        offsets = np.concatenate([[0], np.cumsum(split)])
        timings = tuple(self.simulate(boundaries, schedule, int(split[r]), slow[r], bandwidth_gbps,
                                      None if links is None else links[r], overheads,
                                      None if factors is None else factors[offsets[r]:offsets[r + 1]])
                        for r in range(replicas))
        sync = self.sync_ms(boundaries, replicas, bandwidth_gbps if dp_bandwidth_gbps is None else dp_bandwidth_gbps)
        iteration = max(t.iteration_ms for t in timings) + (float(sync.max()) if len(sync) else 0.0)
        return HybridTiming(iteration, timings, sync)

    def simulate(self, boundaries: Sequence[int], schedule: str, microbatches: int,
                 slowdown: ArrayLike | None = None, bandwidth_gbps: float = math.inf,
                 link_factors: ArrayLike | None = None, overheads: Overheads = NO_OVERHEADS,
                 microbatch_factor: ArrayLike | None = None) -> IterationTiming:
        key = (tuple(boundaries), bandwidth_gbps)
        cached = self._stage_cache.get(key)
        if cached is None:  # per-partition costs are reused across the many conditions a partition meets
            if len(self._stage_cache) > 10_000:
                self._stage_cache.clear()
            cached = self._stage_cache[key] = (*self.stage_fwd_bwd_ms(boundaries),
                                               self.link_ms(boundaries, bandwidth_gbps))
        fwd, bwd, link_ms = cached
        if slowdown is not None:
            factor = np.asarray(slowdown, dtype=np.float64)
            fwd, bwd = fwd * factor, bwd * factor
        if link_factors is not None and len(link_ms) == len(np.atleast_1d(link_factors)):
            link_ms = link_ms / np.asarray(link_factors, dtype=np.float64)
        return simulate_schedule(fwd, bwd, link_ms, schedule, microbatches, overheads, microbatch_factor)


def simulate(profile: LayerProfile, partition: Partition, schedule: str = "1f1b", microbatches: int = 8,
             slowdown: ArrayLike | None = None, bandwidth_gbps: float = math.inf,
             link_factors: ArrayLike | None = None) -> IterationTiming:
    """One iteration of ``partition`` under ``schedule`` with per-device ``slowdown`` factors (>= 1)."""
    factors = None
    if slowdown is not None:
        factors = np.asarray(slowdown, dtype=np.float64)
        if factors.shape != (partition.num_stages,):
            raise InputError(f"--slowdown: expected {partition.num_stages} values (one per stage), got {factors.size}")
        if not np.all(np.isfinite(factors)) or np.any(factors <= 0):
            raise InputError(f"--slowdown: every factor must be a finite number > 0, got {factors.tolist()}")
    return PipelineCosts(profile).simulate(partition.boundaries, schedule, microbatches, factors,
                                           bandwidth_gbps, link_factors)


@dataclass(frozen=True)
class MigrationCost:
    """The stall of a repartition: a fixed overhead plus the moved state over the migration link.

    Attributes:
        bandwidth_gbps: bandwidth that parameters and optimizer state move at, Gbit/s.
        overhead_s: fixed cost of any repartition (agreeing, rebuilding stages and schedules), s.
    """

    bandwidth_gbps: float = 10.0
    overhead_s: float = 0.5

    def bytes_moved(self, state_bytes: np.ndarray, old: Sequence[int], new: Sequence[int]) -> float:
        """Parameter + optimizer bytes of the layers that change stage between two boundary lists."""
        num_layers = len(state_bytes)
        moved = stage_of_layer(old, num_layers) != stage_of_layer(new, num_layers)
        return float(state_bytes[moved].sum())

    def stall_s(self, state_bytes: np.ndarray, old: Sequence[int], new: Sequence[int]) -> float:
        """Seconds training stops to go from ``old`` to ``new`` boundaries (0 when they are equal)."""
        if tuple(old) == tuple(new):
            return 0.0
        return self.overhead_s + float(link_transfer_ms(self.bytes_moved(state_bytes, old, new),
                                                        self.bandwidth_gbps)) / 1e3
