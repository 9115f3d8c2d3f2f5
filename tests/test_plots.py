"""Every figure reads without the code: a title, labelled axes, a legend wherever colours mean something."""

import json

import numpy as np

from rlpipe.envs import EnvConfig
from rlpipe.evaluate import evaluate, plot_efficiency, plot_timeline
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


def test_evaluation_figures_are_readable():
    results = evaluate(["static", "greedy", "oracle"], ["heavy"], episodes=2, seed=1,
                       config=EnvConfig(duration_s=900, min_stages=4, max_stages=4), progress=False)
    figure = plot_efficiency(results["scenarios"], 2)
    assert_readable(figure)
    assert "95% confidence interval" in figure.get_axes()[0].get_title()
    timeline = plot_timeline(results["timelines"]["heavy"], "heavy")
    assert_readable(timeline)
    partitions = [ax for ax in timeline.get_axes() if "partition" in ax.get_title(loc="left")]
    assert len(partitions) == 3  # one stacked-stage panel per policy


def test_report_figure_is_readable(tmp_path):
    record = {"iteration": 10, "wall_s": 2.0, "interval_s": 2.0, "boundaries": [0, 3], "throughput_samples_s": 80.0,
              "loss": 2.0, "losses": [2.0] * 10, "injected_slowdown": [1.0, 2.0],
              "stages": [{"num_layers": 3, "compute_ms": 1.0}, {"num_layers": 3, "compute_ms": 1.0}]}
    moved = {**record, "iteration": 20, "wall_s": 4.0, "boundaries": [0, 4],
             "repartition": {"from": [0, 3], "to": [0, 4], "committed": True, "stall_s": 0.01, "bytes_moved": 1}}
    runs = {"static": [record, {**record, "iteration": 20, "wall_s": 4.0}], "ppo": [record, moved]}
    figure = plot_runs(runs)
    assert_readable(figure)
    titles = [ax.get_title(loc="left") for ax in figure.get_axes()]
    assert any("ppo" in t and "1 repartition" in t for t in titles)
    assert json.dumps(runs)  # plain data in, nothing hidden
    assert np.isfinite([line.get_ydata() for line in figure.get_axes()[0].get_lines()][0]).all()


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
