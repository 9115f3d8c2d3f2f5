"""Run every benchmark side by side in one process and write bench/results.{json,md}.

Usage: ``python -m bench.run_all [--only NAME ...]`` (``make bench`` runs them all, about two hours on 2 cores).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import time
from pathlib import Path

import torch

BENCHMARKS = ["bench_simulator", "bench_env", "bench_policies", "bench_runtime", "bench_hybrid", "bench_soak",
              "bench_fidelity", "bench_live"]
RESULTS = Path(__file__).parent


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"
    return str(value)


def to_markdown(results: dict) -> str:
    lines = ["# Benchmark results", "", "Written by `make bench` (`python -m bench.run_all`; `--only NAME ...` reruns "
             "some and keeps the others' figures): each section says when it was measured, on this machine:", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in results["machine"].items() if k != "date"), ""]
    for name, figures in results["benchmarks"].items():
        lines += [f"## {name}", "", f"Measured {figures.get('measured_at', 'before sections were dated')}.", "",
                  "| figure | value |", "|---|---|"]
        lines += [f"| {key} | {_format(value)} |" for key, value in figures.items()
                  if not isinstance(value, (dict, list)) and key not in ("markdown", "measured_at")]
        lines.append("")
        if isinstance(figures.get("markdown"), str):
            lines += [figures["markdown"], ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=BENCHMARKS, help="benchmarks to run (default: all)")
    args = parser.parse_args()
    path = RESULTS / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {"benchmarks": {}}
    results["machine"] = machine()
    for name in args.only:
        print(f"running {name} ...", flush=True)
        start = time.perf_counter()
        figures = importlib.import_module(f"bench.{name}").run()
        figures["wall_s"] = time.perf_counter() - start
        figures["measured_at"] = time.strftime("%Y-%m-%d %H:%M")
        results["benchmarks"][name] = figures
        print(json.dumps({k: v for k, v in figures.items() if not isinstance(v, (dict, list)) and k != "markdown"},
                         indent=1), flush=True)
        path.write_text(json.dumps(results, indent=1) + "\n")  # nothing lost if a later benchmark fails
        (RESULTS / "results.md").write_text(to_markdown(results))
    print(f"wrote {path} and {RESULTS / 'results.md'}")


if __name__ == "__main__":
    main()
