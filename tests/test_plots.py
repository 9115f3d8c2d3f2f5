"""Every figure reads without the code: a title, labelled axes, a legend wherever colours mean something."""

import numpy as np
import pytest

from rlpipe.envs import EnvConfig
from rlpipe.evaluate import (
    episode_description,
    evaluate,
    plot_efficiency,
    plot_timeline,
    same_series,
    scenario_slug,
)
from rlpipe.plots import policy_colour, stage_colours
from rlpipe.report import plot_runs


def assert_readable(fig):
    axes = fig.get_axes()
    assert any(ax.get_title() for ax in axes) or fig._suptitle is not None
    for ax in axes:
        assert ax.get_ylabel() or ax.texts, "every panel says what it shows"
        if len(ax.get_lines()) + len(ax.collections) > 1:
            assert ax.get_legend() is not None, f"a panel with several colours needs a legend: {ax.get_ylabel()}"
    assert axes[-1].get_xlabel()


def test_policies_and_stages_never_share_a_colour():
    policies = {policy_colour(name) for name in ["static", "greedy", "dynpipe", "threshold", "ppo", "oracle"]}
    assert len(policies) == 6
    from matplotlib.colors import to_hex

    assert not policies & {to_hex(c) for c in stage_colours(8)}


@pytest.fixture(scope="module")
def evaluated():
    return evaluate(["static", "greedy", "dynpipe", "oracle"], ["heavy", "drift"], episodes=2, seed=1,
                    config=EnvConfig(duration_s=300, min_stages=4, max_stages=4), progress=False)


def test_evaluation_figures_are_readable(evaluated):
    figure = plot_efficiency(evaluated["scenarios"], 2)
    assert_readable(figure)
    assert "95% bootstrap interval" in figure.get_axes()[0].get_title()
    timeline = plot_timeline(evaluated["timelines"]["heavy"], "heavy")
    assert_readable(timeline)
    partitions = [ax for ax in timeline.get_axes() if "partition" in ax.get_title(loc="left")]
    assert len(partitions) == 4  # one stacked-stage panel per policy
    for ax in partitions:  # layers come whole: no tick at 2.5
        assert all(float(tick).is_integer() for tick in ax.get_yticks())


def test_efficiency_intervals_never_pass_the_unreachable_bound(evaluated):
    figure = plot_efficiency(evaluated["scenarios"], 2)
    for scenario in evaluated["scenarios"].values():
        for m in scenario.values():
            assert m["efficiency_low"] <= m["efficiency_mean"] <= m["efficiency_high"] <= 1.0 + 1e-12
    tops = [segment[:, 1].max() for container in figure.get_axes()[0].containers
            if hasattr(container, "lines") and container.lines[2] for collection in container.lines[2]
            for segment in collection.get_segments()]
    assert tops and max(tops) <= 1.0 + 1e-12  # the drawn error bars too (2 episodes each)


def test_coinciding_policies_are_named_together_and_the_episode_is_described(evaluated):
    timelines = evaluated["timelines"]["drift"]
    groups = same_series({name: t["efficiency"] for name, t in timelines.items()})
    assert sum(len(g) for g in groups) == 4
    figure = plot_timeline(timelines, "drift")
    labels = [text.get_text() for text in figure.get_axes()[1].get_legend().get_texts()]
    for group in groups:
        assert any(all(name in label for name in group) for label in labels)
        if len(group) > 1:
            assert any("identical" in label for label in labels)
    assert episode_description(timelines).startswith(" (4 stages of ")  # the title names stages and profile
    assert scenario_slug("trace:out/trace.csv") == "trace" and scenario_slug("trace:x/wide.csv") == "trace-wide"


def test_report_figure_is_readable(tmp_path):
    record = {"iteration": 10, "wall_s": 2.0, "interval_s": 2.0, "boundaries": [0, 3], "throughput_samples_s": 80.0,
              "loss": 2.0, "losses": [2.0] * 10, "injected_slowdown": [1.0, 2.0],
              "stages": [{"num_layers": 3, "compute_ms": 1.0}, {"num_layers": 3, "compute_ms": 1.0}]}
    moved = {**record, "iteration": 20, "wall_s": 4.0, "boundaries": [0, 4],
             "repartition": {"from": [0, 3], "to": [0, 4], "committed": True, "stall_s": 0.01, "bytes_moved": 1}}
    slowed = {**record, "injected_slowdown": [2.5, 1.0]}
    runs = {"static": [record, {**record, "iteration": 20, "wall_s": 4.0}], "ppo": [slowed, {**moved, **slowed,
                                                                                          "boundaries": [0, 4]}]}
    figure = plot_runs(runs)
    assert_readable(figure)
    titles = [ax.get_title(loc="left") for ax in figure.get_axes()]
    assert any("ppo" in t and "1 repartition" in t for t in titles)
    assert "injected slowdown in run static" in titles and "injected slowdown in run ppo" in titles
    assert figure.get_axes()[0].get_ylim()[0] == 0  # throughput from zero, not 79-81
    assert np.isfinite([line.get_ydata() for line in figure.get_axes()[0].get_lines()][0]).all()
    single = plot_runs({"run": [record, {**record, "iteration": 20, "wall_s": 4.0}]})
    legends = [ax.get_legend().get_title().get_text() for ax in single.get_axes() if ax.get_legend()]
    assert not any("in run" in title for title in legends)


def test_report_plots_gpu_utilization_when_the_log_has_it():
    stages = [{"num_layers": 3, "compute_ms": 1.0, "gpu_utilization": 60.0, "gpu_memory_bytes": 2**30},
              {"num_layers": 3, "compute_ms": 1.0, "gpu_utilization": 95.0, "gpu_memory_bytes": 2**30}]
    records = [{"iteration": 10 * k, "wall_s": 2.0 * k, "interval_s": 2.0, "boundaries": [0, 3],
                "throughput_samples_s": 80.0, "loss": 2.0 / k, "stages": stages} for k in (1, 2, 3)]
    figure = plot_runs({"ppo": records})
    assert_readable(figure)
    gpu = [ax for ax in figure.get_axes() if "GPU" in ax.get_ylabel()]
    assert len(gpu) == 1 and [list(line.get_ydata()) for line in gpu[0].get_lines()] == [[60.0] * 3, [95.0] * 3]
    cpu_only = plot_runs({"ppo": [{**r, "stages": [{"num_layers": 3, "compute_ms": 1.0}] * 2} for r in records]})
    assert not [ax for ax in cpu_only.get_axes() if "GPU" in ax.get_ylabel()]
