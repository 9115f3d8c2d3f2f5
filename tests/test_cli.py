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
