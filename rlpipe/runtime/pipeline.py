"""AdaptivePipeline: one rank's share of a pipeline-parallel model that repartitions itself as it trains.

Every rank builds it with the model's layers in order and the loss. ``train_step(inputs, targets)``
trains one batch. Every ``interval`` steps the ranks exchange their statistics; rank 0 passes them
through the shared observation encoder to its policy and every rank carries out the decision, a live
repartition that moves layers with their optimizer state. Rank 0 logs every interval, with the
simulator's prediction for it beside the measurement.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

from rlpipe.partition import optimal_partition
from rlpipe.profile import LayerProfile, load_profile, measure_profile
from rlpipe.runtime import checkpoint
from rlpipe.runtime.config import PipelineConfig
from rlpipe.runtime.controller import Controller
from rlpipe.runtime.device_time import INVALID_OVERRUN_FRACTION, DeviceClock, default_scale
from rlpipe.runtime.injection import Injector
from rlpipe.runtime.interval import IntervalMeter, StageReport, exchange_reports, interval_statistics, log_record
from rlpipe.runtime.progress import RunProgress
from rlpipe.runtime.stage import StageWorker
from rlpipe.simulator import MigrationCost, Overheads, PipelineCosts, simulate_schedule
from rlpipe.stats import IntervalStats


@dataclass(frozen=True)
class LaunchPlan:
    """What rank 0 decides at start-up and every rank needs (sent as one float64 tensor).

    Attributes:
        boundaries: the launch partition.
        forward_ms, backward_ms: per layer, its device time per micro-batch, ms (emulated: the
            profile's times x the scale; real: the profile's).
        device_time_scale: emulated device time over the profile's (1.0 in real mode).
    """

    boundaries: tuple[int, ...]
    forward_ms: np.ndarray
    backward_ms: np.ndarray
    device_time_scale: float

    def pack(self) -> torch.Tensor:
        return torch.tensor([*self.boundaries, *self.forward_ms, *self.backward_ms, self.device_time_scale],
                            dtype=torch.float64)

    @classmethod
    def unpack(cls, message: torch.Tensor, world: int, num_layers: int) -> LaunchPlan:
        values = message.numpy()
        return cls(tuple(int(b) for b in values[:world]), values[world:world + num_layers].copy(),
                   values[world + num_layers:world + 2 * num_layers].copy(), float(values[-1]))

    def compute_ms(self) -> np.ndarray:
        """Forward + backward device time of each layer, ms per micro-batch."""
        return self.forward_ms + self.backward_ms


def local_processes_and_cores(world: int) -> tuple[int, int]:
    """(stage processes on this machine, cores this process may run on)."""
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return processes, len(os.sched_getaffinity(0))


def plan_launch(config: PipelineConfig, layers: list[nn.Module], example: torch.Tensor, target: torch.Tensor,
                loss_fn: Callable, rank: int, world: int, processes: int,
                cores: int) -> tuple[LaunchPlan, LayerProfile | None]:
    """Rank 0 reads or measures the profile, picks the device-time scale (for ``processes`` stage
    processes on ``cores`` cores) and the launch partition, and shares them; returns the plan and (on
    rank 0) the profile in device time, for the controller."""
    message = torch.zeros(world + 2 * len(layers) + 1, dtype=torch.float64)
    device_profile = None
    if rank == 0:
        measured = None
        if not config.profile or config.device_time == "emulated":  # emulation compares with real compute here
            measured = measure_profile(layers, example, target, loss_fn, repeats=3)
            for module in layers:
                module.zero_grad(set_to_none=True)
        profile = load_profile(config.profile) if config.profile else measured
        assert profile is not None
        scale = 1.0
        if config.device_time == "emulated":
            assert measured is not None
            scale = config.device_time_scale or default_scale(
                float(profile.compute_ms().sum()), float(measured.compute_ms().sum()), processes, cores)
        device_profile = profile.scaled(scale)
        boundaries = config.boundaries or optimal_partition(
            device_profile, world, microbatches=config.microbatches, schedule=config.schedule).partition.boundaries
        message = LaunchPlan(tuple(boundaries), device_profile.fwd_ms(), device_profile.bwd_ms(), scale).pack()
    dist.broadcast(message, 0)
    return LaunchPlan.unpack(message, world, len(layers)), device_profile


def measure_p2p_bandwidth_gbps(rank: int, world: int, megabytes: int = 8) -> float:
    """Round trip of a tensor between ranks 0 and 1, in Gbit/s one way (0 with a single rank)."""
    if world < 2:
        return 0.0
    payload = torch.zeros(megabytes * 2**20 // 4)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(2):
        if rank == 0:
            dist.send(payload, 1)
            dist.recv(payload, 1)
        elif rank == 1:
            dist.recv(payload, 0)
            dist.send(payload, 0)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.broadcast(elapsed, 0)
    return 4 * payload.numel() * 4 * 8 / elapsed.item() / 1e9


def measure_op_overhead_ms(rank: int, world: int, schedule: str, microbatches: int, steps: int = 8) -> float:
    """What the schedule costs per forward or backward operation beside compute, on this host now (its
    Python, point-to-point calls, loss): a pipeline of one tiny layer per rank, timed over ``steps``
    iterations, over the operations on its critical path (collective; every rank gets rank 0's figure)."""
    torch.manual_seed(0)
    stage = PipelineStage(nn.Linear(4, 4), rank, world, torch.device("cpu"))
    pipeline = get_schedule_class(schedule)(stage, microbatches, loss_fn=nn.functional.mse_loss)
    batch = torch.randn(2 * microbatches, 4)
    elapsed = torch.zeros(1, dtype=torch.float64)
    for step in range(2 + steps):  # two warm-up steps infer shapes
        if step == 2:
            dist.barrier()
            start = time.perf_counter()
        if world == 1:
            pipeline.step(batch, target=batch)
        elif rank == 0:
            pipeline.step(batch)
        elif rank == world - 1:
            pipeline.step(target=batch)
        else:
            pipeline.step()
    elapsed[0] = (time.perf_counter() - start) / steps * 1e3
    dist.broadcast(elapsed, 0)
    zero = np.zeros(world)
    operations = simulate_schedule(zero, zero, np.zeros(max(world - 1, 1)), schedule, microbatches,
                                   Overheads(op_ms=1.0)).iteration_ms  # ops on the critical path
    return float(elapsed.item()) / operations


class AdaptivePipeline:
    """This rank's stage of a pipeline that repartitions itself while it trains.

    Args:
        layers: the model's modules, in order (a stage is a contiguous run of them).
        loss_fn: ``loss_fn(output, target)``, a scalar averaged over the micro-batch.
        config: how the pipeline runs (:class:`~rlpipe.runtime.config.PipelineConfig`); keyword
            arguments override its fields.
        lr: Adam's learning rate.
    """

    def __init__(self, layers: list[nn.Module], loss_fn: Callable, config: PipelineConfig | None = None,
                 lr: float = 1e-3, **overrides: Any):
        known = {f.name for f in fields(PipelineConfig)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"AdaptivePipeline: unknown option(s) {', '.join(sorted(unknown))}")
        self.config = replace(config or PipelineConfig(), **overrides)
        self.layers, self.loss_fn, self.lr = list(layers), loss_fn, lr
        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.processes, self.cores = local_processes_and_cores(self.world)  # before pinning narrows the cores
        self.oversubscribed = self._place_process()
        self.injector: Injector | None = None
        if self.config.interference:
            self.injector = Injector.from_spec(self.config.interference, self.world, self.rank, self.config.time_scale,
                                               self.config.inject, self.config.seed)
            self.injector.start -= self.config.trace_start_s / self.config.time_scale
        self.clock = DeviceClock(self.config.device_time, self.injector)
        self.bandwidth_gbps = measure_p2p_bandwidth_gbps(self.rank, self.world)
        self.stage: StageWorker | None = None
        self.controller: Controller | None = None
        self.predictor: PipelineCosts | None = None
        self.log: IO[str] | None = None
        self.progress: RunProgress | None = None
        self.iteration = self.config.first_iteration
        self.header_written = False
        self.meter = IntervalMeter()
        self.start = time.perf_counter()

    def _place_process(self) -> bool:
        """Pin this rank to a core of its own where the cores suffice (real device time measures the
        host then); returns whether stage processes outnumber cores."""
        processes, cores = self.processes, self.cores
        if processes > cores:
            if self.rank == 0 and self.config.device_time == "real":
                print(f"rlpipe run: warning: {processes} stage processes share {cores} cores: real device time "
                      f"measures contention, not a pipeline (the log says oversubscribed; consider "
                      f"--device-time emulated)", flush=True)
            return True
        local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[local_rank % cores]})
        return False

    # --- set-up ---------------------------------------------------------------------------------

    def set_up(self, example: torch.Tensor, target: torch.Tensor) -> None:
        """Decide the launch partition (rank 0 profiles on one micro-batch of ``example`` unless a
        profile was given) and build this rank's stage; ``train_step`` calls it on its first batch."""
        config = self.config
        self.overheads = Overheads(op_ms=measure_op_overhead_ms(self.rank, self.world, config.schedule,
                                                                config.microbatches))
        plan, device_profile = plan_launch(config, self.layers, example, target, self.loss_fn, self.rank, self.world,
                                           self.processes, self.cores)
        self.plan = plan
        self.stage = StageWorker(self.layers, self.loss_fn, plan.boundaries, self.rank, self.world, config.schedule,
                                 config.microbatches, self.lr, self.clock,
                                 (plan.forward_ms, plan.backward_ms) if config.device_time == "emulated" else None,
                                 config.drop_moved_optimizer_state)
        if self.rank == 0:
            assert device_profile is not None
            self.predictor = PipelineCosts(device_profile)
            self.activation_bytes = device_profile.activation_bytes().tolist()
            if config.policy:
                migration = MigrationCost(bandwidth_gbps=self.bandwidth_gbps or 10.0,
                                          overhead_s=config.migration_overhead_s)
                self.controller = Controller(config.policy, device_profile, self.world, config.schedule,
                                             config.microbatches, migration)
            if config.log:
                Path(config.log).parent.mkdir(parents=True, exist_ok=True)
                self.log = open(config.log, "a" if config.append_log else "w")
            emulation = (f"; device time emulated at {plan.device_time_scale:g} x the profile"
                         if config.device_time == "emulated" else "; device time real")
            print(f"rlpipe run: {self.world} stages {list(plan.boundaries)}, {config.schedule}, "
                  f"{config.microbatches} micro-batches; p2p {self.bandwidth_gbps:.2f} Gbit/s{emulation}", flush=True)
            if config.total_iterations is not None:
                self.progress = RunProgress(config.first_iteration, config.total_iterations, config.log)

    # --- training -------------------------------------------------------------------------------

    def train_step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> list[float]:
        """Train one batch (``inputs`` needed on the first stage, ``targets`` on the last); returns
        the micro-batch losses on the last stage ([] elsewhere). Ends an interval every ``interval``
        steps."""
        if self.stage is None:
            assert inputs is not None and targets is not None, "the first batch sets the pipeline up"
            microbatch = inputs.shape[0] // self.config.microbatches
            self.set_up(inputs[:microbatch], targets[:microbatch])
        assert self.stage is not None
        start, warmup = time.perf_counter(), not self.stage.warm
        self.meter.conditions.append((self.stage.boundaries, self._injected_slowdown(), warmup))
        losses = self.stage.train_step(inputs if self.rank == 0 else None,
                                       targets if self.rank == self.world - 1 else None)
        if losses:
            self.meter.losses.append(float(np.mean(losses)))
        elapsed_s = time.perf_counter() - start
        self.meter.busy_s += elapsed_s
        self.meter.warmup_s += elapsed_s if warmup else 0.0
        self.meter.iterations += 1
        self.meter.samples += 0 if inputs is None else int(inputs.shape[0])
        self.iteration += 1
        if self.iteration % self.config.interval == 0 or self.iteration == self.config.total_iterations:
            self.end_interval()
        return losses

    def _injected_slowdown(self) -> np.ndarray:
        if self.injector is None:
            return np.ones(self.world)
        return self.injector.trace.at(self.injector.trace_time_s())[0].copy()

    def end_interval(self) -> None:
        """Gather every rank's report; rank 0 decides the next partition (unless the run ends here),
        which every rank then adopts (collective)."""
        assert self.stage is not None
        config, meter = self.config, self.meter
        if meter.iterations == 0:
            return
        owned = self.stage.owned_layers()
        compute_s, timed = self.stage.take_compute_s()
        chunks, overran = self.stage.take_overruns()
        losses = meter.losses + [0.0] * (config.interval - len(meter.losses))  # one length on every rank
        own = StageReport(compute_s / timed, meter.busy_s, float(len(owned)), self.stage.memory_bytes(),
                          float(self.plan.compute_ms()[owned.start:owned.stop].sum()), chunks, overran,
                          tuple(losses))
        reports = exchange_reports(own, self.world)
        stats = interval_statistics(reports, meter, self.iteration, self.stage.boundaries, config.microbatches)
        decides = bool(config.policy) and self.iteration != config.total_iterations  # else no next interval
        target = self._broadcast_decision(stats) if decides else None
        if self.rank == 0:
            record = log_record(stats, list(reports[-1].losses[:meter.iterations]), time.perf_counter() - self.start,
                                meter)
            self._publish(record, reports, decides)
        self.meter = IntervalMeter()
        if target is not None and target != self.stage.boundaries:
            self.repartition(target)

    def _broadcast_decision(self, stats: IntervalStats) -> tuple[int, ...]:
        """Rank 0 asks the controller for the next partition; every rank learns it."""
        assert self.stage is not None
        message = torch.tensor(self.stage.boundaries, dtype=torch.int64)
        if self.controller is not None:
            message = torch.tensor(self.controller.decide(stats), dtype=torch.int64)
        dist.broadcast(message, 0)
        return tuple(int(b) for b in message.tolist())

    def _publish(self, record: dict, reports: list[StageReport], decided: bool) -> None:
        """Rank 0: complete an interval's record (the decision only if one was made for the next
        interval), append it to the log, show progress."""
        record["p2p_gbps"] = self.bandwidth_gbps
        record.update(self._prediction())
        if not self.header_written:
            record["run"] = self._run_header()
            self.header_written = True
        if self.config.device_time == "emulated":
            chunks, overran = sum(r.chunks for r in reports), sum(r.overran for r in reports)
            record["emulation"] = {"chunks": chunks, "overran": overran}
        if self.injector is not None:  # each device's slowdown, averaged over the interval's iterations
            record["injected_slowdown"] = np.mean([slowdown for _, slowdown, _ in self.meter.conditions],
                                                  axis=0).tolist()
            record["trace_time_s"] = self.injector.trace_time_s()
        if self.controller is not None:
            if decided:
                record["decision"] = self.controller.last_decision
            record["fallbacks"] = self.controller.fallbacks
        if self.log:
            self.log.write(json.dumps(record) + "\n")
            self.log.flush()
        if self.progress is not None:
            self.progress.interval(record)

    def _run_header(self) -> dict[str, Any]:
        """What the log's first record says of the whole run (see :mod:`rlpipe.runlog`)."""
        config = self.config
        return {"stages": self.world, "schedule": config.schedule, "microbatches": config.microbatches,
                "interval": config.interval, "policy": config.policy, "interference": config.interference,
                "inject": config.inject, "time_scale": config.time_scale, "device_time": config.device_time,
                "device_time_scale": self.plan.device_time_scale, "oversubscribed": self.oversubscribed,
                "processes": self.processes, "cores": self.cores, "p2p_gbps": self.bandwidth_gbps,
                "op_overhead_ms": self.overheads.op_ms, "forward_ms": self.plan.forward_ms.tolist(),
                "backward_ms": self.plan.backward_ms.tolist(), "activation_bytes": self.activation_bytes}

    def _prediction(self) -> dict[str, Any]:
        """What the simulator predicts for the interval's steady iterations (warm-up steps left out, as
        in ``iteration_ms``): their mean iteration time and each stage's compute per micro-batch, for the
        partitions and injected slowdowns they ran under."""
        assert self.predictor is not None
        iteration_ms, stage_ms = [], []
        steady = [(b, s) for b, s, warmup in self.meter.conditions if not warmup]
        for boundaries, slowdown in steady or [(b, s) for b, s, _ in self.meter.conditions]:
            timing = self.predictor.simulate(boundaries, self.config.schedule, self.config.microbatches, slowdown,
                                             self.bandwidth_gbps or np.inf, overheads=self.overheads)
            iteration_ms.append(timing.iteration_ms)
            stage_ms.append(timing.compute_ms / self.config.microbatches)
        return {"predicted_iteration_ms": float(np.mean(iteration_ms)),
                "predicted_compute_ms": np.mean(stage_ms, axis=0).tolist()}

    def repartition(self, target: tuple[int, ...], corrupt: bool = False) -> None:
        """Move layers live to ``target`` (collective: every rank calls it); the interval records it."""
        assert self.stage is not None
        self.meter.repartitions.append(self.stage.repartition(tuple(target), self.iteration, corrupt))

    # --- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, directory: str | Path, meta: dict[str, Any]) -> None:
        """Collective: every rank saves its layers and optimizer state; rank 0 adds the partition, the
        iteration, the scenario's clock and ``meta`` (what identifies the run)."""
        assert self.stage is not None
        meta = {**meta, "boundaries": list(self.stage.boundaries),
                "trace_time_s": self.injector.trace_time_s() if self.injector else 0.0}
        checkpoint.save(directory, self.iteration, self.rank, self.stage.modules, self.stage.owned_layers(),
                        self.stage.optimizer, meta)

    def load_checkpoint(self, folder: Path) -> None:
        """Load this rank's layers and optimizer state from a checkpoint of the same partition."""
        assert self.stage is not None
        checkpoint.load_rank(folder, self.rank, self.stage.modules, self.stage.owned_layers(), self.stage.optimizer)

    # --- the end --------------------------------------------------------------------------------

    def finish(self) -> None:
        """Collective, at the end of training: end a last partial interval and print the run's summary
        (and a warning where the emulation did not hold)."""
        if self.stage is not None and self.meter.iterations:
            self.end_interval()
        if self.progress is None:
            return
        summary = self.progress.close()
        print(summary, flush=True)
        fraction = self.progress.overran_fraction()
        if fraction is not None and fraction > INVALID_OVERRUN_FRACTION:
            print(f"rlpipe run: warning: {fraction:.1%} of compute chunks overran their emulated device time "
                  f"(more than {INVALID_OVERRUN_FRACTION:.0%}): the emulation did not hold; raise "
                  f"--device-time-scale", flush=True)
        self.progress = None

    def close(self) -> None:
        """Tear down (also after a failure: no collective here): the progress bar, the log, any
        competing process, the process group."""
        if self.progress is not None:
            self.progress.bar.close()
        if self.log:
            self.log.close()
        if self.injector is not None:  # a competing process never outlives its stage
            self.injector.close()
        if dist.is_initialized():
            dist.destroy_process_group()
