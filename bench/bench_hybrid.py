"""Hybrid jobs live: 2 replicas of a 2-stage pipeline (4 gloo processes on this machine).

- The gradient sync of each stage group against its floor: its parameter bytes x 2 (D - 1) / D (a ring
  all-reduce) over the measured point-to-point bandwidth.
- A hybrid repartition's stall against its floor: the bytes one replica moves over that bandwidth (the
  replicas move theirs at the same time).
- What a rebalance recovers with a 2x straggler in one replica (emulated device time, 3 interleaved
  repeats, spread given): the even split, the rebalanced split (the one that fits the replicas' speeds),
  and the best layer-only repartition (the partition optimal for every stage's slowest device).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from rlpipe.planning import Planner
from rlpipe.profile import load_profile
from rlpipe.runlog import load_run
from rlpipe.runtime.device_time import comparison_scale

REPEATS = 3
DURATION_S = 20.0
LAYOUT = ["--stages", "2", "--data-parallel", "2", "--microbatches", "4", "--schedule", "1f1b"]


def rlpipe(root: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "rlpipe.cli", *args], check=True, cwd=root, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def sync_and_stall(root: Path, tmp: Path) -> dict:
    """A 10.5M-parameter MLP as 2 x 2 on real device time: every interval's sync, and scripted
    repartitions moving 1-3 layers in both replicas."""
    log = tmp / "stall.jsonl"
    rlpipe(root, "run", "--model", "bench.models:wide_mlp", *LAYOUT, "--batch", "32", "--iterations", "24",
           "--interval", "4", "--boundaries", "0,5", "--repartition-at", "4:0,3", "8:0,6", "12:0,4", "16:0,7", "20:0,5",
           "--log", str(log))
    records = load_run(log)
    header = records[0]["run"]
    gbps = header["p2p_gbps"]
    params = np.array(header["param_bytes"], dtype=float)
    syncs, stalls = [], []
    for record in records[1:]:  # the first interval holds the warm-up
        edges = [*record["boundaries"], len(params)]
        for stage, measured_ms in enumerate(record["sync_ms"]):
            floor_ms = params[edges[stage]:edges[stage + 1]].sum() * 2 * (2 - 1) / 2 * 8 / (gbps * 1e9) * 1e3
            syncs.append({"measured_ms": measured_ms, "floor_ms": floor_ms})
        if "repartition" in record:
            moved = record["repartition"]["bytes_moved"] / 2  # per replica: the two move theirs at once
            stalls.append({"bytes_per_replica": moved, "stall_s": record["repartition"]["stall_s"],
                           "floor_s": moved * 8 / (gbps * 1e9)})
    return {"p2p_gbps": gbps, "sync": syncs, "stalls": stalls,
            "median_sync_over_floor": float(np.median([s["measured_ms"] / s["floor_ms"] for s in syncs])),
            "median_stall_over_floor": float(np.median([s["stall_s"] / s["floor_s"] for s in stalls])),
            "stalls_within_2x_floor_plus_50ms": sum(s["stall_s"] <= 2 * s["floor_s"] + 0.05 for s in stalls)}


def recovery(root: Path, tmp: Path) -> dict:
    """Throughput with a 2x straggler in replica 1's stage 0, three ways, 3 interleaved repeats each."""
    profile = tmp / "profile.json"
    rlpipe(root, "profile", "--model", "transformer", "--layers", "12", "--batch", "16", "--microbatches", "4",
           "-o", str(profile))
    trace = tmp / "straggler.csv"
    trace.write_text("time_s,device,slowdown\n0,2,2.0\n")  # device 1 x 2 + 0
    planner = Planner(load_profile(profile), 2, "1f1b", 4, replicas=2)
    slowdown = np.array([[1.0, 1.0], [2.0, 1.0]])
    split = planner.balanced_split(planner.ideal_boundaries, slowdown)
    layers_only = planner.plan(slowdown.max(axis=0))
    ways = {"even split": [], f"rebalanced {split[0]},{split[1]}": ["--rebalance-at", f"0:{split[0]},{split[1]}"],
            f"layers re-split {','.join(map(str, layers_only))}": ["--boundaries", ",".join(map(str, layers_only))]}
    scale = comparison_scale(4, len(os.sched_getaffinity(0)))
    runs: dict[str, list[float]] = {way: [] for way in ways}
    for repeat in range(REPEATS):
        for way, extra in ways.items():
            log = tmp / f"recovery-{repeat}-{len(runs[way])}-{way.split()[0]}.jsonl"
            rlpipe(root, "run", "--model", "transformer", "--layers", "12", *LAYOUT, "--batch", "32",
                   "--interval", "4", "--profile", str(profile), "--device-time", "emulated",
                   "--device-time-scale", f"{scale:g}", "--duration-s", f"{DURATION_S:g}",
                   "--interference", f"trace:{trace}", *extra, "--log", str(log))
            records = load_run(log)
            records = records[1:] or records  # past the warm-up interval, where the run had more than one
            runs[way].append(sum(r["throughput_samples_s"] * r["interval_s"] for r in records)
                             / sum(r["interval_s"] for r in records))
    even = float(np.mean(runs["even split"]))
    table = {way: {"samples_s": float(np.mean(v)), "spread": float(np.ptp(v)), "vs_even": float(np.mean(v) / even)}
             for way, v in runs.items()}
    return {"device_time_scale": scale, "table": table, "runs": runs}


def run() -> dict:
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        figures = sync_and_stall(root, tmp)
        figures["recovery"] = recovery(root, tmp)
    lines = [f"2 replicas x 2 stages, 4 gloo processes on {len(os.sched_getaffinity(0))} cores, point-to-point "
             f"{figures['p2p_gbps']:.2f} Gbit/s measured.", "",
             f"Gradient sync per stage group (10.5M-parameter MLP, real device time): median "
             f"{figures['median_sync_over_floor']:.2f}x its floor (bytes x 2(D-1)/D over the bandwidth).", "",
             "| repartition | bytes per replica | stall s | floor s | within 2 x floor + 50 ms |",
             "|---|---|---|---|---|"]
    lines += [f"| {k + 1} | {s['bytes_per_replica']:,.0f} | {s['stall_s']:.3f} | {s['floor_s']:.3f} | "
              f"{'yes' if s['stall_s'] <= 2 * s['floor_s'] + 0.05 else 'no'} |"
              for k, s in enumerate(figures["stalls"])]
    recovered = figures["recovery"]
    lines += ["", f"A 2x straggler in replica 1 (12-layer transformer, emulated device time x"
              f"{recovered['device_time_scale']:g}, {DURATION_S:g} s a run, {REPEATS} interleaved repeats, "
              "spread = max - min):", "", "| way | samples/s | spread | vs even split |", "|---|---|---|---|"]
    lines += [f"| {way} | {m['samples_s']:.1f} | {m['spread']:.1f} | {m['vs_even']:.3f} |"
              for way, m in recovered["table"].items()]
    figures["markdown"] = "\n".join(lines)
    return json.loads(json.dumps(figures))
