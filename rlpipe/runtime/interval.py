"""The end of a statistics interval: what each rank reports, gathered on rank 0 as the StageStats
contract and one log record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rlpipe.runtime.stage import Repartition
from rlpipe.stats import IntervalStats, StageStats


@dataclass
class IntervalMeter:
    """What a rank accumulates between two statistics gathers.

    Attributes:
        iterations: iterations trained.
        busy_s: wall seconds spent in those iterations (repartitions not included).
        samples: samples trained (counted where the inputs are: the first stage).
        losses: the mean micro-batch loss of each iteration (known on the last stage only).
        repartitions: the repartitions carried out in the interval.
        conditions: per iteration, the partition and the injected slowdown of every device it ran under,
            and whether it was a warm-up step (a new stage's first, which infers shapes).
        warmup_s: wall seconds of the warm-up steps among them.
    """

    iterations: int = 0
    busy_s: float = 0.0
    samples: int = 0
    losses: list[float] = field(default_factory=list)
    repartitions: list[Repartition] = field(default_factory=list)
    conditions: list[tuple[tuple[int, ...], np.ndarray, bool]] = field(default_factory=list)
    warmup_s: float = 0.0

    def steady_iteration_ms(self) -> float:
        """Mean time of the interval's iterations that were not warm-up steps, ms (all of them when
        every one was)."""
        warmups = sum(1 for *_, warmup in self.conditions if warmup)
        if warmups == self.iterations:
            return self.busy_s / self.iterations * 1e3
        return (self.busy_s - self.warmup_s) / (self.iterations - warmups) * 1e3


@dataclass(frozen=True)
class StageReport:
    """One rank's figures for one interval: the record all ranks exchange (one float64 tensor).

    Attributes:
        compute_s_per_iteration: seconds of forward + backward compute per timed iteration.
        busy_s: wall seconds the interval's iterations took on this rank.
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
        losses: per-iteration losses (the last stage's are the run's), padded to the interval.
    """

    compute_s_per_iteration: float
    busy_s: float
    num_layers: float
    memory_bytes: float
    resident_param_bytes: float
    rss_bytes: float
    profiled_compute_ms: float
    chunks: int
    overran: int
    gpu_utilization: float
    gpu_memory_bytes: float
    losses: tuple[float, ...]

    def pack(self) -> torch.Tensor:
        return torch.tensor([self.compute_s_per_iteration, self.busy_s, self.num_layers, self.memory_bytes,
                             self.resident_param_bytes, self.rss_bytes, self.profiled_compute_ms, self.chunks,
                             self.overran, self.gpu_utilization, self.gpu_memory_bytes, *self.losses],
                            dtype=torch.float64)

    @classmethod
    def unpack(cls, row: torch.Tensor) -> StageReport:
        (compute_s, busy_s, num_layers, memory_bytes, resident, rss, profiled_ms, chunks, overran, gpu_utilization,
         gpu_memory, *losses) = row.tolist()
        return cls(compute_s, busy_s, num_layers, memory_bytes, resident, rss, profiled_ms, int(chunks), int(overran),
                   gpu_utilization, gpu_memory, tuple(losses))


def exchange_reports(own: StageReport, world: int, device: torch.device) -> list[StageReport]:
    """Every rank's report, in rank order (collective: all ranks call it with reports of one length)."""
    packed = own.pack().to(device)
    everyone = [torch.zeros_like(packed) for _ in range(world)]
    dist.all_gather(everyone, packed)
    return [StageReport.unpack(row.cpu()) for row in everyone]


def interval_statistics(reports: list[StageReport], meter: IntervalMeter, iteration: int,
                        boundaries: tuple[int, ...], microbatches: int) -> IntervalStats:
    """The StageStats contract from every rank's report (rank 0's meter for time and repartitions)."""
    stall_s = sum(r.stall_s for r in meter.repartitions)
    iteration_ms = reports[0].busy_s / meter.iterations * 1e3
    stages = []
    for report in reports:
        compute_ms = report.compute_s_per_iteration / microbatches * 1e3
        stages.append(StageStats(compute_ms=compute_ms, comm_ms=0.0,
                                 idle_ms=max(iteration_ms - compute_ms * microbatches, 0.0),
                                 num_layers=int(report.num_layers), memory_bytes=report.memory_bytes,
                                 device_load=compute_ms / max(report.profiled_compute_ms, 1e-9)))
    return IntervalStats.from_stages(iteration, meter.iterations, reports[0].busy_s + stall_s, stall_s, boundaries,
                         tuple(stages))


def log_record(stats: IntervalStats, losses: list[float], elapsed_s: float, meter: IntervalMeter) -> dict[str, Any]:
    """The interval's JSONL record (the controller's decision, injection and prediction are added by
    the caller). ``iteration_ms`` leaves out warm-up steps (their time is ``warmup_s``); throughput
    counts everything, stalls and warm-ups included."""
    repartitions = meter.repartitions
    record = {"iteration": stats.iteration, "wall_s": elapsed_s, "interval_s": stats.wall_s,
              "iteration_ms": meter.steady_iteration_ms(), "warmup_s": meter.warmup_s,
              "boundaries": list(stats.boundaries), "throughput_samples_s": meter.samples / stats.wall_s,
              "loss": float(np.mean(losses)), "losses": losses, "stages": [s.to_dict() for s in stats.stages],
              "stall_s": stats.stall_s}
    if repartitions:
        record["repartition"] = repartitions[-1].to_dict()
        if len(repartitions) > 1:
            record["repartitions"] = [r.to_dict() for r in repartitions]
    return record
