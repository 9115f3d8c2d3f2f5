"""``rlpipe report``: live-run logs (JSONL, one record per interval) as a timeline plot and a summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlpipe.errors import InputError
from rlpipe.plots import (
    mark_repartitions,
    plot_partitions,
    plot_slowdowns,
    policy_colour,
    save_figure,
    stage_colours,
    use_agg,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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
    repartitions = [r for rec in records for r in _repartitions(rec)]
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

    save_figure(plot_runs(runs), out / "timeline.png")
    return [out / "summary.md", out / "summary.json", out / "timeline.png"]


def plot_runs(runs: dict[str, list[dict[str, Any]]]) -> Figure:
    """Live runs side by side over run time: throughput, injected slowdown, and each run's partition
    (stacked stage sizes, repartitions marked)."""
    plt = use_agg()
    first = next(iter(runs.values()))
    num_stages = len(first[0]["boundaries"])
    num_layers = int(sum(s["num_layers"] for s in first[0]["stages"]))
    colours = stage_colours(num_stages)
    fig, axes = plt.subplots(2 + len(runs), 1, figsize=(11, 2.1 * (2 + len(runs))), sharex=True)
    for k, (name, records) in enumerate(runs.items()):
        axes[0].step(_interval_starts(records) + [records[-1]["wall_s"]],
                     [r["throughput_samples_s"] for r in records] + [records[-1]["throughput_samples_s"]],
                     where="post", lw=1.0, color=policy_colour(name, k), label=name)
    axes[0].set_ylabel("throughput\n(samples/s per interval)")
    axes[0].set_title("Live runs: throughput, injected interference and partitions over run time")
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="run", title_fontsize=7)
    if "injected_slowdown" in first[0]:
        plot_slowdowns(axes[1], _interval_starts(first), first[-1]["wall_s"],
                       np.array([r["injected_slowdown"] for r in first]), colours, "injected")
        axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=f"in run {next(iter(runs))}",
                       title_fontsize=7)
    else:
        axes[1].text(0.5, 0.5, "no interference injected", ha="center", va="center", transform=axes[1].transAxes)
        axes[1].set_ylabel("injected slowdown")
    for ax, (name, records) in zip(axes[2:], runs.items()):
        starts = _interval_starts(records)
        plot_partitions(ax, starts, records[-1]["wall_s"], [r["boundaries"] for r in records], num_layers, colours)
        moves = [r["wall_s"] - r["interval_s"] for r in records for m in _repartitions(r) if m.get("committed", True)]
        mark_repartitions(ax, moves)
        ax.set_title(f"{name}: partition over time ({len(moves)} repartition{'s' * (len(moves) != 1)})",
                     fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xlabel("run time (s)")
    return fig


def _interval_starts(records: list[dict[str, Any]]) -> list[float]:
    return [r["wall_s"] - r.get("interval_s", 0.0) for r in records]


def _repartitions(record: dict[str, Any]) -> list[dict[str, Any]]:
    return record.get("repartitions", [record["repartition"]] if "repartition" in record else [])
