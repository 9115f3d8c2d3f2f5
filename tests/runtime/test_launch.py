"""`rlpipe run` as a new user meets it: runs that end cleanly, failures named right, start-up refusals."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from live_runs import ENV as LIVE_ENV
from live_runs import run_summary

TESTS = Path(__file__).resolve().parents[1]
RLPIPE = str(Path(sys.executable).with_name("rlpipe"))  # the console script a user runs
ENV = LIVE_ENV
SMALL = ["--model", "mlp", "--layers", "6", "--stages", "2", "--microbatches", "4", "--batch", "16"]


def rlpipe_run(*args, cwd=None, timeout=180):
    return subprocess.run([RLPIPE, "run", *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=timeout)


def records(log):
    return [json.loads(line) for line in Path(log).read_text().splitlines()]


@pytest.mark.slow
def test_a_run_of_one_interval_ends_cleanly_and_logs_no_decision(tmp_path):
    log = tmp_path / "run.jsonl"
    result = rlpipe_run(*SMALL, "--iterations", "10", "--interval", "10", "--policy", "static", "--log", str(log))
    assert result.returncode == 0, result.stderr[-2000:]
    (record,) = records(log)
    assert record["iteration"] == 10 and "decision" not in record
    assert run_summary(result.stdout).startswith("rlpipe run: 10 iterations")


@pytest.mark.slow
def test_resuming_with_one_interval_left_ends_cleanly(tmp_path):
    common = [*SMALL, "--interval", "10", "--policy", "dynpipe", "--checkpoint-every", "30",
              "--checkpoint-dir", str(tmp_path / "ckpt"), "--log", str(tmp_path / "run.jsonl")]
    assert rlpipe_run(*common, "--iterations", "30").returncode == 0
    result = rlpipe_run(*common, "--iterations", "40", "--resume", str(tmp_path / "ckpt"))
    assert result.returncode == 0, result.stderr[-2000:]
    logged = records(tmp_path / "run.jsonl")
    assert [r["iteration"] for r in logged] == [10, 20, 30, 40]
    assert all("decision" in r for r in logged[:2]) and "decision" not in logged[-1]


@pytest.mark.slow
def test_the_rank_that_failed_first_is_named(tmp_path):
    result = rlpipe_run("--model", "user_models:fails_on_the_last_stage", "--stages", "3", "--microbatches", "4",
                        "--batch", "16", "--iterations", "20", "--interval", "2", "--boundaries", "0,2,3")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "rank 2 failed first" in last and "the loss failed on purpose" in last, last


@pytest.mark.slow
def test_a_folder_named_rlpipe_in_the_working_directory_does_not_shadow_the_package(tmp_path):
    (tmp_path / "rlpipe").mkdir()
    (tmp_path / "rlpipe" / "__init__.py").write_text("raise ImportError('the shadowing clone was imported')\n")
    result = rlpipe_run(*SMALL, "--iterations", "4", "--interval", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_a_model_file_given_by_path_trains(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mlp6.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef build():\n"
        "    layers = [nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3), nn.Identity()]\n"
        "    return layers, torch.randn(4, 8), torch.randint(0, 3, (4,)), nn.functional.cross_entropy\n")
    log = tmp_path / "run.jsonl"
    result = rlpipe_run("--model", "models/mlp6.py:build", "--stages", "2", "--microbatches", "2", "--batch", "8",
                        "--iterations", "4", "--interval", "2", "--log", str(log), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert records(log)[-1]["iteration"] == 4


def test_the_structural_error_comes_first():
    result = rlpipe_run("--model", "mlp", "--layers", "4", "--stages", "6", "--microbatches", "2", "--batch", "8")
    assert result.returncode == 2 and "more stages than the model's 4 layers" in result.stderr
    assert "1F1B" not in result.stderr


def test_run_help_states_its_defaults_and_every_preset():
    text = subprocess.run([RLPIPE, "run", "--help"], capture_output=True, text=True, env=ENV).stdout
    text = " ".join(text.split())
    assert "(default 10)" in text and "none" in text and "jitter" in text and "(default 8)" in text


def test_a_resume_with_nothing_left_to_run_is_refused_before_any_process_starts(tmp_path, capsys):
    from rlpipe.cli import main

    (tmp_path / "iter-00000030").mkdir()
    meta = {"model": "mlp", "layers": None, "schedule": "1f1b", "microbatches": 4, "batch": 16, "seed": 0,
            "boundaries": [0, 3], "iteration": 30}
    (tmp_path / "iter-00000030" / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "latest.json").write_text(json.dumps({"checkpoint": "iter-00000030", "iteration": 30}))
    assert main(["run", *SMALL[:2], *SMALL[4:], "--iterations", "30", "--resume", str(tmp_path)]) == 2
    stderr = capsys.readouterr().err
    assert "at iteration 30" in stderr and "leaves nothing to run" in stderr and len(stderr.splitlines()) == 1


def test_a_profile_of_another_layer_count_is_refused(tmp_path, capsys):
    from rlpipe.cli import main

    assert main(["run", *SMALL, "--profile", "mlp16"]) == 2  # 16 profiled layers, a 6-layer model
    stderr = capsys.readouterr().err
    assert "--profile mlp16: 16 layers, the model has 6" in stderr and len(stderr.splitlines()) == 1
