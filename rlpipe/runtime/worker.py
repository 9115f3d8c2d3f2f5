"""One stage process of ``rlpipe run``: a model, its data (or synthetic data) and a loop around
AdaptivePipeline.

Run by ``rlpipe run`` (one process per stage of every replica) or by ``torchrun -m rlpipe.runtime`` (its
rendezvous); rank r x S + s holds replica r's stage s. The loop is what a user's own script does with the
library API, plus what the command adds: scripted repartitions and rebalances, checkpoints, resume and
the final parameters.
"""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import torch
import torch.distributed as dist

import rlpipe.runtime.checkpoint as checkpoint
from rlpipe.models import ModelSpec, load_model
from rlpipe.runtime.config import PipelineConfig, RunConfig, check_against_model
from rlpipe.runtime.pipeline import AdaptivePipeline, start_process_group
from rlpipe.seeds import DATA_SEED_STRIDE, TARGET_SEED_OFFSET

DATA_BATCHES = 8  # the synthetic data set cycles through this many batches, so the loss can fall


def synthetic_batch(example: torch.Tensor, batch: int, seed: int, iteration: int,
                    integer_range: int | None = None) -> torch.Tensor:
    """A batch shaped like ``example`` (first dim = ``batch``), the same on every rank for an iteration,
    integers drawn from ``0 .. integer_range - 1`` (``None``: up to the example's largest). The same on
    every layout too: a job of other replicas or micro-batches trains on the same data."""
    generator = torch.Generator().manual_seed(seed * DATA_SEED_STRIDE + iteration % DATA_BATCHES)
    shape = (batch, *example.shape[1:])
    if example.is_floating_point():
        return torch.randn(shape, generator=generator, dtype=example.dtype)
    values = integer_range if integer_range is not None else int(example.max()) + 1
    return torch.randint(0, values, shape, generator=generator, dtype=example.dtype)


def batch_for(spec: ModelSpec, config: RunConfig, iteration: int,
              stage: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The iteration's batch (the job's whole batch: each replica trains its share): the model's own
    data, else synthetic data made where it is read (first stages read the inputs, last stages the
    targets)."""
    if spec.batches is not None:
        return spec.batches(iteration, config.batch)
    inputs = (synthetic_batch(spec.example_microbatch, config.batch, config.seed, iteration, spec.integer_range)
              if stage == 0 else None)
    targets = (synthetic_batch(spec.target, config.batch, config.seed + TARGET_SEED_OFFSET, iteration,
                               spec.integer_range) if stage == config.stages - 1 else None)
    return inputs, targets


def resume_point(config: RunConfig) -> tuple[Path | None, PipelineConfig]:
    """The checkpoint to resume (``None``: start fresh) and the pipeline's config: a resumed run goes on
    at the checkpoint's iteration and scenario time, on its partition if the stage count is the same
    (else on the launch partition for this count: the layers reshard), on its micro-batch split if the
    replica count is the same (else the even split)."""
    resumed, meta = checkpoint.latest(config.resume) if config.resume else (None, {})
    if resumed is not None:
        checkpoint.check_compatible(meta, config, str(config.resume))
    pipeline_config = config.pipeline_config(meta.get("iteration", 0), meta.get("trace_time_s", 0.0))
    if resumed is not None and len(meta["boundaries"]) == config.stages:
        pipeline_config.boundaries = tuple(meta["boundaries"])
    split = meta.get("microbatch_split")
    if resumed is not None and isinstance(split, list) and len(split) == config.data_parallel:
        pipeline_config.microbatch_split = tuple(split)
    if resumed is not None and config.profile is None and (resumed / checkpoint.PROFILE_FILE).exists():
        pipeline_config.profile = str(resumed / checkpoint.PROFILE_FILE)  # the same devices as before ...
        if (config.device_time == "emulated" and config.device_time_scale is None
                and meta.get("device_time") == "emulated" and isinstance(meta.get("device_time_scale"), (int, float))):
            pipeline_config.device_time_scale = float(meta["device_time_scale"])  # ... at the same speed
    return resumed, pipeline_config


def limit_file_size(limit_bytes: int) -> None:
    """The full-disk test: a write past ``limit_bytes`` fails (EFBIG), as a write to a full disk does."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))


def run_worker(config: RunConfig) -> None:
    """The whole life of one stage process."""
    torch.set_num_threads(1)  # one thread per rank: more only contend for the cores
    if config.file_limit_bytes is not None:
        limit_file_size(config.file_limit_bytes)
    start_process_group(config.transport, timeout_s=config.timeout_s)
    pipe = None
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        if world != config.processes:
            raise RuntimeError(f"{world} processes were started for {config.data_parallel} replica(s) of "
                               f"{config.stages} stages")
        spec = load_model(config.model, config.layers, config.batch // (config.microbatches * config.data_parallel),
                          seed=config.seed,
                          meta=True)  # a built-in's layers as structure: each rank gives its own ones values
        check_against_model(config, len(spec.layers))  # under torchrun no launcher checked it
        resumed, pipeline_config = resume_point(config)
        pipe = AdaptivePipeline(spec.layers, spec.loss_fn, config=pipeline_config,
                                optimizer=lambda params: torch.optim.Adam(params, lr=config.lr))
        pipe.set_up(spec.example_microbatch, spec.target)
        if resumed is not None:
            pipe.load_checkpoint(resumed)
        identity = {key: getattr(config, key) for key in checkpoint.IDENTITY_KEYS}
        for iteration in range(pipeline_config.first_iteration, config.iterations):
            if pipe.out_of_time():
                break
            if iteration in config.repartition_at:
                pipe.repartition(tuple(config.repartition_at[iteration]), corrupt=config.fail_transfer_at == iteration)
            if iteration in config.rebalance_at:
                pipe.rebalance(config.rebalance_at[iteration])
            pipe.train_step(*batch_for(spec, config, iteration, pipe.mesh.stage))
            if config.checkpoint_every and (iteration + 1) % config.checkpoint_every == 0:
                assert config.checkpoint_dir is not None  # the config checks --checkpoint-every has it
                pipe.save_checkpoint(config.checkpoint_dir, identity, keep=config.keep_checkpoints)
        if config.save_params:
            assert pipe.stage is not None
            params = pipe.stage.gather_parameters()
            if rank == 0:
                Path(config.save_params).parent.mkdir(parents=True, exist_ok=True)
                torch.save(params, config.save_params)
        pipe.finish()
        dist.barrier()
    finally:
        if pipe is not None:
            pipe.close()
        elif dist.is_initialized():
            dist.destroy_process_group()
