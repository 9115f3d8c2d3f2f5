"""Models rlpipe can profile and train: three built-ins and user factories.

The factory contract (the same for ``rlpipe profile`` and ``rlpipe run``): a function that takes no
arguments and returns ``(layers, example_microbatch, target, loss_fn)``:

- ``layers``: an ``nn.Sequential`` or a list of modules, applied in order;
- ``example_microbatch``: one micro-batch of input (its first dimension is the micro-batch size);
- ``target``: the matching target for ``loss_fn``;
- ``loss_fn(output, target)``: returns a scalar loss.

A user passes it as ``pkg.module:factory`` (importable from the working directory or the Python path)
or ``path/to/file.py:factory``. The built-ins take a layer count and micro-batch size. A model's name
(what profiles are called) is the built-in's name and layer count, or the factory's module.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlpipe.errors import InputError, UserCodeError


@dataclass
class ModelSpec:
    """A model split into layers, with one example micro-batch to train or profile it on.

    Attributes:
        batches: where training data comes from (``None``: synthetic batches shaped like the
            example): ``batches(iteration, batch_size) -> (inputs, targets)``.
        integer_range: integer inputs and targets (tokens, class labels) lie in ``0 .. integer_range - 1``,
            and synthetic batches draw from all of it whatever the micro-batch size (``None``: up to the
            example's largest value).
    """

    name: str
    layers: list[nn.Module]
    example_microbatch: torch.Tensor
    target: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batches: Batches | None = None
    integer_range: int | None = None


Batches = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


class _Flatten2d(nn.Module):
    """Global average pool + flatten: (B, C, H, W) -> (B, C)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def _token_cross_entropy(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())


def _building(meta: bool) -> AbstractContextManager:
    """Where layers are built: on the meta device (structure only, no storage) or as usual."""
    return torch.device("meta") if meta else nullcontext()


def transformer(num_layers: int = 8, microbatch_size: int = 4, d_model: int = 128, seq_len: int = 64,
                vocab: int = 2048, meta: bool = False) -> ModelSpec:
    """Token embedding, ``num_layers - 2`` encoder blocks, a vocabulary head: ends differ from the middle."""
    if num_layers < 3:
        raise InputError(f"--layers: the transformer needs at least 3 layers, got {num_layers}")
    with _building(meta):
        layers: list[nn.Module] = [nn.Embedding(vocab, d_model)]
        layers += [nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.0,
                                              batch_first=True) for _ in range(num_layers - 2)]
        layers.append(nn.Linear(d_model, vocab))
    tokens = torch.randint(0, vocab, (microbatch_size, seq_len))
    target = torch.roll(tokens, shifts=-1, dims=1)
    return ModelSpec(f"transformer{num_layers}", layers, tokens, target, _token_cross_entropy, integer_range=vocab)


def mlp(num_layers: int = 8, microbatch_size: int = 32, width: int = 512, meta: bool = False) -> ModelSpec:
    """``num_layers`` Linear+ReLU blocks of equal width: nearly uniform layer costs."""
    with _building(meta):
        layers: list[nn.Module] = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(num_layers - 1)]
        layers.append(nn.Linear(width, 10))
    x = torch.randn(microbatch_size, width)
    target = torch.randint(0, 10, (microbatch_size,))
    return ModelSpec(f"mlp{num_layers}", layers, x, target, F.cross_entropy, integer_range=10)


def cnn(num_layers: int = 8, microbatch_size: int = 8, image: int = 64, meta: bool = False) -> ModelSpec:
    """Convolutions that halve resolution and double channels every other layer until 8x8: costs are
    strongly uneven (early layers heavy in compute and activations, late ones in parameters)."""
    if num_layers < 2:
        raise InputError(f"--layers: the cnn needs at least 2 layers, got {num_layers}")
    layers: list[nn.Module] = []
    channels, size = 3, image
    with _building(meta):
        for index in range(num_layers - 1):
            downsample = index % 2 == 1 and size > 8
            out_channels = 32 if index == 0 else channels * (2 if downsample else 1)
            layers.append(nn.Sequential(nn.Conv2d(channels, out_channels, 3, stride=2 if downsample else 1,
                                                  padding=1), nn.ReLU()))
            channels, size = out_channels, size // 2 if downsample else size
        layers.append(nn.Sequential(_Flatten2d(), nn.Linear(channels, 10)))
    x = torch.randn(microbatch_size, 3, image, image)
    target = torch.randint(0, 10, (microbatch_size,))
    return ModelSpec(f"cnn{num_layers}", layers, x, target, F.cross_entropy, integer_range=10)


CORPUS_BYTES = 2_000_000


def stdlib_text(limit: int = CORPUS_BYTES) -> torch.Tensor:
    """Real text that ships with every Python: the standard library's own source files, in a fixed
    order, as bytes (at most ``limit``), a uint8 tensor; no download."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    if total == 0:
        raise InputError(f"charlm: no Python source files found under {root}")
    return torch.frombuffer(bytearray(b"".join(chunks)[:limit]), dtype=torch.uint8)


def charlm(num_layers: int = 8, microbatch_size: int = 4, d_model: int = 128, seq_len: int = 64,
           meta: bool = False) -> ModelSpec:
    """A character-level language model trained on the Python standard library's source: byte
    embedding, ``num_layers - 2`` causal encoder blocks, a 256-way head. Its loss falls from ln 256."""
    if num_layers < 3:
        raise InputError(f"--layers: charlm needs at least 3 layers, got {num_layers}")
    with _building(meta):
        layers: list[nn.Module] = [nn.Embedding(256, d_model)]
        layers += [_CausalBlock(d_model) for _ in range(num_layers - 2)]
        layers.append(nn.Linear(d_model, 256))
    text = stdlib_text()

    def batches(iteration: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` windows of the text at places drawn from the iteration's own seed."""
        generator = torch.Generator().manual_seed(iteration)
        starts = torch.randint(0, len(text) - seq_len - 1, (batch_size,), generator=generator)
        windows = torch.stack([text[s:s + seq_len + 1] for s in starts.tolist()]).long()
        return windows[:, :-1], windows[:, 1:]

    inputs, targets = batches(0, microbatch_size)
    return ModelSpec(f"charlm{num_layers}", layers, inputs, targets, _token_cross_entropy, batches)


class _CausalBlock(nn.TransformerEncoderLayer):
    """A transformer encoder block that only looks back (a language model's block)."""

    def __init__(self, d_model: int):
        super().__init__(d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return super().forward(x, src_mask=mask, is_causal=True)


BUILTIN_MODELS: dict[str, Callable[..., ModelSpec]] = {"transformer": transformer, "mlp": mlp, "cnn": cnn,
                                                       "charlm": charlm}


def load_model(spec: str, num_layers: int | None = None, microbatch_size: int | None = None,
               seed: int = 0, meta: bool = False) -> ModelSpec:
    """Build a built-in model by name, or call a user's ``pkg.module:factory`` or ``path/to/file.py:factory``.

    ``seed`` seeds torch first, so every process that builds the model gets the same parameters.
    ``meta``: build a built-in model's layers as structure only (the meta device); a rank then gives
    values to the layers it owns (``runtime.layers.initialise``). A factory always builds for real.
    """
    torch.manual_seed(seed)
    if spec in BUILTIN_MODELS:
        kwargs: dict[str, Any] = {"meta": meta}
        if num_layers is not None:
            kwargs["num_layers"] = num_layers
        if microbatch_size is not None:
            kwargs["microbatch_size"] = microbatch_size
        return BUILTIN_MODELS[spec](**kwargs)
    if ":" not in spec:
        raise InputError(f"--model '{spec}': not a built-in model ({', '.join(BUILTIN_MODELS)}) "
                         f"nor a 'pkg.module:factory' or 'path/to/file.py:factory'")
    target, _, attr = spec.rpartition(":")
    module = _import_module_or_file(target, spec)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InputError(f"--model '{spec}': {target} has no callable '{attr}'")
    result = _call_factory(factory, spec)
    if not isinstance(result, tuple) or len(result) not in (4, 5):
        raise InputError(f"--model '{spec}': the factory must return (layers, example_microbatch, target, loss_fn) "
                         f"or those and a data source")
    layers, example, target_tensor, loss_fn = result[:4]
    layer_list = list(layers) if isinstance(layers, (nn.Sequential, list, tuple, nn.ModuleList)) else None
    if not layer_list or not all(isinstance(layer, nn.Module) for layer in layer_list):
        raise InputError(f"--model '{spec}': layers must be an nn.Sequential or a list of nn.Module")
    if not isinstance(example, torch.Tensor) or example.dim() == 0:
        raise InputError(f"--model '{spec}': example_microbatch must be a tensor with a batch dimension")
    name = Path(target).stem if target.endswith(".py") else target.rpartition(".")[2]
    return ModelSpec(name, layer_list, example, target_tensor, loss_fn, _data_source(result[4], spec)
                     if len(result) == 5 else None)


def _call_factory(factory: Callable[[], Any], spec: str) -> Any:
    """The factory's result; if it raises, a :class:`UserCodeError` naming it and its error, with the
    frames of the user's own code (rlpipe's are not theirs to read)."""
    try:
        return factory()
    except Exception as err:
        frames = [frame for frame in traceback.extract_tb(err.__traceback__)
                  if "rlpipe" not in Path(frame.filename).parts]
        details = "".join(["Traceback (your code):\n", *traceback.format_list(frames),
                           *traceback.format_exception_only(type(err), err)])
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise UserCodeError(f"--model '{spec}': the factory raised {type(err).__name__}: {first_line}",
                            details) from None


def _data_source(source: Any, spec: str) -> Batches:
    """A factory's data source as ``batches(iteration, batch_size)``: a callable so, or an iterable of
    ``(inputs, targets)`` batches, cycled through."""
    if callable(source):
        return source
    try:
        cached = [tuple(batch) for batch in source]
    except TypeError:
        raise InputError(f"--model '{spec}': the data source must be batches(iteration, batch_size) or an "
                         f"iterable of (inputs, targets)") from None
    if not cached or any(len(batch) != 2 for batch in cached):
        raise InputError(f"--model '{spec}': the data source must hold (inputs, targets) pairs")
    return lambda iteration, batch_size: cached[iteration % len(cached)]


def _import_module_or_file(target: str, spec: str) -> ModuleType:
    """Import ``pkg.module`` (also from the working directory) or load ``path/to/file.py``.

    The working directory and the file's folder go at the end of ``sys.path``: a user's modules are
    found there, yet a folder that happens to hold a clone named ``rlpipe`` never shadows the
    installed package.
    """
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise InputError(f"--model '{spec}': no such file '{target}'")
        _append_to_path(str(path.parent.resolve()))  # so the file can import its neighbours
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise InputError(f"--model '{spec}': '{target}' is not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
        return module
    _append_to_path(os.getcwd())
    try:
        return importlib.import_module(target)
    except ImportError as err:
        raise InputError(f"--model '{spec}': cannot import module '{target}' ({err}); give a module importable "
                         f"from here or a file, as path/to/file.py:factory") from None


def _append_to_path(folder: str) -> None:
    if folder not in sys.path:
        sys.path.append(folder)
