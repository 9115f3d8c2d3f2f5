"""The deploy artifact: a PPO actor as a plain torch state dict plus JSON metadata.

``policy.pt`` holds the actor's weights (loaded with ``torch.load(..., weights_only=True)``: no
pickle, no code); ``policy.json`` holds what acting needs: observation version, ``s_max``, history,
action layout, network shape, and the provenance of the training run. Loading needs neither
stable-baselines3 nor the training code.
"""

from __future__ import annotations

import json
import pickle
import struct
import zipfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlpipe.errors import InputError
from rlpipe.fields import check_field_types
from rlpipe.files import read_json
from rlpipe.observation import DEFAULT_D_MAX, OBSERVATION_VERSION, ActionLayout, ObservationEncoder

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
MAX_S_MAX, MAX_HISTORY, MAX_WIDTH = 64, 64, 65_536


@dataclass(frozen=True)
class ArtifactMeta:
    """What ``policy.json`` records."""

    observation_version: int
    s_max: int
    history: int
    observation_size: int
    num_actions: int
    hidden_sizes: list[int]
    activation: str = "tanh"
    action_layout: str = ("0 keep, 1 replan, 2 rebalance, 3 replan+rebalance, 4 onset re-split, "
                          "5+2(i-1) boundary i -1, 6+2(i-1) boundary i +1")
    training: dict[str, Any] = field(default_factory=dict)
    d_max: int = DEFAULT_D_MAX


class Actor(nn.Module):
    """The policy network: observation -> action logits (an MLP)."""

    def __init__(self, observation_size: int, hidden_sizes: list[int], num_actions: int, activation: str = "tanh"):
        super().__init__()
        layers: list[nn.Module] = []
        width = observation_size
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), ACTIVATIONS[activation]()]
            width = hidden
        layers.append(nn.Linear(width, num_actions))
        self.net = nn.Sequential(*layers)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation)

    @torch.no_grad()
    def act(self, observation: np.ndarray, mask: np.ndarray) -> int:
        """The deterministic action: the most likely valid one."""
        logits = self(torch.as_tensor(observation, dtype=torch.float32).unsqueeze(0))[0]
        logits[~torch.as_tensor(mask, dtype=torch.bool)] = -torch.inf
        return int(torch.argmax(logits))


def save_artifact(actor: Actor, meta: ArtifactMeta, out_dir: str | Path, stem: str = "policy") -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights, metadata = out / f"{stem}.pt", out / f"{stem}.json"
    torch.save(actor.state_dict(), weights)
    metadata.write_text(json.dumps(asdict(meta), indent=1) + "\n")
    return weights, metadata


def read_meta(metadata: Path) -> ArtifactMeta:
    """``policy.json``, every field checked (types, sizes): a problem is one InputError."""
    data = read_json(metadata, "policy description")
    names = {f.name for f in fields(ArtifactMeta)}
    if not isinstance(data, dict) or not {"observation_version", "s_max", "history"} <= set(data) <= names:
        raise InputError(f"{metadata}: not a policy description (expected the fields {', '.join(sorted(names))})")
    try:
        meta = ArtifactMeta(**data)
    except TypeError as err:
        raise InputError(f"{metadata}: not a policy description ({err})") from None
    check_field_types(meta, str(metadata))
    if not 2 <= meta.s_max <= MAX_S_MAX or not 1 <= meta.history <= MAX_HISTORY or not 1 <= meta.d_max <= MAX_S_MAX:
        raise InputError(f"{metadata}: s_max {meta.s_max} / history {meta.history} / d_max {meta.d_max} out of range "
                         f"(2-{MAX_S_MAX} / 1-{MAX_HISTORY} / 1-{MAX_S_MAX})")
    if not meta.hidden_sizes or not all(1 <= width <= MAX_WIDTH for width in meta.hidden_sizes):
        raise InputError(f"{metadata}: hidden_sizes: expected widths in 1-{MAX_WIDTH}, got {meta.hidden_sizes}")
    if meta.activation not in ACTIVATIONS:
        raise InputError(f"{metadata}: activation: {meta.activation!r} is none of {', '.join(ACTIVATIONS)}")
    return meta


def load_artifact(path: str | Path, s_max: int | None = None) -> tuple[Actor, ArtifactMeta]:
    """Load ``DIR`` / ``DIR/policy.pt`` / ``X.pt`` with its ``X.json``; refuse what does not fit.

    Args:
        path: the artifact folder or its ``.pt`` file.
        s_max: the observation's stage capacity the caller will feed (``None``: the artifact's own).
    """
    path = Path(path)
    if not path.exists() and path.suffix != ".pt":
        raise InputError(f"{path}: no such folder (a policy is a folder written by 'rlpipe train --out', holding "
                         f"policy.pt and policy.json)")
    weights = path / "policy.pt" if path.is_dir() else path.with_suffix(".pt")
    metadata = weights.with_suffix(".json")
    if not weights.exists() or not metadata.exists():
        raise InputError(f"{path}: no policy artifact there (a folder written by 'rlpipe train --out', "
                         f"holding {weights.name} and {metadata.name})")
    meta = read_meta(metadata)
    if meta.observation_version != OBSERVATION_VERSION:
        raise InputError(f"{metadata}: trained for observation version {meta.observation_version}, "
                         f"this rlpipe encodes version {OBSERVATION_VERSION}")
    if s_max is not None and meta.s_max != s_max:
        raise InputError(f"{metadata}: trained for up to {meta.s_max} stages (s_max), "
                         f"the observation here is laid out for {s_max}")
    expected_size = ObservationEncoder.size_for(meta.s_max, meta.history, meta.d_max)
    if meta.observation_size != expected_size or meta.num_actions != ActionLayout(meta.s_max).num_actions:
        raise InputError(f"{metadata}: observation size {meta.observation_size} / {meta.num_actions} actions "
                         f"do not match s_max {meta.s_max}, history {meta.history}, d_max {meta.d_max}")
    actor = Actor(meta.observation_size, meta.hidden_sizes, meta.num_actions, meta.activation)
    try:
        state = torch.load(weights, weights_only=True, map_location="cpu")
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError("not a state dict of tensors")
        actor.load_state_dict(state)
    # what a corrupt or foreign file raises (a damaged zip, a truncated stream, an unpickler refusing a
    # global or reading a flipped opcode's argument off its stack or memo, tensors of other shapes): say
    # which, never run its code. Anything else is a bug, and shows.
    except (RuntimeError, pickle.UnpicklingError, EOFError, zipfile.BadZipFile, ValueError, OSError, IndexError,
            KeyError, struct.error) as err:
        first_line = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise InputError(f"{weights}: unreadable policy weights ({type(err).__name__}: {first_line})") from None
    actor.eval()
    return actor, meta
