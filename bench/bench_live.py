"""The comparison that matters, live: every policy, three times each, interleaved, under the same injected
window, side by side in one run, for one pipeline and for a hybrid job.

- ``pipeline``: a 12-layer transformer as 4 stage processes, under ``window`` (mild noise, a short 2x
  burst, then a 3x straggler for the last three quarters), and static and ppo under ``calm`` (mild noise
  alone: ppo should hold);
- ``hybrid``: the same model as 2 replicas of a 2-stage pipeline (4 processes), under ``window`` on the
  job's 4 devices (device r x 2 + s is replica r's stage s): a short burst on one device, then a lasting
  straggler in one replica.

Every run of a setup emulates the same devices (one profile measured once, one device-time scale) for the
same wall time (``--duration-s``), so every run meets the same stretch of its scenario whatever its speed.
That wall time is sized on this machine, per setup, so that a run holds ``CALM_ITERATIONS`` iterations
without interference: a machine twice as slow runs twice as long, and every policy gets the same number of
decisions to act on a slowdown on any machine (a fixed 40 s held 13-15 iterations of the hybrid job on a
2-core machine where an earlier, faster one held 25-28 of one pipeline: too few for any rule to earn a move back).
Each run's throughput is set beside the simulator's prediction for the same run (its partitions,
splits, injected slowdowns and stalls), so that the live ranking of policies can be held against the
simulated one. Differences inside the run-to-run spread are ties. Last, the same static run without
interference is made in 5 pairs: two runs of the same arguments should give throughputs within 3%.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from itertools import combinations
from pathlib import Path

import numpy as np

from rlpipe.calibration import replayed_iteration_ms
from rlpipe.runlog import load_run, warmup_extra_s
from rlpipe.runtime.device_time import comparison_scale

POLICIES = ["static", "greedy", "dynpipe", "threshold", "falcon", "falcon-early", "ppo"]
REPEATS = 3
CALM_ITERATIONS = 40  # iterations a run holds without interference (its wall time is sized to it, per setup)
SIZING_S = 20.0  # the wall time of the calm static run that measures a setup's speed
PAIRS, PAIR_DURATION_S = 5, 20.0
MICROBATCHES, BATCH = 4, 16
INTERVAL = 2  # iterations between decisions: at a decision every 10, runs of ~25 iterations left no policy
# intervals enough after the straggler to act on it (measured: every rule tied static)
MODEL = ["--model", "transformer", "--layers", "12", "--schedule", "1f1b", "--interval", str(INTERVAL), "--seed", "3",
         "--device-time", "emulated", "--inject", "throttle"]
SETUPS = {  # name: (layout arguments, processes, {window: policies})
    "pipeline": (["--stages", "4", "--microbatches", str(MICROBATCHES), "--batch", str(BATCH)], 4,
                 {"window": POLICIES, "calm": ["static", "ppo"]}),
    "hybrid": (["--stages", "2", "--data-parallel", "2", "--microbatches", str(MICROBATCHES), "--batch",
                str(2 * BATCH)], 4, {"window": POLICIES}),
}


def simulated_samples_s(records: list[dict]) -> float:
    """What the simulator predicts for the run: each interval's iterations at the simulated iteration
    time of its partition, split and mean injected slowdowns (with what the run measured at start-up: the
    host overhead per operation, the optimizer step and the gradient sync), plus the run's measured stalls
    and what its warm-up steps took beyond ordinary iterations (every iteration, warm-ups included, is
    simulated once)."""
    seconds = samples = 0.0
    for record, iteration_ms in zip(records, replayed_iteration_ms(records), strict=True):
        assert iteration_ms is not None  # a run's log starts with its header
        iterations = len(record["losses"]) or 1
        seconds += iterations * iteration_ms / 1e3 + record.get("stall_s", 0.0) + warmup_extra_s(record)
        samples += record["throughput_samples_s"] * record["interval_s"]
    return samples / seconds


def one_run(root: Path, tmp: Path, profile: Path, layout: list[str], window: str, policy: str, name: str,
            scale: float, duration_s: float) -> dict:
    log = tmp / f"{name}.jsonl"
    subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", *MODEL, *layout, "--duration-s", f"{duration_s:g}",
                    "--profile", str(profile), "--device-time-scale", f"{scale:g}", "--interference", window,
                    "--time-scale", f"{3600.0 / duration_s:g}", "--policy", policy, "--log", str(log)],
                   check=True, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return figures_of(log)


def sized_duration_s(root: Path, tmp: Path, profile: Path, setup: str, scale: float) -> tuple[float, float]:
    """The wall time, s, in which a setup's calm static run holds ``CALM_ITERATIONS`` iterations on this
    machine, from one calm static run of ``SIZING_S`` (its iterations over its measured intervals' time, so
    that start-up does not count); returns it and the measured iterations per second."""
    sizing = one_run(root, tmp, profile, SETUPS[setup][0], "none", "static", f"{setup}-sizing", scale, SIZING_S)
    return CALM_ITERATIONS / sizing["iterations_per_s"], sizing["iterations_per_s"]


def repeatability(root: Path, tmp: Path, profile: Path, scale: float) -> dict:
    """Pairs of the same static run without interference: how far apart two runs of the same arguments are."""
    layout = SETUPS["pipeline"][0]
    pairs = [[one_run(root, tmp, profile, layout, "none", "static", f"pair-{k}-{half}", scale, PAIR_DURATION_S)
              ["live_samples_s"] for half in (0, 1)] for k in range(PAIRS)]
    gaps = [abs(a / b - 1) for a, b in pairs]
    return {"pairs": pairs, "gaps": gaps, "largest_gap": max(gaps), "within_3_percent": bool(max(gaps) <= 0.03)}


def figures_of(log: Path) -> dict:
    """One run's figures from its log."""
    records = load_run(log)
    seconds = sum(r["interval_s"] for r in records)
    chunks = sum(r["emulation"]["chunks"] for r in records)
    return {"live_samples_s": sum(r["throughput_samples_s"] * r["interval_s"] for r in records) / seconds,
            "iterations_per_s": sum(len(r["losses"]) for r in records) / seconds,
            "sim_samples_s": simulated_samples_s(records), "iterations": records[-1]["iteration"],
            "repartitions": sum(1 for r in records if "repartition" in r and r["repartition"]["committed"]),
            "rebalances": sum(1 for r in records if "rebalance" in r),
            "fidelity": float(np.median([abs(r["iteration_ms"] / r["predicted_iteration_ms"] - 1) for r in records])),
            "overran": sum(r["emulation"]["overran"] for r in records) / max(chunks, 1),
            "decision_ms": float(np.median([r["decision"]["latency_ms"] for r in records if "decision" in r]))}


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Mean and spread (max - min over the repeats) of each policy's figures."""
    table = {}
    static = np.mean([r["live_samples_s"] for r in runs["static"]])
    static_sim = np.mean([r["sim_samples_s"] for r in runs["static"]])
    for policy, repeats in runs.items():
        live = np.array([r["live_samples_s"] for r in repeats])
        sim = np.array([r["sim_samples_s"] for r in repeats])
        table[policy] = {"live_mean": float(live.mean()), "live_spread": float(np.ptp(live)),
                         "live_vs_static": float(live.mean() / static), "sim_mean": float(sim.mean()),
                         "sim_spread": float(np.ptp(sim)), "sim_vs_static": float(sim.mean() / static_sim),
                         "repartitions_per_run": float(np.mean([r["repartitions"] for r in repeats])),
                         "rebalances_per_run": float(np.mean([r["rebalances"] for r in repeats])),
                         "iterations_per_run": float(np.mean([r["iterations"] for r in repeats])),
                         "fidelity": float(np.median([r["fidelity"] for r in repeats])),
                         "overran": float(np.max([r["overran"] for r in repeats])),
                         "decision_ms": float(np.median([r["decision_ms"] for r in repeats]))}
    return table


def rankings_agree(table: dict[str, dict[str, float]]) -> tuple[bool, list[str]]:
    """Whether every pair the live runs tell apart (difference beyond both spreads) is ordered the same
    way by the simulator; returns the verdict and the disagreements."""
    disagreements = []
    for a, b in combinations(table, 2):
        live = table[a]["live_mean"] - table[b]["live_mean"]
        if abs(live) <= max(table[a]["live_spread"], table[b]["live_spread"]):
            continue  # a tie live
        sim = table[a]["sim_mean"] - table[b]["sim_mean"]
        if abs(sim) > max(table[a]["sim_spread"], table[b]["sim_spread"]) and np.sign(sim) != np.sign(live):
            disagreements.append(f"{a} vs {b}: live {live:+.1f}, simulated {sim:+.1f} samples/s")
    return not disagreements, disagreements


def run() -> dict:
    """Every setup, or those named in ``RLPIPE_BENCH_LIVE_SETUPS`` (comma-separated: a shorter run)."""
    root = Path(__file__).resolve().parents[1]
    cores = len(os.sched_getaffinity(0))
    chosen = [name for name in os.environ.get("RLPIPE_BENCH_LIVE_SETUPS", ",".join(SETUPS)).split(",") if name]
    unknown = sorted(set(chosen) - set(SETUPS))
    if unknown:
        raise SystemExit(f"RLPIPE_BENCH_LIVE_SETUPS: {', '.join(unknown)}: none of {', '.join(SETUPS)}")
    results: dict = {"policies": POLICIES, "repeats": REPEATS, "calm_iterations": CALM_ITERATIONS, "cores": cores,
                     "setups": {}}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        profile = tmp / "profile.json"
        subprocess.run([sys.executable, "-m", "rlpipe.cli", "profile", "--model", "transformer", "--layers", "12",
                        "--batch", str(BATCH), "--microbatches", str(MICROBATCHES), "-o", str(profile)],
                       check=True, cwd=root, stdout=subprocess.DEVNULL)
        for setup in chosen:
            layout, processes, windows = SETUPS[setup]
            scale = comparison_scale(processes, cores)  # one scale for every run of the setup
            duration_s, calm_rate = sized_duration_s(root, tmp, profile, setup, scale)
            print(f"  {setup}: {calm_rate:.2f} calm iterations/s: runs of {duration_s:.0f} s", flush=True)
            found: dict = {"device_time_scale": scale, "processes": processes, "duration_s": duration_s,
                           "calm_iterations_per_s": calm_rate, "windows": {}}
            for window, policies in windows.items():
                runs: dict[str, list[dict]] = {policy: [] for policy in policies}
                for repeat in range(REPEATS):  # interleaved, so that a slow spell of the machine hits all alike
                    for policy in policies:
                        print(f"  {setup} {window} {policy} #{repeat + 1}", flush=True)
                        runs[policy].append(one_run(root, tmp, profile, layout, window, policy,
                                                    f"{setup}-{window}-{policy}-{repeat}", scale, duration_s))
                table = summarise(runs)
                agree, disagreements = rankings_agree(table)
                found["windows"][window] = {"table": table, "runs": runs, "rankings_agree": agree,
                                            "disagreements": disagreements}
            results["setups"][setup] = found
        results["repeatability"] = repeatability(root, tmp, profile, comparison_scale(4, cores))
    results.update(acceptance(results["setups"]))
    results["repeatable_within_3_percent"] = results["repeatability"]["within_3_percent"]
    results["markdown"] = to_markdown(results)
    return results


def beats_every_rule(table: dict[str, dict[str, float]]) -> bool:
    """Whether ppo is at least every rule's throughput, within the spreads (a difference inside them is a tie)."""
    ppo = table["ppo"]
    return all(ppo["live_mean"] >= table[p]["live_mean"] - max(ppo["live_spread"], table[p]["live_spread"])
               for p in table if p != "ppo")


def acceptance(setups: dict) -> dict:
    """The live bars: ppo at least every rule within the spread and at least 1.2x static under the windows
    (both setups), at most one repartition per 100 iterations when calm, and the simulated ranking the live one."""
    figures = {}
    for setup, found in setups.items():
        window = found["windows"]["window"]["table"]
        figures[f"{setup}_ppo_at_least_every_rule_within_spread"] = beats_every_rule(window)
        figures[f"{setup}_ppo_vs_static_window"] = window["ppo"]["live_vs_static"]
        figures[f"{setup}_ppo_at_least_1_2x_static"] = bool(window["ppo"]["live_vs_static"] >= 1.2)
        figures[f"{setup}_rankings_agree"] = all(w["rankings_agree"] for w in found["windows"].values())
    if "pipeline" not in setups:
        return figures
    calm = setups["pipeline"]["windows"]["calm"]["table"]["ppo"]
    per_100 = calm["repartitions_per_run"] * 100 / max(calm["iterations_per_run"], 1)
    figures["pipeline_ppo_repartitions_per_100_iterations_calm"] = per_100
    figures["pipeline_ppo_calm_at_most_one_per_100"] = bool(per_100 <= 1.0)
    return figures


def to_markdown(results: dict) -> str:
    lines = []
    for setup, found in results["setups"].items():
        lines += [f"**{setup}**: live, device time emulated, {found['processes']} stage processes on "
                  f"{results['cores']} cores ({found['processes'] / results['cores']:g} per core), device-time scale "
                  f"x{found['device_time_scale']:g} for every run, {found['duration_s']:.0f} s of wall time a run "
                  f"(the scenario's hour stretched over it; sized to hold {results['calm_iterations']} iterations "
                  f"without interference at the {found['calm_iterations_per_s']:.2f} iterations/s measured), "
                  f"{results['repeats']} repeats a policy, interleaved (mean, "
                  "and spread = max - min); the simulated column is the simulator's prediction for the same runs.",
                  ""]
        for window, block in found["windows"].items():
            lines += [f"### {setup}, {window}", "",
                      "| policy | live samples/s | spread | live vs static | simulated vs static | repartitions / run "
                      "| rebalances / run | iterations / run | fidelity | overran | decision ms |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            for policy, m in block["table"].items():
                # two decimals: spreads are hundredths of a sample/s, and one decimal printed them all as 0.0
                lines.append(f"| {policy} | {m['live_mean']:.2f} | {m['live_spread']:.2f} | "
                             f"{m['live_vs_static']:.3f} | {m['sim_vs_static']:.3f} | "
                             f"{m['repartitions_per_run']:.1f} | {m['rebalances_per_run']:.1f} | "
                             f"{m['iterations_per_run']:.0f} | {m['fidelity']:.3f} | "
                             f"{m['overran']:.1%} | {m['decision_ms']:.2f} |")
            table = block["table"]
            order = sorted(table, key=lambda p: -table[p]["live_mean"])
            sim_order = sorted(table, key=lambda p: -table[p]["sim_mean"])
            verdict = "agree" if block["rankings_agree"] else "disagree: " + "; ".join(block["disagreements"])
            lines += ["", f"Ranking live: {' > '.join(order)}; simulated: {' > '.join(sim_order)} "
                      f"(pairs inside the spread are ties): {verdict}.", ""]
    pairs = results["repeatability"]
    lines += [f"Repeatability: {PAIRS} pairs of the same static run without interference ({PAIR_DURATION_S:g} s each, "
              f"the pipeline's scale): throughputs " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in pairs["pairs"])
              + f"; largest gap {pairs['largest_gap']:.1%} (bar: 3%)."]
    return "\n".join(lines)
