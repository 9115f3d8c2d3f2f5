"""The comparison that matters: the live 4-stage pipeline under injected interference (throttle),
once per policy, side by side in one run; throughput against static, and next to it the simulator's
prediction for the same profile, partition history and trace (the sim-to-real gap)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from rlpipe.profile import load_profile
from rlpipe.runlog import load_run
from rlpipe.simulator import PipelineCosts

POLICIES = ["static", "greedy", "dynpipe", "ppo"]
SCENARIOS = ["heavy", "bursty"]
RUN = ["--model", "transformer", "--layers", "12", "--stages", "4", "--schedule", "1f1b", "--microbatches", "4",
       "--batch", "16", "--iterations", "400", "--interval", "10", "--inject", "throttle", "--time-scale", "20",
       "--seed", "3"]


def simulated_throughput(records: list[dict], profile_path: Path, batch: int, microbatches: int) -> float:
    """Samples/s the simulator predicts for the run's own partition history and injected slowdowns,
    with the run's measured repartition stalls."""
    costs = PipelineCosts(load_profile(profile_path))
    total_s, samples = 0.0, 0
    for record in records:
        iterations = len(record["losses"]) or 1
        timing = costs.simulate(tuple(record["boundaries"]), "1f1b", microbatches, record["injected_slowdown"])
        total_s += iterations * timing.iteration_ms / 1e3 + record.get("stall_s", 0.0)
        samples += iterations * batch
    return samples / total_s


def run() -> dict:
    root = Path(__file__).resolve().parents[1]
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "profile.json"
        subprocess.run([sys.executable, "-m", "rlpipe.cli", "profile", "--model", "transformer", "--layers", "12",
                        "--batch", "16", "--microbatches", "4", "-o", str(profile)], check=True, cwd=root)
        for scenario in SCENARIOS:
            results[scenario] = {}
            for policy in POLICIES:
                log = Path(tmp) / f"{scenario}-{policy}.jsonl"
                subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", *RUN, "--profile", str(profile),
                                "--interference", scenario, "--policy", policy, "--log", str(log)],
                               check=True, cwd=root, stdout=subprocess.DEVNULL)
                records = load_run(log)
                live = sum(len(r["losses"]) * 16 for r in records) / sum(r["interval_s"] for r in records)
                latencies = [r["decision"]["latency_ms"] for r in records if "decision" in r]
                results[scenario][policy] = {
                    "live_samples_s": live, "sim_samples_s": simulated_throughput(records, profile, 16, 4),
                    "repartitions": sum(1 for r in records if "repartition" in r),
                    "decision_ms_median": float(np.median(latencies)),
                    "iteration_ms_median": float(np.median([r["interval_s"] / len(r["losses"]) * 1e3
                                                            for r in records]))}
    lines = []
    for scenario, table in results.items():
        static = table["static"]
        lines += [f"### {scenario} (live, throttle)", "",
                  "| policy | live samples/s | live vs static | sim vs static | live / sim | repartitions "
                  "| decision ms |",
                  "|---|---|---|---|---|---|---|"]
        for policy, m in table.items():
            m["live_vs_static"] = m["live_samples_s"] / static["live_samples_s"]
            m["sim_vs_static"] = m["sim_samples_s"] / static["sim_samples_s"]
            m["live_over_sim"] = m["live_samples_s"] / m["sim_samples_s"]
            lines.append(f"| {policy} | {m['live_samples_s']:.1f} | {m['live_vs_static']:.3f} "
                         f"| {m['sim_vs_static']:.3f} | {m['live_over_sim']:.3f} | {m['repartitions']} "
                         f"| {m['decision_ms_median']:.2f} |")
        live_rank = sorted(table, key=lambda p: -table[p]["live_samples_s"])
        sim_rank = sorted(table, key=lambda p: -table[p]["sim_samples_s"])
        lines += ["", f"ranking live: {' > '.join(live_rank)}; simulated: {' > '.join(sim_rank)}", ""]
    return {"results": results, "markdown": "\n".join(lines)}
