"""A rank's layers and their storage: the layers its stage owns hold values on its device; the others
keep only their structure (the ``meta`` device), and get storage when a repartition brings them here.
"""

from __future__ import annotations

import torch
from torch import nn

from rlpipe.seeds import LAYER_SEED_STRIDE


def is_materialised(layer: nn.Module) -> bool:
    """Whether the layer holds storage (not the meta device's shapes alone)."""
    return not any(t.is_meta for t in [*layer.parameters(), *layer.buffers()])


def materialise(layer: nn.Module, device: torch.device) -> None:
    """Give a meta layer (uninitialised) storage on ``device``; a layer that has storage is left alone."""
    if not is_materialised(layer):
        layer.to_empty(device=device)


def initialise(layer: nn.Module, index: int, seed: int, device: torch.device) -> None:
    """Give a meta layer storage on ``device`` and fresh values: each submodule's own initialisation
    (``reset_parameters``), seeded by the layer's index, so that whichever rank builds layer ``index``
    builds the same values (a single process that initialises every layer so gets them all)."""
    materialise(layer, device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * LAYER_SEED_STRIDE + index)
        for module in layer.modules():
            reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
            if callable(reset):
                reset()


def free(layer: nn.Module) -> None:
    """Drop a layer's storage, keeping its structure (the meta device)."""
    layer.to("meta")


def resident_param_bytes(layers: list[nn.Module]) -> int:
    """Bytes of the parameters that hold storage on this rank."""
    return sum(p.numel() * p.element_size() for layer in layers for p in layer.parameters() if not p.is_meta)
