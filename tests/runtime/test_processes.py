"""Stage processes (rlpipe/runtime/processes.py): which rank the launcher names when a run fails, from
the stages' reports and heartbeats, and live runs where a stage dies or stops responding."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from live_runs import alive, children_with_rank, rlpipe_run, start_run

from rlpipe.runtime.migration import HOLD_IN_FLIGHT_ENV
from rlpipe.runtime.processes import HEARTBEAT_S, first_failure


def report(folder: Path, rank: int, error: str, at: float) -> None:
    (folder / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "time": at, "error": error}))


def beat(folder: Path, rank: int, age_s: float) -> None:
    path = folder / f"heartbeat{rank}"
    path.touch()
    os.utime(path, (time.time() - age_s, time.time() - age_s))


def test_a_stage_killed_by_a_signal_is_the_cause(tmp_path):
    report(tmp_path, 0, "RuntimeError: connection closed by peer", time.time())
    assert first_failure(tmp_path, [(2, signal.SIGKILL)]) == (2, "killed by SIGKILL")


def test_the_earliest_report_is_the_cause(tmp_path):
    report(tmp_path, 1, "ValueError: bad loss", 100.0)
    report(tmp_path, 0, "RuntimeError: connection closed by peer", 100.5)
    assert first_failure(tmp_path, []) == (1, "ValueError: bad loss")


def test_after_timeouts_the_stage_whose_heartbeat_stopped_is_named(tmp_path):
    for rank in (0, 2, 3):
        report(tmp_path, rank, "DistBackendError: Timed out waiting 5000ms for recv operation", 100.0 + rank)
        beat(tmp_path, rank, 0.2)
    beat(tmp_path, 1, 6.0)
    rank, why = first_failure(tmp_path, [])
    assert rank == 1 and "no heartbeat for 6 s" in why


def test_a_stopped_stage_is_named_after_the_others_stopped_beating_too(tmp_path):
    for rank in (0, 2):  # they timed out, reported and exited a few seconds ago
        report(tmp_path, rank, "DistBackendError: Timed out waiting 5000ms for recv operation", 100.0 + rank)
        beat(tmp_path, rank, 4.0)
    beat(tmp_path, 1, 10.0)
    rank, why = first_failure(tmp_path, [], silent=[1])
    assert rank == 1 and "no heartbeat for 10 s" in why


def test_after_timeouts_a_stage_still_running_without_failing_is_named(tmp_path):
    report(tmp_path, 0, "DistBackendError: Timed out waiting 5000ms for recv operation", 100.0)
    for rank in (0, 1):
        beat(tmp_path, rank, 0.2)  # both beat: rank 1 runs, stuck in its own work
    rank, why = first_failure(tmp_path, [], silent=[1])
    assert rank == 1 and "stopped answering" in why


def test_heartbeats_do_not_override_an_ordinary_error(tmp_path):
    report(tmp_path, 2, "ValueError: bad loss", 100.0)
    beat(tmp_path, 2, 10 * HEARTBEAT_S)
    beat(tmp_path, 0, 0.1)
    assert first_failure(tmp_path, []) == (2, "ValueError: bad loss")


# --- live: a stage that dies, a stage that stops ----------------------------------------------------

COMMON = ["--model", "mlp", "--layers", "6", "--microbatches", "4", "--batch", "16", "--interval", "10",
          "--checkpoint-every", "10"]
PIPELINE = ["--stages", "3", "--boundaries", "0,2,4"]
HYBRID = ["--stages", "2", "--data-parallel", "2"]  # replica 1's stage 0 is rank 2


def start_until_first_checkpoint(tmp_path, layout, *extra, env=None):
    """A long run, started and left to publish its first checkpoint; returns it and its stages' pids."""
    processes = 4 if layout is HYBRID else 3
    launcher = start_run(*COMMON, *layout, "--checkpoint-dir", str(tmp_path / "ckpt"), "--iterations", "100000",
                         *extra, env=env)
    deadline = time.monotonic() + 90
    while len(children := children_with_rank(launcher.pid)) < processes and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(children) == processes
    while not (tmp_path / "ckpt" / "latest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return launcher, children


def assert_ended_and_resumes(tmp_path, launcher, children, named, within_s):
    """The launcher exits within ``within_s`` naming the stage (``named``), no stage process is left, and
    the last checkpoint resumes (on one pipeline of three stages, whatever layout wrote it)."""
    failed_at = time.monotonic()
    _, stderr = launcher.communicate(timeout=within_s + 30)
    assert time.monotonic() - failed_at < within_s, time.monotonic() - failed_at
    last = stderr.strip().splitlines()[-1]
    assert launcher.returncode == 1 and f"{named} failed first" in last, stderr[-2000:]
    assert_nothing_left_and_it_resumes(tmp_path, children)
    return last


def assert_nothing_left_and_it_resumes(tmp_path, children: dict[int, int]) -> None:
    """No stage process outlives the run, and its last checkpoint resumes for ten more iterations."""
    time.sleep(0.5)
    assert alive(children.values()) == []
    reached = json.loads((tmp_path / "ckpt" / "latest.json").read_text())["iteration"]
    records, _ = rlpipe_run(tmp_path, "resumed", *COMMON, *PIPELINE, "--checkpoint-dir", str(tmp_path / "ckpt"),
                            "--iterations", str(reached + 10), "--resume", str(tmp_path / "ckpt"))
    assert records[-1]["iteration"] == reached + 10


@pytest.mark.slow
def test_a_dead_stage_of_a_hybrid_job_ends_the_run_naming_its_replica_stage_and_rank(tmp_path):
    launcher, children = start_until_first_checkpoint(tmp_path, HYBRID)
    os.kill(children[2], signal.SIGKILL)
    assert_ended_and_resumes(tmp_path, launcher, children, "replica 1, stage 0, rank 2", within_s=10)


@pytest.mark.slow
def test_a_stopped_stage_ends_the_run_within_the_timeout_naming_its_rank(tmp_path):
    timeout_s = 5
    launcher, children = start_until_first_checkpoint(tmp_path, PIPELINE, "--timeout-s", str(timeout_s))
    os.kill(children[1], signal.SIGSTOP)
    last = assert_ended_and_resumes(tmp_path, launcher, children, "rank 1", within_s=timeout_s + 10)
    assert "stopped responding" in last


@pytest.mark.slow
def test_a_peer_killed_while_its_layers_are_in_flight_ends_the_run_and_the_checkpoint_survives(tmp_path):
    """Stage 2 gives layer 4 to stage 1 at iteration 12 (after the first checkpoint) and holds its transfer
    in flight: killed then, the survivors end, the launcher names it, and the checkpoint resumes."""
    hold = tmp_path / "in-flight"
    launcher, children = start_until_first_checkpoint(tmp_path, PIPELINE, "--repartition-at", "12:0,2,5",
                                                      env={HOLD_IN_FLIGHT_ENV: str(hold)})
    deadline = time.monotonic() + 60
    while not Path(f"{hold}.rank2").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(f"{hold}.rank2").exists() and not Path(f"{hold}.rank1").exists()  # only the giver holds
    os.kill(children[2], signal.SIGKILL)
    last = assert_ended_and_resumes(tmp_path, launcher, children, "rank 2", within_s=15)
    assert "killed by SIGKILL" in last


@pytest.mark.slow
def test_ctrl_c_stops_every_stage_with_130_and_the_checkpoint_resumes(tmp_path):
    launcher, children = start_until_first_checkpoint(tmp_path, PIPELINE)
    launcher.send_signal(signal.SIGINT)  # what Ctrl-C sends the launcher (a terminal sends it the stages too)
    try:
        _, stderr = launcher.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # seen twice in full suites, never alone: say where the launcher hangs
        launcher.send_signal(signal.SIGUSR1)
        time.sleep(2)
        launcher.kill()
        _, stderr = launcher.communicate()
        pytest.fail(f"the launcher did not exit 60 s after SIGINT; its stacks:\n{stderr[-6000:]}")
    assert launcher.returncode == 130
    assert "stage processes exited with 130, 130, 130" in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == "rlpipe run: interrupted"
    assert_nothing_left_and_it_resumes(tmp_path, children)

