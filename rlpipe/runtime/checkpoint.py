"""Checkpoints of a live pipeline: every rank saves its own layers and Adam state; rank 0 records the
partition and iteration. A checkpoint is written into a temporary folder and published by an
atomic rename plus an atomic ``latest.json`` pointer, so a crash mid-write never damages the last
good one. Loading uses ``torch.load(..., weights_only=True)``: tensors only, no code.
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

IDENTITY_KEYS = ("model", "layers", "stages", "schedule", "microbatches", "batch", "seed")


def _named_tensors(modules: list[nn.Module], layers: range) -> dict[str, torch.Tensor]:
    named: dict[str, torch.Tensor] = {}
    for i in layers:
        named.update({f"{i}.{n}": t for n, t in modules[i].named_parameters()})
        named.update({f"{i}.{n}": t for n, t in modules[i].named_buffers()})
    return named


def save(directory: str | Path, iteration: int, rank: int, modules: list[nn.Module], layers: range,
         optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> Path:
    """Collective: every rank calls it at the same iteration. Returns the published folder."""
    root = Path(directory)
    final = root / f"iter-{iteration:08d}"
    staging = root / f".iter-{iteration:08d}.tmp"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    dist.barrier()
    params = {f"{i}.{n}": p for i in layers for n, p in modules[i].named_parameters()}
    state = {name: dict(optimizer.state[p]) for name, p in params.items() if optimizer.state.get(p)}
    tensors = {name: t.detach().clone() for name, t in _named_tensors(modules, layers).items()}
    torch.save({"tensors": tensors, "optimizer": state}, staging / f"rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        (staging / "meta.json").write_text(json.dumps({**meta, "iteration": iteration}, indent=1) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        pointer = root / "latest.json.tmp"
        pointer.write_text(json.dumps({"checkpoint": final.name, "iteration": iteration}) + "\n")
        os.replace(pointer, root / "latest.json")
    dist.barrier()
    return final


def latest(directory: str | Path) -> tuple[Path, dict[str, Any]]:
    """The last published checkpoint folder and its metadata."""
    root = Path(directory)
    try:
        pointer = json.loads((root / "latest.json").read_text())
        folder = root / pointer["checkpoint"]
        meta = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError:
        raise InputError(f"--resume {directory}: no checkpoint there (latest.json or its folder is missing)") from None
    except (json.JSONDecodeError, KeyError) as err:
        raise InputError(f"--resume {directory}: unreadable checkpoint pointer ({err})") from None
    return folder, meta


def check_compatible(meta: dict[str, Any], config: Any, source: str) -> None:
    for key in IDENTITY_KEYS:
        if meta.get(key) != getattr(config, key):
            raise InputError(f"--resume {source}: the checkpoint has {key}={meta.get(key)!r}, "
                             f"this run {getattr(config, key)!r}")


def load_rank(folder: Path, rank: int, modules: list[nn.Module], layers: range,
              optimizer: torch.optim.Optimizer) -> None:
    """Write this rank's saved layers into ``modules`` and its Adam state into ``optimizer``."""
    saved = torch.load(folder / f"rank{rank}.pt", weights_only=True)
    named = _named_tensors(modules, layers)
    with torch.no_grad():
        for name, tensor in named.items():
            tensor.copy_(saved["tensors"][name])
    params = {f"{i}.{n}": p for i in layers for n, p in modules[i].named_parameters()}
    for name, state in saved["optimizer"].items():
        optimizer.state[params[name]] = state
