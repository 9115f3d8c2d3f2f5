"""Evaluation: every policy on the same seeded episodes of every scenario, as metrics, tables and plots.

All policies of a scenario meet the same episodes (common random numbers: the same situation,
trace and timer noise), so their differences are the policies' and not the luck of the draw.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from rlpipe.agents import make_policy
from rlpipe.envs.evaluation import EpisodeResult, run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.seeds import EPISODE_SEED_STRIDE


def evaluate(policies: Sequence[str], scenarios: Sequence[str], episodes: int = 5, seed: int = 0,
             config: EnvConfig | None = None, progress: bool = True) -> dict[str, Any]:
    """Metrics per scenario and policy, plus a recorded timeline of each scenario's first episode.

    ``speedup_vs_static`` compares throughput (iterations per second, stalls included) with the
    ``static`` policy on the same episodes; static runs even when not asked for.
    """
    env = RepartitionEnv(config or EnvConfig())
    names = list(dict.fromkeys(policies))
    run_names = names if "static" in names else names + ["static"]
    loaded = {name: make_policy(name) for name in run_names}
    results: dict[str, Any] = {"scenarios": {}, "timelines": {}}
    bar = tqdm(total=len(scenarios) * len(run_names) * episodes, desc="evaluate", unit="episode",
               disable=not progress)
    for scenario in scenarios:
        runs: dict[str, list[EpisodeResult]] = {}
        for name in run_names:
            runs[name] = []
            for episode in range(episodes):
                bar.set_postfix_str(f"{scenario} {name}")
                runs[name].append(run_episode(env, loaded[name], seed * EPISODE_SEED_STRIDE + episode, scenario,
                                              record=episode == 0))
                bar.update()
        static_speed = np.array([r.iterations_per_s for r in runs["static"]])
        table = {}
        for name in names:
            eff = np.array([r.efficiency for r in runs[name]])
            table[name] = {
                "efficiency_mean": float(eff.mean()),
                "efficiency_ci95": float(1.96 * eff.std(ddof=1) / math.sqrt(len(eff))) if len(eff) > 1 else 0.0,
                "speedup_vs_static": float(np.mean(np.array([r.iterations_per_s for r in runs[name]]) / static_speed)),
                "repartitions_per_hour": float(np.mean([r.repartitions_per_hour for r in runs[name]])),
                "stall_s_per_hour": float(np.mean([r.stall_s_per_hour for r in runs[name]])),
            }
        results["scenarios"][scenario] = table
        results["timelines"][scenario] = {name: runs[name][0].timeline for name in names}
    bar.close()
    return results


def to_markdown(results: dict[str, Any]) -> str:
    """The metrics as one Markdown table per scenario."""
    lines = []
    for scenario, table in results["scenarios"].items():
        lines += [f"### {scenario}", "",
                  "| policy | efficiency | ±95% | speedup vs static | repartitions/h | stall s/h |",
                  "|---|---|---|---|---|---|"]
        for name, m in table.items():
            lines.append(f"| {name} | {m['efficiency_mean']:.4f} | {m['efficiency_ci95']:.4f} | "
                         f"{m['speedup_vs_static']:.3f} | {m['repartitions_per_hour']:.1f} | "
                         f"{m['stall_s_per_hour']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def write_report(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """``results.json``, ``results.md`` and PNG plots into ``out_dir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"scenarios": results["scenarios"]}, indent=1) + "\n")
    plots = [out / "efficiency.png"]
    (out / "results.md").write_text("# Evaluation\n\n" + to_markdown(results) + "\n![efficiency](efficiency.png)\n")

    scenarios = list(results["scenarios"])
    policies = list(next(iter(results["scenarios"].values())))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(scenarios) * len(policies) / 2), 4))
    width = 0.8 / len(policies)
    for k, name in enumerate(policies):
        means = [results["scenarios"][s][name]["efficiency_mean"] for s in scenarios]
        errors = [results["scenarios"][s][name]["efficiency_ci95"] for s in scenarios]
        ax.bar(np.arange(len(scenarios)) + k * width, means, width, yerr=errors, label=name, capsize=2)
    ax.set_xticks(np.arange(len(scenarios)) + width * (len(policies) - 1) / 2, scenarios)
    ax.set_ylabel("efficiency (1.0 = clairvoyant bound)")
    low = min(m["efficiency_mean"] for t in results["scenarios"].values() for m in t.values())
    ax.set_ylim(max(0.0, low - 0.05), 1.0)
    ax.legend(ncol=len(policies), fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(plots[0], dpi=110)
    plt.close(fig)

    for scenario, timelines in results.get("timelines", {}).items():
        path = out / f"timeline_{scenario.replace(':', '_').replace('/', '_')}.png"
        plot_timeline(timelines, f"{scenario}: first episode", path)
        plots.append(path)
    return [out / "results.json", out / "results.md", *plots]


def plot_timeline(timelines: dict[str, dict[str, list]], title: str, path: Path) -> None:
    """Injected slowdown, per-stage compute time and partition boundaries over one episode."""
    import matplotlib.pyplot as plt

    names = [n for n in timelines if timelines[n].get("time_s")]
    fig, axes = plt.subplots(2 + len(names), 1, figsize=(10, 2.0 * (2 + len(names))), sharex=True)
    first = timelines[names[0]]
    minutes = np.array(first["time_s"]) / 60
    axes[0].step(minutes, np.array(first["slowdown"]), where="pre")
    axes[0].set_ylabel("slowdown")
    axes[0].set_title(title)
    for name in names:
        axes[1].plot(np.array(timelines[name]["time_s"]) / 60, timelines[name]["efficiency"], label=name, lw=0.8)
    axes[1].set_ylabel("efficiency")
    axes[1].legend(fontsize=7, ncol=len(names))
    for ax, name in zip(axes[2:], names):
        t = np.array(timelines[name]["time_s"]) / 60
        compute = np.array(timelines[name]["stage_compute_ms"])
        ax.step(t, compute, where="pre", lw=0.8)
        ax.set_ylabel(f"{name}\nstage ms")
        twin = ax.twinx()
        twin.step(t, np.array(timelines[name]["boundaries"])[:, 1:], where="pre", color="black", lw=0.6, alpha=0.6)
        twin.set_ylabel("boundaries", fontsize=7)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
