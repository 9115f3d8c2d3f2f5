"""Moving layers between live stages: parameters, buffers and Adam state travel as one flat tensor.

Every rank holds a copy of every layer's module (built from the same seed), so a receiver knows
each layer's shapes; what travels is the owner's current values. Moves are grouped by (sender,
receiver) pair and processed in the same order on every rank, so blocking point-to-point calls
cannot deadlock. A transfer is atomic: receivers stage what they get, every rank reports whether
its part succeeded, and all commit together or all keep the old partition.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

STATE_KEYS = ("exp_avg", "exp_avg_sq")


def owner_of(layer: int, boundaries: tuple[int, ...]) -> int:
    """The stage (rank) that holds ``layer`` under ``boundaries``."""
    return sum(1 for start in boundaries if start <= layer) - 1


def transfer_plan(old: tuple[int, ...], new: tuple[int, ...], num_layers: int) -> dict[tuple[int, int], list[int]]:
    """``{(sender, receiver): [layers]}`` in a deterministic order."""
    plan: dict[tuple[int, int], list[int]] = {}
    for layer in range(num_layers):
        src, dst = owner_of(layer, old), owner_of(layer, new)
        if src != dst:
            plan.setdefault((src, dst), []).append(layer)
    return dict(sorted(plan.items()))


def _layer_tensors(layer: nn.Module) -> list[torch.Tensor]:
    return [p.data for _, p in sorted(layer.named_parameters())] + [b for _, b in sorted(layer.named_buffers())]


def packed_size(layer: nn.Module) -> int:
    """Floats one layer takes in a transfer: values, two Adam moments per parameter, steps, a flag."""
    params = sum(p.numel() for p in layer.parameters())
    buffers = sum(b.numel() for b in layer.buffers())
    return params * 3 + buffers + len(list(layer.parameters())) + 1


def pack(layers: list[nn.Module], optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """One float32 tensor: for each layer, a has-state flag, its parameters and buffers, then each
    parameter's Adam step, exp_avg and exp_avg_sq (zeros when the optimizer has not stepped yet);
    :func:`exchange` appends a checksum."""
    parts: list[torch.Tensor] = []
    for layer in layers:
        params = [p for _, p in sorted(layer.named_parameters())]
        states = [optimizer.state.get(p, {}) for p in params]
        has_state = all(state for state in states) and bool(params)
        parts.append(torch.tensor([1.0 if has_state else 0.0]))
        parts += [t.detach().reshape(-1).float() for t in _layer_tensors(layer)]
        for p, state in zip(params, states):
            parts.append(torch.tensor([float(state["step"]) if has_state else 0.0]))
            for key in STATE_KEYS:
                parts.append(state[key].reshape(-1).float() if has_state else torch.zeros(p.numel()))
    return torch.cat(parts) if parts else torch.zeros(0)


def unpack(flat: torch.Tensor, layers: list[nn.Module]) -> list[dict]:
    """Write values into ``layers`` and return, per layer, ``{param: adam_state}`` (empty if none)."""
    offset, states = 0, []

    def take(n: int) -> torch.Tensor:
        nonlocal offset
        chunk = flat[offset: offset + n]
        offset += n
        return chunk

    for layer in layers:
        has_state = bool(take(1).item())
        with torch.no_grad():
            for t in _layer_tensors(layer):
                t.copy_(take(t.numel()).reshape(t.shape).to(t.dtype))
        layer_state = {}
        for _, p in sorted(layer.named_parameters()):
            step = take(1).item()
            moments = {key: take(p.numel()).reshape(p.shape) for key in STATE_KEYS}  # views: no copy
            if has_state:
                layer_state[p] = {"step": torch.tensor(step), **moments}
        states.append(layer_state)
    if offset != flat.numel():
        raise ValueError(f"transfer size mismatch: used {offset} of {flat.numel()} values")
    return states


@dataclass
class Received:
    """Layers a rank got in a transfer, staged until every rank agrees to commit."""

    layers: list[int]
    payload: torch.Tensor


def exchange(plan: dict[tuple[int, int], list[int]], rank: int, modules: list[nn.Module],
             optimizer: torch.optim.Optimizer, corrupt: bool = False) -> tuple[list[Received], bool, int]:
    """Send what this rank loses and receive what it gains; returns (staged receipts, ok, bytes sent).

    Every transfer of this rank is posted at once (one isend or irecv per peer, not a coalesced
    batch, which can hang on gloo) and then awaited, so independent pairs move in parallel instead
    of along a chain. A received payload's checksum is verified; ``corrupt`` spoils it (the
    atomicity test's fault).
    """
    world = dist.get_world_size()
    sends, receives, bytes_sent = [], [], 0
    for (src, dst), layers in plan.items():
        tag = src * world + dst
        if rank == src:
            flat = pack([modules[i] for i in layers], optimizer)
            message = torch.cat([flat, flat.sum().reshape(1)])  # same data, same summation order at both ends
            sends.append((message, dist.isend(message, dst, tag=tag)))
            bytes_sent += message.numel() * message.element_size()
        elif rank == dst:
            message = torch.empty(sum(packed_size(modules[i]) for i in layers) + 1)
            receives.append((layers, message, dist.irecv(message, src, tag=tag)))
    for _, work in sends:
        work.wait()
    received, ok = [], True
    for layers, message, work in receives:
        work.wait()
        payload, checksum = message[:-1], message[-1]
        expected = payload.sum() + (1.0 if corrupt else 0.0)
        ok = ok and torch.equal(expected, checksum)
        received.append(Received(layers, payload))
    return received, ok, bytes_sent


def all_agree(ok: bool) -> bool:
    """True on every rank if ``ok`` is true on every rank."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
