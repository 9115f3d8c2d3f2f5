"""Checkpoints (rlpipe/runtime/checkpoint.py): resume on the same or another stage count, refusals, how
many are kept, a full disk and kills in the middle of a save."""

import json
import multiprocessing
import os
import random
import signal
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from live_runs import assert_same_training, read_log, rlpipe_run, run_command

from rlpipe.runtime import checkpoint

MLP = ["--model", "mlp", "--layers", "8", "--microbatches", "4", "--batch", "16", "--interval", "2"]


def published(folder):
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


@pytest.mark.slow
def test_resume_continues_with_the_same_losses(tmp_path):
    common = [*MLP, "--stages", "2", "--boundaries", "0,3", "--repartition-at", "2:0,2", "6:0,4"]
    whole = rlpipe_run(tmp_path, "whole", *common, "--iterations", "8")
    checkpoints = tmp_path / "ckpt"
    first = rlpipe_run(tmp_path, "first", *common, "--iterations", "4", "--checkpoint-every", "2",
                       "--checkpoint-dir", str(checkpoints))
    assert json.loads((checkpoints / "latest.json").read_text())["iteration"] == 4
    second = rlpipe_run(tmp_path, "second", *common, "--iterations", "8", "--resume", str(checkpoints))
    assert second[0][0]["boundaries"] == [0, 2]  # the checkpoint's partition, not the launch one
    assert_same_training(whole, (first[0] + second[0], second[1]))


@pytest.fixture(scope="module")
def four_stage_checkpoint(tmp_path_factory):
    """Eight iterations of four stages, and the first four of them checkpointed (resuming only reads it)."""
    tmp_path = tmp_path_factory.mktemp("four")
    whole = rlpipe_run(tmp_path, "whole", *MLP, "--stages", "4", "--iterations", "8")
    checkpoints = tmp_path / "ckpt"
    first = rlpipe_run(tmp_path, "first", *MLP, "--stages", "4", "--iterations", "4", "--checkpoint-every", "4",
                       "--checkpoint-dir", str(checkpoints))
    return whole, first, checkpoints


@pytest.mark.slow
@pytest.mark.parametrize("resumed_stages", [2, 3])
def test_a_checkpoint_of_four_stages_resumes_on_another_stage_count(tmp_path, four_stage_checkpoint, resumed_stages):
    whole, first, checkpoints = four_stage_checkpoint
    second = rlpipe_run(tmp_path, "second", *MLP, "--stages", str(resumed_stages), "--iterations", "8",
                        "--resume", str(checkpoints))
    assert len(first[0][-1]["boundaries"]) == 4 and len(second[0][0]["boundaries"]) == resumed_stages
    assert_same_training(whole, (first[0] + second[0], second[1]))


@pytest.mark.slow
def test_another_model_or_layer_count_is_refused_in_one_line(tmp_path):
    checkpoints = tmp_path / "ckpt"
    rlpipe_run(tmp_path, "first", *MLP, "--stages", "2", "--iterations", "2", "--checkpoint-every", "2",
               "--checkpoint-dir", str(checkpoints))
    for changed, message in ((["--layers", "6"], "layers=8"), (["--model", "cnn"], "model='mlp'")):
        args = [*MLP, "--stages", "2", "--iterations", "4", "--resume", str(checkpoints), *changed]
        result = run_command(*args, timeout=60)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.slow
def test_only_the_newest_checkpoints_are_kept(tmp_path):
    checkpoints = tmp_path / "ckpt"
    rlpipe_run(tmp_path, "run", *MLP, "--stages", "4", "--iterations", "10", "--checkpoint-every", "2",
               "--checkpoint-dir", str(checkpoints), "--keep-checkpoints", "3")
    assert published(checkpoints) == ["iter-00000006", "iter-00000008", "iter-00000010"]


@pytest.mark.slow
def test_a_full_disk_keeps_the_last_checkpoint_and_the_run_going(tmp_path):
    common = [*MLP, "--stages", "2"]
    whole = rlpipe_run(tmp_path, "whole", *common, "--iterations", "8")
    checkpoints = tmp_path / "ckpt"
    first = rlpipe_run(tmp_path, "first", *common, "--iterations", "4", "--checkpoint-every", "4",
                       "--checkpoint-dir", str(checkpoints))
    shard = max(p.stat().st_size for p in (checkpoints / "iter-00000004").iterdir())
    # resumed with --keep-checkpoints 1, every save fails: no file may grow past half a shard
    full = run_command(*common, "--iterations", "8", "--resume", str(checkpoints), "--checkpoint-every", "2",
                       "--checkpoint-dir", str(checkpoints), "--keep-checkpoints", "1",
                       "--file-limit-bytes", str(shard // 2), "--log", str(tmp_path / "full.jsonl"))
    assert full.returncode == 0, full.stderr[-3000:]
    warnings = [line for line in full.stdout.splitlines() if "was not written" in line]
    assert [w.split("iteration ")[1].split()[0] for w in warnings] == ["6", "8"], full.stdout
    assert read_log(tmp_path / "full.jsonl")[-1]["iteration"] == 8  # the run went on
    assert published(checkpoints) == ["iter-00000004"]  # the one it resumed from, intact
    second = rlpipe_run(tmp_path, "second", *common, "--iterations", "8", "--resume", str(checkpoints))
    assert_same_training(whole, (first[0] + second[0], second[1]))


# --- kills in the middle of a save -----------------------------------------------------------------

TENSORS = {"layers.0.weight": (64, 64), "layers.1.weight": (256, 64), "optimizer.1.weight.exp_avg": (256, 64)}


def _save_forever(folder: str, rank: int, port: int, first_iteration: int) -> None:
    """One of two ranks saving checkpoints back to back; every tensor holds the iteration it was saved at."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mine = {key: torch.zeros(shape) for i, (key, shape) in enumerate(TENSORS.items()) if i % 2 == rank}
    for iteration in range(first_iteration, first_iteration + 10_000):
        for tensor in mine.values():
            tensor.fill_(iteration)
        checkpoint.save(folder, iteration, rank, mine, {"boundaries": [0, 1]}, keep=2)


def _published_iteration(folder) -> int:
    try:
        return json.loads((folder / "latest.json").read_text())["iteration"]
    except (OSError, ValueError):  # none yet
        return -1


@pytest.mark.slow
def test_kills_at_random_moments_of_a_save_leave_the_previous_checkpoint_loadable(tmp_path):
    from rlpipe.runtime.launch import free_port

    rng = random.Random(14)
    context = multiprocessing.get_context("fork")
    next_iteration, loaded = 1, []
    for _ in range(20):
        port = free_port()
        ranks = [context.Process(target=_save_forever, args=(str(tmp_path), rank, port, next_iteration))
                 for rank in (0, 1)]
        for process in ranks:
            process.start()
        deadline = time.monotonic() + 60
        while _published_iteration(tmp_path) < next_iteration and time.monotonic() < deadline:
            time.sleep(0.01)  # this round has published one: the kill comes in a later save
        time.sleep(rng.uniform(0.0, 0.5))
        victim = rng.choice(ranks)
        os.kill(victim.pid, signal.SIGKILL)
        for process in ranks:
            os.kill(process.pid, signal.SIGKILL)
            process.join()
        folder, meta = checkpoint.latest(tmp_path)
        restored = {key: torch.full(shape, -1.0) for key, shape in TENSORS.items()}
        dcp.load(restored, checkpoint_id=str(folder))
        assert all(torch.all(t == meta["iteration"]) for t in restored.values()), folder
        loaded.append(meta["iteration"])
        next_iteration = meta["iteration"] + 1000  # the next round's names come after every leftover
    assert len(set(loaded)) == 20


# --- what a resume reads, one piece at a time (no processes) -------------------------------------------

def publish_fake(folder, meta):
    """A published checkpoint folder holding only ``meta`` (what ``latest`` reads)."""
    (folder / "iter-00000004").mkdir(parents=True)
    (folder / "iter-00000004" / "meta.json").write_text(json.dumps(meta))
    (folder / "latest.json").write_text(json.dumps({"checkpoint": "iter-00000004", "iteration": 4}))


def test_a_missing_or_corrupt_pointer_is_refused_in_one_line(tmp_path):
    with pytest.raises(checkpoint.InputError, match="no checkpoint there"):
        checkpoint.latest(tmp_path)
    (tmp_path / "latest.json").write_text("{not json")
    with pytest.raises(checkpoint.InputError, match="unreadable checkpoint pointer"):
        checkpoint.latest(tmp_path)
    (tmp_path / "latest.json").write_text(json.dumps({"iteration": 4}))  # no folder named
    with pytest.raises(checkpoint.InputError, match="unreadable checkpoint pointer"):
        checkpoint.latest(tmp_path)


def test_a_checkpoint_without_its_partition_is_refused(tmp_path):
    publish_fake(tmp_path, {"iteration": 4, "stages": 2})
    with pytest.raises(checkpoint.InputError, match="lacks the partition or the iteration"):
        checkpoint.latest(tmp_path)


@pytest.mark.parametrize("key, theirs, ours", [("schedule", "gpipe", "1f1b"), ("microbatches", 8, 4),
                                                ("batch", 32, 16), ("seed", 1, 0), ("model", "cnn", "mlp"),
                                                ("layers", 6, 8)])
def test_another_runs_checkpoint_is_refused_naming_what_differs(key, theirs, ours):
    from rlpipe.runtime.config import RunConfig

    config = RunConfig(model="mlp", layers=8, schedule="1f1b", microbatches=4, batch=16, seed=0)
    meta = {k: getattr(config, k) for k in checkpoint.IDENTITY_KEYS}
    checkpoint.check_compatible(meta, config, "ckpt")  # its own run's: accepted
    with pytest.raises(checkpoint.InputError, match=f"the checkpoint has {key}={theirs!r}, this run {ours!r}"):
        checkpoint.check_compatible({**meta, key: theirs}, config, "ckpt")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process saves and loads here
def test_a_checkpoint_that_lacks_a_layer_is_refused(tmp_path):
    layers = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
    optimizer = torch.optim.Adam([p for layer in layers for p in layer.parameters()])
    dcp.save(checkpoint.tensors_of(layers, range(0, 1), optimizer), checkpoint_id=str(tmp_path))  # layer 0 only
    with pytest.raises(checkpoint.InputError, match="lacks layers.1."):
        checkpoint.load(tmp_path, layers, range(0, 2), optimizer, torch.device("cpu"))
    checkpoint.load(tmp_path, layers, range(0, 1), optimizer, torch.device("cpu"))  # what it has, it gives
