"""The end of a statistics interval: what each rank reports, gathered on rank 0 as the StageStats
contract and one log record."""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rlpipe.runtime.mesh import ParallelDims
from rlpipe.runtime.stage import Repartition
from rlpipe.stats import IntervalStats, StageStats, tail_iterations


@dataclass
class IntervalMeter:
    """What a rank accumulates between two statistics gathers.

    Attributes:
        iterations: iterations trained.
        busy_s: wall seconds spent in those iterations (repartitions not included).
        samples: samples the job trained (the whole batch, every replica's share).
        losses: the job's mean loss of each iteration (every rank knows it).
        repartitions: the repartitions carried out in the interval.
        rebalances: the new micro-batch splits asked for in the interval (iteration, from, to).
        conditions: per iteration, the partition, the injected slowdown of every device and the
            micro-batch split it ran under, and whether it was a warm-up step (a new stage's first, which
            infers shapes).
        met_slowdowns: per iteration, the injected slowdown this rank's device met (emulated device time:
            its chunks' emulated time over their undisturbed time; NaN otherwise).
        warmup_s: wall seconds of the warm-up steps among them.
    """

    iterations: int = 0
    busy_s: float = 0.0
    samples: int = 0
    losses: list[float] = field(default_factory=list)
    repartitions: list[Repartition] = field(default_factory=list)
    rebalances: list[dict[str, Any]] = field(default_factory=list)
    conditions: list[tuple[tuple[int, ...], np.ndarray, tuple[int, ...], bool]] = field(default_factory=list)
    met_slowdowns: list[float] = field(default_factory=list)
    warmup_s: float = 0.0

    @property
    def warmup_iterations(self) -> int:
        """The interval's warm-up steps."""
        return sum(1 for *_, warmup in self.conditions if warmup)

    def steady_iteration_ms(self) -> float:
        """Mean time of the interval's iterations that were not warm-up steps, ms (all of them when
        every one was)."""
        warmups = self.warmup_iterations
        if warmups == self.iterations:
            return self.busy_s / self.iterations * 1e3
        return (self.busy_s - self.warmup_s) / (self.iterations - warmups) * 1e3


@dataclass(frozen=True)
class StageReport:
    """One rank's figures for one interval: the record all ranks exchange (one float64 tensor).

    Attributes:
        compute_ms: forward + backward compute per micro-batch over the timed iterations, ms.
        compute_cv: the dispersion (std over mean) of that compute from one timed iteration to the next.
        tail_compute_ms: the same compute over the interval's last timed iterations (``tail_iterations`` of
            them; all of the compute where none was timed), ms per micro-batch.
        busy_s: wall seconds the interval's iterations took on this rank.
        sync_ms: gradient sync per iteration, ms.
        staging_ms: copies across the host boundary per iteration (host-staged transport; else 0), ms:
            the stage's communication.
        microbatches: micro-batches this rank's replica ran in the interval's last iteration.
        num_layers: layers the stage holds.
        memory_bytes: parameters and optimizer state held on the rank, bytes.
        resident_param_bytes: parameters that hold storage on the rank, bytes.
        rss_bytes: the stage process's resident memory (RSS), bytes (-1 where unknown).
        profiled_compute_ms: the interference-free device time of those layers (the profile's, emulated:
            scaled), forward + backward, ms per micro-batch.
        chunks: compute chunks timed (emulated device time only, else 0).
        overran: those whose real compute overran their emulated time.
        gpu_utilization: the GPU's utilisation from NVML, % (-1: no GPU or no NVML).
        gpu_memory_bytes: the GPU's memory in use from NVML, bytes (-1 likewise).
        device_allocated_bytes: what this process holds allocated on its GPU at the interval's end
            (``torch.cuda.memory_allocated``), bytes (-1: not on a GPU).
    """

    compute_ms: float
    compute_cv: float
    tail_compute_ms: float
    busy_s: float
    sync_ms: float
    staging_ms: float
    microbatches: float
    num_layers: float
    memory_bytes: float
    resident_param_bytes: float
    rss_bytes: float
    profiled_compute_ms: float
    chunks: float
    overran: float
    gpu_utilization: float
    gpu_memory_bytes: float
    device_allocated_bytes: float

    @property
    def device_load(self) -> float:
        return self.compute_ms / max(self.profiled_compute_ms, 1e-9)

    @property
    def tail_load(self) -> float:
        """The device's load over the interval's last timed iterations."""
        return self.tail_compute_ms / max(self.profiled_compute_ms, 1e-9)

    def pack(self) -> torch.Tensor:
        return torch.tensor(astuple(self), dtype=torch.float64)

    @classmethod
    def unpack(cls, row: torch.Tensor) -> StageReport:
        return cls(*row.tolist())


def exchange_reports(own: StageReport, world: int, device: torch.device) -> list[StageReport]:
    """Every rank's report, in rank order (collective)."""
    packed = own.pack().to(device)
    everyone = [torch.zeros_like(packed) for _ in range(world)]
    dist.all_gather(everyone, packed)
    return [StageReport.unpack(row.cpu()) for row in everyone]


def tail_compute(per_iteration_ms: list[float], compute_ms: float) -> float:
    """The mean of the last timed iterations' compute per micro-batch (``tail_iterations`` of them), ms;
    ``compute_ms`` (the interval's) where none was timed."""
    if not per_iteration_ms:
        return compute_ms
    return float(np.mean(per_iteration_ms[-tail_iterations(len(per_iteration_ms)):]))


def compute_dispersion(per_iteration_ms: list[float]) -> float:
    """Standard deviation over mean of the per-iteration figures (0 with fewer than two)."""
    if len(per_iteration_ms) < 2:
        return 0.0
    values = np.asarray(per_iteration_ms)
    return float(values.std(ddof=1) / max(values.mean(), 1e-12))


def _stage_stats(report: StageReport, iteration_ms: float) -> StageStats:
    return StageStats(compute_ms=report.compute_ms, comm_ms=report.staging_ms,
                      idle_ms=max(iteration_ms - report.compute_ms * report.microbatches - report.sync_ms
                                  - report.staging_ms, 0.0),
                      num_layers=int(report.num_layers), memory_bytes=report.memory_bytes,
                      device_load=report.device_load)


def interval_statistics(reports: list[StageReport], meter: IntervalMeter, iteration: int,
                        boundaries: tuple[int, ...], dims: ParallelDims) -> IntervalStats:
    """The StageStats contract from every rank's report (rank 0's meter for time and repartitions).
    A stage's figures are its stage group's most loaded member's; every device's load is kept; a stage
    group's gradient sync is its all-reduce's own time (its shortest member's)."""
    stall_s = sum(r.stall_s for r in meter.repartitions)
    iteration_ms = reports[0].busy_s / meter.iterations * 1e3
    grid = [[reports[dims.rank_of(r, s)] for s in range(dims.stages)] for r in range(dims.replicas)]
    slowest = [max((grid[r][s] for r in range(dims.replicas)), key=lambda report: report.device_load)
               for s in range(dims.stages)]
    loads = np.array([[report.device_load for report in row] for row in grid])
    # A stage group's gradient sync is its all-reduce: the member that arrives last waits for nothing but the
    # collective, the others also wait for it. Their longest (a straggling replica's whole lead) would show a
    # slowed job as a communication-bound one, where the simulator's sync is the collective alone.
    sync_ms = np.array([min(grid[r][s].sync_ms for r in range(dims.replicas)) for s in range(dims.stages)])
    return IntervalStats.from_stages(
        iteration, meter.iterations, reports[0].busy_s + stall_s, stall_s, boundaries,
        tuple(_stage_stats(report, iteration_ms) for report in slowest),
        compute_cv=np.array([report.compute_cv for report in slowest]), replica_load=loads,
        split=tuple(int(row[0].microbatches) for row in grid), sync_ms=sync_ms,
        tail_load=np.array([[report.tail_load for report in row] for row in grid]))


def log_record(stats: IntervalStats, reports: list[StageReport], dims: ParallelDims, losses: list[float],
               elapsed_s: float, meter: IntervalMeter) -> dict[str, Any]:
    """The interval's JSONL record (the controller's decision, injection and prediction are added by
    the caller). ``iteration_ms`` leaves out warm-up steps (``warmup_iterations`` of them, taking
    ``warmup_s``); throughput counts everything, stalls and warm-ups included. ``stages`` are the stage
    groups' most loaded members (the whole pipeline when D = 1); ``replicas[r].stages[s]`` every device's
    own figures."""
    repartitions = meter.repartitions
    iteration_ms = reports[0].busy_s / meter.iterations * 1e3
    replicas = []
    for replica in range(dims.replicas):
        row = [reports[dims.rank_of(replica, s)] for s in range(dims.stages)]
        stages = []
        for report in row:
            figures = _stage_stats(report, iteration_ms).to_dict()
            figures.update(compute_cv=report.compute_cv, tail_load=report.tail_load, sync_ms=report.sync_ms,
                           resident_param_bytes=int(report.resident_param_bytes), rss_bytes=int(report.rss_bytes))
            if report.gpu_utilization >= 0:  # on a GPU: NVML's figures
                figures["gpu_utilization"] = report.gpu_utilization
                figures["gpu_memory_bytes"] = int(report.gpu_memory_bytes)
            if report.device_allocated_bytes >= 0:
                figures["device_allocated_bytes"] = int(report.device_allocated_bytes)
            stages.append(figures)
        replicas.append({"microbatches": int(row[0].microbatches), "stages": stages})
    record = {"iteration": stats.iteration, "wall_s": elapsed_s, "interval_s": stats.wall_s,
              "iteration_ms": meter.steady_iteration_ms(), "warmup_s": meter.warmup_s,
              "warmup_iterations": meter.warmup_iterations,
              "boundaries": list(stats.boundaries), "throughput_samples_s": meter.samples / stats.wall_s,
              "loss": float(np.mean(losses)), "losses": losses,
              "stages": [_group_figures(s, replicas) for s in range(dims.stages)],
              "replicas": replicas, "microbatch_split": [r["microbatches"] for r in replicas],
              "sync_ms": [float(x) for x in (stats.sync_ms if stats.sync_ms is not None else [])],
              "stall_s": stats.stall_s}
    if repartitions:
        record["repartition"] = repartitions[-1].to_dict()
        if len(repartitions) > 1:
            record["repartitions"] = [r.to_dict() for r in repartitions]
    return record


def _group_figures(stage: int, replicas: list[dict[str, Any]]) -> dict[str, Any]:
    """Stage ``stage``'s figures in the record: its most loaded member's, as the controller saw them."""
    slowest = max(replicas, key=lambda r: r["stages"][stage]["device_load"])
    return dict(slowest["stages"][stage])
