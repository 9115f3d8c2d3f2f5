"""Soak: 2,000 iterations on 4 CPU ranks (gloo) with a scripted repartition every 10 iterations, back and
forth between two partitions (199 moves), beside the same run without repartitions.

Checks what a days-long job needs: the losses equal the run without repartitions (1e-5), each rank's
resident memory (RSS) grows less than 5% after warm-up (iteration 200 to the end), and every stall stays
within 2 x its bandwidth floor (bytes moved / measured point-to-point bandwidth) + 50 ms."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ITERATIONS, EVERY, WARMUP_ITERATIONS = 2000, 10, 200
PARTITIONS = ("0,2,4,6", "0,3,5,7")
COMMON = ["--model", "bench.models:soak_mlp", "--stages", "4", "--schedule", "1f1b", "--microbatches", "4",
          "--batch", "16", "--iterations", str(ITERATIONS), "--interval", str(EVERY), "--boundaries", PARTITIONS[0]]


def live_run(folder: Path, name: str, *extra: str) -> list[dict]:
    log = folder / f"{name}.jsonl"
    subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", *COMMON, "--log", str(log), *extra], check=True,
                   cwd=Path(__file__).resolve().parents[1])
    return [json.loads(line) for line in log.read_text().splitlines()]


def run() -> dict:
    plan = [f"{i}:{PARTITIONS[(i // EVERY) % 2]}" for i in range(EVERY, ITERATIONS, EVERY)]
    with tempfile.TemporaryDirectory() as tmp:
        still = live_run(Path(tmp), "still")
        moving = live_run(Path(tmp), "moving", "--repartition-at", *plan)
    losses_still = [loss for r in still for loss in r["losses"]]
    losses_moving = [loss for r in moving for loss in r["losses"]]
    loss_gap = max(abs(a - b) for a, b in zip(losses_still, losses_moving, strict=True))
    moves = [m for r in moving for m in r.get("repartitions", [r["repartition"]] if "repartition" in r else [])]
    bandwidth_gbps = moving[0]["p2p_gbps"]
    over_target = [m for m in moves if m["stall_s"] > 2 * m["bytes_moved"] * 8 / (bandwidth_gbps * 1e9) + 0.05]
    after_warmup = next(r for r in moving if r["iteration"] >= WARMUP_ITERATIONS)
    growth = [end["rss_bytes"] / start["rss_bytes"] - 1
              for start, end in zip(after_warmup["stages"], moving[-1]["stages"], strict=True)]
    stalls = sorted(m["stall_s"] for m in moves)
    lines = ["| rank | RSS at iteration 200 (MB) | RSS at the end (MB) | growth |", "|---|---|---|---|"]
    lines += [f"| {rank} | {start['rss_bytes'] / 1e6:.1f} | {end['rss_bytes'] / 1e6:.1f} | {g:+.2%} |"
              for rank, (start, end, g) in enumerate(zip(after_warmup["stages"], moving[-1]["stages"], growth))]
    return {"iterations": ITERATIONS, "repartitions": len(moves),
            "committed": sum(m["committed"] for m in moves), "max_loss_difference": loss_gap,
            "losses_equal": loss_gap <= 1e-5, "max_rss_growth": max(growth),
            "rss_growth_under_5pct": max(growth) < 0.05,
            "p2p_gbps": bandwidth_gbps, "median_stall_s": stalls[len(stalls) // 2], "max_stall_s": stalls[-1],
            "stalls_over_target": len(over_target), "throughput_still": still[-1]["iteration"] / still[-1]["wall_s"],
            "throughput_moving": moving[-1]["iteration"] / moving[-1]["wall_s"], "markdown": "\n".join(lines)}
