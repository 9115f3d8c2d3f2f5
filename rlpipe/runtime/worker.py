"""One stage process of ``rlpipe run``: a model, its data (or synthetic data) and a loop around
AdaptivePipeline.

Run by ``rlpipe run`` (one process per stage) or by ``torchrun -m rlpipe.runtime`` (its rendezvous);
rank r holds stage r. The loop is what a user's own script does with the library API, plus what the
command adds: scripted repartitions, checkpoints, resume and the final parameters.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from rlpipe.models import load_model
from rlpipe.runtime import checkpoint
from rlpipe.runtime.config import RunConfig, check_against_model
from rlpipe.runtime.pipeline import AdaptivePipeline, start_process_group
from rlpipe.seeds import DATA_SEED_STRIDE, TARGET_SEED_OFFSET

DATA_BATCHES = 8  # the synthetic data set cycles through this many batches, so the loss can fall


def synthetic_batch(example: torch.Tensor, batch: int, seed: int, iteration: int) -> torch.Tensor:
    """A batch shaped like ``example`` (first dim = ``batch``), the same on every rank for an iteration."""
    generator = torch.Generator().manual_seed(seed * DATA_SEED_STRIDE + iteration % DATA_BATCHES)
    shape = (batch, *example.shape[1:])
    if example.is_floating_point():
        return torch.randn(shape, generator=generator, dtype=example.dtype)
    return torch.randint(0, int(example.max()) + 1, shape, generator=generator, dtype=example.dtype)


def run_worker(config: RunConfig) -> None:
    """The whole life of one stage process."""
    torch.set_num_threads(1)  # one thread per rank: more only contend for the cores
    start_process_group()
    pipe = None
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        if world != config.stages:
            raise RuntimeError(f"{world} processes were started for {config.stages} stages")
        spec = load_model(config.model, config.layers, config.batch // config.microbatches, seed=config.seed,
                          meta=True)  # a built-in's layers as structure: each rank gives its own theirs values
        check_against_model(config, len(spec.layers))  # under torchrun no launcher checked it
        resumed, meta = checkpoint.latest(config.resume) if config.resume else (None, {})
        if resumed is not None:
            checkpoint.check_compatible(meta, config, str(config.resume))
        pipeline_config = config.pipeline_config(meta.get("iteration", 0), meta.get("trace_time_s", 0.0))
        if resumed is not None:
            pipeline_config.boundaries = tuple(meta["boundaries"])
        pipe = AdaptivePipeline(spec.layers, spec.loss_fn, config=pipeline_config,
                                optimizer=lambda params: torch.optim.Adam(params, lr=config.lr))
        pipe.set_up(spec.example_microbatch, spec.target)
        if resumed is not None:
            pipe.load_checkpoint(resumed)
        for iteration in range(pipeline_config.first_iteration, config.iterations):
            if iteration in config.repartition_at:
                pipe.repartition(tuple(config.repartition_at[iteration]), corrupt=config.fail_transfer_at == iteration)
            inputs = targets = None  # the first stage reads the inputs, the last the targets
            if spec.batches is not None:  # the model's own data
                inputs, targets = spec.batches(iteration, config.batch)
            else:
                if rank == 0:
                    inputs = synthetic_batch(spec.example_microbatch, config.batch, config.seed, iteration)
                if rank == world - 1:
                    targets = synthetic_batch(spec.target, config.batch, config.seed + TARGET_SEED_OFFSET, iteration)
            pipe.train_step(inputs, targets)
            if config.checkpoint_every and (iteration + 1) % config.checkpoint_every == 0:
                assert config.checkpoint_dir is not None  # the config checks --checkpoint-every has it
                pipe.save_checkpoint(config.checkpoint_dir, {k: getattr(config, k) for k in checkpoint.IDENTITY_KEYS})
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
