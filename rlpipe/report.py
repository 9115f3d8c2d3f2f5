"""``rlpipe report``: live-run logs (JSONL, one record per interval) as a timeline plot and a summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlpipe.calibration import Calibration, calibrated_iteration_ms
from rlpipe.plots import (
    mark_repartitions,
    plot_partitions,
    plot_slowdowns,
    policy_colour,
    save_figure,
    stage_colours,
    use_agg,
)
from rlpipe.runlog import INVALID_OVERRUN_FRACTION, load_run

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def summarize(records: list[dict[str, Any]], calibration: Calibration | None = None) -> dict[str, Any]:
    """Mean throughput (samples/s over the whole run, stalls included), repartitions, stall, fallbacks,
    median decision latency, how device time was run, and how well the simulator predicted the run:
    the median over intervals of |live / predicted iteration time - 1| (also calibrated, if given)."""
    repartitions = [r for rec in records for r in _repartitions(rec)]
    committed = [r for r in repartitions if r.get("committed", True)]
    interval_s = np.array([rec.get("interval_s", 0.0) for rec in records])
    samples = np.array([rec["throughput_samples_s"] * rec.get("interval_s", 0.0) for rec in records])
    fallbacks = records[-1].get("fallbacks", {})
    latencies = [rec["decision"]["latency_ms"] for rec in records if "decision" in rec]
    header: dict[str, Any] = next((rec["run"] for rec in records if "run" in rec), {})
    chunks = sum(rec["emulation"]["chunks"] for rec in records if "emulation" in rec)
    overran = sum(rec["emulation"]["overran"] for rec in records if "emulation" in rec)
    ratios = [rec["iteration_ms"] / rec["predicted_iteration_ms"] for rec in records if "predicted_iteration_ms" in rec]
    summary = {"iterations": records[-1]["iteration"], "wall_s": records[-1]["wall_s"],
               "throughput_samples_s": float(samples.sum() / interval_s.sum()) if interval_s.sum() > 0 else 0.0,
               "repartitions": len(committed), "stall_s": float(sum(r["stall_s"] for r in committed)),
               "bytes_moved": int(sum(r["bytes_moved"] for r in committed)),
               "fallbacks": int(sum(fallbacks.values())),
               "decision_latency_ms": float(np.median(latencies)) if latencies else None,
               "first_loss": records[0].get("loss"), "final_loss": records[-1].get("loss"),
               "device_time": header.get("device_time"), "device_time_scale": header.get("device_time_scale"),
               "profile_id": header.get("profile_id"),
               "oversubscribed": header.get("oversubscribed"), "transport": header.get("transport"),
               "emulation_overran": overran / chunks if chunks else None,
               "emulation_valid": overran / chunks <= INVALID_OVERRUN_FRACTION if chunks else None,
               "fidelity": float(np.median(np.abs(np.array(ratios) - 1))) if ratios else None}
    if calibration is not None:
        calibrated = [(rec["iteration_ms"], p) for rec, p in zip(records, calibrated_iteration_ms(records, calibration),
                                                                 strict=True) if p is not None]
        summary["calibrated_fidelity"] = (float(np.median([abs(live / p - 1) for live, p in calibrated]))
                                          if calibrated else None)
    return summary


def describe_device_time(summary: dict[str, Any]) -> str:
    """How a run's device time was run, in a few words (for tables); on GPUs, with the transport."""
    on_gpu = f", {summary['transport']}" if summary.get("transport") in ("nccl", "host-staged") else ""
    if summary["device_time"] == "emulated":
        validity = "" if summary["emulation_valid"] in (None, True) else ", INVALID"
        profile = f", profile {summary['profile_id']}" if summary.get("profile_id") else ""
        overran = summary["emulation_overran"]  # None: no emulated chunk was measured (a run too short)
        return (f"emulated x{summary['device_time_scale']:g}{profile}{on_gpu} "
                + (f"({overran:.1%} overran{validity})" if overran is not None else "(no chunk measured)"))
    if summary["device_time"] == "real":
        return ("real, oversubscribed" if summary["oversubscribed"] else "real") + on_gpu
    return "-"


def write_report(paths: list[str], out_dir: str | Path, calibration: Calibration | None = None) -> list[Path]:
    """``summary.md``, ``summary.json`` and ``timeline.png`` for one or more runs side by side."""
    runs = {Path(p).stem: load_run(p) for p in paths}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = {name: summarize(records, calibration) for name, records in runs.items()}
    first = next(iter(summaries.values()))["throughput_samples_s"] or 1.0
    calibrated = " | calibrated" if calibration is not None else ""
    lines = ["# Run report", "",
             "Fidelity: the median over intervals of |live / predicted iteration time - 1| (the simulator's "
             "prediction for the interval's partition, profile and injected slowdowns; warm-up steps left out).", "",
             f"| run | iterations | throughput samples/s | vs first | repartitions | stall s | bytes moved | fallbacks "
             f"| decision ms | loss first -> final | device time | fidelity{calibrated} |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if calibration is not None else "")]
    for name, s in summaries.items():
        latency = "-" if s["decision_latency_ms"] is None else f"{s['decision_latency_ms']:.3f}"
        loss = ("-" if s["final_loss"] is None or s["first_loss"] is None
                else f"{s['first_loss']:.3f} -> {s['final_loss']:.3f}")
        fidelity = "-" if s["fidelity"] is None else f"{s['fidelity']:.3f}"
        if calibration is not None:
            fidelity += " | -" if s["calibrated_fidelity"] is None else f" | {s['calibrated_fidelity']:.3f}"
        lines.append(f"| {name} | {s['iterations']} | {s['throughput_samples_s']:.1f} | "
                     f"{s['throughput_samples_s'] / first:.3f} | {s['repartitions']} | {s['stall_s']:.3f} | "
                     f"{s['bytes_moved']:,} | {s['fallbacks']} | {latency} | {loss} | {describe_device_time(s)} | "
                     f"{fidelity} |")
    devices = {name: (s.get("profile_id"), s.get("device_time_scale")) for name, s in summaries.items()
               if s["device_time"] == "emulated"}
    if len(set(devices.values())) > 1:
        shown = "; ".join(f"{name}: profile {pid or 'unknown'} at x{scale:g}" for name, (pid, scale) in devices.items())
        lines += ["", f"These runs emulated different devices ({shown}): their throughputs do not compare. Give "
                  "every run the same --profile and --device-time-scale (README, 'Comparing runs')."]
    invalid = [name for name, s in summaries.items() if s["emulation_valid"] is False]
    if invalid:
        lines += ["", f"Emulation did not hold in {', '.join(invalid)}: more than {INVALID_OVERRUN_FRACTION:.0%} of "
                  "compute chunks overran their emulated time; their figures measure the host, not the profile."]
    (out / "summary.md").write_text("\n".join(lines) + "\n\n![timeline](timeline.png)\n")
    (out / "summary.json").write_text(json.dumps(summaries, indent=1) + "\n")
    save_figure(plot_runs(runs), out / "timeline.png")
    return [out / "summary.md", out / "summary.json", out / "timeline.png"]


def plot_runs(runs: dict[str, list[dict[str, Any]]]) -> Figure:
    """Live runs side by side over run time: throughput, each run's injected slowdown, live over
    predicted iteration time (where logged), GPU utilisation (on CUDA), training loss, and each run's
    partition (stacked stage sizes, repartitions marked)."""
    plt = use_agg()
    first = next(iter(runs.values()))
    num_stages = len(first[0]["boundaries"])
    num_layers = int(sum(s["num_layers"] for s in first[0]["stages"]))
    colours = stage_colours(num_stages)
    predicted = any("predicted_iteration_ms" in r for records in runs.values() for r in records)
    on_gpu = any("gpu_utilization" in s for r in first for s in r["stages"])  # NVML's figures, on CUDA only
    injected = [name for name, records in runs.items() if "injected_slowdown" in records[0]]
    panels = max(len(injected), 1)  # every run's own interference: a drop in one needs its own cause
    extra = 2 + panels + predicted + on_gpu
    fig, axes = plt.subplots(extra + len(runs), 1, figsize=(11, 2.1 * (extra + len(runs))), sharex=True)
    for k, (name, records) in enumerate(runs.items()):
        axes[0].step(_interval_starts(records) + [records[-1]["wall_s"]],
                     [r["throughput_samples_s"] for r in records] + [records[-1]["throughput_samples_s"]],
                     where="post", lw=1.0, color=policy_colour(name, k), label=name)
    axes[0].set_ylim(bottom=0)
    axes[0].set_ylabel("throughput\n(samples/s per interval)")
    axes[0].set_title("Live runs: throughput, injected interference and partitions over run time")
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="run", title_fontsize=7)
    for ax, name in zip(axes[1:1 + panels], injected):
        _plot_injected(ax, runs[name], name if len(runs) > 1 else None)
    if not injected:
        axes[1].text(0.5, 0.5, "no interference injected", ha="center", va="center", transform=axes[1].transAxes)
        axes[1].set_ylabel("injected slowdown")
    row = 1 + panels
    if predicted:
        for k, (name, records) in enumerate(runs.items()):
            kept = [r for r in records if "predicted_iteration_ms" in r]
            axes[row].plot([r["wall_s"] for r in kept], [r["iteration_ms"] / r["predicted_iteration_ms"] for r in kept],
                           marker=".", lw=0.9, color=policy_colour(name, k), label=name)
        axes[row].axhspan(0.9, 1.1, color="grey", alpha=0.15, label="within 10%")
        axes[row].axhline(1.0, color="black", lw=0.6, ls=":")
        axes[row].set_ylabel("live / predicted\niteration time")
        axes[row].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="run", title_fontsize=7)
    if on_gpu:
        _plot_gpu_utilization(axes[extra - 2], first, colours, next(iter(runs)))
    for k, (name, records) in enumerate(runs.items()):
        with_loss = [r for r in records if r.get("loss") is not None]
        axes[extra - 1].plot([r["wall_s"] for r in with_loss], [r["loss"] for r in with_loss], marker=".", lw=0.9,
                             color=policy_colour(name, k), label=name)
    axes[extra - 1].set_ylabel("training loss\n(per interval)")
    axes[extra - 1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="run", title_fontsize=7)
    for ax, (name, records) in zip(axes[extra:], runs.items()):
        starts = _interval_starts(records)
        plot_partitions(ax, starts, records[-1]["wall_s"], [r["boundaries"] for r in records], num_layers, colours)
        moves = [r["wall_s"] - r["interval_s"] for r in records for m in _repartitions(r) if m.get("committed", True)]
        mark_repartitions(ax, moves)
        ax.set_title(f"{name}: partition over time ({len(moves)} repartition{'s' * (len(moves) != 1)})"
                     f"{_split_history(records)}", fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xlabel("run time (s)")
    return fig


def _plot_injected(ax: Any, records: list[dict[str, Any]], run: str | None) -> None:
    """One run's injected slowdown of every device (``run``: its name, when several runs are shown)."""
    slowdowns = np.array([r["injected_slowdown"] for r in records])
    plot_slowdowns(ax, _interval_starts(records), records[-1]["wall_s"], slowdowns, len(records[0]["boundaries"]),
                   "injected")
    if run is not None:
        ax.set_title(f"injected slowdown in run {run}", fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="device", title_fontsize=7)


def _plot_gpu_utilization(ax: Any, records: list[dict[str, Any]], colours: list, run: str) -> None:
    """Each stage's GPU utilisation per interval (NVML), in one run."""
    for stage, colour in enumerate(colours):
        kept = [r for r in records if "gpu_utilization" in r["stages"][stage]]
        ax.plot([r["wall_s"] for r in kept], [r["stages"][stage]["gpu_utilization"] for r in kept], marker=".",
                lw=0.9, color=colour, label=f"stage {stage}")
    ax.set_ylabel("GPU utilisation\n(%, NVML)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=f"in run {run}", title_fontsize=7)


def _split_history(records: list[dict[str, Any]]) -> str:
    """A hybrid run's micro-batch splits in turn (``"; micro-batches per replica 4,4 -> 3,5"``), else ''."""
    splits: list[list[int]] = []
    for record in records:
        split = record.get("microbatch_split", [])
        if len(split) > 1 and (not splits or split != splits[-1]):
            splits.append(split)
    return "; micro-batches per replica " + " -> ".join(",".join(map(str, s)) for s in splits) if splits else ""


def _interval_starts(records: list[dict[str, Any]]) -> list[float]:
    return [r["wall_s"] - r.get("interval_s", 0.0) for r in records]


def _repartitions(record: dict[str, Any]) -> list[dict[str, Any]]:
    return record.get("repartitions", [record["repartition"]] if "repartition" in record else [])
