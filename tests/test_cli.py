"""The command line end to end, as a user runs it: real subprocesses, real exit codes."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from live_runs import ENV

TESTS = Path(__file__).parent


def rlpipe(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rlpipe.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=ENV)


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
    (["profile", "--model", "mlp", "--repeats", "0", "-o", "x.json"], "--repeats 0"),
    (["partition", "--profile", "transformer16", "--stages", "4", "--memory-gb", "0.001"], "memory"),
    (["train", "--vec-env", "threads", "--out", "out"], "vec_env: dummy, subproc, split"),
    (["train", "--vec-env", "subproc", "--vec-workers", "0", "--out", "out"], "vec_workers, by default one"),
    (["train", "--vec-env", "split", "--vec-workers", "1", "--out", "out"], "split: 2 to 4 shards"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    result = rlpipe(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_help_explains_every_command(capsys):
    from rlpipe.cli import build_parser, commands, main

    build_parser()
    assert set(commands) >= {"profile", "partition", "simulate", "scenario", "evaluate", "train", "run", "report",
                             "calibrate", "demo"}
    for name, parser in commands.items():
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        shown = " ".join(capsys.readouterr().out.split())
        assert exit_info.value.code == 0 and shown.startswith(f"usage: rlpipe {name}")
        for action in parser._actions:  # every option is listed, with words that say what it does
            if action.help != argparse.SUPPRESS and action.option_strings:
                assert action.option_strings[0] in shown and len(action.help or "") > 10, (name, action.dest)


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


def test_a_missing_policy_folder_names_the_files_training_writes(capsys):
    from rlpipe.cli import main

    assert main(["run", "--model", "mlp", "--stages", "2", "--policy", "ppo:out/does-not-exist"]) == 2
    stderr = capsys.readouterr().err
    assert "policy.pt and policy.json" in stderr and "does-not-exist.pt" not in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_a_json_file_that_is_no_run_log_is_named_so(tmp_path, capsys):
    from rlpipe.cli import main
    from rlpipe.profile import load_profile

    load_profile("mlp16").save(tmp_path / "profile.json")
    assert main(["report", str(tmp_path / "profile.json"), "-o", str(tmp_path / "report")]) == 2
    stderr = capsys.readouterr().err
    assert "a JSON document, not a run log" in stderr and "not JSON" not in stderr


def test_a_mistyped_option_shows_the_usage_of_its_command(capsys):
    from rlpipe.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--polcy", "threshold", "--model", "mlp", "--stages", "2"])
    stderr = capsys.readouterr().err
    assert exit_info.value.code == 2 and stderr.startswith("usage: rlpipe run")
    assert "unrecognized arguments: --polcy threshold" in stderr


def test_a_failing_factory_is_named_with_the_users_own_traceback(tmp_path):
    result = rlpipe("profile", "--model", "user_models:raises", "-o", str(tmp_path / "p.json"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert lines[0] == ("rlpipe profile: error: --model 'user_models:raises': the factory raised ValueError: "
                        "the checkpoint path is wrong")
    assert "user_models.py" in result.stderr and "_make_layers" in result.stderr
    assert "rlpipe/" not in result.stderr.replace("rlpipe profile", "")  # none of rlpipe's own frames


def test_calibrate_refuses_emulated_logs_unless_asked(tmp_path, capsys):
    from synthetic_logs import synthetic_run

    from rlpipe.cli import main

    records = synthetic_run(0, intervals=60)
    records[0]["run"]["device_time"] = "emulated"
    log = tmp_path / "emulated.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["calibrate", str(log), "-o", str(tmp_path / "c.json")]) == 2
    stderr = capsys.readouterr().err
    assert "emulated device time" in stderr and "--allow-emulated" in stderr and not (tmp_path / "c.json").exists()
    assert main(["calibrate", str(log), "-o", str(tmp_path / "c.json"), "--allow-emulated"]) == 0
    assert (tmp_path / "c.json").exists()


@pytest.mark.slow
def test_the_demo_runs_its_comparison_in_a_few_seconds_a_policy(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli", "demo", "--duration-s", "4", "--policies",
                             "static,threshold", "--out", str(out)], capture_output=True, text=True, timeout=300,
                            env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert "static" in summary and "threshold" in summary and (out / "timeline.png").stat().st_size > 10_000
    for policy in ("static", "threshold"):
        records = [json.loads(line) for line in (out / f"{policy}.jsonl").read_text().splitlines()]
        assert records[0]["run"]["policy"] == policy and records[-1]["wall_s"] >= 4

