"""The live runtime on real gloo process groups: training, repartition correctness and atomicity."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from live_runs import ENV, assert_same_training, losses, read_log, rlpipe_run, run_watching_stages

# 8 layers; every few iterations the boundaries move, both ways, and the tensors between stages
# change shape (the transformer's embedding and head, the cnn's down-sampling layers).
PLANS = {
    2: ["3:0,2", "6:0,6", "9:0,4", "12:0,1"],
    4: ["3:0,1,2,3", "6:0,3,5,7", "9:0,2,4,6", "12:0,4,5,6"],
}


@pytest.mark.slow
# each schedule once, 1f1b at 4 stages (its warm-up differs from stage to stage); the user's-loop tests run
# both schedules, moving layers, at 2 and at 4 stages (test_pipeline_api.py)
@pytest.mark.parametrize("stages, schedule", [(2, "gpipe"), (4, "1f1b")])
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
    before, after = losses(baseline[0]), losses(lossy[0])
    assert len(before) == len(after) == 12 and before[:3] == after[:3]  # the same run until the first move
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-4  # then the lost Adam state shows in the losses


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
    result, stages = run_watching_stages(*args)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert stages == set()  # this launcher started no stage process


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
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for node in (0, 1)]
    for node in nodes:
        _, stderr = node.communicate(timeout=240)
        assert node.returncode == 0, stderr[-3000:]
    records = read_log(log)
    assert_same_training(single, (records, torch.load(params, weights_only=True)))
    assert records[-1]["boundaries"] == [0, 4]
