"""``rlpipe run``: check the request, start one stage process per stage of every replica on this
machine, watch them.

Each process is forked from the launcher with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), so the worker is the same code torchrun starts. If any process dies, the others are
stopped within seconds and the error names the rank (and its replica and stage); child processes never
outlive the launcher. Ctrl-C stops every stage (each exits with 130) and leaves the last checkpoint.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch

import rlpipe.runtime.checkpoint as checkpoint
from rlpipe.errors import InputError
from rlpipe.models import BUILTIN_MODELS, load_model
from rlpipe.profile import load_profile
from rlpipe.runtime.config import RunConfig, check_against_model
from rlpipe.runtime.mesh import ParallelDims
from rlpipe.runtime.processes import FAILURE_DIR_ENV, StageProcess, first_failure
from rlpipe.runtime.transport import choose_transport


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def validate(config: RunConfig) -> None:
    """Refuse a run that cannot work before any process starts (one-line InputError)."""
    spec = load_model(config.model, config.layers, config.batch // (config.microbatches * config.data_parallel),
                      seed=config.seed)
    num_layers = len(spec.layers)
    check_against_model(config, num_layers)
    microbatch_size = spec.example_microbatch.shape[0]
    total = config.microbatches * config.data_parallel
    if config.model not in BUILTIN_MODELS and microbatch_size * total != config.batch:
        raise InputError(f"--batch {config.batch}: the factory's micro-batch of {microbatch_size} x {total} "
                         f"micro-batches (--data-parallel x --microbatches) makes {microbatch_size * total}")
    if config.resume:
        _, meta = checkpoint.latest(config.resume)
        checkpoint.check_compatible(meta, config, config.resume)
        if meta["iteration"] >= config.iterations:
            raise InputError(f"--resume {config.resume}: the checkpoint is at iteration {meta['iteration']}, "
                             f"--iterations {config.iterations} leaves nothing to run")
    if config.policy:
        from rlpipe.agents import make_policy

        make_policy(config.policy, live=True, fallback=config.fallback)  # a named artifact must load now
    if config.interference:
        from rlpipe.interference import load_scenario

        load_scenario(config.interference, config.processes, 3600.0, config.seed)
    if config.transport != "auto" and not torch.backends.cuda.is_built():  # else each stage checks its GPUs
        choose_transport(config.transport, 0, config.processes, 0)
    if config.profile:
        profile = load_profile(config.profile)
        if profile.num_layers != num_layers:
            raise InputError(f"--profile {config.profile}: {profile.num_layers} layers, the model has {num_layers}")


def launch(config: RunConfig, poll_s: float = 0.2, grace_s: float = 3.0) -> int:
    """Start the stage processes and wait; returns 0 on success, 1 if a rank failed (named on stderr)."""
    validate(config)
    with tempfile.TemporaryDirectory(prefix="rlpipe-failures-") as failure_dir:
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "WORLD_SIZE": str(config.processes), "OMP_NUM_THREADS": "1", FAILURE_DIR_ENV: failure_dir}
        from rlpipe.runtime.__main__ import stage_main

        if config.checkpoint_every or config.resume:  # imported once here, not in every stage
            importlib.import_module("torch.distributed.checkpoint")
        torch.set_num_threads(1)  # no thread pool in the launcher: forking it is safe, and stages run one each
        processes = [StageProcess(rank, {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                  lambda: stage_main(config)) for rank in range(config.processes)]
        try:
            while True:
                codes = [p.poll() for p in processes]
                if any(code not in (None, 0) for code in codes):
                    killed = [(rank, -code) for rank, code in enumerate(codes) if code is not None and code < 0]
                    if not killed:  # the others fail within moments of the first: let them say why
                        _settle(processes, grace_s)
                    silent = [rank for rank, p in enumerate(processes) if p.poll() is None]
                    _stop(processes, grace_s)
                    rank, why = first_failure(failure_dir, killed, silent)
                    if rank < 0:  # no stage said why: name the first one found dead
                        rank = next(r for r, code in enumerate(codes) if code not in (None, 0))
                        why = f"exit code {codes[rank]}"
                    where = ParallelDims(config.data_parallel, config.stages).describe(rank)
                    print(f"rlpipe run: error: stage process {where} failed first ({why}); "
                          f"the run was stopped", file=sys.stderr)
                    return 1
                if all(code == 0 for code in codes):
                    return 0
                time.sleep(poll_s)
        except KeyboardInterrupt:  # Ctrl-C: every stage stops (a terminal sends it SIGINT too)
            for process in processes:
                process.send_signal(signal.SIGINT)
            _settle(processes, max(grace_s, 10.0))
            codes = [p.poll() for p in processes]
            _stop(processes, grace_s)
            shown = ", ".join("running (killed)" if code is None else str(code) for code in codes)
            print(f"rlpipe run: interrupted; stage processes exited with {shown}", file=sys.stderr)
            raise
        finally:
            _stop(processes, grace_s)


def _settle(processes: list[StageProcess], wait_s: float) -> None:
    """Wait up to ``wait_s`` for the stage processes still running to exit by themselves."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.05)


def _stop(processes: list[StageProcess], grace_s: float) -> None:
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
