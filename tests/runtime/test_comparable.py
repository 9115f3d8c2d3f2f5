"""Live runs that compare: the same arguments emulate the same devices (a measured profile is kept), a
wall-time budget meets the same stretch of the scenario whatever a run's speed, a resumed run keeps its
devices and counts what it did, and the default device-time scale grows when a busy machine overruns it."""

import json

import pytest
from live_runs import read_log, rlpipe_run, run_command, run_summary

from rlpipe.report import write_report

SMALL = ["--model", "mlp", "--layers", "6", "--stages", "2", "--microbatches", "4", "--batch", "16",
         "--interval", "5", "--device-time", "emulated"]


@pytest.mark.slow
def test_two_runs_of_the_same_arguments_emulate_the_same_devices(tmp_path):
    fresh_cache = {"RLPIPE_CACHE_DIR": str(tmp_path / "cache")}  # whatever the suite measured before
    first, _ = rlpipe_run(tmp_path, "first", *SMALL, "--iterations", "10", env=fresh_cache)
    second, _ = rlpipe_run(tmp_path, "second", *SMALL, "--iterations", "10", env=fresh_cache)
    a, b = first[0]["run"], second[0]["run"]
    assert a["profile_id"] == b["profile_id"] and a["device_time_scale"] == b["device_time_scale"]
    assert (a["profile_source"], b["profile_source"]) == ("measured", "cached")
    other, _ = rlpipe_run(tmp_path, "other", *SMALL, "--iterations", "10", "--device-time-scale",
                          str(2 * a["device_time_scale"]), env=fresh_cache)
    same = write_report([str(tmp_path / "first.jsonl"), str(tmp_path / "second.jsonl")], tmp_path / "same")
    different = write_report([str(tmp_path / "first.jsonl"), str(tmp_path / "other.jsonl")], tmp_path / "different")
    assert "emulated different devices" not in same[0].read_text()
    assert "emulated different devices" in different[0].read_text()
    assert f"profile {a['profile_id']}" in same[0].read_text()


@pytest.mark.slow
def test_a_wall_time_budget_meets_the_same_stretch_of_the_scenario_whatever_the_speed(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,device,slowdown\n20,1,2.0\n")
    runs = {}
    for name, scale in (("fast", "6"), ("slow", "24")):
        runs[name], _ = rlpipe_run(tmp_path, name, *SMALL, "--duration-s", "3", "--device-time-scale", scale,
                                   "--interference", f"trace:{trace}", "--time-scale", "10")
    iterations = {name: records[-1]["iteration"] for name, records in runs.items()}
    assert iterations["fast"] > 1.5 * iterations["slow"]  # the slow devices ran fewer iterations ...
    for records in runs.values():  # ... over the same 3 s, so the same 30 s of the scenario
        assert sum(r["interval_s"] for r in records) == pytest.approx(3.0, abs=0.6)
        assert records[-1]["trace_time_s"] == pytest.approx(30.0, abs=6.0)
        # both met the change at 20 s: the slowdown averaged over the last interval (part of it before 20 s
        # where a slow interval is long), and 1.0 in every interval that ended before it
        assert 1.0 < records[-1]["injected_slowdown"][1] <= 2.0
        assert all(r["injected_slowdown"][1] == 1.0 for r in records if r["trace_time_s"] < 19.0)


@pytest.mark.slow
def test_a_resumed_run_says_where_it_starts_counts_what_it_did_and_keeps_its_devices(tmp_path):
    checkpoints = tmp_path / "ckpt"
    first, _ = rlpipe_run(tmp_path, "first", *SMALL, "--iterations", "20", "--checkpoint-every", "20",
                          "--checkpoint-dir", str(checkpoints))
    log = tmp_path / "second.jsonl"
    result = run_command(*SMALL, "--iterations", "30", "--resume", str(checkpoints), "--log", str(log))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("rlpipe run:")]
    assert "rlpipe run: resumed from iteration 20" in lines
    assert run_summary(result.stdout).startswith("rlpipe run: 10 iterations (iterations 20-30)")
    before, after = first[0]["run"], read_log(log)[0]["run"]
    # a busy host may have adapted the default scale: a record says so when it changes
    last_scale = [before["device_time_scale"], *(r["device_time_scale"] for r in first if "device_time_scale" in r)][-1]
    assert after["profile_id"] == before["profile_id"] and after["device_time_scale"] == last_scale
    assert after["first_iteration"] == 20 and json.loads((checkpoints / "latest.json").read_text())["iteration"] == 20


@pytest.mark.slow
def test_the_default_scale_grows_when_the_machine_overruns_it_and_a_given_one_never_does(tmp_path):
    model = ["--model", "user_models:slows_after_profiling", "--stages", "2", "--microbatches", "4", "--batch",
             "16", "--interval", "5", "--device-time", "emulated", "--iterations", "30"]
    log = tmp_path / "adapting.jsonl"
    result = run_command(*model, "--log", str(log))
    assert result.returncode == 0, result.stderr[-2000:]
    records = read_log(log)
    scales = [r["device_time_scale"] for r in records if "device_time_scale" in r]
    assert scales and scales == sorted(scales) and scales[0] == records[0]["run"]["device_time_scale"] * 1.25
    assert "the devices now run" in result.stdout
    fixed, _ = rlpipe_run(tmp_path, "fixed", *model, "--device-time-scale", "1")
    assert not any("device_time_scale" in r for r in fixed)  # a given scale stays: compared runs need it
