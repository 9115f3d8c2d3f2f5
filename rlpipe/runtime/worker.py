"""One stage process of ``rlpipe run``: a small trainer with named steps.

Run by ``rlpipe run`` (one process per stage) or by ``torchrun -m rlpipe.runtime`` (its rendezvous);
rank r holds stage r. :class:`Trainer` sets up, then ``train`` loops over ``train_iteration``; at the
end of every interval ``end_interval`` gathers the statistics, asks the controller and carries out
its decision through ``repartition``; ``checkpoint`` saves on its cadence; ``close`` tears down.
Rank 0 writes the log.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO

import numpy as np
import torch
import torch.distributed as dist

from rlpipe.models import load_model
from rlpipe.partition import optimal_partition
from rlpipe.profile import LayerProfile, load_profile, measure_profile
from rlpipe.runtime import checkpoint
from rlpipe.runtime.config import RunConfig, check_against_model
from rlpipe.runtime.controller import Controller
from rlpipe.runtime.injection import Injector
from rlpipe.runtime.interval import IntervalMeter, StageReport, exchange_reports, interval_statistics, log_record
from rlpipe.runtime.progress import RunProgress
from rlpipe.runtime.stage import StageWorker
from rlpipe.seeds import DATA_SEED_STRIDE, TARGET_SEED_OFFSET
from rlpipe.simulator import MigrationCost

DATA_BATCHES = 8  # the synthetic data set cycles through this many batches, so the loss can fall


def synthetic_batch(example: torch.Tensor, batch: int, seed: int, iteration: int) -> torch.Tensor:
    """A batch shaped like ``example`` (first dim = ``batch``), the same on every rank for an iteration."""
    generator = torch.Generator().manual_seed(seed * DATA_SEED_STRIDE + iteration % DATA_BATCHES)
    shape = (batch, *example.shape[1:])
    if example.is_floating_point():
        return torch.randn(shape, generator=generator, dtype=example.dtype)
    return torch.randint(0, int(example.max()) + 1, shape, generator=generator, dtype=example.dtype)


def initial_boundaries(config: RunConfig, spec_layers: list, example: torch.Tensor, target: torch.Tensor,
                       loss_fn, rank: int, world: int) -> tuple[tuple[int, ...], np.ndarray, LayerProfile | None]:
    """Rank 0 decides the launch partition (given, or optimal for the profile) and shares it with the
    profiled compute per layer (for device load); returns (boundaries, profiled compute ms per layer,
    the profile on rank 0 / None elsewhere)."""
    num_layers = len(spec_layers)
    message = torch.zeros(world + num_layers, dtype=torch.float64)
    profile = None
    if rank == 0:
        if config.profile:
            profile = load_profile(config.profile)
        else:
            profile = measure_profile(spec_layers, example, target, loss_fn, repeats=3)
            for module in spec_layers:
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


class Trainer:
    """The life of one stage process: set up, train, tear down (see the module docstring)."""

    def __init__(self, config: RunConfig):
        """Set up: process group, model, launch partition (or the resumed one), stage, controller, log."""
        self.config = config
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        torch.set_num_threads(1)  # one thread per rank: more only contend for the cores
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        self.injector: Injector | None = None
        self.log: IO[str] | None = None
        if self.world != config.stages:
            raise RuntimeError(f"{self.world} processes were started for {config.stages} stages")
        self.spec = load_model(config.model, config.layers, config.batch // config.microbatches, seed=config.seed)
        check_against_model(config, len(self.spec.layers))  # under torchrun no launcher checked it
        boundaries, self.profiled_ms, profile = initial_boundaries(
            config, self.spec.layers, self.spec.example_microbatch, self.spec.target, self.spec.loss_fn,
            self.rank, self.world)
        resumed, resume_meta = checkpoint.latest(config.resume) if config.resume else (None, {})
        if resumed is not None:
            checkpoint.check_compatible(resume_meta, config, str(config.resume))
            boundaries = tuple(resume_meta["boundaries"])
        self.first_iteration = resume_meta.get("iteration", 0)
        self.bandwidth_gbps = measure_p2p_bandwidth_gbps(self.rank, self.world)
        if config.interference:
            self.injector = Injector.from_spec(config.interference, self.world, self.rank, config.time_scale,
                                               config.inject, config.seed)
            # a resumed run's scenario clock goes on where it stopped
            self.injector.start -= resume_meta.get("trace_time_s", 0.0) / config.time_scale
        self.stage = StageWorker(self.spec.layers, self.spec.loss_fn, boundaries, self.rank, self.world,
                                 config.schedule, config.microbatches, config.lr, self.injector,
                                 config.drop_moved_optimizer_state)
        if resumed is not None:
            checkpoint.load_rank(resumed, self.rank, self.stage.modules, self.stage.owned_layers(),
                                 self.stage.optimizer)
        self.controller = self._make_controller(profile) if self.rank == 0 and config.policy else None
        self.progress: RunProgress | None = None
        if self.rank == 0:
            if config.log:
                Path(config.log).parent.mkdir(parents=True, exist_ok=True)
                self.log = open(config.log, "a" if config.resume else "w")
            print(f"rlpipe run: {self.world} stages {list(boundaries)}, {config.schedule}, "
                  f"{config.microbatches} micro-batches; p2p {self.bandwidth_gbps:.2f} Gbit/s", flush=True)
            self.progress = RunProgress(self.first_iteration, config.iterations, config.log)
        self.meter = IntervalMeter()
        self.start = time.perf_counter()

    def _make_controller(self, profile: LayerProfile | None) -> Controller:
        """Rank 0's controller, planning migrations at the measured point-to-point bandwidth."""
        assert profile is not None and self.config.policy  # rank 0 holds the profile
        migration_cost = MigrationCost(bandwidth_gbps=self.bandwidth_gbps or 10.0,
                                       overhead_s=self.config.migration_overhead_s)
        return Controller(self.config.policy, profile, self.world, self.config.schedule, self.config.microbatches,
                          migration_cost)

    def train(self) -> None:
        """Every iteration from the first (or the resumed one) to ``config.iterations``."""
        config = self.config
        for iteration in range(self.first_iteration, config.iterations):
            if iteration in config.repartition_at:
                self.repartition(tuple(config.repartition_at[iteration]), iteration,
                                 corrupt=config.fail_transfer_at == iteration)
            self.train_iteration(iteration)
            if (iteration + 1) % config.interval == 0 or iteration + 1 == config.iterations:
                self.end_interval(iteration + 1)
            if config.checkpoint_every and (iteration + 1) % config.checkpoint_every == 0:
                self.checkpoint(iteration + 1)
        if config.save_params:
            params = self.stage.gather_parameters()
            if self.rank == 0:
                Path(config.save_params).parent.mkdir(parents=True, exist_ok=True)
                torch.save(params, config.save_params)

    def train_iteration(self, iteration: int) -> None:
        """One training iteration on the synthetic batch of ``iteration``."""
        config, start = self.config, time.perf_counter()
        inputs = target = None
        if self.rank == 0:
            inputs = synthetic_batch(self.spec.example_microbatch, config.batch, config.seed, iteration)
        if self.rank == self.world - 1:
            target = synthetic_batch(self.spec.target, config.batch, config.seed + TARGET_SEED_OFFSET, iteration)
        losses = self.stage.train_step(inputs, target)
        if losses:
            self.meter.losses.append(float(np.mean(losses)))
        self.meter.busy_s += time.perf_counter() - start
        self.meter.iterations += 1

    def end_interval(self, iteration: int) -> None:
        """Gather every rank's report; rank 0 decides the next partition, which every rank then adopts."""
        config, meter = self.config, self.meter
        owned = self.stage.owned_layers()
        compute_s, timed = self.stage.take_compute_s()
        losses = meter.losses + [0.0] * (config.interval - len(meter.losses))  # padded: one length on every rank
        own = StageReport(compute_s / timed, meter.busy_s, float(len(owned)), self.stage.memory_bytes(),
                          float(self.profiled_ms[owned.start:owned.stop].sum()), tuple(losses))
        reports = exchange_reports(own, self.world)
        stats = interval_statistics(reports, meter, iteration, self.stage.boundaries, config.microbatches)
        decides = bool(config.policy) and iteration < config.iterations  # the last interval has no next one
        target = self.broadcast_decision(stats) if decides else None
        if self.rank == 0:
            run_losses = list(reports[-1].losses[:meter.iterations])
            self.publish(log_record(stats, run_losses, time.perf_counter() - self.start, config.batch,
                                    meter.repartitions), decides)
        self.meter = IntervalMeter()
        if target is not None and target != self.stage.boundaries:
            self.repartition(target, iteration)

    def broadcast_decision(self, stats) -> tuple[int, ...]:
        """Rank 0 asks the controller for the next partition; every rank learns it."""
        message = torch.tensor(self.stage.boundaries, dtype=torch.int64)
        if self.controller is not None:
            message = torch.tensor(self.controller.decide(stats), dtype=torch.int64)
        dist.broadcast(message, 0)
        return tuple(int(b) for b in message.tolist())

    def publish(self, record: dict, decided: bool) -> None:
        """Rank 0: complete an interval's record (the decision only if one was made for the next
        interval), append it to the log, show progress."""
        record["p2p_gbps"] = self.bandwidth_gbps
        if self.injector is not None:
            record["injected_slowdown"] = self.injector.trace.at(self.injector.trace_time_s())[0].tolist()
            record["trace_time_s"] = self.injector.trace_time_s()
        if self.controller is not None:
            if decided:
                record["decision"] = self.controller.last_decision
            record["fallbacks"] = self.controller.fallbacks
        if self.log:
            self.log.write(json.dumps(record) + "\n")
            self.log.flush()
        assert self.progress is not None  # rank 0 shows progress
        self.progress.interval(record)

    def repartition(self, target: tuple[int, ...], iteration: int, corrupt: bool = False) -> None:
        """Move layers live to ``target`` (collective); the interval's meter records it."""
        self.meter.repartitions.append(self.stage.repartition(target, iteration, corrupt))

    def checkpoint(self, iteration: int) -> None:
        """Collective: every rank saves its layers; the partition and the scenario clock go in the metadata."""
        meta = {key: getattr(self.config, key) for key in checkpoint.IDENTITY_KEYS}
        meta.update(boundaries=list(self.stage.boundaries),
                    trace_time_s=self.injector.trace_time_s() if self.injector else 0.0)
        assert self.config.checkpoint_dir is not None  # the config checks --checkpoint-every has it
        checkpoint.save(self.config.checkpoint_dir, iteration, self.rank, self.stage.modules,
                        self.stage.owned_layers(), self.stage.optimizer, meta)

    def close(self) -> None:
        """Tear down: the progress bar (with the run's summary), the log, any competing process, the
        process group."""
        if self.progress is not None:
            summary = self.progress.close()
            if self.progress.bar.n >= self.config.iterations:
                print(summary, flush=True)
        if self.log:
            self.log.close()
        if self.injector is not None:  # a competing process never outlives its stage
            self.injector.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def run_worker(config: RunConfig) -> None:
    """The whole life of one stage process."""
    trainer = None
    try:
        trainer = Trainer(config)
        trainer.train()
        dist.barrier()
    finally:
        if trainer is not None:
            trainer.close()
        elif dist.is_initialized():
            dist.destroy_process_group()
