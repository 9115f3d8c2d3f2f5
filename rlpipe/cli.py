"""The ``rlpipe`` command. It parses and prints; the work lives in library functions.

A user's mistake (an :class:`~rlpipe.errors.InputError`) ends with one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rlpipe.errors import InputError, UserCodeError
from rlpipe.partition import SCHEDULES

if TYPE_CHECKING:
    from rlpipe.envs.repartition import EnvConfig

EVALUATE_POLICIES = "static,greedy,dynpipe,oracle"
EVALUATE_SCENARIOS = "bursty,heavy,drift"
DEMO_POLICIES = "static,dynpipe,threshold,ppo"
commands: dict[str, argparse.ArgumentParser] = {}  # each command's parser, by name (filled by build_parser)


def _floats(text: str, option: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise InputError(f"{option} '{text}': expected comma-separated numbers like 1,1,0.6") from None
    if not all(math.isfinite(v) for v in values):
        raise InputError(f"{option} '{text}': every value must be finite")
    return values


def _slowdowns(text: str | None) -> list[float] | None:
    """``--slowdown``: one factor per stage, >= 1 (2 = twice as slow), as in traces."""
    if not text:
        return None
    values = _floats(text, "--slowdown")
    if any(v < 1.0 for v in values):
        raise InputError(f"--slowdown '{text}': every factor must be >= 1 (2 = twice as slow, as in traces)")
    return values


FREE_LINKS_NOTE = "links: infinite bandwidth, so transfers cost nothing (give --bandwidth-gbps to price them)"


def _positive_bandwidth(value: float | None) -> float:
    if value is None:
        return math.inf
    if not value > 0:
        raise InputError(f"--bandwidth-gbps: must be > 0, got {value}")
    return value


# --- profile ---------------------------------------------------------------------------------

def cmd_profile(args: argparse.Namespace) -> None:
    import torch

    from rlpipe.models import load_model
    from rlpipe.profile import measure_profile

    if args.repeats < 1:
        raise InputError(f"--repeats {args.repeats}: must be at least 1 (timed runs per layer in each pass)")
    if args.batch % args.microbatches:
        raise InputError(f"--batch {args.batch}: must be divisible by --microbatches {args.microbatches}")
    torch.set_num_threads(1)  # the runtime runs one thread per stage: profile what it will see
    spec = load_model(args.model, args.layers, args.batch // args.microbatches)
    print(f"profiling {spec.name}: {len(spec.layers)} layers, micro-batch {spec.example_microbatch.shape[0]}",
          file=sys.stderr)
    profile = measure_profile(spec.layers, spec.example_microbatch, spec.target, spec.loss_fn,
                              name=spec.name, repeats=args.repeats)
    profile.save(args.output)
    total = sum(layer.compute_ms for layer in profile.layers)
    print(f"wrote {args.output}: {profile.num_layers} layers, {total:.2f} ms fwd+bwd per micro-batch")


# --- partition -------------------------------------------------------------------------------

def cmd_partition(args: argparse.Namespace) -> None:
    from rlpipe.partition import optimal_partition, stage_memory_bytes
    from rlpipe.profile import load_profile

    profile = load_profile(args.profile)
    if args.speeds and args.slowdown:
        raise InputError("--speeds and --slowdown say the same thing: give one")
    slowdown = _slowdowns(args.slowdown)
    speeds = [1.0 / s for s in slowdown] if slowdown else (_floats(args.speeds, "--speeds") if args.speeds else None)
    memory_cap = None if args.memory_gb is None else args.memory_gb * 1e9
    plan = optimal_partition(profile, args.stages, speeds, _positive_bandwidth(args.bandwidth_gbps),
                             memory_cap_bytes=memory_cap, microbatches=args.microbatches, schedule=args.schedule)
    if args.json:
        print(json.dumps({"boundaries": list(plan.partition.boundaries), "stage_ms": plan.stage_ms.tolist(),
                          "bottleneck_ms": plan.bottleneck_ms}))
        return
    memory = stage_memory_bytes(profile, plan.partition, args.microbatches, args.schedule)
    print(f"{profile.name}: {profile.num_layers} layers on {args.stages} stages")
    print(f"{'stage':>5} {'layers':>9} {'ms/microbatch':>14} {'memory MB':>10}")
    for stage, ((start, end), ms) in enumerate(zip(plan.partition.stage_ranges(), plan.stage_ms)):
        print(f"{stage:>5} {f'{start}-{end - 1}':>9} {ms:>14.3f} {memory[stage] / 1e6:>10.1f}")
    print(f"boundaries {','.join(map(str, plan.partition.boundaries))}  bottleneck {plan.bottleneck_ms:.3f} ms")
    if args.bandwidth_gbps is None:
        print(FREE_LINKS_NOTE)


# --- simulate --------------------------------------------------------------------------------

def cmd_simulate(args: argparse.Namespace) -> None:
    from rlpipe.partition import Partition
    from rlpipe.profile import load_profile
    from rlpipe.simulator import simulate

    profile = load_profile(args.profile)
    partition = Partition.parse(args.boundaries, profile.num_layers)
    slowdown = _slowdowns(args.slowdown)
    timing = simulate(profile, partition, args.schedule, args.microbatches, slowdown,
                      _positive_bandwidth(args.bandwidth_gbps))
    if args.json:
        print(json.dumps(timing.to_dict()))
        return
    print(f"{args.schedule}, {args.microbatches} micro-batches: iteration {timing.iteration_ms:.3f} ms")
    print(f"{'stage':>5} {'compute ms':>11} {'comm ms':>9} {'idle ms':>9}")
    for stage, row in enumerate(timing.to_dict()["stages"]):
        print(f"{stage:>5} {row['compute_ms']:>11.3f} {row['comm_ms']:>9.3f} {row['idle_ms']:>9.3f}")
    if args.bandwidth_gbps is None:
        print(FREE_LINKS_NOTE)


# --- scenario --------------------------------------------------------------------------------

def cmd_scenario(args: argparse.Namespace) -> None:
    from rlpipe.interference import generate_scenario

    trace = generate_scenario(args.name, args.devices, args.duration_s, args.seed)
    trace.save_csv(args.output)
    print(f"wrote {args.output}: {args.name}, {args.devices} devices, {args.duration_s:g} s, "
          f"{len(trace.change_s) - 1} changes, worst slowdown {trace.slowdown.max():.2f}x")


# --- evaluate --------------------------------------------------------------------------------

def _names(texts: str | list[str] | None, option: str, default: str = "") -> list[str]:
    """Comma-separated names; a repeated option (a list of texts) adds up, ``None`` gives ``default``."""
    text = ",".join(texts) if isinstance(texts, list) else (texts or default)
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise InputError(f"{option}: give at least one name")
    return names


def env_config_from_args(args: argparse.Namespace) -> EnvConfig:
    """The environment options of evaluate: --profile, --stages, --data-parallel, --duration-s."""
    from rlpipe.envs.repartition import EnvConfig
    from rlpipe.observation import DEFAULT_D_MAX, DEFAULT_S_MAX
    from rlpipe.profile import load_profile

    overrides: dict = {"duration_s": args.duration_s}
    if args.profile:
        overrides["profile"] = load_profile(args.profile)
    if args.stages:
        if args.stages < 1:
            raise InputError(f"--stages: must be >= 1, got {args.stages}")
        if args.profile and args.stages > overrides["profile"].num_layers:
            raise InputError(f"--stages {args.stages}: more stages than the profile's "
                             f"{overrides['profile'].num_layers} layers")
        # heuristics read any number of stages: the observation gets room for them all
        overrides.update(min_stages=args.stages, max_stages=args.stages, s_max=max(DEFAULT_S_MAX, args.stages))
    if getattr(args, "data_parallel", None) is not None:
        if args.data_parallel < 1:
            raise InputError(f"--data-parallel: must be >= 1, got {args.data_parallel}")
        overrides.update(data_parallel=(args.data_parallel, args.data_parallel),
                         d_max=max(DEFAULT_D_MAX, args.data_parallel))
    if getattr(args, "calibration", None):
        from rlpipe.calibration import Calibration

        overrides["calibration"] = Calibration.load(args.calibration)
    return EnvConfig(**overrides).validate()


def cmd_evaluate(args: argparse.Namespace) -> None:
    import torch

    from rlpipe.agents import make_policy
    from rlpipe.evaluate import evaluate, to_markdown, write_report
    from rlpipe.interference import check_scenario

    policies = _names(args.policies, "--policies", EVALUATE_POLICIES)
    scenarios = _names(args.scenarios, "--scenarios", EVALUATE_SCENARIOS)
    for policy in policies:
        make_policy(policy)  # fail fast on a bad name or artifact, before any episode runs
    for scenario in scenarios:
        check_scenario(scenario)
    if args.episodes < 1:
        raise InputError(f"--episodes: must be >= 1, got {args.episodes}")
    # one decision at a time through a small network: a second thread only contends, with the simulator and with
    # evaluations run side by side (one per core, as the README's table is made: two of ppo took 18 s with two
    # threads each, 3 s with one); restored after, for a caller in the same process
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = evaluate(policies, scenarios, args.episodes, args.seed, env_config_from_args(args))
    finally:
        torch.set_num_threads(threads)
    files = write_report(results, args.out)
    print(to_markdown(results))
    print("wrote " + ", ".join(str(f) for f in files))


# --- train -----------------------------------------------------------------------------------

def cmd_train(args: argparse.Namespace) -> None:
    from rlpipe.agents.ppo import TrainConfig, train

    config = TrainConfig.from_yaml(args.config) if args.config else TrainConfig()
    if args.timesteps is not None:
        config.n_timesteps = args.timesteps
    if args.n_envs is not None:
        config.n_envs = args.n_envs
    if args.vec_env is not None:
        config.vec_env = args.vec_env
    if args.vec_workers is not None:
        config.vec_workers = args.vec_workers
    if args.seed is not None:
        config.seed = args.seed
    if args.scenarios:
        config.env_kwargs["scenarios"] = _names(args.scenarios, "--scenarios")
    if args.calibration:
        config.env_kwargs["calibration"] = args.calibration
    config.validate(args.config or "options")  # with the options: a bad value ends here, not in an episode
    # torch's default threads, not one: on 2 cores PPO's own work (rollouts' forward passes, updates in
    # minibatches of 1,024) ran 1.4x as fast on two, its phase end to end 1.11x and the whole run 1.15x (bench_env's
    # harness, 65,536 steps, five interleaved pairs, 2026-12-05); the held-out scoring, one decision at a time,
    # took the same either way
    policy = train(config, args.out)
    history = json.loads((Path(args.out) / "eval" / "efficiency.json").read_text())
    step, best = max(history, key=lambda entry: entry[1])  # the first of equals: the imitated policy before PPO's
    where = "the imitated policy, before PPO" if step == 0 and config.imitate else f"step {step:,}"
    print(f"held-out mean efficiency, evaluated {len(history)} time(s): best {best:.4f} ({where}), "
          f"exported as the policy")
    print(f"wrote {policy} and {policy.with_suffix('.json')} (also best/, eval/, final_model.zip, "
          f"phases.json, TensorBoard logs in {args.out}/tb)")


# --- run -------------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> None:
    from rlpipe.runtime.config import config_from_args
    from rlpipe.runtime.launch import launch

    code = launch(config_from_args(args))
    if code:
        raise SystemExit(code)


# --- report ----------------------------------------------------------------------------------

def cmd_report(args: argparse.Namespace) -> None:
    from rlpipe.report import write_report

    calibration = None
    if args.calibration:
        from rlpipe.calibration import Calibration

        calibration = Calibration.load(args.calibration)
    files = write_report(args.logs, args.output, calibration)
    print((files[0]).read_text().split("\n\n![")[0])
    print("wrote " + ", ".join(str(f) for f in files))


# --- calibrate -------------------------------------------------------------------------------

def cmd_calibrate(args: argparse.Namespace) -> None:
    import numpy as np

    from rlpipe.calibration import calibrated_iteration_ms, fit
    from rlpipe.runlog import load_run

    runs = [load_run(path) for path in args.logs]
    emulated = [path for path, records in zip(args.logs, runs) if records[0].get("run", {}).get("device_time")
                == "emulated"]
    if emulated and not args.allow_emulated:
        raise InputError(f"{emulated[0]}: a run on emulated device time: its timers show the emulator (it sleeps "
                         f"to the profile), not this machine; calibrate on --device-time real runs, or give "
                         f"--allow-emulated to fit it anyway")
    calibration = fit(runs, list(args.logs))
    calibration.save(args.output)
    before, after = [], []
    for records in runs:
        for record, predicted in zip(records, calibrated_iteration_ms(records, calibration), strict=True):
            if predicted is not None and "predicted_iteration_ms" in record:
                before.append(abs(record["iteration_ms"] / record["predicted_iteration_ms"] - 1))
                after.append(abs(record["iteration_ms"] / predicted - 1))
    c = calibration
    migration = "no repartition logged" if c.migration_overhead_s is None else f"{c.migration_overhead_s:.3f} s"
    print(f"fitted {c.intervals} intervals of {c.runs} run(s):")
    print(f"  measured / predicted stage compute: bias {c.compute_bias:+.3f}, stages differ by "
          f"{c.stage_bias_spread:.3f} (std), noise sigma {c.noise_sigma:.3f}, outliers {c.outlier_probability:.1%} "
          f"of intervals (median {c.outlier_scale:+.2f})")
    measured = ("" if c.measured_op_overhead_ms is None or c.measured_iteration_overhead_ms is None else
                f" (the runs measured {c.measured_op_overhead_ms:.3f} and {c.measured_iteration_overhead_ms:.3f} of "
                f"them at start-up; the rest is the fit's)")
    print(f"  overheads: {c.op_overhead_ms:.3f} ms per operation, {c.iteration_overhead_ms:.3f} ms per iteration"
          f"{measured}; migration beyond bytes / bandwidth: {migration}; point-to-point {c.p2p_gbps:.2f} Gbit/s")
    if before:
        print(f"  median |live / predicted - 1| on these logs: {np.median(before):.3f} uncalibrated, "
              f"{np.median(after):.3f} calibrated (judge it on other runs: rlpipe report --calibration)")
    print(f"wrote {args.output}")


# --- demo ------------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace) -> None:
    """The main job on embedded defaults: a live pipeline on emulated device time under an injected
    window that teaches both lessons (hold through mild noise, move for a lasting straggler), once per
    policy, then the comparison and its timeline. The runs compare: one profile measured once, one
    device-time scale, and the same wall-time budget, so each meets the same stretch of the scenario."""
    import os

    import torch

    from rlpipe.interference import check_scenario
    from rlpipe.models import load_model
    from rlpipe.profile import measure_profile
    from rlpipe.report import write_report
    from rlpipe.runtime.config import UNLIMITED_ITERATIONS, RunConfig
    from rlpipe.runtime.device_time import comparison_scale
    from rlpipe.runtime.launch import launch

    check_scenario(args.scenario)
    if not args.duration_s > 0:
        raise InputError(f"--duration-s: must be > 0, got {args.duration_s}")
    policies = _names(args.policies, "--policies", DEMO_POLICIES)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = RunConfig(model="charlm", layers=12, stages=4, schedule="1f1b", microbatches=4, batch=16,
                     iterations=UNLIMITED_ITERATIONS, duration_s=args.duration_s, interval=10, seed=3,
                     interference=args.scenario, inject="throttle", device_time="emulated",
                     profile=str(out / "profile.json"), time_scale=3600.0 / args.duration_s)  # the hour spans a run
    torch.set_num_threads(1)
    spec = load_model(base.model, base.layers, base.batch // base.microbatches, seed=base.seed)
    measure_profile(spec.layers, spec.example_microbatch, spec.target, spec.loss_fn, name=spec.name).save(
        out / "profile.json")
    base.device_time_scale = comparison_scale(base.stages, len(os.sched_getaffinity(0)))  # one scale for all
    logs = []
    for policy in policies:
        print(f"\n=== {policy}: live 4-stage pipeline, emulated device time, injected {args.scenario}, "
              f"{args.duration_s:g} s ===", flush=True)
        log = out / f"{policy.split(':')[0]}.jsonl"
        if launch(RunConfig(**{**base.__dict__, "policy": policy, "log": str(log)})):
            raise SystemExit(1)
        logs.append(str(log))
    files = write_report(logs, out)
    print("\n" + files[0].read_text().split("\n\n![")[0])
    print("wrote " + ", ".join(str(f) for f in files))


# --- parser ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from rlpipe.interference import PRESETS

    parser = argparse.ArgumentParser(
        prog="rlpipe", description="Repartition pipeline-parallel training on shared, noisy machines: train "
        "a PPO controller offline (train), deploy a policy to a live torch.distributed pipeline (run, report, "
        "demo), evaluate it against heuristics in simulation (evaluate). Tools: profile, partition, simulate, "
        "scenario.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Callable[[argparse.Namespace], None], help_text: str) -> argparse.ArgumentParser:
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        commands[name] = sub
        return sub

    p = add("profile", cmd_profile, "Measure each layer of a torch model on this machine and write a profile JSON.")
    p.add_argument("--model", required=True, help="built-in model (transformer, mlp, cnn), pkg.module:factory "
                   "or path/to/file.py:factory (see README, 'Your own model')")
    p.add_argument("--layers", type=int, default=None, help="number of layers of a built-in model (default 8)")
    p.add_argument("--batch", type=int, default=32, help="samples per iteration (default 32)")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per iteration (default 8)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed runs per layer in each of 3 passes over the model: a pass keeps the median, "
                        "the profile the least over the passes (default 5)")
    p.add_argument("-o", "--output", required=True, help="profile JSON to write")

    p = add("partition", cmd_partition, "The contiguous partition that minimises the bottleneck stage time.")
    p.add_argument("--profile", required=True, help="profile JSON, or the name of a shipped profile")
    p.add_argument("--stages", type=int, required=True, help="number of pipeline stages")
    p.add_argument("--slowdown", help="slowdown factor per stage device, >= 1, e.g. 1,1,2,1: the third computes "
                   "twice as slowly, as in traces (default all 1)")
    p.add_argument("--speeds", help="or: relative device speed per stage, 1/slowdown, e.g. 1,1,0.5,1")
    p.add_argument("--bandwidth-gbps", type=float, help="link bandwidth between stages, Gbit/s (default: "
                   "infinite: activations cross stages for free)")
    p.add_argument("--memory-gb", type=float, help="memory cap per stage, GB (default: none)")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per iteration, for memory (default 8)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="schedule, for memory (default 1f1b)")
    p.add_argument("--json", action="store_true", help="print {boundaries, stage_ms, bottleneck_ms} as JSON")

    p = add("simulate", cmd_simulate, "Simulate one training iteration of a partition under a schedule.")
    p.add_argument("--profile", required=True, help="profile JSON, or the name of a shipped profile")
    p.add_argument("--boundaries", required=True, help="first layer of each stage, e.g. 0,5,9,14")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule (default 1f1b)")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per iteration (default 8)")
    p.add_argument("--slowdown", help="slowdown factor per stage device, >= 1, e.g. 1,1,2,1: the third computes "
                   "twice as slowly, as in traces (default all 1)")
    p.add_argument("--bandwidth-gbps", type=float, help="link bandwidth between stages, Gbit/s (default: "
                   "infinite: activations cross stages for free, comm ms 0)")
    p.add_argument("--json", action="store_true", help="print {iteration_ms, stages: [...]} as JSON")

    p = add("scenario", cmd_scenario, "Write an interference preset as a time_s,device,slowdown trace CSV.")
    p.add_argument("--name", required=True, help=f"preset: {', '.join(PRESETS)}")
    p.add_argument("--devices", type=int, required=True, help="number of devices (pipeline stages)")
    p.add_argument("--duration-s", type=float, default=3600.0, help="length of the trace, s (default 3600)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("-o", "--output", required=True, help="trace CSV to write")
    p = add("evaluate", cmd_evaluate, "Run policies on the same seeded simulated episodes of each scenario; "
            "write results.json, results.md and plots.")
    p.add_argument("--policies", action="append",
                   help="comma-separated: static, greedy, dynpipe, threshold, falcon, falcon-early, oracle, hindsight, "
                   "onset-blind, ppo, ppo:PATH; "
                   f"repeatable (default {EVALUATE_POLICIES})")
    p.add_argument("--scenarios", action="append",
                   help=f"comma-separated presets or trace:FILE.csv; repeatable (default {EVALUATE_SCENARIOS})")
    p.add_argument("--episodes", type=int, default=5, help="episodes per policy and scenario (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the episodes (default 0)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--profile", help="use this profile (JSON or shipped name) in every episode (default: each "
                   "episode draws one of the shipped transformer16, transformer32, mlp16, cnn16)")
    p.add_argument("--stages", type=int, help="use this stage count in every episode (default: each episode draws "
                   "2-8, capped by the profile's layers)")
    p.add_argument("--data-parallel", type=int, metavar="D", help="run jobs of D data-parallel replicas of the "
                   "pipeline; a trace's device r x stages + s is replica r's stage s (default 1)")
    p.add_argument("--duration-s", type=float, default=3600.0,
                   help="simulated training time per episode, s (default 3600)")
    p.add_argument("--calibration", help="simulate timers and overheads as this fit from rlpipe calibrate says "
                   "(default: 3%% lognormal timer noise)")
    p = add("train", cmd_train, "Train a PPO agent offline on the simulated environment and export a deploy "
            "artifact (policy.pt + policy.json).")
    p.add_argument("--config", help="optional YAML hyper-parameters, rl-baselines3-zoo layout, e.g. "
                   "configs/ppo.yml (default: the built-in TrainConfig defaults)")
    p.add_argument("--scenarios", action="append",
                   help="comma-separated presets or trace:FILE.csv to train on (overrides the config)")
    p.add_argument("--timesteps", type=int, help="environment steps to train for (overrides the config)")
    p.add_argument("--n-envs", type=int, help="parallel environments (overrides the config)")
    p.add_argument("--vec-env", help="where the environments step: dummy (in turn in this process), subproc "
                   "(in --vec-workers other processes) or split (in --vec-workers shards, the first in this "
                   "process): the same steps and weights each way; overrides the config")
    p.add_argument("--vec-workers", type=int, help="subproc's processes (default: one per environment) or "
                   "split's shards (default 2), each stepping its share of the environments in turn; one per "
                   "core is fastest; overrides the config")
    p.add_argument("--seed", type=int, help="training seed (overrides the config)")
    p.add_argument("--calibration", help="a fit from rlpipe calibrate: its measurement model (noise, outliers, "
                   "stage biases, overheads) joins the timer models training draws from")
    p.add_argument("--out", required=True, help="output folder: checkpoints, best model, TensorBoard logs, artifact")
    p = add("report", cmd_report, "Summarise live-run logs (JSONL from rlpipe run --log): summary.md and a "
            "timeline PNG; several logs are compared side by side.")
    p.add_argument("logs", nargs="+", help="run logs (JSONL)")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--calibration", help="also judge the calibrated simulator (a file from rlpipe calibrate, "
                   "fitted on other runs) against these runs")

    p = add("calibrate", cmd_calibrate, "Fit what the simulator assumes (measurement noise and bias, overheads, "
            "migration overhead, point-to-point bandwidth) from live-run logs; train and evaluate can simulate "
            "with the fit (--calibration).")
    p.add_argument("logs", nargs="+", help="run logs (JSONL from rlpipe run --log), on real device time")
    p.add_argument("-o", "--output", required=True, help="calibration JSON to write")
    p.add_argument("--allow-emulated", action="store_true", help="fit logs of emulated device time too (their "
                   "noise is the emulator's, near none: the fit describes it, not the machine)")

    p = add("demo", cmd_demo, "The main job on embedded defaults: a live 4-stage pipeline of a character-level "
            "language model (trained on the Python standard library's source) on emulated device time under "
            "an injected window (mild noise to hold through, a short burst, then a lasting "
            "straggler to move for), run once per policy for the same wall time, then a comparison table and plots "
            "(~6 minutes on 2 cores).")
    p.add_argument("--out", default="demo-out", help="output folder (default demo-out)")
    p.add_argument("--policies", action="append", help=f"policies to compare (default {DEMO_POLICIES})")
    p.add_argument("--scenario", default="window", help="injected scenario, stretched over each run (default "
                   "window)")
    p.add_argument("--duration-s", type=float, default=75.0, help="wall time each policy's run trains for, s: "
                   "the scenario's hour is stretched over it, and every run meets the same stretch (default 75)")

    p = add("run", cmd_run, "Train a model as a live pipeline of stage processes on torch.distributed "
            "(gloo on CPU, NCCL on CUDA), repartitioning it while it runs.")
    from rlpipe.runtime.config import add_run_arguments

    add_run_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if hasattr(signal, "SIGUSR1") and argv is None:  # a hung command shows where: kill -USR1 PID prints every stack
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # a mistyped option: the command's own usage, not the top-level one
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    code = dispatch(args)
    if argv is None and args.command == "run":
        # the launcher only watched its stage processes, which have written everything: it leaves
        # without finalizing torch's modules, a second of a short run's wall time
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit status (a user's mistake: one line on stderr and 2)."""
    try:
        args.handler(args)
    except UserCodeError as err:
        print(f"rlpipe {args.command}: error: {err}", file=sys.stderr)
        print(err.details.rstrip(), file=sys.stderr)
        return 2
    except InputError as err:
        print(f"rlpipe {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rlpipe {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
