"""Emulated device time: a chunk takes the profile's time x scale x injected slowdown; overruns count;
the simulator predicts live emulated runs within 10%."""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from live_runs import ENV

from rlpipe.interference import InterferenceTrace
from rlpipe.runlog import load_run
from rlpipe.runtime.device_time import DeviceClock, comparison_scale, default_scale
from rlpipe.runtime.injection import Injector

TESTS = Path(__file__).resolve().parents[1]


def test_an_emulated_chunk_lasts_its_device_time_times_the_injected_slowdown():
    clock = DeviceClock("emulated")
    clock.set_stage(forward_ms=20.0, backward_ms=40.0)
    start = time.perf_counter()
    clock.timed(lambda: None, False, 0)
    assert 0.020 <= time.perf_counter() - start < 0.030
    slowed = DeviceClock("emulated", Injector(InterferenceTrace(np.array([0.0]), np.array([[2.0]]), np.ones((1, 0)),
                                                                  60.0), device=0, time_scale=1.0))
    slowed.set_stage(forward_ms=20.0, backward_ms=40.0)
    start = time.perf_counter()
    slowed.timed(lambda: None, True, 0)
    assert 0.080 <= time.perf_counter() - start < 0.095  # 40 ms x 2
    assert slowed.chunks == 1 and slowed.overran == 0 and slowed.compute_s >= 0.080


def test_a_chunk_slower_than_its_device_time_is_counted_and_not_stretched():
    clock = DeviceClock("emulated")
    clock.set_stage(forward_ms=5.0, backward_ms=5.0)
    start = time.perf_counter()
    clock.timed(time.sleep, False, 0, 0.03)
    assert time.perf_counter() - start < 0.04 and clock.overran == 1


def test_real_device_time_is_what_the_chunk_takes():
    clock = DeviceClock("real")
    clock.timed(time.sleep, False, 0, 0.01)
    assert 0.01 <= clock.compute_s < 0.02 and clock.chunks == 0


def test_the_default_scale_grows_with_processes_per_core_and_a_faster_profile():
    assert default_scale(profile_ms=10.0, real_ms=10.0, processes=2, cores=2) == pytest.approx(2.0)
    assert default_scale(profile_ms=10.0, real_ms=10.0, processes=8, cores=2) == pytest.approx(8.0)
    assert default_scale(profile_ms=1.0, real_ms=10.0, processes=4, cores=2) == pytest.approx(40.0)  # a GPU profile


def test_compared_runs_share_one_scale_with_a_margin_over_the_default():
    assert comparison_scale(4, 2) == pytest.approx(1.25 * default_scale(1.0, 1.0, 4, 2)) == pytest.approx(5.0)
    assert comparison_scale(2, 2) < comparison_scale(8, 2)


def run(tmp_path, name, *args):
    log = tmp_path / f"{name}.jsonl"
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", "--model", "transformer", "--layers", "8",
                             *args, "--log", str(log)], capture_output=True, text=True, timeout=300,
                            env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_run(log), result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("stages, schedule, trace", [(2, "1f1b", None), (4, "gpipe", "1.0,2,2.5\n3.0,2,1.0")])
def test_the_simulator_predicts_an_emulated_run_within_ten_percent(tmp_path, stages, schedule, trace):
    args = ["--stages", str(stages), "--schedule", schedule, "--microbatches", "4", "--batch", "16",
            "--iterations", "40", "--interval", "5", "--device-time", "emulated"]
    if trace:  # stage 2 2.5x slower for a while
        (tmp_path / "trace.csv").write_text("time_s,device,slowdown\n" + trace + "\n")
        args += ["--interference", f"trace:{tmp_path / 'trace.csv'}", "--time-scale", "1"]
    records, stdout = run(tmp_path, "emulated", *args)
    header = records[0]["run"]
    assert header["device_time"] == "emulated" and header["device_time_scale"] >= 2.0
    ratios = np.array([r["iteration_ms"] / r["predicted_iteration_ms"] for r in records])
    assert np.median(np.abs(ratios - 1)) <= 0.10, ratios
    chunks = sum(r["emulation"]["chunks"] for r in records)
    assert chunks > 0 and sum(r["emulation"]["overran"] for r in records) / chunks <= 0.05
    if trace:
        assert max(max(r["injected_slowdown"]) for r in records) > 1.5  # the slowdown was on during the run
    assert "overran their emulated time" in stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_real_time_with_more_stages_than_cores_warns_and_marks_the_log(tmp_path):
    import os

    stages = len(os.sched_getaffinity(0)) + 1
    records, stdout = run(tmp_path, "real", "--stages", str(stages), "--microbatches", str(stages),
                          "--batch", str(4 * stages), "--iterations", "4", "--interval", "2")
    assert records[0]["run"]["oversubscribed"] is True and records[0]["run"]["device_time"] == "real"
    assert "share" in stdout and "cores" in stdout


def test_colocation_needs_real_device_time():
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", "--model", "mlp", "--stages", "2",
                             "--device-time", "emulated", "--interference", "heavy", "--inject", "colocate"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "colocate" in result.stderr and "Traceback" not in result.stderr
