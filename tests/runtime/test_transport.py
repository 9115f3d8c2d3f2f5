"""The transport (rlpipe/runtime/transport.py): the choice for each host, the host boundary's copies and
their accounting, and, on real gloo processes, a pipeline whose every tensor between ranks goes through
host copies (as the host-staged transport does on a shared GPU) training exactly as one process would."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from live_runs import ENV as LIVE_ENV
from live_runs import rlpipe_run
from torch import nn

from rlpipe.errors import InputError
from rlpipe.runtime.device_time import DeviceClock
from rlpipe.runtime.transport import HostStaged, choose_transport, staged_loss

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "scripts"))
import own_loop  # noqa: E402

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


# --- the choice ------------------------------------------------------------------------------------

def test_auto_gives_each_process_its_own_gpu_where_there_are_enough_and_shares_them_where_not():
    own = choose_transport("auto", gpus=4, local_processes=4, local_rank=3)
    assert (own.name, own.backend, str(own.compute), str(own.wire), own.shared_device) == (
        "nccl", "nccl", "cuda:3", "cuda:3", False)
    shared = choose_transport("auto", gpus=1, local_processes=4, local_rank=3)
    assert (shared.name, shared.backend, str(shared.compute), str(shared.wire), shared.shared_device) == (
        "host-staged", "gloo", "cuda:0", "cpu", True)
    assert str(choose_transport("auto", gpus=2, local_processes=4, local_rank=3).compute) == "cuda:1"
    cpu = choose_transport("auto", gpus=0, local_processes=4, local_rank=1)
    assert (cpu.name, str(cpu.compute), cpu.staged) == ("gloo", "cpu", False)


def test_a_forced_choice_is_kept_or_refused_by_name():
    forced = choose_transport("host-staged", gpus=4, local_processes=4, local_rank=2)
    assert (forced.name, str(forced.compute), forced.shared_device, forced.staged) == (
        "host-staged", "cuda:2", False, True)
    with pytest.raises(InputError, match="4 stage processes on this host and 1 GPU.*host-staged shares them"):
        choose_transport("nccl", gpus=1, local_processes=4, local_rank=0)
    for requested in ("nccl", "host-staged"):
        with pytest.raises(InputError, match=f"--transport {requested}: needs a GPU"):
            choose_transport(requested, gpus=0, local_processes=2, local_rank=0)
    with pytest.raises(InputError, match="expected one of auto, nccl, host-staged"):
        choose_transport("infiniband", gpus=1, local_processes=1, local_rank=0)


def test_rlpipe_run_refuses_a_gpu_transport_on_a_host_without_one_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", "--model", "mlp", "--stages", "2",
                             "--transport", "nccl", "--iterations", "2"], capture_output=True, text=True,
                            env=LIVE_ENV, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == ["rlpipe run: error: --transport nccl: needs a GPU, and this host "
                                                  "has none (auto runs on the CPU)"]


# --- the host boundary -------------------------------------------------------------------------------

def test_the_host_boundary_copies_both_ways_and_keeps_the_gradients():
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    clock = DeviceClock("real")
    staged = HostStaged(layers, torch.device("cpu"), last=False, clock=clock)
    inputs = torch.randn(5, 4, requires_grad=True)
    plain_inputs = inputs.detach().clone().requires_grad_()
    out = staged(inputs)
    expected = layers(plain_inputs)
    assert torch.equal(out, expected) and out.data_ptr() != expected.data_ptr()  # a copy of the same values
    grads = torch.autograd.grad(out.sum(), [inputs, *layers.parameters()])
    plain = torch.autograd.grad(expected.sum(), [plain_inputs, *layers.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(grads, plain, strict=True))
    assert clock.staging_s > 0  # the copies in and out, and the gradient's copy back
    last = HostStaged(layers, torch.device("cpu"), last=True, clock=clock)
    loss = staged_loss(nn.functional.cross_entropy)(last(inputs), torch.tensor([0, 1, 2, 0, 1]))
    assert loss.ndim == 0 and loss.requires_grad


def test_copies_across_the_host_boundary_are_not_device_time(monkeypatch):
    """A chunk that spends 40 ms copying and emulates 30 ms of device work: the clock asks for a sleep to
    the end of 40 + 30 ms and counts no copy as compute."""
    real_sleep, asked = time.sleep, []
    monkeypatch.setattr(time, "sleep", asked.append)
    clock = DeviceClock("emulated")
    clock.set_stage(forward_ms=30.0, backward_ms=60.0)

    def chunk() -> None:
        real_sleep(0.04)
        clock.staging_s += 0.04

    start = time.perf_counter()
    clock.timed(chunk, False, 0)
    copying_s = time.perf_counter() - start - 0.04  # what the copy took beyond its 40 ms (a busy host's delay)
    assert len(asked) == 1 and 0.03 - copying_s - 0.01 < asked[0] <= 0.03  # the device time left after the copies
    assert clock.compute_s == pytest.approx(0.03) and clock.overran == 0  # the emulated 30 ms, none of the copy's


# --- a pipeline staged through the host, on real gloo processes -----------------------------------------

def own_loop_run(tmp_path, processes: int, *options: str) -> dict:
    out = tmp_path / f"staged-{processes}.json"
    result = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node",
                             str(processes), str(TESTS / "scripts" / "own_loop.py"),
                             str(out), "adamw", "1f1b", "staged", *options], capture_output=True, text=True,
                            timeout=300, env={**LIVE_ENV, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("processes, options", [(2, ["3:0,2", "6:0,5", "9:0,3"]),
                                                (4, ["dp=2", "3:0,2", "5:split=3,5", "7:0,5"])])
def test_a_pipeline_staged_through_the_host_trains_like_one_process(tmp_path, processes, options):
    reference = own_loop.single_process("adamw")
    found = own_loop_run(tmp_path, processes, *options)
    assert found["transport"] == "host-staged"
    assert max(abs(a - b) for a, b in zip(found["losses"], reference, strict=True)) <= 1e-5
    assert found["seen"][-1]["boundaries"] == [int(b) for b in options[-1].split(":")[1].split(",")]
    assert all(ms > 0 for interval in found["comm_ms"] for ms in interval)  # the copies count as communication


@pytest.mark.slow
def test_the_log_names_the_transport(tmp_path):
    records, _ = rlpipe_run(tmp_path, "cpu", "--model", "mlp", "--stages", "2", "--iterations", "2",
                            "--interval", "2")
    header = records[0]["run"]
    assert (header["transport"], header["device"], header["oversubscribed"]) == ("gloo", "cpu", False)
    assert all(s["comm_ms"] == 0 for s in records[0]["stages"])  # nothing staged on the CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU: make gpu-check checks it")
def test_the_gpu_check_says_in_one_line_that_there_is_no_gpu():
    result = subprocess.run([sys.executable, "-m", "bench.gpu_check"], capture_output=True, text=True, timeout=120,
                            cwd=TESTS.parent, env=LIVE_ENV)
    assert result.returncode == 0 and len(result.stdout.strip().splitlines()) == 1
    assert result.stdout.startswith("gpu-check: no CUDA GPU on this host")

