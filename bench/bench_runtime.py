"""Live repartition stall against its physical floor (bytes moved / measured point-to-point
bandwidth), on 4 CPU ranks over gloo with a ~10M-parameter model."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

# Each step moves 1-3 layers (12.6 MB each with Adam state) in both directions.
PLAN = ["4:0,2,5,7", "8:0,3,6,8", "12:0,1,4,7", "16:0,3,5,8", "20:0,2,4,6", "24:0,4,6,8"]


def run() -> dict:
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "stall.jsonl"
        subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", "--model", "bench.models:wide_mlp",
                        "--stages", "4", "--schedule", "1f1b", "--microbatches", "4", "--batch", "16",
                        "--iterations", "28", "--interval", "4", "--boundaries", "0,3,6,8", "--log", str(log),
                        "--repartition-at", *PLAN], check=True, cwd=root)
        records = [json.loads(line) for line in log.read_text().splitlines()]
    bandwidth_gbps = records[0]["p2p_gbps"]
    rows = []
    for record in records:
        if "repartition" in record:
            r = record["repartition"]
            floor_s = r["bytes_moved"] * 8 / (bandwidth_gbps * 1e9)
            rows.append({"bytes_moved": r["bytes_moved"], "stall_s": r["stall_s"], "floor_s": floor_s,
                         "target_s": 2 * floor_s + 0.05, "meets_target": r["stall_s"] <= 2 * floor_s + 0.05})
    lines = ["| bytes moved | stall s | floor s | target (2 x floor + 50 ms) | met |", "|---|---|---|---|---|"]
    lines += [f"| {r['bytes_moved']:,} | {r['stall_s']:.3f} | {r['floor_s']:.3f} | {r['target_s']:.3f} | "
              f"{'yes' if r['meets_target'] else 'no'} |" for r in rows]
    return {"p2p_gbps": bandwidth_gbps, "repartitions": len(rows),
            "met_target": sum(r["meets_target"] for r in rows),
            "median_stall_over_floor": sorted(r["stall_s"] / r["floor_s"] for r in rows)[len(rows) // 2],
            "rows": rows, "markdown": "\n".join(lines)}
