"""Evaluation: every policy on the same seeded episodes of every scenario, as metrics, tables and plots.

All policies of a scenario meet the same episodes (common random numbers: the same situation,
trace and timer noise), so their differences are the policies' and not the luck of the draw. Each policy
is also compared, episode by episode, with the scenario's best rule: the paired difference's mean and its
95% bootstrap interval say whether a gap is the policies' or the few episodes' (a heavy-tailed scenario
such as bursty needs many episodes to tell 0.003 apart).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from rlpipe.agents import FALLBACKS, make_policy
from rlpipe.decision import Policy
from rlpipe.envs.evaluation import EpisodeResult, bootstrap_interval, run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.errors import InputError
from rlpipe.interference import check_scenario
from rlpipe.plots import (
    mark_repartitions,
    plot_partitions,
    plot_slowdowns,
    policy_colour,
    save_figure,
    stage_colours,
    use_agg,
)
from rlpipe.seeds import EPISODE_SEED_STRIDE

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def evaluate(policies: Sequence[str], scenarios: Sequence[str], episodes: int = 5, seed: int = 0,
             config: EnvConfig | None = None, progress: bool = True) -> dict[str, Any]:
    """Metrics per scenario and policy, plus a recorded timeline of each scenario's first episode.

    ``speedup_vs_static`` compares throughput (iterations per second, stalls included) with the
    ``static`` policy on the same episodes; static runs even when not asked for. Where ``policies`` name
    any of :data:`RULES`, every policy also gets ``vs_best_rule_*``: its efficiency minus that of the
    scenario's best named rule, episode by episode (see :func:`against_best_rule`).
    """
    config = config or EnvConfig()
    names = list(dict.fromkeys(policies))
    run_names = names if "static" in names else names + ["static"]
    loaded = {name: make_policy(name) for name in run_names}
    envs = environments(loaded, config)
    for scenario in scenarios:
        check_scenario(scenario, config.min_stages)
    results: dict[str, Any] = {"scenarios": {}, "timelines": {}, "episodes": episodes}
    with tqdm(total=len(scenarios) * len(run_names) * episodes, desc="evaluate", unit="episode",
              disable=not progress) as bar:
        for scenario in scenarios:
            runs: dict[str, list[EpisodeResult]] = {}
            for name in run_names:
                bar.set_postfix_str(f"{scenario} {name}")
                runs[name] = []
                for episode in range(episodes):
                    runs[name].append(run_episode(envs[name], loaded[name], seed * EPISODE_SEED_STRIDE + episode,
                                                  scenario, record=episode == 0))
                    bar.update()
            table = {name: _metrics(runs[name], runs["static"]) for name in names}
            results["scenarios"][scenario] = against_best_rule(table, runs)
            results["timelines"][scenario] = {name: runs[name][0].timeline for name in names}
    return results


def environments(policies: dict[str, Policy], config: EnvConfig) -> dict[str, RepartitionEnv]:
    """An environment for each policy, laid out as it reads observations (a learned policy: as it was
    trained; a heuristic: room for every stage). Same seeds, same episodes, whatever the layout."""
    built: dict[tuple[int, int, int], RepartitionEnv] = {}
    chosen = {}
    for name, policy in policies.items():
        most_replicas = config.data_parallel[1]
        layout = policy.observation_layout or (max(config.s_max, config.max_stages), config.history,
                                               max(config.d_max, most_replicas))
        if layout[0] < config.max_stages:
            raise InputError(f"policy '{name}' was trained for pipelines of up to {layout[0]} stages, these "
                             f"episodes have up to {config.max_stages} (the heuristics have no such limit)")
        if layout[2] < most_replicas:
            raise InputError(f"policy '{name}' was trained for jobs of up to {layout[2]} replicas, these episodes "
                             f"have up to {most_replicas} (the heuristics have no such limit)")
        if layout not in built:
            built[layout] = RepartitionEnv(replace(config, s_max=layout[0], history=layout[1], d_max=layout[2]))
        chosen[name] = built[layout]
    return chosen


RULES = FALLBACKS  # the causal rules, the live fallbacks: what a learned policy must match


def against_best_rule(table: dict[str, dict[str, Any]], runs: dict[str, list[EpisodeResult]]) -> dict[str, Any]:
    """``table`` (one scenario's metrics by policy) with each policy compared to the best rule among those it
    names (:data:`RULES`; the highest mean efficiency, the first named on a tie): ``best_rule``, and
    ``vs_best_rule_mean``, ``_low`` and ``_high``, the mean of the per-episode differences (policy - best rule,
    on the same episodes) and its 95% bootstrap interval. Unchanged when it names no rule."""
    rules = [name for name in table if name in RULES]
    if not rules:
        return table
    best = max(rules, key=lambda name: table[name]["efficiency_mean"])
    best_efficiency = np.array([r.efficiency for r in runs[best]])
    for name, metrics in table.items():
        difference = np.array([r.efficiency for r in runs[name]]) - best_efficiency
        low, high = bootstrap_interval(difference)
        metrics.update(best_rule=best, vs_best_rule_mean=float(difference.mean()), vs_best_rule_low=low,
                       vs_best_rule_high=high)
    return table


def _metrics(runs: list[EpisodeResult], static: list[EpisodeResult]) -> dict[str, float]:
    efficiency = np.array([r.efficiency for r in runs])
    speed = np.array([r.iterations_per_s for r in runs])
    static_speed = np.array([r.iterations_per_s for r in static])
    low, high = bootstrap_interval(efficiency)
    return {
        "efficiency_mean": float(efficiency.mean()),
        "efficiency_low": low,
        "efficiency_high": high,
        "speedup_vs_static": float(np.mean(speed / static_speed)),
        "repartitions_per_hour": float(np.mean([r.repartitions_per_hour for r in runs])),
        "rebalances_per_hour": float(np.mean([r.rebalances_per_hour for r in runs])),
        "stall_s_per_hour": float(np.mean([r.stall_s_per_hour for r in runs])),
    }


def to_markdown(results: dict[str, Any]) -> str:
    """The metrics as one Markdown table per scenario (with a column against the best rule where one ran)."""
    lines = []
    for scenario, table in results["scenarios"].items():
        paired = any("best_rule" in m for m in table.values())
        lines += [f"### {scenario}", "",
                  "| policy | efficiency | 95% interval | speedup vs static | repartitions/h | rebalances/h "
                  "| stall s/h |" + (" vs best rule (95% paired interval) |" if paired else ""),
                  "|---|---|---|---|---|---|---|" + ("---|" if paired else "")]
        for name, m in table.items():
            interval = f"{m['efficiency_low']:.4f}-{m['efficiency_high']:.4f}"
            lines.append(f"| {name} | {m['efficiency_mean']:.4f} | {interval} | "
                         f"{m['speedup_vs_static']:.3f} | {m['repartitions_per_hour']:.1f} | "
                         f"{m.get('rebalances_per_hour', 0.0):.1f} | {m['stall_s_per_hour']:.1f} |"
                         + (f" {_versus_best_rule(name, m)} |" if paired else ""))
        lines.append("")
    return "\n".join(lines)


def _versus_best_rule(name: str, metrics: dict[str, Any]) -> str:
    """A table cell: ``-0.0026 (-0.0051 to -0.0004) vs static``, or ``the best rule``."""
    if name == metrics["best_rule"]:
        return "the best rule"
    return (f"{metrics['vs_best_rule_mean']:+.4f} ({metrics['vs_best_rule_low']:+.4f} to "
            f"{metrics['vs_best_rule_high']:+.4f}) vs {metrics['best_rule']}")


def write_report(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """``results.json``, ``results.md`` and PNG plots into ``out_dir``; returns the files written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"scenarios": results["scenarios"]}, indent=1) + "\n")
    (out / "results.md").write_text("# Evaluation\n\n" + to_markdown(results) + "\n![efficiency](efficiency.png)\n")
    plots = [out / "efficiency.png"]
    save_figure(plot_efficiency(results["scenarios"], results.get("episodes")), plots[0])
    for scenario, timelines in results.get("timelines", {}).items():
        path = out / f"timeline_{scenario_slug(scenario)}.png"
        save_figure(plot_timeline(timelines, f"{scenario}: the first episode, every policy on the same conditions"
                                  f"{episode_description(timelines)}"), path)
        plots.append(path)
    return [out / "results.json", out / "results.md", *plots]


def scenario_slug(scenario: str) -> str:
    """A file-name part for a scenario: the preset's name, or ``trace-STEM`` for ``trace:path/STEM.csv`` (just
    ``STEM`` when it already starts with ``trace``: ``trace.csv`` gives ``timeline_trace.png``)."""
    if scenario.startswith("trace:"):
        stem = Path(scenario[len("trace:"):]).stem
        return stem if stem.startswith("trace") else "trace-" + stem
    return scenario


def episode_description(timelines: dict[str, dict[str, Any]]) -> str:
    """``" (4 stages of transformer16, 1f1b, 8 micro-batches)"``: what a timeline's episode ran (a replica
    count too when the job had several)."""
    first = next((t for t in timelines.values() if t.get("time_s")), {})
    if "stages" not in first:
        return ""
    replicas = f"{first['replicas']} replicas x " if first.get("replicas", 1) > 1 else ""
    return (f" ({replicas}{first['stages']} stages of {first['profile']}, {first['schedule']}, "
            f"{first['microbatches']} micro-batches)")


def same_series(series: dict[str, list[float]]) -> list[list[str]]:
    """Groups of names whose series are identical, in first-seen order (a line drawn over another hides
    it: a legend must say which coincide)."""
    groups: list[list[str]] = []
    for name, values in series.items():
        match = next((g for g in groups if np.array_equal(series[g[0]], values)), None)
        if match is None:
            groups.append([name])
        else:
            match.append(name)
    return groups


def plot_efficiency(scenarios: dict[str, dict[str, dict[str, float]]], episodes: int | None) -> Figure:
    """Grouped bars: mean efficiency per scenario and policy, with 95% confidence intervals."""
    plt = use_agg()
    names = list(scenarios)
    policies = list(next(iter(scenarios.values())))
    fig, ax = plt.subplots(figsize=(max(7.5, 1.3 * len(names) * max(len(policies), 2) / 2 + 1.5), 4.4))
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        means = np.array([scenarios[s][policy]["efficiency_mean"] for s in names])
        errors = np.array([[m - scenarios[s][policy]["efficiency_low"], scenarios[s][policy]["efficiency_high"] - m]
                           for s, m in zip(names, means)]).T
        ax.bar(np.arange(len(names)) + k * width, means, width, yerr=errors, capsize=2, label=policy,
               color=policy_colour(policy, k))
    ax.set_xticks(np.arange(len(names)) + width * (len(policies) - 1) / 2, names)
    low = min(m["efficiency_low"] for t in scenarios.values() for m in t.values())
    high = max(m["efficiency_high"] for t in scenarios.values() for m in t.values())
    bottom = max(0.0, np.floor((low - 0.02) * 20) / 20)
    ax.set_ylim(bottom, max(1.0, high) + 0.005)
    ax.axhline(1.0, color="black", lw=0.6, ls=":")
    ax.set_ylabel("efficiency (1.0 = clairvoyant bound)")
    ax.set_xlabel("scenario")
    over = f" over {episodes} episodes" if episodes else ""
    note = f"; the y axis starts at {bottom:.2f}, not 0" if bottom > 0 else ""
    ax.set_title(f"Simulated efficiency by scenario\nbars: mean; error bars: 95% bootstrap interval of the mean"
                 f"{over} (within the episodes' range: never above 1.0){note}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="policy", title_fontsize=8)
    return fig


def plot_timeline(timelines: dict[str, dict[str, Any]], title: str) -> Figure:
    """One episode of every policy: the injected slowdowns, each policy's efficiency per interval, and
    each policy's partition over time (stacked stage sizes, repartitions marked)."""
    plt = use_agg()
    names = [n for n in timelines if timelines[n].get("time_s")]
    first = timelines[names[0]]
    num_layers = int(first["num_layers"])
    colours = stage_colours(len(first["boundaries"][0]))
    fig, axes = plt.subplots(2 + len(names), 1, figsize=(11, 2.1 * (2 + len(names))), sharex=True)
    minutes = lambda key, timeline: np.array(timeline[key]) / 60  # noqa: E731
    plot_slowdowns(axes[0], minutes("start_s", first), float(minutes("time_s", first)[-1]), np.array(first["slowdown"]),
                   len(colours), "injected")
    axes[0].set_title(title)
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="stage's device",
                   title_fontsize=7)
    efficiencies = {name: timelines[name]["efficiency"] for name in names}
    for group in same_series(efficiencies):  # identical lines once, the legend naming every policy they are
        name = group[0]
        label = name if len(group) == 1 else f"{' = '.join(group)} (identical)"
        axes[1].step(minutes("time_s", timelines[name]), timelines[name]["efficiency"], where="pre", lw=0.9,
                     color=policy_colour(name, names.index(name)), label=label)
    axes[1].set_ylabel("efficiency per interval\n(1 = clairvoyant)")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="policy", title_fontsize=7)
    for ax, name in zip(axes[2:], names):
        timeline = timelines[name]
        starts, boundaries = minutes("start_s", timeline), timeline["boundaries"]
        plot_partitions(ax, starts, float(minutes("time_s", timeline)[-1]), boundaries, num_layers, colours)
        moves = [starts[i] for i in range(1, len(boundaries)) if boundaries[i] != boundaries[i - 1]]
        mark_repartitions(ax, moves)
        ax.set_title(f"{name}: partition over time ({len(moves)} repartition{'s' * (len(moves) != 1)})",
                     fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xlabel("simulated time (minutes)")
    return fig

