"""The live runtime on real gloo process groups: training, repartition correctness, atomicity, faults."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parents[1]


def rlpipe_run(tmp_path, name, *args, timeout=240):
    log = tmp_path / f"{name}.jsonl"
    params = tmp_path / f"{name}.pt"
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", *args, "--log", str(log),
                             "--save-params", str(params)], capture_output=True, text=True, timeout=timeout,
                            env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return records, torch.load(params, weights_only=True)


def losses(records):
    return [loss for record in records for loss in record["losses"]]


def assert_same_training(a, b, tolerance=1e-5):
    (records_a, params_a), (records_b, params_b) = a, b
    la, lb = losses(records_a), losses(records_b)
    assert len(la) == len(lb) and all(abs(x - y) <= tolerance for x, y in zip(la, lb)), (la, lb)
    assert params_a.keys() == params_b.keys()
    for key in params_a:
        assert torch.allclose(params_a[key], params_b[key], atol=tolerance, rtol=0), key


# 8 layers; every few iterations the boundaries move, both ways, and the tensors between stages
# change shape (the transformer's embedding and head, the cnn's down-sampling layers).
PLANS = {
    2: ["3:0,2", "6:0,6", "9:0,4", "12:0,1"],
    4: ["3:0,1,2,3", "6:0,3,5,7", "9:0,2,4,6", "12:0,4,5,6"],
}


@pytest.mark.slow
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_repartitions_reproduce_the_run_without_them(tmp_path, stages, schedule):
    common = ["--model", "cnn", "--layers", "8", "--stages", str(stages), "--schedule", schedule,
              "--microbatches", "4", "--batch", "8", "--iterations", "15", "--interval", "3",
              "--boundaries", {2: "0,4", 4: "0,2,4,6"}[stages]]
    baseline = rlpipe_run(tmp_path, "baseline", *common)
    moving = rlpipe_run(tmp_path, "moving", *common, "--repartition-at", *PLANS[stages])
    assert_same_training(baseline, moving)
    repartitions = [r["repartition"] for r in moving[0] if "repartition" in r]
    assert len(repartitions) == 4 and all(r["committed"] and r["bytes_moved"] > 0 for r in repartitions)
    assert moving[0][-1]["boundaries"] == [int(b) for b in PLANS[stages][-1].split(":")[1].split(",")]


@pytest.mark.slow
def test_dropping_moved_optimizer_state_breaks_the_comparison(tmp_path):
    common = ["--model", "mlp", "--layers", "6", "--stages", "2", "--microbatches", "4", "--batch", "16",
              "--iterations", "12", "--interval", "3", "--boundaries", "0,3", "--lr", "0.01"]
    baseline = rlpipe_run(tmp_path, "baseline", *common)
    lossy = rlpipe_run(tmp_path, "lossy", *common, "--repartition-at", "3:0,1", "6:0,5",
                       "--drop-moved-optimizer-state")
    with pytest.raises(AssertionError):
        assert_same_training(baseline, lossy)


@pytest.mark.slow
def test_a_failed_transfer_keeps_the_old_partition_everywhere(tmp_path):
    common = ["--model", "mlp", "--layers", "6", "--stages", "3", "--microbatches", "4", "--batch", "16",
              "--iterations", "9", "--interval", "3", "--boundaries", "0,2,4"]
    baseline = rlpipe_run(tmp_path, "baseline", *common)
    failed = rlpipe_run(tmp_path, "failed", *common, "--repartition-at", "3:0,1,4", "--fail-transfer-at", "3")
    attempt = failed[0][1]["repartition"]
    assert not attempt["committed"] and failed[0][-1]["boundaries"] == [0, 2, 4]
    assert_same_training(baseline, failed)


@pytest.mark.slow
def test_user_model_trains_through_the_factory_contract(tmp_path):
    records, params = rlpipe_run(tmp_path, "user", "--model", "user_models:tiny", "--stages", "2",
                                 "--microbatches", "2", "--batch", "8", "--iterations", "6", "--interval", "3",
                                 "--repartition-at", "3:0,3")
    assert records[-1]["boundaries"] == [0, 3] and len(params) == 6
    stage = records[0]["stages"][0]
    assert {"compute_ms", "comm_ms", "idle_ms", "num_layers", "memory_bytes", "device_load"} <= set(stage)
    assert records[0]["throughput_samples_s"] > 0 and records[0]["loss"] > 0


@pytest.mark.parametrize("args, message", [
    (["--model", "no_such_pkg.mod:factory", "--stages", "2"], "cannot import"),
    (["--model", "mlp", "--layers", "4", "--stages", "6", "--microbatches", "8"], "more stages than"),
    (["--model", "mlp", "--layers", "6", "--stages", "2", "--boundaries", "0,9"], "--boundaries"),
    (["--model", "mlp", "--layers", "6", "--stages", "2", "--boundaries", "0,2,4"], "the run has 2"),
    (["--model", "mlp", "--stages", "4", "--microbatches", "2", "--batch", "8"], "1F1B needs"),
])
def test_bad_input_is_refused_before_any_process_starts(args, message):
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", *args], capture_output=True, text=True,
                            timeout=60, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    leftovers = subprocess.run(["pgrep", "-f", "rlpipe.runtime"], capture_output=True, text=True).stdout
    assert leftovers.strip() == ""


@pytest.mark.slow
def test_torchrun_with_two_launchers_trains_like_rlpipe_run(tmp_path):
    common = ["--model", "mlp", "--layers", "6", "--stages", "2", "--microbatches", "4", "--batch", "16",
              "--iterations", "9", "--interval", "3", "--boundaries", "0,3", "--repartition-at", "3:0,2", "6:0,4"]
    single = rlpipe_run(tmp_path, "single", *common)
    from rlpipe.runtime.launch import free_port

    port = str(free_port())
    log, params = tmp_path / "torchrun.jsonl", tmp_path / "torchrun.pt"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    nodes = [subprocess.Popen([torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                               "--master-addr", "127.0.0.1", "--master-port", port, "-m", "rlpipe.runtime", *common,
                               "--log-file", str(log), "--save-params", str(params)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
             for node in (0, 1)]
    for node in nodes:
        _, stderr = node.communicate(timeout=240)
        assert node.returncode == 0, stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert_same_training(single, (records, torch.load(params, weights_only=True)))
    assert records[-1]["boundaries"] == [0, 4]


def _children_with_rank(parent_pid: int) -> dict[int, int]:
    """{rank: pid} of the stage processes a launcher started."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, StopIteration):
            continue
        if ppid == parent_pid:
            for item in environ:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(entry.name)
    return found


@pytest.mark.slow
def test_a_dead_stage_ends_the_run_naming_its_rank(tmp_path):
    import os
    import signal
    import time

    common = ["--model", "mlp", "--layers", "6", "--stages", "3", "--microbatches", "4", "--batch", "16",
              "--interval", "10", "--boundaries", "0,2,4", "--checkpoint-every", "10",
              "--checkpoint-dir", str(tmp_path / "ckpt")]
    launcher = subprocess.Popen([sys.executable, "-m", "rlpipe.cli", "run", *common, "--iterations", "100000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 60
    while len(children := _children_with_rank(launcher.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(children) == 3
    while not (tmp_path / "ckpt" / "latest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # let training reach its first checkpoint
    os.kill(children[1], signal.SIGKILL)
    killed_at = time.monotonic()
    _, stderr = launcher.communicate(timeout=30)
    assert time.monotonic() - killed_at < 10
    assert launcher.returncode == 1 and "rank 1" in stderr
    time.sleep(0.5)
    for pid in children.values():
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    # the last checkpoint survived and resumes
    reached = json.loads((tmp_path / "ckpt" / "latest.json").read_text())["iteration"]
    assert reached >= 10
    records, _ = rlpipe_run(tmp_path, "resumed", *common, "--iterations", str(reached + 10), "--resume",
                            str(tmp_path / "ckpt"))
    assert records[-1]["iteration"] == reached + 10


@pytest.mark.slow
def test_resume_continues_with_the_same_losses(tmp_path):
    common = ["--model", "mlp", "--layers", "6", "--stages", "2", "--microbatches", "4", "--batch", "16",
              "--interval", "2", "--boundaries", "0,3", "--repartition-at", "2:0,2", "6:0,4"]
    whole = rlpipe_run(tmp_path, "whole", *common, "--iterations", "8")
    checkpoints = tmp_path / "ckpt"
    first = rlpipe_run(tmp_path, "first", *common, "--iterations", "4", "--checkpoint-every", "2",
                       "--checkpoint-dir", str(checkpoints))
    assert json.loads((checkpoints / "latest.json").read_text())["iteration"] == 4
    second = rlpipe_run(tmp_path, "second", *common, "--iterations", "8", "--resume", str(checkpoints))
    assert_same_training(whole, (first[0] + second[0], second[1]))
