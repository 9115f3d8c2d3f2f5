"""Checkpoints of a live pipeline, in PyTorch's distributed checkpoint format (``torch.distributed.
checkpoint``, what torchtitan uses): every rank writes the tensors of the layers it owns, keyed by the
layer's index (``layers.<i>.<name>``, ``optimizer.<i>.<name>.<state>``), so a checkpoint written by S
stages loads on S' stages: each rank reads the keys of the layers it owns then. Beside them, JSON: the
partition, the iteration and what identifies the run.

A checkpoint is written into a temporary folder and published by an atomic rename plus an atomic
``latest.json`` pointer, so a crash or a full disk mid-write never damages the last good one; the
newest ``keep`` are kept. Loading reads tensors only (no pickled objects, no code).

``torch.distributed.checkpoint`` is imported where a checkpoint is written or read: its planners and
storage layers take a third of a second of a run's start-up here, which a run without checkpoints need
not pay (``rlpipe run`` imports it before it forks the stages when the run checkpoints or resumes).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlpipe.errors import InputError

IDENTITY_KEYS = ("model", "layers", "schedule", "microbatches", "batch", "seed")
"""What must match for a run to resume a checkpoint (the stage count may differ: layers reshard)."""
FOLDER_PREFIX = "iter-"
PROFILE_FILE = "profile.json"  # the profile the run emulated or planned with (what a resumed run keeps)


def tensors_of(modules: list[nn.Module], owned: range, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The checkpoint keys of this rank's layers: parameters, buffers and per-parameter optimizer state."""
    found = {}
    for i in owned:
        for name, tensor in [*modules[i].named_parameters(), *modules[i].named_buffers()]:
            found[f"layers.{i}.{name}"] = tensor.detach()
        for name, p in modules[i].named_parameters():
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    found[f"optimizer.{i}.{name}.{key}"] = value
                elif isinstance(value, (int, float)):  # a plain number: a tensor in the checkpoint
                    found[f"optimizer.{i}.{name}.{key}"] = torch.tensor(float(value), dtype=torch.float64)
    return found


def save(directory: str | Path, iteration: int, rank: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
         keep: int = 3, files: dict[str, str] | None = None) -> str | None:
    """Collective: every rank writes its tensors; rank 0 writes ``meta`` and ``files`` (name: text) beside
    them, publishes the checkpoint and keeps the newest ``keep``. Returns ``None`` when it was published,
    else why not (the same on every rank; the last published checkpoint stays loadable)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    root = Path(directory)
    final, staging = root / f"{FOLDER_PREFIX}{iteration:08d}", root / f".{FOLDER_PREFIX}{iteration:08d}.tmp"
    error = None
    try:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        dist.barrier()
        dcp.save(tensors, checkpoint_id=str(staging))
        if rank == 0:
            for name, text in (files or {}).items():
                (staging / name).write_text(text)
            (staging / "meta.json").write_text(json.dumps({**meta, "iteration": iteration}, indent=1) + "\n")
    # a full disk, a lost file system: the run goes on, its last checkpoint intact (DCP's own
    # CheckpointException derives from BaseException, not Exception)
    except (Exception, CheckpointException) as err:
        error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    failed = torch.tensor([0 if error is None else 1], dtype=torch.int64)
    dist.all_reduce(failed)
    if failed.item():
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        return error or "another rank could not write its part"
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        pointer = root / "latest.json.tmp"
        pointer.write_text(json.dumps({"checkpoint": final.name, "iteration": iteration}) + "\n")
        os.replace(pointer, root / "latest.json")
        prune(root, keep)
    dist.barrier()
    return None


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` published checkpoints (and stale temporary folders)."""
    published = sorted(p for p in root.glob(f"{FOLDER_PREFIX}*") if p.is_dir())
    for old in published[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(f".{FOLDER_PREFIX}*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def latest(directory: str | Path) -> tuple[Path, dict[str, Any]]:
    """The last published checkpoint folder and its metadata."""
    root = Path(directory)
    try:
        pointer = json.loads((root / "latest.json").read_text())
        folder = root / pointer["checkpoint"]
        meta = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError:
        raise InputError(f"--resume {directory}: no checkpoint there (latest.json or its folder is missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise InputError(f"--resume {directory}: unreadable checkpoint pointer ({err})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("boundaries"), list) or \
            not isinstance(meta.get("iteration"), int):
        raise InputError(f"--resume {directory}: {folder.name}/meta.json lacks the partition or the iteration")
    return folder, meta


def check_compatible(meta: dict[str, Any], config: Any, source: str) -> None:
    """Refuse to resume another run's checkpoint (another model, layer count, schedule, ...)."""
    for key in IDENTITY_KEYS:
        if meta.get(key) != getattr(config, key):
            raise InputError(f"--resume {source}: the checkpoint has {key}={meta.get(key)!r}, "
                             f"this run {getattr(config, key)!r}")


def load(folder: Path, modules: list[nn.Module], owned: range, optimizer: torch.optim.Optimizer,
         device: torch.device) -> None:
    """Collective: every rank reads the layers it owns now (whichever stage wrote them) into
    ``modules`` and their optimizer state into ``optimizer``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    stored = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    wanted: dict[str, torch.Tensor] = {}
    for i in owned:
        for name, tensor in [*modules[i].named_parameters(), *modules[i].named_buffers()]:
            wanted[f"layers.{i}.{name}"] = tensor.detach()
        prefixes = {f"optimizer.{i}.{name}.": p for name, p in modules[i].named_parameters()}
        for key, info in stored.items():
            prefix = next((pre for pre in prefixes if key.startswith(pre)), None)
            if prefix is not None and isinstance(info, TensorStorageMetadata):
                wanted[key] = torch.empty(info.size, dtype=info.properties.dtype, device=device)
    missing = [key for key in wanted if key not in stored]
    if missing:
        raise InputError(f"--resume {folder}: the checkpoint lacks {missing[0]} (another model?)")
    dcp.load(wanted, checkpoint_id=str(folder))
    for i in owned:
        for name, p in modules[i].named_parameters():
            prefix = f"optimizer.{i}.{name}."
            state = {key[len(prefix):]: value for key, value in wanted.items() if key.startswith(prefix)}
            if state:
                if "step" in state:  # torch optimizers keep their step count on the CPU
                    state["step"] = state["step"].cpu()
                optimizer.state[p] = state
