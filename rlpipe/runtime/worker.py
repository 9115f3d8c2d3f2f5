"""One pipeline stage process: trains its layers under a torch.distributed.pipelining schedule,
reports statistics every interval, and takes part in live repartitions.

Run by ``rlpipe run`` (one process per stage) or by ``torchrun -m rlpipe.runtime`` (its rendezvous);
rank r holds stage r. Rank 0 writes the log.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from rlpipe.models import ModelSpec, load_model
from rlpipe.partition import optimal_partition
from rlpipe.profile import LayerProfile, load_profile, measure_profile
from rlpipe.runtime import checkpoint, migration
from rlpipe.runtime.config import RunConfig
from rlpipe.runtime.controller import Controller
from rlpipe.runtime.injection import Injector
from rlpipe.simulator import MigrationCost
from rlpipe.stats import IntervalStats, StageStats

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
DATA_BATCHES = 8  # the synthetic data set cycles through this many batches, so the loss can fall


class TimedStage(PipelineStage):
    """A PipelineStage that accumulates the seconds it spends computing (forward and backward),
    stretched by injected interference when an :class:`Injector` is attached."""

    compute_s: float = 0.0
    injector: Injector | None = None

    def _timed(self, chunk, *args, **kwargs):
        start = time.perf_counter()
        try:
            return chunk(*args, **kwargs)
        finally:
            if self.injector is not None:
                self.injector.stretch(time.perf_counter() - start)
            self.compute_s += time.perf_counter() - start

    def forward_one_chunk(self, *args, **kwargs):
        return self._timed(super().forward_one_chunk, *args, **kwargs)

    def backward_one_chunk(self, *args, **kwargs):
        return self._timed(super().backward_one_chunk, *args, **kwargs)


def synthetic_batch(example: torch.Tensor, batch: int, seed: int, iteration: int) -> torch.Tensor:
    """A batch shaped like ``example`` (first dim = ``batch``), the same on every rank for an iteration."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + iteration % DATA_BATCHES)
    shape = (batch, *example.shape[1:])
    if example.is_floating_point():
        return torch.randn(shape, generator=generator, dtype=example.dtype)
    return torch.randint(0, int(example.max()) + 1, shape, generator=generator, dtype=example.dtype)


@dataclass
class Repartition:
    """What one repartition did."""

    iteration: int
    old: tuple[int, ...]
    new: tuple[int, ...]
    committed: bool
    bytes_moved: int
    stall_s: float

    def to_dict(self) -> dict:
        return {"iteration": self.iteration, "from": list(self.old), "to": list(self.new), "committed": self.committed,
                "bytes_moved": self.bytes_moved, "stall_s": self.stall_s}


class StageWorker:
    """Stage ``rank`` of the pipeline: its layers, optimizer, PipelineStage and schedule."""

    def __init__(self, config: RunConfig, spec: ModelSpec, boundaries: tuple[int, ...], rank: int, world: int,
                 injector: Injector | None = None):
        self.config, self.spec, self.rank, self.world = config, spec, rank, world
        self.injector = injector
        self.modules: list[nn.Module] = spec.layers  # every rank holds every layer; it trains its own
        self.boundaries = tuple(boundaries)
        self.device = torch.device("cpu")
        self.optimizer = torch.optim.Adam(self.owned_params(), lr=config.lr)
        self.timed_iterations, self.warmup_compute_s = 0, 0.0
        self._build()

    def owned_layers(self) -> range:
        edges = list(self.boundaries) + [len(self.modules)]
        return range(edges[self.rank], edges[self.rank + 1])

    def owned_params(self) -> list[nn.Parameter]:
        return [p for i in self.owned_layers() for p in self.modules[i].parameters()]

    def _build(self) -> None:
        """A new stage and schedule for the current layers (swapping an old stage's module breaks
        when the tensors between stages change shape)."""
        submodule = nn.Sequential(*[self.modules[i] for i in self.owned_layers()])
        self.stage = TimedStage(submodule, self.rank, self.world, self.device)
        self.stage.injector = self.injector
        self.warm = False  # the first step of a new stage infers shapes: its time is not compute
        self.schedule = SCHEDULES[self.config.schedule](self.stage, self.config.microbatches, loss_fn=self.spec.loss_fn)

    def train_step(self, iteration: int) -> list[float]:
        """One iteration; returns the micro-batch losses (on the last stage, else [])."""
        self.optimizer.zero_grad(set_to_none=True)
        compute_before = self.stage.compute_s
        losses: list[torch.Tensor] = []
        batch = self.config.batch
        if self.rank == 0:
            inputs = synthetic_batch(self.spec.example_microbatch, batch, self.config.seed, iteration)
        if self.rank == self.world - 1:
            target = synthetic_batch(self.spec.target, batch, self.config.seed + 7919, iteration)
        if self.world == 1:
            self.schedule.step(inputs, target=target, losses=losses)
        elif self.rank == 0:
            self.schedule.step(inputs)
        elif self.rank == self.world - 1:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        self.optimizer.step()
        if self.warm:
            self.timed_iterations += 1
        else:  # keep the warm-up step out of the compute statistics (unless nothing else is timed)
            self.warmup_compute_s = self.stage.compute_s - compute_before
            self.stage.compute_s = compute_before
            self.warm = True
        return [float(loss.detach()) for loss in losses]

    def repartition(self, new: tuple[int, ...], iteration: int, corrupt: bool = False) -> Repartition:
        """Move layers to their new owners; all ranks commit together or keep the old partition."""
        start = time.perf_counter()
        old = self.boundaries
        plan = migration.transfer_plan(old, new, len(self.modules))
        received, ok, bytes_sent = migration.exchange(plan, self.rank, self.modules, self.optimizer, corrupt)
        committed = migration.all_agree(ok)
        if committed:
            moved_state = {p: state for receipt in received for p, state in receipt.adam_states().items()}
            kept = {p: s for p, s in self.optimizer.state.items() if s}
            self.boundaries = tuple(new)
            self.optimizer = torch.optim.Adam(self.owned_params(), lr=self.config.lr)
            for p in self.owned_params():
                if p in kept:
                    self.optimizer.state[p] = kept[p]
                elif p in moved_state and not self.config.drop_moved_optimizer_state:
                    self.optimizer.state[p] = moved_state[p]
            self._build()
        totals = torch.tensor([float(bytes_sent)], dtype=torch.float64)
        dist.all_reduce(totals)
        dist.barrier()
        return Repartition(iteration, old, tuple(new), committed, int(totals.item()), time.perf_counter() - start)

    def gather_parameters(self) -> dict[str, torch.Tensor]:
        """Every layer's current parameters on rank 0 (other ranks return {})."""
        plan = {(src, 0): list(range(start, end)) for src, (start, end) in
                enumerate(zip(self.boundaries, list(self.boundaries[1:]) + [len(self.modules)])) if src != 0}
        migration.exchange(plan, self.rank, self.modules, self.optimizer)  # values land in rank 0's copies
        if self.rank != 0:
            return {}
        return {f"{i}.{name}": p.detach().clone() for i, module in enumerate(self.modules)
                for name, p in module.named_parameters()}


def initial_boundaries(config: RunConfig, spec: ModelSpec, rank: int,
                       world: int) -> tuple[tuple[int, ...], np.ndarray, LayerProfile | None]:
    """Rank 0 decides the launch partition (given, or optimal for the profile) and shares it with the
    profiled compute per layer (for device load); returns (boundaries, profiled compute ms per layer,
    the profile on rank 0 / None elsewhere)."""
    num_layers = len(spec.layers)
    message = torch.zeros(world + num_layers, dtype=torch.float64)
    profile = None
    if rank == 0:
        if config.profile:
            profile = load_profile(config.profile)
        else:
            profile = measure_profile(spec.layers, spec.example_microbatch, spec.target, spec.loss_fn, repeats=3)
            for module in spec.layers:
                module.zero_grad(set_to_none=True)
        boundaries = config.boundaries or optimal_partition(
            profile, world, microbatches=config.microbatches, schedule=config.schedule).partition.boundaries
        message[:world] = torch.tensor(boundaries, dtype=torch.float64)
        message[world:] = torch.as_tensor(profile.compute_ms())
    dist.broadcast(message, 0)
    return tuple(int(b) for b in message[:world].tolist()), message[world:].numpy(), profile


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


@dataclass
class IntervalMeter:
    """What a rank accumulates between two statistics gathers."""

    iterations: int = 0
    wall_s: float = 0.0
    losses: list[float] = field(default_factory=list)
    repartitions: list[Repartition] = field(default_factory=list)


def gather_interval(worker: StageWorker, meter: IntervalMeter, profiled_ms: np.ndarray, iteration: int,
                    elapsed_s: float) -> tuple[IntervalStats, dict] | None:
    """All ranks share their interval figures; rank 0 returns the statistics and the log record
    (others None)."""
    config, world = worker.config, worker.world
    owned = worker.owned_layers()
    compute_s, timed = worker.stage.compute_s, worker.timed_iterations
    if timed == 0:  # only a warm-up step in this interval: report it rather than nothing
        compute_s, timed = worker.warmup_compute_s, 1
    own = torch.tensor([compute_s / timed, meter.wall_s, float(len(owned)),
                        sum(p.numel() * p.element_size() * 3 for p in worker.owned_params()),
                        float(profiled_ms[owned.start:owned.stop].sum())], dtype=torch.float64)
    losses = torch.zeros(config.interval, dtype=torch.float64)  # per-iteration loss, known on the last stage
    losses[:len(meter.losses)] = torch.tensor(meter.losses, dtype=torch.float64)
    own = torch.cat([own, losses])
    everyone = [torch.zeros_like(own) for _ in range(world)]
    dist.all_gather(everyone, own)
    worker.stage.compute_s, worker.timed_iterations = 0.0, 0
    if worker.rank != 0:
        return None
    iterations, stall_s = meter.iterations, sum(r.stall_s for r in meter.repartitions)
    wall_s = everyone[0][1].item() + stall_s
    iteration_ms = everyone[0][1].item() / iterations * 1e3
    stages = []
    for row in everyone:
        compute_ms = row[0].item() / config.microbatches * 1e3  # row[0]: compute seconds per timed iteration
        stages.append(StageStats(compute_ms=compute_ms, comm_ms=0.0,
                                 idle_ms=max(iteration_ms - compute_ms * config.microbatches, 0.0),
                                 num_layers=int(row[2].item()), memory_bytes=row[3].item(),
                                 device_load=compute_ms / max(row[4].item(), 1e-9)))
    stats = IntervalStats(iteration, iterations, wall_s, stall_s, worker.boundaries, tuple(stages))
    losses = everyone[-1][5:5 + iterations].tolist()
    record = {"iteration": iteration, "wall_s": elapsed_s, "interval_s": wall_s, "boundaries": list(worker.boundaries),
              "throughput_samples_s": iterations * config.batch / wall_s, "loss": float(np.mean(losses)),
              "losses": losses, "stages": [s.to_dict() for s in stages], "stall_s": stall_s}
    if meter.repartitions:
        record["repartition"] = meter.repartitions[-1].to_dict()
        if len(meter.repartitions) > 1:
            record["repartitions"] = [r.to_dict() for r in meter.repartitions]
    return stats, record


def broadcast_decision(controller: Controller | None, stats: IntervalStats | None,
                       worker: StageWorker) -> tuple[int, ...]:
    """Rank 0 asks the controller for the next partition; every rank learns it."""
    message = torch.tensor(worker.boundaries, dtype=torch.int64)
    if controller is not None and stats is not None:
        target, controller.last_info = controller.decide(stats)
        message = torch.tensor(target, dtype=torch.int64)
    dist.broadcast(message, 0)
    return tuple(int(b) for b in message.tolist())


def publish(record: dict, log, bandwidth_gbps: float, injector: Injector | None, controller: Controller | None) -> None:
    """Rank 0: complete an interval's record, append it to the log, show progress."""
    record["p2p_gbps"] = bandwidth_gbps
    if injector is not None:
        record["injected_slowdown"] = injector.trace.at(injector.trace_time_s())[0].tolist()
        record["trace_time_s"] = injector.trace_time_s()
    if controller is not None:
        record["decision"] = controller.last_info
        record["fallbacks"] = dict(getattr(controller.policy, "fallbacks", {}))
    if log:
        log.write(json.dumps(record) + "\n")
        log.flush()
    line = (f"iter {record['iteration']:>5}  {record['throughput_samples_s']:8.1f} samples/s  "
            f"loss {record['loss']:.4f}  boundaries {record['boundaries']}")
    if "repartition" in record:
        line += f"  repartitioned in {record['repartition']['stall_s']:.3f}s"
    if "decision" in record:
        line += f"  next: {record['decision']['action']}"
    print(line, flush=True)


def save_checkpoint(worker: StageWorker, iteration: int, injector: Injector | None) -> None:
    """Collective: every rank saves its layers; the partition and the scenario clock go in the metadata."""
    meta = {key: getattr(worker.config, key) for key in checkpoint.IDENTITY_KEYS}
    meta.update(boundaries=list(worker.boundaries), trace_time_s=injector.trace_time_s() if injector else 0.0)
    checkpoint.save(worker.config.checkpoint_dir, iteration, worker.rank, worker.modules, worker.owned_layers(),
                    worker.optimizer, meta)


def run_worker(config: RunConfig) -> None:
    """The whole life of one stage process."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)  # one thread per rank: more only contend for the cores
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    injector: Injector | None = None
    try:
        if world != config.stages:
            raise RuntimeError(f"{world} processes were started for {config.stages} stages")
        spec = load_model(config.model, config.layers, config.batch // config.microbatches, seed=config.seed)
        boundaries, profiled_ms, profile = initial_boundaries(config, spec, rank, world)
        first_iteration, resumed = 0, None
        if config.resume:
            resumed, resume_meta = checkpoint.latest(config.resume)
            checkpoint.check_compatible(resume_meta, config, config.resume)
            boundaries, first_iteration = tuple(resume_meta["boundaries"]), resume_meta["iteration"]
        bandwidth = measure_p2p_bandwidth_gbps(rank, world)
        injector = None if not config.interference else Injector.from_spec(
            config.interference, world, rank, config.time_scale, config.inject, config.seed)
        worker = StageWorker(config, spec, boundaries, rank, world, injector)
        if resumed is not None:
            checkpoint.load_rank(resumed, rank, worker.modules, worker.owned_layers(), worker.optimizer)
            if injector is not None:  # the scenario's clock goes on where it stopped
                injector.start -= resume_meta.get("trace_time_s", 0.0) / config.time_scale
        controller = None
        if rank == 0 and config.policy:
            migration_cost = MigrationCost(bandwidth_gbps=bandwidth or 10.0, overhead_s=config.migration_overhead_s)
            controller = Controller(config.policy, profile, world, config.schedule, config.microbatches, migration_cost)
        log = open(config.log, "a" if config.resume else "w") if (rank == 0 and config.log) else None
        if rank == 0:
            print(f"rlpipe run: {world} stages {list(boundaries)}, {config.schedule}, "
                  f"{config.microbatches} micro-batches; p2p {bandwidth:.2f} Gbit/s", flush=True)
        meter, start = IntervalMeter(), time.perf_counter()
        for iteration in range(first_iteration, config.iterations):
            if iteration in config.repartition_at:
                target = tuple(config.repartition_at[iteration])
                meter.repartitions.append(worker.repartition(target, iteration,
                                                             corrupt=config.fail_transfer_at == iteration))
            step_start = time.perf_counter()
            losses = worker.train_step(iteration)
            if losses:
                meter.losses.append(float(np.mean(losses)))
            meter.wall_s += time.perf_counter() - step_start
            meter.iterations += 1
            if (iteration + 1) % config.interval == 0 or iteration + 1 == config.iterations:
                gathered = gather_interval(worker, meter, profiled_ms, iteration + 1, time.perf_counter() - start)
                stats, record = gathered if gathered is not None else (None, None)
                target = None
                if config.policy and iteration + 1 < config.iterations:
                    target = broadcast_decision(controller, stats, worker)
                if record is not None:
                    publish(record, log, bandwidth, injector, controller)
                meter = IntervalMeter()
                if target is not None and target != worker.boundaries:
                    meter.repartitions.append(worker.repartition(target, iteration + 1))
            if config.checkpoint_every and (iteration + 1) % config.checkpoint_every == 0:
                save_checkpoint(worker, iteration + 1, injector)
        if config.save_params:
            params = worker.gather_parameters()
            if rank == 0:
                torch.save(params, config.save_params)
        if log:
            log.close()
        dist.barrier()
    finally:
        if injector is not None:  # a competing process never outlives its stage
            injector.close()
        dist.destroy_process_group()
