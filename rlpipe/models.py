"""Models rlpipe can profile and train: three built-ins and user factories.

The factory contract (the same for ``rlpipe profile`` and ``rlpipe run``): a function that takes no
arguments and returns ``(layers, example_microbatch, target, loss_fn)``:

- ``layers``: an ``nn.Sequential`` or a list of modules, applied in order;
- ``example_microbatch``: one micro-batch of input (its first dimension is the micro-batch size);
- ``target``: the matching target for ``loss_fn``;
- ``loss_fn(output, target)``: returns a scalar loss.

A user passes it as ``pkg.module:factory``. The built-ins take a layer count and micro-batch size.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlpipe.errors import InputError


@dataclass
class ModelSpec:
    """A model split into layers, with one example micro-batch to train or profile it on."""

    name: str
    layers: list[nn.Module]
    example_microbatch: torch.Tensor
    target: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _Flatten2d(nn.Module):
    """Global average pool + flatten: (B, C, H, W) -> (B, C)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def _token_cross_entropy(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())


def transformer(num_layers: int = 8, microbatch_size: int = 4, d_model: int = 128, seq_len: int = 64,
                vocab: int = 2048) -> ModelSpec:
    """Token embedding, ``num_layers - 2`` encoder blocks, a vocabulary head: ends differ from the middle."""
    if num_layers < 3:
        raise InputError(f"--layers: the transformer needs at least 3 layers, got {num_layers}")
    layers: list[nn.Module] = [nn.Embedding(vocab, d_model)]
    layers += [nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.0,
                                          batch_first=True) for _ in range(num_layers - 2)]
    layers.append(nn.Linear(d_model, vocab))
    tokens = torch.randint(0, vocab, (microbatch_size, seq_len))
    target = torch.roll(tokens, shifts=-1, dims=1)
    return ModelSpec("transformer", layers, tokens, target, _token_cross_entropy)


def mlp(num_layers: int = 8, microbatch_size: int = 32, width: int = 512) -> ModelSpec:
    """``num_layers`` Linear+ReLU blocks of equal width: nearly uniform layer costs."""
    layers: list[nn.Module] = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(num_layers - 1)]
    layers.append(nn.Linear(width, 10))
    x = torch.randn(microbatch_size, width)
    target = torch.randint(0, 10, (microbatch_size,))
    return ModelSpec("mlp", layers, x, target, F.cross_entropy)


def cnn(num_layers: int = 8, microbatch_size: int = 8, image: int = 64) -> ModelSpec:
    """Convolutions that halve resolution and double channels every other layer until 8x8: costs are
    strongly uneven (early layers heavy in compute and activations, late ones in parameters)."""
    if num_layers < 2:
        raise InputError(f"--layers: the cnn needs at least 2 layers, got {num_layers}")
    layers: list[nn.Module] = []
    channels, size = 3, image
    for index in range(num_layers - 1):
        downsample = index % 2 == 1 and size > 8
        out_channels = 32 if index == 0 else channels * (2 if downsample else 1)
        layers.append(nn.Sequential(nn.Conv2d(channels, out_channels, 3, stride=2 if downsample else 1, padding=1),
                                    nn.ReLU()))
        channels, size = out_channels, size // 2 if downsample else size
    layers.append(nn.Sequential(_Flatten2d(), nn.Linear(channels, 10)))
    x = torch.randn(microbatch_size, 3, image, image)
    target = torch.randint(0, 10, (microbatch_size,))
    return ModelSpec("cnn", layers, x, target, F.cross_entropy)


BUILTIN_MODELS: dict[str, Callable[..., ModelSpec]] = {"transformer": transformer, "mlp": mlp, "cnn": cnn}


def load_model(spec: str, num_layers: int | None = None, microbatch_size: int | None = None,
               seed: int = 0) -> ModelSpec:
    """Build a built-in model by name, or call a user's ``pkg.module:factory``.

    ``seed`` seeds torch first, so every process that builds the model gets the same parameters.
    """
    torch.manual_seed(seed)
    if spec in BUILTIN_MODELS:
        kwargs: dict[str, Any] = {}
        if num_layers is not None:
            kwargs["num_layers"] = num_layers
        if microbatch_size is not None:
            kwargs["microbatch_size"] = microbatch_size
        return BUILTIN_MODELS[spec](**kwargs)
    if ":" not in spec:
        raise InputError(f"--model '{spec}': not a built-in model ({', '.join(BUILTIN_MODELS)}) "
                         f"nor a 'pkg.module:factory'")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InputError(f"--model '{spec}': cannot import module '{module_name}' ({err})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InputError(f"--model '{spec}': module '{module_name}' has no callable '{attr}'")
    result = factory()
    if not isinstance(result, tuple) or len(result) != 4:
        raise InputError(f"--model '{spec}': the factory must return (layers, example_microbatch, target, loss_fn)")
    layers, example, target, loss_fn = result
    layer_list = list(layers) if isinstance(layers, (nn.Sequential, list, tuple, nn.ModuleList)) else None
    if not layer_list or not all(isinstance(layer, nn.Module) for layer in layer_list):
        raise InputError(f"--model '{spec}': layers must be an nn.Sequential or a list of nn.Module")
    if not isinstance(example, torch.Tensor) or example.dim() == 0:
        raise InputError(f"--model '{spec}': example_microbatch must be a tensor with a batch dimension")
    return ModelSpec(attr, layer_list, example, target, loss_fn)
