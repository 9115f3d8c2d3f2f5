"""Profiles a run measures at start-up, kept so that two runs of the same model on the same machine
emulate the same devices.

Measuring a profile takes a second or two and comes out differently every time (a busy
machine, a cold cache): two runs of the same arguments would emulate different devices and their
throughputs would differ for no reason of the policy's. So a measured profile is kept, keyed by the
model's structure, its micro-batch's shape, the device and the machine, and the next run of the same
model there reuses it. Its identity (a hash of its contents) goes into the run's log header, and
``rlpipe report`` says when compared runs emulated different devices. ``RLPIPE_CACHE_DIR`` moves the
cache (default ``~/.cache/rlpipe``); deleting it measures afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlpipe.errors import InputError
from rlpipe.profile import LayerProfile

CACHE_ENV = "RLPIPE_CACHE_DIR"


def cache_dir() -> Path:
    """Where measured profiles are kept."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rlpipe") / "profiles"


def machine_identity() -> dict[str, Any]:
    """What makes two machines time the same model differently."""
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    return {"node": platform.node(), "processor": model or platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__}


def model_key(layers: Sequence[nn.Module], example: torch.Tensor, target: torch.Tensor, device: torch.device) -> str:
    """A short hash of what a measured profile depends on: the layers' structure, the micro-batch's and
    target's shapes and types, the device and the machine."""
    description = {"layers": [repr(layer) for layer in layers], "example": [list(example.shape), str(example.dtype)],
                   "target": [list(target.shape), str(target.dtype)], "device": device.type,
                   "machine": machine_identity()}
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]


def profile_id(profile: LayerProfile) -> str:
    """A short hash of a profile's contents: two runs with the same id emulate the same devices."""
    return hashlib.sha256(json.dumps(profile.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def measured_profile(key: str, measure: Callable[[], LayerProfile]) -> tuple[LayerProfile, str]:
    """The profile measured for ``key`` on this machine before, else ``measure()`` now (then kept);
    returns it and where it came from (``"cached"`` or ``"measured"``)."""
    path = cache_dir() / f"{key}.json"
    if path.exists():
        try:
            return LayerProfile.load(path), "cached"
        except InputError:  # a damaged entry: measure again and replace it
            pass
    profile = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(f".tmp{os.getpid()}")
        profile.save(staging)
        os.replace(staging, path)  # another run measuring the same model at once: one of them wins whole
    except OSError:  # no writable cache: this run measures, and so will the next
        pass
    return profile, "measured"
