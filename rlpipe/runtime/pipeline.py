"""AdaptivePipeline: one rank's share of a pipeline-parallel model that repartitions itself as it trains.

Every rank builds it with the model's layers in order and the loss. ``train_step(inputs, targets)``
trains one batch. Every ``interval`` steps the ranks exchange their statistics; rank 0 passes them
through the shared observation encoder to its policy and every rank carries out the decision, a live
repartition that moves layers with their optimizer state. Rank 0 logs every interval, with the
simulator's prediction for it beside the measurement.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

import rlpipe.runtime.checkpoint as checkpoint
from rlpipe.agents import make_policy
from rlpipe.errors import InputError
from rlpipe.partition import SCHEDULES, Partition, optimal_partition
from rlpipe.profile import LayerProfile, load_profile, measure_profile
from rlpipe.runtime.config import PipelineConfig
from rlpipe.runtime.controller import Controller
from rlpipe.runtime.device_time import DEVICE_TIME_MODES, INVALID_OVERRUN_FRACTION, DeviceClock, default_scale
from rlpipe.runtime.injection import Injector
from rlpipe.runtime.interval import IntervalMeter, StageReport, exchange_reports, interval_statistics, log_record
from rlpipe.runtime.layers import initialise, is_materialised
from rlpipe.runtime.processes import start_heartbeat
from rlpipe.runtime.progress import RunProgress
from rlpipe.runtime.stage import OptimizerFactory, StageWorker
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
        values = message.cpu().numpy()
        return cls(tuple(int(b) for b in values[:world]), values[world:world + num_layers].copy(),
                   values[world + num_layers:world + 2 * num_layers].copy(), float(values[-1]))

    def compute_ms(self) -> np.ndarray:
        """Forward + backward device time of each layer, ms per micro-batch."""
        return self.forward_ms + self.backward_ms


def start_process_group(timeout_s: float = 120.0) -> None:
    """Join the job's process group (torchrun's environment): NCCL when every stage process on this
    machine has a GPU of its own (``cuda:LOCAL_RANK``), else gloo on the CPU (NCCL cannot put two ranks
    on one GPU, and gloo moves only CPU tensors point to point). A collective or a transfer that waits
    longer than ``timeout_s`` for another stage raises, so a hung stage ends the run."""
    if dist.is_initialized():
        return
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if 0 < gpus < local and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(f"rlpipe: warning: {local} stage processes on this machine but {gpus} GPU(s): NCCL needs one each, "
              f"so the stages run on the CPU with gloo", flush=True)
    dist.init_process_group("nccl" if gpus >= local > 0 else "gloo", timeout=timedelta(seconds=timeout_s))
    start_heartbeat(dist.get_rank())


def process_rss_bytes() -> int:
    """This process's resident memory (RSS) now, bytes, from ``/proc`` (-1 where there is none)."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return -1
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def gpu_load(device: torch.device) -> tuple[float, float]:
    """(utilisation %, memory in use in bytes) of a GPU from NVML, or (-1, -1) where there is none."""
    if device.type != "cuda":
        return -1.0, -1.0
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        return (float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                float(pynvml.nvmlDeviceGetMemoryInfo(handle).used))
    except Exception:  # no NVML here (not installed, no driver): the figures are optional
        return -1.0, -1.0


def local_processes_and_cores(world: int) -> tuple[int, int]:
    """(stage processes on this machine, cores this process may run on)."""
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return processes, len(os.sched_getaffinity(0))


def plan_launch(config: PipelineConfig, layers: list[nn.Module], example: torch.Tensor, target: torch.Tensor,
                loss_fn: Callable, rank: int, world: int, processes: int, cores: int, device: torch.device,
                init_layer: Callable[[int, nn.Module], None]) -> tuple[LaunchPlan, LayerProfile | None]:
    """Rank 0 reads or measures the profile (on copies of any layer that has only structure, given
    values by ``init_layer``), picks the device-time scale (for ``processes`` stage processes on
    ``cores`` cores) and the launch partition, and shares them; returns the plan and (on rank 0) the
    profile in device time, for the controller."""
    message = torch.zeros(world + 2 * len(layers) + 1, dtype=torch.float64, device=device)
    device_profile = None
    if rank == 0:
        measured = None
        # the default emulation scale compares the profile with real compute here; a given scale needs no measuring
        needs_scale = config.device_time == "emulated" and config.device_time_scale is None
        if not config.profile or needs_scale:
            measured = measure_profile(_RealLayers(layers, init_layer), example.to(device), target.to(device),  # type: ignore[arg-type]
                                       loss_fn, repeats=3, device=device)
            for module in layers:
                module.zero_grad(set_to_none=True)
        profile = load_profile(config.profile) if config.profile else measured
        assert profile is not None
        scale = 1.0
        if config.device_time == "emulated" and config.device_time_scale is not None:
            scale = config.device_time_scale
        elif config.device_time == "emulated":
            assert measured is not None  # needs_scale
            scale = default_scale(float(profile.compute_ms().sum()), float(measured.compute_ms().sum()), processes,
                                  cores)
        device_profile = profile.scaled(scale)
        boundaries = config.boundaries or optimal_partition(
            device_profile, world, microbatches=config.microbatches, schedule=config.schedule).partition.boundaries
        plan = LaunchPlan(tuple(boundaries), device_profile.fwd_ms(), device_profile.bwd_ms(), scale)
        message = plan.pack().to(device)
    dist.broadcast(message, 0)
    return LaunchPlan.unpack(message, world, len(layers)), device_profile


class _RealLayers:
    """The layers as they are where they hold values; a layer that has only structure (the meta device)
    is given to the profiler as an initialised copy, one at a time, so that profiling never holds the
    whole model (its values do not matter to its time)."""

    def __init__(self, layers: list[nn.Module], init_layer: Callable[[int, nn.Module], None]):
        self.layers, self.init_layer = layers, init_layer

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[nn.Module]:
        for index, layer in enumerate(self.layers):
            if is_materialised(layer):
                yield layer
            else:
                copied = copy.deepcopy(layer)
                self.init_layer(index, copied)
                yield copied


def measure_p2p_bandwidth_gbps(rank: int, world: int, device: torch.device, megabytes: int = 8) -> float:
    """Round trip of a tensor between ranks 0 and 1, in Gbit/s one way (0 with a single rank)."""
    if world < 2:
        return 0.0
    payload = torch.zeros(megabytes * 2**20 // 4, device=device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(2):
        if rank == 0:
            dist.send(payload, 1)
            dist.recv(payload, 1)
        elif rank == 1:
            dist.recv(payload, 0)
            dist.send(payload, 0)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.broadcast(elapsed, 0)
    return 4 * payload.numel() * 4 * 8 / elapsed.item() / 1e9


def measure_op_overhead_ms(rank: int, world: int, schedule: str, microbatches: int, device: torch.device,
                           steps: int = 8) -> float:
    """What the schedule costs per forward or backward operation beside compute, on this host now (its
    Python, point-to-point calls, loss): a pipeline of one tiny layer per rank, timed over ``steps``
    iterations, over the operations on its critical path (collective; every rank gets rank 0's figure)."""
    torch.manual_seed(0)
    stage = PipelineStage(nn.Linear(4, 4).to(device), rank, world, device)
    pipeline = get_schedule_class(schedule)(stage, microbatches, loss_fn=nn.functional.mse_loss)
    batch = torch.randn(2 * microbatches, 4, device=device)
    elapsed = torch.zeros(1, dtype=torch.float64, device=device)
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


def _checked_config(layers: Sequence[nn.Module], loss_fn: Callable, optimizer: OptimizerFactory | None,
                    config: PipelineConfig | None, overrides: dict[str, Any]) -> PipelineConfig:
    """The pipeline's config, every argument checked: a mistake is one exception naming the argument."""
    if isinstance(layers, nn.Module) and not isinstance(layers, (nn.Sequential, nn.ModuleList)):
        raise TypeError(f"AdaptivePipeline: layers: expected the model's modules in order (a list or "
                        f"nn.Sequential), got one {type(layers).__name__}")
    if not layers or not all(isinstance(layer, nn.Module) for layer in layers):
        raise TypeError("AdaptivePipeline: layers: expected a non-empty list (or nn.Sequential) of nn.Module")
    if not callable(loss_fn):
        raise TypeError(f"AdaptivePipeline: loss_fn: expected loss_fn(output, target), got {type(loss_fn).__name__}")
    if optimizer is not None and not callable(optimizer):
        raise TypeError("AdaptivePipeline: optimizer: expected a function from a list of parameters to a "
                        "torch.optim optimizer, e.g. lambda params: torch.optim.AdamW(params, lr=3e-4)")
    unknown = set(overrides) - {f.name for f in fields(PipelineConfig)}
    if unknown:
        raise TypeError(f"AdaptivePipeline: unknown option(s) {', '.join(sorted(unknown))} (options: "
                        f"{', '.join(f.name for f in fields(PipelineConfig))})")
    checked = replace(config or PipelineConfig(), **overrides)
    if checked.schedule not in SCHEDULES:
        raise ValueError(f"AdaptivePipeline: schedule: {checked.schedule!r} is none of {', '.join(SCHEDULES)}")
    for name in ("microbatches", "interval"):
        value = getattr(checked, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"AdaptivePipeline: {name}: must be an integer >= 1, got {value!r}")
    if checked.device_time not in DEVICE_TIME_MODES:
        raise ValueError(f"AdaptivePipeline: device_time: {checked.device_time!r} is none of "
                         f"{', '.join(DEVICE_TIME_MODES)}")
    if checked.policy is not None:
        try:
            make_policy(checked.policy, live=True, fallback=checked.fallback)
        except InputError as err:
            raise ValueError(f"AdaptivePipeline: policy: {err}") from None
    return checked


def default_optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """Adam at a learning rate of 1e-3."""
    return torch.optim.Adam(params, lr=1e-3)


class AdaptivePipeline:
    """This rank's stage of a pipeline that repartitions itself while it trains (the library API).

    Every rank of a job (``torchrun --nproc-per-node S script.py``, or ``rlpipe run``) builds one with
    the same arguments::

        pipe = AdaptivePipeline(layers, loss_fn, optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4),
                                microbatches=8, schedule="1f1b", policy="ppo", interval=10)
        for inputs, targets in loader:            # the same batches on every rank
            loss = pipe.train_step(inputs, targets)

    Args:
        layers: the model's modules in order (a stage is a contiguous run of them), built on the CPU or
            on the ``meta`` device (structure only: a rank then initialises just the layers it owns).
            A rank keeps only its stage's layers; the others are freed.
        loss_fn: ``loss_fn(output, target)``, a scalar averaged over the micro-batch.
        optimizer: builds an optimizer from a list of parameters (any ``torch.optim`` optimizer; default
            Adam at 1e-3); its per-parameter state moves with the layers.
        config: how the pipeline runs (:class:`~rlpipe.runtime.config.PipelineConfig`); keyword
            arguments override its fields (``microbatches``, ``schedule``, ``policy``, ``interval``, ...).
        init_layer: ``init_layer(index, layer)`` gives a meta layer this rank owns its values (default:
            storage on the device, then each submodule's ``reset_parameters`` seeded by the index).
    """

    def __init__(self, layers: Sequence[nn.Module], loss_fn: Callable, optimizer: OptimizerFactory | None = None,
                 config: PipelineConfig | None = None, init_layer: Callable[[int, nn.Module], None] | None = None,
                 **overrides: Any):
        self.config = _checked_config(layers, loss_fn, optimizer, config, overrides)
        self.layers, self.loss_fn = list(layers), loss_fn
        self.optimizer_factory = optimizer or default_optimizer
        start_process_group()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = (torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', self.rank))}")
                       if dist.get_backend() == "nccl" else torch.device("cpu"))
        self.init_layer = init_layer or (lambda index, layer: initialise(layer, index, self.config.seed, self.device))
        self.processes, self.cores = local_processes_and_cores(self.world)  # before pinning narrows the cores
        self.oversubscribed = self._place_process()
        self.injector: Injector | None = None
        if self.config.interference:
            self.injector = Injector.from_spec(self.config.interference, self.world, self.rank, self.config.time_scale,
                                               self.config.inject, self.config.seed)
            self.injector.start -= self.config.trace_start_s / self.config.time_scale
        self.clock = DeviceClock(self.config.device_time, self.injector, self.device)
        self.bandwidth_gbps = measure_p2p_bandwidth_gbps(self.rank, self.world, self.device)
        self.stage: StageWorker | None = None
        self.controller: Controller | None = None
        self.predictor: PipelineCosts | None = None
        self.log: IO[str] | None = None
        self.progress: RunProgress | None = None
        self.iteration = self.config.first_iteration
        self.header_written = False
        self._pending_state: dict[str, Any] | None = None
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
        profile was given), give this rank's layers their values and build its stage; ``train_step``
        calls it on its first batch."""
        config = self.config
        self.overheads = Overheads(op_ms=measure_op_overhead_ms(self.rank, self.world, config.schedule,
                                                                config.microbatches, self.device))
        plan, device_profile = plan_launch(config, self.layers, example, target, self.loss_fn, self.rank, self.world,
                                           self.processes, self.cores, self.device, self.init_layer)
        self.plan = plan
        owned = Partition(plan.boundaries, len(self.layers)).stage_ranges()[self.rank]
        for index in range(*owned):
            if not is_materialised(self.layers[index]):
                self.init_layer(index, self.layers[index])
        self.stage = StageWorker(self.layers, self.loss_fn, plan.boundaries, self.rank, self.world, config.schedule,
                                 config.microbatches, self.optimizer_factory, self.clock, self.device,
                                 (plan.forward_ms, plan.backward_ms) if config.device_time == "emulated" else None,
                                 config.drop_moved_optimizer_state)
        if self._pending_state is not None:
            self._apply_state(self._pending_state)
            self._pending_state = None
        if self.rank == 0:
            assert device_profile is not None
            self.predictor = PipelineCosts(device_profile)
            self.activation_bytes = device_profile.activation_bytes().tolist()
            if config.policy:
                migration = MigrationCost(bandwidth_gbps=self.bandwidth_gbps or 10.0,
                                          overhead_s=config.migration_overhead_s)
                self.controller = Controller(config.policy, device_profile, self.world, config.schedule,
                                             config.microbatches, migration, config.fallback)
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

    def train_step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float:
        """Train one batch; returns its mean loss (over its micro-batches) on every rank.

        The first stage reads ``inputs`` and the last ``targets`` (a rank may pass ``None`` for what it
        does not read); the batch's first dimension must divide into the micro-batches. Every
        ``interval`` steps an interval ends: statistics, a decision, maybe a live repartition.
        """
        self._check_batch(inputs, "inputs", self.rank == 0)
        self._check_batch(targets, "targets", self.rank == self.world - 1)
        if self.stage is None:
            if inputs is None or targets is None:
                raise ValueError("train_step: the first batch sets the pipeline up: give inputs and targets on "
                                 "every rank")
            if self.config.schedule == "1f1b" and self.config.microbatches < self.world:
                raise ValueError(f"AdaptivePipeline: microbatches: 1F1B needs at least as many micro-batches as "
                                 f"stages ({self.world}), got {self.config.microbatches}")
            microbatch = inputs.shape[0] // self.config.microbatches
            self.set_up(inputs[:microbatch], targets[:microbatch])
        assert self.stage is not None
        start, warmup = time.perf_counter(), not self.stage.warm
        self.meter.conditions.append((self.stage.boundaries, self._injected_slowdown(), warmup))
        losses = self.stage.train_step(inputs.to(self.device) if self.rank == 0 and inputs is not None else None,
                                       targets.to(self.device) if self.rank == self.world - 1
                                       and targets is not None else None)
        mean = torch.tensor([float(np.mean(losses)) if losses else 0.0], dtype=torch.float64, device=self.device)
        dist.broadcast(mean, self.world - 1)  # the last stage computed it; every rank returns it
        self.meter.losses.append(float(mean.item()))
        elapsed_s = time.perf_counter() - start
        self.meter.busy_s += elapsed_s
        self.meter.warmup_s += elapsed_s if warmup else 0.0
        self.meter.iterations += 1
        self.meter.samples += 0 if inputs is None else int(inputs.shape[0])
        self.iteration += 1
        if self.iteration % self.config.interval == 0 or self.iteration == self.config.total_iterations:
            self.end_interval()
        return float(mean.item())

    def _check_batch(self, batch: torch.Tensor | None, name: str, needed: bool) -> None:
        if batch is None:
            if needed:
                raise ValueError(f"train_step: {name}: this rank's stage reads them, got None")
            return
        if not isinstance(batch, torch.Tensor) or batch.dim() == 0:
            raise ValueError(f"train_step: {name}: expected a tensor with a batch dimension, "
                             f"got {type(batch).__name__}")
        if batch.shape[0] % self.config.microbatches:
            raise ValueError(f"train_step: {name}: a batch of {batch.shape[0]} samples does not divide into "
                             f"microbatches={self.config.microbatches}")

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
                          float(self.stage.resident_param_bytes()), float(process_rss_bytes()),
                          float(self.plan.compute_ms()[owned.start:owned.stop].sum()), chunks, overran,
                          *gpu_load(self.device), tuple(losses))
        reports = exchange_reports(own, self.world, self.device)
        stats = interval_statistics(reports, meter, self.iteration, self.stage.boundaries, config.microbatches)
        decides = bool(config.policy) and self.iteration != config.total_iterations  # else no next interval
        target = self._broadcast_decision(stats) if decides else None
        if self.rank == 0:
            record = log_record(stats, list(reports[-1].losses[:meter.iterations]), time.perf_counter() - self.start,
                                meter)
            for stage, report in zip(record["stages"], reports, strict=True):
                stage["resident_param_bytes"] = int(report.resident_param_bytes)
                stage["rss_bytes"] = int(report.rss_bytes)
                if report.gpu_utilization >= 0:  # on a GPU: NVML's figures
                    stage["gpu_utilization"] = report.gpu_utilization
                    stage["gpu_memory_bytes"] = int(report.gpu_memory_bytes)
            self._publish(record, reports, decides)
        self.meter = IntervalMeter()
        if target is not None and target != self.stage.boundaries:
            self.repartition(target)

    def _broadcast_decision(self, stats: IntervalStats) -> tuple[int, ...]:
        """Rank 0 asks the controller for the next partition; every rank learns it."""
        assert self.stage is not None
        boundaries = self.controller.decide(stats) if self.controller is not None else self.stage.boundaries
        message = torch.tensor(boundaries, dtype=torch.int64, device=self.device)
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

    # --- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's share of the pipeline: the parameters, buffers and optimizer state of the layers it
        owns, keyed ``"<layer index>.<name>"``, with the partition and the iteration. Save it per rank;
        :meth:`load_state_dict` takes it back (on a pipeline of the same model and stage count)."""
        if self.stage is None:
            raise ValueError("state_dict: the pipeline holds nothing before its first train_step")
        owned = self.stage.owned_layers()
        layers = {f"{i}.{name}": t.detach().clone() for i in owned
                  for name, t in [*self.layers[i].named_parameters(), *self.layers[i].named_buffers()]}
        optimizer = {f"{i}.{name}": dict(self.stage.optimizer.state[p]) for i in owned
                     for name, p in self.layers[i].named_parameters() if self.stage.optimizer.state.get(p)}
        return {"boundaries": list(self.stage.boundaries), "iteration": self.iteration, "rank": self.rank,
                "world": self.world, "num_layers": len(self.layers), "layers": layers, "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back this rank's :meth:`state_dict`: before the first step the pipeline starts on the saved
        partition; after it, it repartitions live to the saved partition first (collective)."""
        if state.get("world") != self.world or state.get("num_layers") != len(self.layers):
            raise ValueError(f"load_state_dict: saved from {state.get('world')} stages of a {state.get('num_layers')}"
                             f"-layer model, this pipeline has {self.world} stages of {len(self.layers)} layers")
        if state.get("rank") != self.rank:
            raise ValueError(f"load_state_dict: this is rank {self.rank}'s pipeline, the state is rank "
                             f"{state.get('rank')}'s")
        self.iteration = int(state["iteration"])
        if self.stage is None:  # applied by set_up, which starts on the saved partition
            self.config = replace(self.config, boundaries=tuple(state["boundaries"]))
            self._pending_state = state
            return
        if tuple(state["boundaries"]) != self.stage.boundaries:
            self.repartition(tuple(state["boundaries"]))
        self._apply_state(state)

    def _apply_state(self, state: dict[str, Any]) -> None:
        assert self.stage is not None
        with torch.no_grad():
            for i in self.stage.owned_layers():
                for name, t in [*self.layers[i].named_parameters(), *self.layers[i].named_buffers()]:
                    t.copy_(state["layers"][f"{i}.{name}"])
        for i in self.stage.owned_layers():
            for name, p in self.layers[i].named_parameters():
                saved = state["optimizer"].get(f"{i}.{name}")
                if saved:
                    self.stage.optimizer.state[p] = {k: v.to(self.device) if isinstance(v, torch.Tensor)
                                                     and v.dim() > 0 else v for k, v in saved.items()}

    # --- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, directory: str | Path, meta: dict[str, Any], keep: int = 3) -> bool:
        """Collective: every rank saves its layers and their optimizer state (PyTorch's distributed
        checkpoint format); rank 0 adds the partition, the iteration, the scenario's clock and ``meta``
        (what identifies the run), publishes it and keeps the newest ``keep``. A save that fails (a full
        disk) leaves the last checkpoint loadable; the run says so in one line and goes on. Returns whether
        it was published."""
        assert self.stage is not None
        meta = {**meta, "stages": self.world, "num_layers": len(self.layers), "boundaries": list(self.stage.boundaries),
                "trace_time_s": self.injector.trace_time_s() if self.injector else 0.0}
        tensors = checkpoint.tensors_of(self.layers, self.stage.owned_layers(), self.stage.optimizer)
        error = checkpoint.save(directory, self.iteration, self.rank, tensors, meta, keep)
        if error is not None and self.rank == 0:
            message = (f"rlpipe run: warning: the checkpoint at iteration {self.iteration} was not written ({error}); "
                       f"the last one published stays loadable")
            if self.progress is not None:
                self.progress.bar.write(message)
            else:
                print(message, flush=True)
        return error is None

    def load_checkpoint(self, folder: Path) -> None:
        """Collective: load the layers this rank owns now, whichever stage count wrote them."""
        assert self.stage is not None
        checkpoint.load(folder, self.layers, self.stage.owned_layers(), self.stage.optimizer, self.device)

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
