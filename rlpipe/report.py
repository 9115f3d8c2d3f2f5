"""``rlpipe report``: live-run logs (JSONL, one record per interval) as a timeline plot and a summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rlpipe.errors import InputError

REQUIRED_FIELDS = ("iteration", "wall_s", "boundaries", "throughput_samples_s", "stages")


def load_run(path: str | Path) -> list[dict[str, Any]]:
    """The records of one run log; a malformed line is an error naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such run log") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: line {number}: not JSON ({err.msg})") from None
        missing = [k for k in REQUIRED_FIELDS if k not in record]
        if missing:
            raise InputError(f"{path}: line {number}: missing field(s) {', '.join(missing)}")
        records.append(record)
    if not records:
        raise InputError(f"{path}: no records")
    return records


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean throughput (samples/s over the whole run, stalls included), repartitions, stall, fallbacks,
    median decision latency."""
    repartitions = [r for rec in records
                    for r in rec.get("repartitions", [rec["repartition"]] if "repartition" in rec else [])]
    committed = [r for r in repartitions if r.get("committed", True)]
    interval_s = np.array([rec.get("interval_s", 0.0) for rec in records])
    samples = np.array([rec["throughput_samples_s"] * rec.get("interval_s", 0.0) for rec in records])
    fallbacks = records[-1].get("fallbacks", {})
    latencies = [rec["decision"]["latency_ms"] for rec in records if "decision" in rec]
    return {"iterations": records[-1]["iteration"], "wall_s": records[-1]["wall_s"],
            "throughput_samples_s": float(samples.sum() / interval_s.sum()) if interval_s.sum() > 0 else 0.0,
            "repartitions": len(committed), "stall_s": float(sum(r["stall_s"] for r in committed)),
            "bytes_moved": int(sum(r["bytes_moved"] for r in committed)),
            "fallbacks": int(sum(fallbacks.values())),
            "decision_latency_ms": float(np.median(latencies)) if latencies else None,
            "final_loss": records[-1].get("loss")}


def write_report(paths: list[str], out_dir: str | Path) -> list[Path]:
    """``summary.md`` and ``timeline.png`` for one or more runs side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {Path(p).stem: load_run(p) for p in paths}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = {name: summarize(records) for name, records in runs.items()}
    first = next(iter(summaries.values()))["throughput_samples_s"] or 1.0
    lines = ["# Run report", "", "| run | iterations | throughput samples/s | vs first | repartitions | stall s | "
             "bytes moved | fallbacks | decision ms | final loss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        latency = "-" if s["decision_latency_ms"] is None else f"{s['decision_latency_ms']:.3f}"
        loss = "-" if s["final_loss"] is None else f"{s['final_loss']:.4f}"
        lines.append(f"| {name} | {s['iterations']} | {s['throughput_samples_s']:.1f} | "
                     f"{s['throughput_samples_s'] / first:.3f} | {s['repartitions']} | {s['stall_s']:.3f} | "
                     f"{s['bytes_moved']:,} | {s['fallbacks']} | {latency} | {loss} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n\n![timeline](timeline.png)\n")
    (out / "summary.json").write_text(json.dumps(summaries, indent=1) + "\n")

    fig, axes = plt.subplots(2 + len(runs), 1, figsize=(10, 2.2 * (2 + len(runs))), sharex=True)
    for name, records in runs.items():
        wall = [r["wall_s"] for r in records]
        axes[0].plot(wall, [r["throughput_samples_s"] for r in records], label=name, lw=1)
        if "injected_slowdown" in records[0]:
            axes[1].step(wall, [r["injected_slowdown"] for r in records], where="pre", lw=0.8)
    axes[0].set_ylabel("samples/s")
    axes[0].legend(fontsize=7)
    axes[1].set_ylabel("injected\nslowdown")
    for ax, (name, records) in zip(axes[2:], runs.items()):
        wall = [r["wall_s"] for r in records]
        ax.step(wall, [[s["compute_ms"] for s in r["stages"]] for r in records], where="pre", lw=0.8)
        ax.set_ylabel(f"{name}\nstage ms/mb", fontsize=8)
        twin = ax.twinx()
        twin.step(wall, [r["boundaries"][1:] for r in records], where="pre", color="black", lw=0.6, alpha=0.6)
        twin.set_ylabel("boundaries", fontsize=7)
        for r in records:
            if "repartition" in r:
                ax.axvline(r["wall_s"], color="red", lw=0.6, alpha=0.5)
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=100)
    plt.close(fig)
    return [out / "summary.md", out / "summary.json", out / "timeline.png"]
