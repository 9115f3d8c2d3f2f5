"""The GPU check (``make gpu-check``): stages on ``cuda:LOCAL_RANK`` with NCCL train with live
repartitions exactly as without them, and a PPO controller runs. Skipped without two GPUs: NCCL puts one
rank on each GPU (two ranks on one GPU are refused), and gloo moves only CPU tensors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                                  reason="needs CUDA with at least two GPUs")]
TESTS = Path(__file__).resolve().parents[1]


def run(tmp_path, name, *args):
    log, params = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.pt"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", "--model", "mlp", "--layers", "8",
                             "--stages", "2", "--microbatches", "4", "--batch", "32", "--iterations", "12",
                             "--interval", "3", *args, "--log", str(log), "--save-params", str(params)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in log.read_text().splitlines()], torch.load(params, weights_only=True)


def test_repartitions_on_gpus_reproduce_the_run_without_them(tmp_path):
    still = run(tmp_path, "still", "--boundaries", "0,4")
    moving = run(tmp_path, "moving", "--boundaries", "0,4", "--repartition-at", "3:0,2", "6:0,6", "9:0,3")
    losses = [[loss for r in records for loss in r["losses"]] for records, _ in (still, moving)]
    assert all(abs(a - b) <= 1e-5 for a, b in zip(*losses, strict=True))
    for key in still[1]:
        assert torch.allclose(still[1][key], moving[1][key], atol=1e-5, rtol=0)
    stages = [s for r in moving[0] for s in r["stages"]]
    assert all(s["resident_param_bytes"] > 0 for s in stages)
    assert all(0 <= s["gpu_utilization"] <= 100 for s in stages if "gpu_utilization" in s)  # NVML's, if installed


def test_a_ppo_controller_runs_on_gpus(tmp_path):
    records, _ = run(tmp_path, "ppo", "--policy", "ppo", "--interference", "heavy", "--time-scale", "60")
    assert records[-1]["iteration"] == 12 and all("decision" in r for r in records[:-1])
