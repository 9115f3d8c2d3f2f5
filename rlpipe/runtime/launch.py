"""``rlpipe run``: check the request, start one stage process per stage on this machine, watch them.

Each process gets torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the
worker is the same code torchrun starts. If any process dies, the others are stopped within
seconds and the error names the rank; child processes never outlive the launcher.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from rlpipe.errors import InputError
from rlpipe.models import BUILTIN_MODELS, load_model
from rlpipe.partition import Partition
from rlpipe.profile import load_profile
from rlpipe.runtime import checkpoint
from rlpipe.runtime.config import RunConfig
from rlpipe.runtime.processes import die_with_parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def validate(config: RunConfig) -> None:
    """Refuse a run that cannot work before any process starts (one-line InputError)."""
    spec = load_model(config.model, config.layers, config.batch // config.microbatches, seed=config.seed)
    num_layers = len(spec.layers)
    if config.stages > num_layers:
        raise InputError(f"--stages {config.stages}: more stages than the model's {num_layers} layers")
    is_factory = config.model not in BUILTIN_MODELS
    microbatch_size = spec.example_microbatch.shape[0]
    if is_factory and microbatch_size * config.microbatches != config.batch:
        raise InputError(f"--batch {config.batch}: the factory's micro-batch of {microbatch_size} "
                         f"x {config.microbatches} micro-batches makes {microbatch_size * config.microbatches}")
    for label, boundaries in [("--boundaries", config.boundaries)] + [
            (f"--repartition-at {it}", b) for it, b in config.repartition_at.items()]:
        if boundaries is None:
            continue
        if len(boundaries) != config.stages:
            raise InputError(f"{label} {','.join(map(str, boundaries))}: {len(boundaries)} stages, "
                             f"the run has {config.stages}")
        try:
            Partition(tuple(boundaries), num_layers)
        except InputError as err:
            raise InputError(f"{label}: {err} (the model has {num_layers} layers)") from None
    if config.resume:
        _, meta = checkpoint.latest(config.resume)
        checkpoint.check_compatible(meta, config, config.resume)
        if meta["iteration"] >= config.iterations:
            raise InputError(f"--resume {config.resume}: the checkpoint is at iteration {meta['iteration']}, "
                             f"--iterations {config.iterations} leaves nothing to run")
    if config.policy:
        from rlpipe.agents import make_policy

        make_policy(config.policy, strict=False, live=True)
    if config.interference:
        from rlpipe.interference import load_scenario

        load_scenario(config.interference, config.stages, 3600.0, config.seed)
    if config.profile:
        profile = load_profile(config.profile)
        if profile.num_layers != num_layers:
            raise InputError(f"--profile {config.profile}: {profile.num_layers} layers, the model has {num_layers}")


def launch(config: RunConfig, poll_s: float = 0.2, grace_s: float = 3.0) -> int:
    """Start the stage processes and wait; returns 0 on success, 1 if a rank failed."""
    validate(config)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(config.stages), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "rlpipe.runtime", *config.to_argv()]
    processes = [subprocess.Popen(command, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                  preexec_fn=die_with_parent) for rank in range(config.stages)]
    try:
        while True:
            codes = [p.poll() for p in processes]
            failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                rank, code = failed[0]
                _stop(processes, grace_s)
                reason = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                print(f"rlpipe run: error: stage process rank {rank} died ({reason}); the run was stopped",
                      file=sys.stderr)
                return 1
            if all(code == 0 for code in codes):
                return 0
            time.sleep(poll_s)
    except KeyboardInterrupt:
        _stop(processes, grace_s)
        raise
    finally:
        _stop(processes, grace_s)


def _stop(processes: list[subprocess.Popen], grace_s: float) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
