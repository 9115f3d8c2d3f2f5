"""The run's options: one typed dataclass, one argparse definition shared by launcher and worker."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

from rlpipe.errors import InputError
from rlpipe.partition import SCHEDULES, Partition
from rlpipe.split import check_split

BUILTIN_MODEL_NAMES = ("transformer", "mlp", "cnn", "charlm")  # rlpipe.models.BUILTIN_MODELS, named without
# importing torch, so that reading the options stays quick (tests/runtime/test_config.py checks they agree)
DEVICE_TIME_MODES = ("real", "emulated")  # rlpipe.runtime.device_time
TRANSPORTS = ("auto", "nccl", "host-staged")  # rlpipe.runtime.transport
UNLIMITED_ITERATIONS = 10**12  # a run with a wall-time budget and no --iterations runs until the budget is spent


@dataclass
class PipelineConfig:
    """How an :class:`~rlpipe.runtime.pipeline.AdaptivePipeline` runs, whoever drives its loop.

    Attributes:
        schedule: a name from :data:`rlpipe.partition.SCHEDULES`.
        microbatches: micro-batches per replica per iteration (M: the job's batch holds D x M).
        interval: iterations per statistics interval (and per controller decision).
        data_parallel: D, the replicas of the pipeline (world size = D x stages).
        microbatch_split: micro-batches of each replica at the start (``None``: M each).
        boundaries: first layer of each stage (``None``: the optimal partition of the profile).
        profile: profile JSON or shipped name (``None``: measured at start-up on rank 0).
        policy: controller policy: static, greedy, dynpipe, threshold, ppo or ppo:PATH (``None``: no
            controller).
        fallback: the heuristic that decides for ``ppo`` when its actor cannot (static, greedy,
            dynpipe, threshold).
        device_time: ``real`` (what the host gives) or ``emulated`` (the profile's time x scale).
        device_time_scale: emulated time over the profile's (``None``: chosen so that emulation holds).
        transport: ``auto``, ``nccl`` or ``host-staged`` (:mod:`rlpipe.runtime.transport`).
        interference: injected scenario preset or ``trace:FILE.csv`` (``None``: none).
        inject: ``throttle`` (stretch compute) or ``colocate`` (a competing process; real time only).
        time_scale: trace seconds per second of run time.
        trace_start_s: where the scenario's clock starts (a resumed run goes on where it stopped), s.
        seed: seed of the injected scenario.
        migration_overhead_s: the fixed repartition cost the controller plans with, s.
        log: JSONL file for one record per interval (``None``: no log); appended to when ``append_log``.
        append_log: append to ``log`` (a resumed run) instead of starting it afresh.
        total_iterations: the run's length, if known: the last interval then decides nothing.
        duration_s: the run's wall-time budget from its first iteration on, if it has one, s (progress is
            then shown in time).
        first_iteration: the iteration the run starts at (a resumed run starts past 0).
        drop_moved_optimizer_state: forget moved layers' optimizer state (the correctness control test only).
    """

    schedule: str = "1f1b"
    microbatches: int = 4
    interval: int = 10
    data_parallel: int = 1
    microbatch_split: tuple[int, ...] | None = None
    boundaries: tuple[int, ...] | None = None
    profile: str | None = None
    policy: str | None = None
    fallback: str = "dynpipe"
    device_time: str = "real"
    device_time_scale: float | None = None
    transport: str = "auto"
    interference: str | None = None
    inject: str = "throttle"
    time_scale: float = 12.0
    trace_start_s: float = 0.0
    seed: int = 0
    migration_overhead_s: float = 0.1
    log: str | None = None
    append_log: bool = False
    total_iterations: int | None = None
    duration_s: float | None = None
    first_iteration: int = 0
    drop_moved_optimizer_state: bool = False


@dataclass
class RunConfig:
    """Options of a live pipeline run (``rlpipe run`` / ``python -m rlpipe.runtime``).

    Attributes:
        model: built-in model name or ``pkg.module:factory``.
        layers: layer count of a built-in model (``None``: its default).
        stages: pipeline stages (S), one process each per replica.
        data_parallel: replicas of the pipeline (D): D x S stage processes.
        schedule: ``"1f1b"`` or ``"gpipe"``.
        microbatches: micro-batches per replica per iteration (M).
        batch: samples per iteration, the whole job's (a multiple of D x ``microbatches``).
        iterations: training iterations to run (with ``duration_s``: at most).
        duration_s: train for this much wall time from the first iteration on, s (``None``: ``iterations``):
            compared runs then meet the same stretch of their scenario, whatever their speed.
        boundaries: first layer of each stage (``None``: the optimal partition of the profile).
        profile: profile JSON (``None``: measured at start-up).
        seed: seed of the model's initial parameters and of the synthetic data.
        lr: Adam learning rate.
        interval: iterations per statistics interval (and per controller decision).
        log: JSONL file for one record per interval (``None``: no log).
        repartition_at: scripted repartitions, ``{iteration: boundaries}``, applied before that iteration.
        rebalance_at: scripted micro-batch splits, ``{iteration: split}``, in force from that iteration.
        save_params: write the final parameters of every layer to this file (``None``: don't).
        policy: controller policy: static, greedy, dynpipe, threshold, ppo or ppo:PATH (``None``: no
            controller).
        fallback: the heuristic that decides for ``ppo`` when its actor cannot.
        interference: injected scenario preset or ``trace:FILE.csv`` (``None``: none).
        inject: ``throttle`` (sleep-stretch compute) or ``colocate`` (a competing process).
        time_scale: trace seconds per second of run time.
        migration_overhead_s: the fixed repartition cost the controller plans with, s.
        device_time: ``real`` or ``emulated`` (see :class:`PipelineConfig`).
        device_time_scale: emulated time over the profile's (``None``: chosen so that emulation holds).
        transport: how stage processes reach their GPUs and each other: ``auto``, ``nccl`` or
            ``host-staged`` (:mod:`rlpipe.runtime.transport`).
        checkpoint_every: save a checkpoint every this many iterations (``None``: never).
        checkpoint_dir: where checkpoints go.
        keep_checkpoints: how many of the newest checkpoints to keep.
        resume: continue from the latest checkpoint in this folder (``None``: start fresh).
        timeout_s: how long a collective or a transfer may wait for another stage before the run ends, s.
    """

    model: str = "mlp"
    layers: int | None = None
    stages: int = 2
    data_parallel: int = 1
    schedule: str = "1f1b"
    microbatches: int = 4
    batch: int = 32
    iterations: int = 20
    duration_s: float | None = None
    boundaries: tuple[int, ...] | None = None
    profile: str | None = None
    seed: int = 0
    lr: float = 1e-3
    interval: int = 10
    log: str | None = None
    repartition_at: dict[int, tuple[int, ...]] = field(default_factory=dict)
    rebalance_at: dict[int, tuple[int, ...]] = field(default_factory=dict)
    save_params: str | None = None
    policy: str | None = None
    fallback: str = "dynpipe"
    interference: str | None = None
    inject: str = "throttle"
    time_scale: float = 12.0
    migration_overhead_s: float = 0.1
    device_time: str = "real"
    device_time_scale: float | None = None
    transport: str = "auto"
    checkpoint_every: int | None = None
    checkpoint_dir: str | None = None
    keep_checkpoints: int = 3
    resume: str | None = None
    timeout_s: float = 120.0
    drop_moved_optimizer_state: bool = False  # for the correctness control test only
    fail_transfer_at: int | None = None  # for the atomicity test only: corrupt the transfer before this iteration
    file_limit_bytes: int | None = None  # for the full-disk test only: the largest file a stage process may write

    @property
    def processes(self) -> int:
        """Stage processes of the job: D x S."""
        return self.data_parallel * self.stages

    def pipeline_config(self, first_iteration: int = 0, trace_start_s: float = 0.0) -> PipelineConfig:
        """The pipeline's part of the run (a resumed run starts at ``first_iteration``, its scenario
        clock at ``trace_start_s``)."""
        shared = {f.name: getattr(self, f.name) for f in fields(PipelineConfig) if hasattr(self, f.name)}
        return PipelineConfig(**{**shared, "append_log": bool(self.resume), "total_iterations": self.iterations,
                                 "first_iteration": first_iteration, "trace_start_s": trace_start_s,
                                 "duration_s": self.duration_s})

    def to_argv(self) -> list[str]:
        """The command-line arguments that rebuild this config in a worker process."""
        argv = []
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--log-file" if f.name == "log" else "--" + f.name.replace("_", "-")
            if value is None or value is False or (f.name in ("repartition_at", "rebalance_at") and not value):
                continue
            if value is True:
                argv.append(flag)
            elif f.name == "boundaries":
                argv += [flag, ",".join(map(str, value))]
            elif f.name in ("repartition_at", "rebalance_at"):
                argv += [flag] + [f"{it}:{','.join(map(str, b))}" for it, b in sorted(value.items())]
            else:
                argv += [flag, str(value)]
        return argv


def _boundaries(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': expected comma-separated layer indices like 0,4,9") from None


def _repartition(text: str) -> tuple[int, tuple[int, ...]]:
    iteration, sep, rest = text.partition(":")
    if not sep or not iteration.isdigit():
        raise argparse.ArgumentTypeError(f"'{text}': expected ITER:BOUNDARIES like 10:0,5,9")
    return int(iteration), _boundaries(rest)


def _rebalance(text: str) -> tuple[int, tuple[int, ...]]:
    iteration, sep, rest = text.partition(":")
    try:
        if not sep or not iteration.isdigit():
            raise ValueError
        return int(iteration), tuple(int(part) for part in rest.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}': expected ITER:SPLIT like 10:3,5 (micro-batches per "
                                         f"replica)") from None


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``rlpipe run``; ``python -m rlpipe.runtime`` takes the same. Defaults come from
    :class:`RunConfig`."""
    from rlpipe.agents import FALLBACKS
    from rlpipe.interference import PRESETS
    from rlpipe.runtime.injection import INJECTION_MODES

    d = RunConfig()
    parser.add_argument("--model", required=True, help=f"built-in model ({', '.join(BUILTIN_MODEL_NAMES)}), "
                        "pkg.module:factory or path/to/file.py:factory (see README, 'Your own model')")
    parser.add_argument("--layers", type=int, help="layer count of a built-in model (default 8)")
    parser.add_argument("--stages", type=int, required=True, help="pipeline stages, one process each per replica")
    parser.add_argument("--data-parallel", type=int, default=d.data_parallel, metavar="D",
                        help="replicas of the pipeline (data parallelism): D x stages processes; replica r's "
                        f"stage s is rank (and trace device) r x stages + s (default {d.data_parallel})")
    parser.add_argument("--schedule", choices=SCHEDULES, default=d.schedule,
                        help=f"pipeline schedule (default {d.schedule})")
    parser.add_argument("--microbatches", type=int, default=d.microbatches,
                        help=f"micro-batches per replica per iteration (default {d.microbatches})")
    parser.add_argument("--batch", type=int, default=d.batch, help="samples per iteration, the whole job's: "
                        f"data-parallel x microbatches micro-batches (default {d.batch})")
    parser.add_argument("--iterations", type=int, help=f"training iterations (default {d.iterations}; with "
                        "--duration-s, at most this many: unlimited unless given)")
    parser.add_argument("--duration-s", type=float, help="train for this much wall time from the first iteration "
                        "on, s, then report throughput over it: compared runs meet the same stretch of their "
                        "scenario whatever their speed (default: --iterations)")
    parser.add_argument("--boundaries", type=_boundaries, help="first layer of each stage, e.g. 0,4,9,13 "
                        "(default: the optimal partition of the profile)")
    parser.add_argument("--profile", help="profile JSON or shipped name for the initial partition "
                        "(default: measure now)")
    parser.add_argument("--seed", type=int, default=d.seed,
                        help=f"seed of parameters and synthetic data (default {d.seed})")
    parser.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr:g})")
    parser.add_argument("--interval", type=int, default=d.interval,
                        help=f"iterations per statistics interval and controller decision (default {d.interval})")
    parser.add_argument("--log", "--log-file", dest="log", help="write one JSON record per interval to this "
                        "JSONL file (under torchrun, spell it --log-file: torchrun claims --log)")
    parser.add_argument("--repartition-at", nargs="+", action="extend", type=_repartition, default=[],
                        metavar="ITER:BOUNDARIES", help="scripted live repartitions, applied before iteration ITER, "
                        "e.g. 10:0,3,8 (several after one flag, or the flag repeated)")
    parser.add_argument("--rebalance-at", nargs="+", action="extend", type=_rebalance, default=[],
                        metavar="ITER:SPLIT", help="scripted micro-batch splits between replicas, in force from "
                        "iteration ITER, e.g. 10:3,5 (replica 0 runs 3 micro-batches, replica 1 runs 5; they total "
                        "data-parallel x microbatches)")
    parser.add_argument("--save-params", help="write every layer's final parameters to this .pt file")
    parser.add_argument("--policy", help="controller deciding repartitions (and, with replicas, micro-batch splits) "
                        "every --interval iterations: static, greedy, dynpipe, threshold, falcon, falcon-early, ppo "
                        "(the shipped default) or ppo:PATH (a folder written by rlpipe train; default: none, only "
                        "--repartition-at and --rebalance-at)")
    parser.add_argument("--fallback", choices=FALLBACKS, default=d.fallback,
                        help="the heuristic that decides for ppo when its actor cannot (more stages than it was "
                        f"trained for, unusable statistics; default {d.fallback})")
    parser.add_argument("--interference", help=f"inject a scenario preset ({', '.join(PRESETS)}) or "
                        "trace:FILE.csv on the stages (default: none)")
    parser.add_argument("--inject", choices=INJECTION_MODES, default=d.inject,
                        help="throttle: stretch compute by the slowdown (reproducible); colocate: run a competing "
                        f"process on the stage's core while slowed (default {d.inject})")
    parser.add_argument("--time-scale", type=float, default=d.time_scale,
                        help=f"trace seconds per second of run time (default {d.time_scale:g}: "
                        f"{60 / d.time_scale:g} minutes replay an hour)")
    parser.add_argument("--device-time", choices=DEVICE_TIME_MODES, default=d.device_time,
                        help="real: a stage's compute is what the host gives it; emulated: every chunk runs for "
                        "real, then the stage sleeps until the profile's time for its layers x scale x injected "
                        "slowdown has passed, as a host waits on its GPU (use it on machines with fewer cores "
                        f"than stages; default {d.device_time})")
    parser.add_argument("--device-time-scale", type=float, help="emulated device time over the profile's "
                        "(default: chosen from stage processes per core and the measured real compute, so that "
                        "emulation holds here; the log records it)")
    parser.add_argument("--transport", choices=TRANSPORTS, default=d.transport,
                        help="nccl: a GPU per stage process, tensors GPU to GPU; host-staged: stage processes share "
                        "the GPUs (more processes than GPUs), layers and their state stay on the GPU and what "
                        "crosses a stage boundary goes through the host over gloo; auto: nccl where every stage "
                        f"process has a GPU, host-staged where they must share, the CPU without one (default "
                        f"{d.transport}; the log records the choice)")
    parser.add_argument("--migration-overhead-s", type=float, default=d.migration_overhead_s,
                        help="fixed cost of a repartition the controller plans with, s "
                        f"(default {d.migration_overhead_s})")
    parser.add_argument("--checkpoint-every", type=int, help="save model, optimizer, partition and iteration "
                        "every N iterations (needs --checkpoint-dir)")
    parser.add_argument("--checkpoint-dir", help="folder for checkpoints")
    parser.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                        help=f"how many of the newest checkpoints to keep (default {d.keep_checkpoints})")
    parser.add_argument("--resume", help="continue from the latest checkpoint in this folder (written by any "
                        "number of stages: the layers go to this run's partition)")
    parser.add_argument("--timeout-s", type=float, default=d.timeout_s,
                        help="how long a stage waits for another (a collective, a transfer) before the run ends "
                        f"naming it, s (default {d.timeout_s:g})")
    parser.add_argument("--drop-moved-optimizer-state", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fail-transfer-at", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--file-limit-bytes", type=int, help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    values = {f.name: getattr(args, f.name) for f in fields(RunConfig) if hasattr(args, f.name)}
    values["repartition_at"] = dict(args.repartition_at or [])
    values["rebalance_at"] = dict(args.rebalance_at or [])
    if values.get("iterations") is None:
        values["iterations"] = UNLIMITED_ITERATIONS if args.duration_s is not None else RunConfig.iterations
    config = RunConfig(**values)
    if config.duration_s is not None and not config.duration_s > 0:
        raise InputError(f"--duration-s: must be > 0, got {config.duration_s}")
    if min(config.stages, config.data_parallel, config.microbatches, config.iterations, config.interval) < 1:
        raise InputError("--stages, --data-parallel, --microbatches, --iterations and --interval must be >= 1")
    total = config.data_parallel * config.microbatches
    if config.batch % total:
        raise InputError(f"--batch {config.batch}: must be divisible by the job's {total} micro-batches "
                         f"(--data-parallel {config.data_parallel} x --microbatches {config.microbatches})")
    for iteration, split in config.rebalance_at.items():
        check_split(split, config.data_parallel, config.microbatches, config.schedule, config.stages,
                    f"--rebalance-at {iteration}:")
    if config.checkpoint_every is not None and (config.checkpoint_every < 1 or not config.checkpoint_dir):
        raise InputError("--checkpoint-every: needs a value >= 1 and --checkpoint-dir")
    if config.time_scale <= 0:
        raise InputError(f"--time-scale: must be > 0, got {config.time_scale}")
    if config.keep_checkpoints < 1:
        raise InputError(f"--keep-checkpoints: must be >= 1, got {config.keep_checkpoints}")
    if not config.timeout_s > 0:
        raise InputError(f"--timeout-s: must be > 0, got {config.timeout_s}")
    if config.device_time_scale is not None and not config.device_time_scale > 0:
        raise InputError(f"--device-time-scale: must be > 0, got {config.device_time_scale}")
    if config.device_time == "emulated" and config.interference and config.inject == "colocate":
        raise InputError("--inject colocate: a competing process slows real compute only; with --device-time "
                         "emulated use --inject throttle (it scales the emulated time)")
    return config


def check_against_model(config: RunConfig, num_layers: int) -> None:
    """The checks that need the model's layer count, the structural ones first (a user fixing the first
    error should not meet a deeper one next): stages against layers, every given partition, then
    what the schedule needs."""
    if config.stages > num_layers:
        raise InputError(f"--stages {config.stages}: more stages than the model's {num_layers} layers")
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
    if config.schedule == "1f1b" and config.microbatches < config.stages:
        raise InputError(f"--microbatches {config.microbatches}: 1F1B needs at least as many micro-batches "
                         f"as stages ({config.stages})")
