"""The command line end to end, as a user runs it: real subprocesses, real exit codes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def rlpipe(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rlpipe.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})


def test_partition_json():
    result = rlpipe("partition", "--profile", "transformer16", "--stages", "4", "--speeds", "1,1,0.5,1", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["boundaries"][0] == 0 and len(plan["boundaries"]) == 4
    assert plan["bottleneck_ms"] == pytest.approx(max(plan["stage_ms"]))
    sizes = [b - a for a, b in zip(plan["boundaries"], plan["boundaries"][1:] + [16])]
    assert sizes[2] < sizes[1]  # the slow device gets fewer layers


def test_simulate_json_and_table():
    args = ["simulate", "--profile", "transformer16", "--boundaries", "0,5,9,13", "--schedule", "gpipe",
            "--microbatches", "8", "--slowdown", "1,1,2,1"]
    result = rlpipe(*args, "--json")
    assert result.returncode == 0, result.stderr
    timing = json.loads(result.stdout)
    assert timing["iteration_ms"] > 0 and len(timing["stages"]) == 4
    assert set(timing["stages"][0]) == {"compute_ms", "comm_ms", "idle_ms"}
    assert "iteration" in rlpipe(*args).stdout


def test_profile_a_user_model_and_partition_it(tmp_path):
    out = tmp_path / "user.json"
    result = rlpipe("profile", "--model", "user_models:tiny", "--repeats", "1", "-o", str(out))
    assert result.returncode == 0, result.stderr
    profile = json.loads(out.read_text())
    assert len(profile["layers"]) == 5 and profile["microbatch_size"] == 4
    assert rlpipe("partition", "--profile", str(out), "--stages", "2").returncode == 0


def test_scenario_writes_a_replayable_trace(tmp_path):
    out = tmp_path / "trace.csv"
    result = rlpipe("scenario", "--name", "heavy", "--devices", "4", "--duration-s", "600", "--seed", "1",
                    "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text().startswith("time_s,device,slowdown\n")


@pytest.mark.parametrize("args, message", [
    (["partition", "--profile", "transformer16", "--stages", "40"], "more stages than"),
    (["partition", "--profile", "missing.json", "--stages", "2"], "missing.json"),
    (["simulate", "--profile", "transformer16", "--boundaries", "0,20"], "boundaries"),
    (["simulate", "--profile", "transformer16", "--boundaries", "0,8", "--slowdown", "1,x"], "--slowdown"),
    (["scenario", "--name", "stormy", "--devices", "2", "-o", "x.csv"], "stormy"),
    (["profile", "--model", "nowhere.mod:fn", "-o", "x.json"], "cannot import"),
    (["partition", "--profile", "transformer16", "--stages", "4", "--memory-gb", "0.001"], "memory"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    result = rlpipe(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_help_explains_every_command():
    for command in ["profile", "partition", "simulate", "scenario"]:
        result = rlpipe(command, "--help")
        assert result.returncode == 0 and "--" in result.stdout


def test_partition_takes_slowdowns_like_traces_do():
    by_slowdown = rlpipe("partition", "--profile", "transformer16", "--stages", "4", "--slowdown", "1,1,2,1", "--json")
    by_speed = rlpipe("partition", "--profile", "transformer16", "--stages", "4", "--speeds", "1,1,0.5,1", "--json")
    assert by_slowdown.returncode == 0, by_slowdown.stderr
    assert json.loads(by_slowdown.stdout)["boundaries"] == json.loads(by_speed.stdout)["boundaries"]
    refused = rlpipe("partition", "--profile", "transformer16", "--stages", "4", "--slowdown", "1,1,0.5,1")
    assert refused.returncode == 2 and ">= 1" in refused.stderr


def test_free_links_are_said_to_be_free():
    result = rlpipe("simulate", "--profile", "transformer16", "--boundaries", "0,8")
    assert result.returncode == 0 and "infinite bandwidth" in result.stdout
    priced = rlpipe("simulate", "--profile", "transformer16", "--boundaries", "0,8", "--bandwidth-gbps", "1")
    assert "infinite bandwidth" not in priced.stdout


def test_help_answers_what_a_new_user_asks():
    evaluate = " ".join(rlpipe("evaluate", "--help").stdout.split())
    assert "2-8" in evaluate and "transformer16" in evaluate
    train = " ".join(rlpipe("train", "--help").stdout.split())
    assert "optional" in train and "default" in train


def test_heuristics_evaluate_on_more_stages_than_ppo_knows(tmp_path):
    result = rlpipe("evaluate", "--policies", "static,greedy", "--scenarios", "heavy", "--episodes", "1",
                    "--stages", "10", "--duration-s", "300", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    refused = rlpipe("evaluate", "--policies", "static,ppo", "--scenarios", "heavy", "--episodes", "1",
                     "--stages", "10", "--duration-s", "300", "--out", str(tmp_path / "out"))
    assert refused.returncode == 2 and "up to 8 stages" in refused.stderr and "s_max" not in refused.stderr


def test_a_trace_for_a_device_the_pipeline_lacks_is_an_error_on_its_own_line(tmp_path):
    trace = tmp_path / "wide.csv"
    trace.write_text("time_s,device,slowdown\n10,5,2.0\n")
    result = rlpipe("evaluate", "--policies", "static", "--scenarios", f"none,trace:{trace}", "--episodes", "1",
                    "--stages", "4", "--duration-s", "300", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    last = result.stderr.splitlines()[-1]
    assert last.startswith("rlpipe evaluate: error:") and "device 5" in last and "--stages" in last


def test_a_trace_scenario_names_its_timeline_after_the_file(tmp_path):
    trace = tmp_path / "my-trace.csv"
    trace.write_text("time_s,device,slowdown\n10,1,2.0\n")
    result = rlpipe("evaluate", "--policies", "static", "--scenarios", f"trace:{trace}", "--episodes", "1",
                    "--stages", "2", "--duration-s", "300", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "timeline_trace-my-trace.png").exists()
