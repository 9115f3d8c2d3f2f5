import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlpipe.envs import EnvConfig
from rlpipe.evaluate import evaluate, to_markdown, write_report


def test_evaluate_is_deterministic_and_complete(tmp_path):
    config = EnvConfig(duration_s=900)
    first = evaluate(["static", "dynpipe", "oracle"], ["heavy", "none"], episodes=2, seed=3, config=config,
                     progress=False)
    second = evaluate(["static", "dynpipe", "oracle"], ["heavy", "none"], episodes=2, seed=3, config=config,
                      progress=False)
    assert first["scenarios"] == second["scenarios"]
    heavy = first["scenarios"]["heavy"]
    assert set(heavy) == {"static", "dynpipe", "oracle"}
    assert heavy["static"]["speedup_vs_static"] == pytest.approx(1.0)
    for metrics in heavy.values():
        assert set(metrics) == {"efficiency_mean", "efficiency_low", "efficiency_high", "speedup_vs_static",
                                "repartitions_per_hour", "rebalances_per_hour", "stall_s_per_hour", "best_rule",
                                "vs_best_rule_mean", "vs_best_rule_low", "vs_best_rule_high"}
        assert 0.0 < metrics["efficiency_low"] <= metrics["efficiency_mean"] <= metrics["efficiency_high"] <= 1.0
    assert first["scenarios"]["none"]["static"]["efficiency_mean"] == pytest.approx(1.0)
    files = write_report(first, tmp_path)
    assert all(f.exists() and f.stat().st_size > 0 for f in files)
    assert any(f.suffix == ".png" and "timeline" in f.name for f in files)


def test_each_policy_is_compared_episode_by_episode_with_the_best_rule(tmp_path):
    """On heavy, threshold beats static in every episode: threshold is the best rule, static's paired interval
    lies wholly below 0 and the oracle's above it. falcon on one pipeline is the threshold rule, so its paired
    difference is exactly 0, though the episodes' own spread is wide."""
    config = EnvConfig(duration_s=900, min_stages=4, max_stages=4)
    results = evaluate(["static", "threshold", "falcon", "oracle"], ["heavy"], episodes=4, seed=5, config=config,
                       progress=False)
    heavy = results["scenarios"]["heavy"]
    assert {m["best_rule"] for m in heavy.values()} == {"threshold"}
    assert heavy["static"]["vs_best_rule_low"] <= heavy["static"]["vs_best_rule_mean"] <= \
        heavy["static"]["vs_best_rule_high"] < 0.0
    assert heavy["oracle"]["vs_best_rule_low"] > 0.0
    assert heavy["static"]["vs_best_rule_mean"] == pytest.approx(
        heavy["static"]["efficiency_mean"] - heavy["threshold"]["efficiency_mean"])
    falcon = heavy["falcon"]
    assert falcon["vs_best_rule_low"] == falcon["vs_best_rule_mean"] == falcon["vs_best_rule_high"] == 0.0
    assert falcon["efficiency_high"] - falcon["efficiency_low"] > 0.001
    markdown = to_markdown(results)
    assert "| threshold |" in markdown and "the best rule |" in markdown
    low, high = heavy["static"]["vs_best_rule_low"], heavy["static"]["vs_best_rule_high"]
    assert f"({low:+.4f} to {high:+.4f}) vs threshold |" in markdown


def test_without_a_rule_there_is_no_best_rule():
    results = evaluate(["oracle"], ["light"], episodes=1, config=EnvConfig(duration_s=300), progress=False)
    assert "best_rule" not in results["scenarios"]["light"]["oracle"]
    assert "vs best rule" not in to_markdown(results)


def test_a_hybrid_jobs_report_draws_every_devices_slowdown(tmp_path):
    """With replicas the timeline draws D x S devices' slowdowns, each named by its replica and stage (it
    once ran out of colours at the first device past the stages)."""
    from rlpipe.cli import main

    code = main(["evaluate", "--policies", "static,falcon", "--scenarios", "heavy", "--episodes", "1", "--stages", "2",
                 "--data-parallel", "2", "--duration-s", "300", "--out", str(tmp_path)])
    assert code == 0 and (tmp_path / "timeline_heavy.png").stat().st_size > 0
    from rlpipe.evaluate import plot_timeline

    results = evaluate(["static"], ["heavy"], episodes=1, config=EnvConfig(duration_s=300, min_stages=2, max_stages=2,
                                                                           data_parallel=(2, 2)), progress=False)
    figure = plot_timeline(results["timelines"]["heavy"], "heavy")
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert labels == ["replica 0, stage 0", "replica 0, stage 1", "replica 1, stage 0", "replica 1, stage 1"]


@pytest.mark.slow
def test_evaluate_command_writes_results(tmp_path):
    trace = tmp_path / "t.csv"
    subprocess.run([sys.executable, "-m", "rlpipe.cli", "scenario", "--name", "bursty", "--devices", "4",
                    "--duration-s", "600", "-o", str(trace)], check=True)
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli", "evaluate", "--policies", "static,greedy",
                             "--scenarios", f"heavy,trace:{trace}", "--episodes", "2", "--stages", "4",
                             "--duration-s", "600", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(data["scenarios"]) == {"heavy", f"trace:{trace}"}
    assert "| greedy |" in (tmp_path / "out" / "results.md").read_text()


GOLDEN = Path(__file__).parent / "data" / "evaluate_golden.json"


def test_evaluate_reproduces_the_recorded_results(tmp_path):
    """``rlpipe evaluate`` on fixed seeds gives the recorded figures: a refactoring guard. A deliberate
    change of behaviour re-records the file in its commit (last: falcon-early's expected-life re-split, and the
    observation-v12 policy that imitates it; only their rows and the others' differences from the best rule moved).

    The tolerance, rel 1e-6, is chosen between two scales. Another numpy, BLAS or numba build sums in
    another order or vectorises differently: each figure is a mean over thousands of simulated
    intervals, and reordered float64 sums move it by ~1e-12 relative at most. A change of behaviour
    moves it far more: one decision taken differently in one episode changes an efficiency by 1e-4 or
    more. (A build whose float32 actor flips a near-tied argmax would take another decision, and fail
    here rightly: that is a change of behaviour on that build.)"""
    from rlpipe.cli import main

    code = main(["evaluate", "--policies", "static,greedy,dynpipe,threshold,falcon,falcon-early,oracle,ppo",
                 "--scenarios", "heavy,bursty,drift",
                 "--episodes", "2", "--seed", "7", "--stages", "4", "--duration-s", "900", "--out", str(tmp_path)])
    assert code == 0
    produced = json.loads((tmp_path / "results.json").read_text())["scenarios"]
    golden = json.loads(GOLDEN.read_text())["scenarios"]
    assert produced.keys() == golden.keys()
    for scenario, table in golden.items():
        assert produced[scenario].keys() == table.keys(), scenario
        for policy, metrics in table.items():
            assert produced[scenario][policy].keys() == metrics.keys(), (scenario, policy)
            for key, value in metrics.items():
                expected = value if isinstance(value, str) else pytest.approx(value, rel=1e-6, abs=1e-9)
                assert produced[scenario][policy][key] == expected, (scenario, policy, key)
