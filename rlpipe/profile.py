"""Per-layer cost profiles: the one description of a model that partitioner, simulator and runtime read.

A profile is measured on a real torch model (:func:`measure_profile`) and stored as JSON::

    {"name": str, "microbatch_size": int,
     "layers": [{"name": str, "fwd_ms": float, "bwd_ms": float, "activation_bytes": int,
                 "param_bytes": int, "optimizer_bytes": int}, ...]}

``activation_bytes`` is the size of the layer's output for one micro-batch; ``optimizer_bytes`` is the
optimizer state for the layer's parameters (Adam keeps two moments: 2x the parameter bytes).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from rlpipe.errors import InputError
from rlpipe.fields import is_number
from rlpipe.files import read_json

LAYER_FIELDS = ("name", "fwd_ms", "bwd_ms", "activation_bytes", "param_bytes", "optimizer_bytes")


@dataclass(frozen=True)
class LayerCost:
    """Measured cost of one layer for one micro-batch.

    Attributes:
        name: the layer's name (its module class and index).
        fwd_ms: forward time in milliseconds.
        bwd_ms: backward time in milliseconds.
        activation_bytes: bytes of the layer's output (what crosses a stage boundary after it).
        param_bytes: bytes of the layer's parameters.
        optimizer_bytes: bytes of the optimizer state of those parameters.
    """

    name: str
    fwd_ms: float
    bwd_ms: float
    activation_bytes: int
    param_bytes: int
    optimizer_bytes: int

    @property
    def compute_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms

    @property
    def state_bytes(self) -> int:
        """Bytes that move when the layer changes stage: parameters plus optimizer state."""
        return self.param_bytes + self.optimizer_bytes


@dataclass(frozen=True)
class LayerProfile:
    """A model's per-layer costs, in execution order."""

    name: str
    microbatch_size: int
    layers: tuple[LayerCost, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def compute_ms(self) -> np.ndarray:
        """Forward + backward time of each layer, ms per micro-batch."""
        return np.array([layer.compute_ms for layer in self.layers], dtype=np.float64)

    def activation_bytes(self) -> np.ndarray:
        return np.array([layer.activation_bytes for layer in self.layers], dtype=np.float64)

    def state_bytes(self) -> np.ndarray:
        return np.array([layer.state_bytes for layer in self.layers], dtype=np.float64)

    def fwd_ms(self) -> np.ndarray:
        """Forward time of each layer, ms per micro-batch."""
        return np.array([layer.fwd_ms for layer in self.layers], dtype=np.float64)

    def bwd_ms(self) -> np.ndarray:
        """Backward time of each layer, ms per micro-batch."""
        return np.array([layer.bwd_ms for layer in self.layers], dtype=np.float64)

    def scaled(self, factor: float) -> LayerProfile:
        """The same model with every forward and backward time multiplied by ``factor``."""
        return replace(self, layers=tuple(replace(layer, fwd_ms=layer.fwd_ms * factor, bwd_ms=layer.bwd_ms * factor)
                                          for layer in self.layers))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "microbatch_size": self.microbatch_size,
                "layers": [asdict(layer) for layer in self.layers]}

    def save(self, path: str | Path) -> None:
        """Write the profile JSON (creating its folder)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: Any, source: str = "profile") -> LayerProfile:
        """Validate and build a profile; every problem is an :class:`InputError` naming the field."""
        if not isinstance(data, dict):
            raise InputError(f"{source}: expected a JSON object with 'name', 'microbatch_size', 'layers'")
        for key in ("name", "microbatch_size", "layers"):
            if key not in data:
                raise InputError(f"{source}: missing field '{key}'")
        microbatch_size = data["microbatch_size"]
        if not _is_int(microbatch_size) or microbatch_size < 1:
            raise InputError(f"{source}: microbatch_size: must be an integer >= 1, got {microbatch_size!r}")
        raw_layers = data["layers"]
        if not isinstance(raw_layers, list) or not raw_layers:
            raise InputError(f"{source}: layers: must be a non-empty list")
        layers = [_layer_from_dict(raw, f"{source}: layers[{i}]") for i, raw in enumerate(raw_layers)]
        return cls(name=str(data["name"]), microbatch_size=int(microbatch_size), layers=tuple(layers))

    @classmethod
    def load(cls, path: str | Path) -> LayerProfile:
        return cls.from_dict(read_json(path, "profile file"), source=str(path))


MIN_LAYER_MS, MAX_LAYER_MS = 1e-6, 1e7  # a nanosecond; about three hours per micro-batch
MAX_LAYER_BYTES = 2**50  # a pebibyte


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _layer_from_dict(raw: Any, where: str) -> LayerCost:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected an object with fields {', '.join(LAYER_FIELDS)}")
    for key in LAYER_FIELDS:
        if key not in raw:
            raise InputError(f"{where}: missing field '{key}'")
    for key in ("fwd_ms", "bwd_ms"):
        value = raw[key]
        if not is_number(value) or not 0 <= value <= MAX_LAYER_MS:
            raise InputError(f"{where}.{key}: must be a number in [0, {MAX_LAYER_MS:g}] ms, got {value!r}")
    if raw["fwd_ms"] + raw["bwd_ms"] < MIN_LAYER_MS:
        raise InputError(f"{where}: fwd_ms + bwd_ms must be at least {MIN_LAYER_MS:g} ms (every layer takes some "
                         f"time), got {raw['fwd_ms'] + raw['bwd_ms']!r}")
    for key in ("activation_bytes", "param_bytes", "optimizer_bytes"):
        value = raw[key]
        if not _is_int(value) or not 0 <= value <= MAX_LAYER_BYTES:
            raise InputError(f"{where}.{key}: must be an integer in [0, 2**50], got {value!r}")
    return LayerCost(name=str(raw["name"]), fwd_ms=float(raw["fwd_ms"]), bwd_ms=float(raw["bwd_ms"]),
                     activation_bytes=raw["activation_bytes"], param_bytes=raw["param_bytes"],
                     optimizer_bytes=raw["optimizer_bytes"])


def shipped_profile_names() -> list[str]:
    """Names of the profiles that ship inside the package (``rlpipe/profiles/NAME.json``)."""
    folder = resources.files("rlpipe") / "profiles"
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".json"))


def load_profile(name_or_path: str | Path) -> LayerProfile:
    """Load a shipped profile by name (``transformer16``) or any profile by path."""
    name = str(name_or_path)
    if name in shipped_profile_names():
        data = json.loads((resources.files("rlpipe") / "profiles" / f"{name}.json").read_text())
        return LayerProfile.from_dict(data, source=f"shipped profile {name}")
    if not Path(name).exists() and not name.endswith(".json"):
        raise InputError(f"profile '{name}': neither a file nor a shipped profile "
                         f"(shipped: {', '.join(shipped_profile_names())})")
    return LayerProfile.load(name)


def measure_profile(layers: Sequence[Any], example_microbatch: Any, target: Any, loss_fn: Callable,
                    name: str = "model", warmup: int = 2, repeats: int = 5, device: Any = None,
                    passes: int = 3) -> LayerProfile:
    """Time each layer's forward and backward on this machine, one micro-batch at a time.

    Each layer runs on the (detached) output of the layer before it, so its time is its own. The
    last layer's forward includes the loss and its backward starts from the loss. The layers are timed
    one at a time in ``passes`` passes over the model (``layers`` is iterated once a pass); a layer's time
    is the median of ``repeats`` runs after ``warmup`` runs within a pass, and the least over the passes.
    Other work on the machine only ever adds time, and a burst of it (the other ranks of a run starting
    up) covers the few layers timed while it lasts: in one pass, a transformer's head measured 1.2x to
    2.2x its middle blocks from one run's start-up to the next (1.2x-1.4x in three passes), an error per
    layer that moves with the partition, so no calibration of the whole removes it. Optimizer bytes
    assume Adam (two moments). On a GPU (``device``) the clock waits for the device before it reads the
    time.
    """
    import torch

    synchronise = (lambda: torch.cuda.synchronize(device)) if getattr(device, "type", "cpu") == "cuda" else (
        lambda: None)
    timings: list[list[tuple[float, float]]] = []  # per pass, each layer's (forward, backward) ms
    costs = []
    for _ in range(passes):
        timings.append([])
        layer_input = example_microbatch
        for index, layer in enumerate(layers):
            home = next((t.device for t in layer.parameters()), None)
            moved = device is not None and home is not None and home != torch.device(device)
            if moved:
                layer.to(device)  # one layer at a time on the device, back home after its timing
            is_last = index == len(layers) - 1
            fwd_ms, bwd_ms, out = _time_layer(layer, layer_input, (lambda y: loss_fn(y, target)) if is_last else None,
                                              warmup, repeats, synchronise)
            timings[-1].append((fwd_ms, bwd_ms))
            if len(timings) == 1:
                param_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())
                activation_bytes = int(out.numel() * out.element_size())
                costs.append(LayerCost(f"{index}:{type(layer).__name__}", 0.0, 0.0, activation_bytes,
                                       int(param_bytes), int(2 * param_bytes)))
            layer_input = out.detach()
            if moved:
                layer.to(home)
    fastest = np.min(np.array(timings), axis=0)  # other work only adds time
    costs = [replace(cost, fwd_ms=round(float(fwd), 5), bwd_ms=round(float(bwd), 5))
             for cost, (fwd, bwd) in zip(costs, fastest, strict=True)]
    return LayerProfile(name=name, microbatch_size=int(example_microbatch.shape[0]), layers=tuple(costs))


def _time_layer(layer: Any, layer_input: Any, loss: Callable | None, warmup: int, repeats: int,
                synchronise: Callable[[], None]) -> tuple[float, float, Any]:
    """One layer's median forward and backward ms over ``repeats`` runs after ``warmup``, and its output.
    ``loss``: the last layer's, included in its forward, its backward starting from it."""
    import torch

    fwd_samples, bwd_samples = [], []
    for run in range(warmup + repeats):
        x = layer_input.detach().requires_grad_(layer_input.is_floating_point())
        synchronise()
        start = time.perf_counter()
        out = layer(x)
        head = loss(out) if loss is not None else out
        synchronise()
        mid = time.perf_counter()
        if head.requires_grad:
            head.backward(None if loss is not None else torch.ones_like(head))
        synchronise()
        end = time.perf_counter()
        layer.zero_grad(set_to_none=True)
        if run >= warmup:
            fwd_samples.append((mid - start) * 1e3)
            bwd_samples.append((end - mid) * 1e3)
    return statistics.median(fwd_samples), statistics.median(bwd_samples), out
