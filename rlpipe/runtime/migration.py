"""Moving layers between live stages: parameters, buffers and Adam state, point to point.

Every rank holds a copy of every layer's module (built from the same seed), so a receiver knows
each layer's shapes; what travels is the owner's current values, received straight into the
receiver's copy, which no stage uses until the move commits. A transfer is atomic: every rank
reports whether its part arrived intact, and all commit together or all keep the old partition
(an aborted receipt only refreshed a copy nobody trains).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from rlpipe.partition import Partition

STATE_KEYS = ("exp_avg", "exp_avg_sq")


def transfer_plan(old: tuple[int, ...], new: tuple[int, ...], num_layers: int) -> dict[tuple[int, int], list[int]]:
    """``{(sender, receiver): [layers]}`` in a deterministic order."""
    plan: dict[tuple[int, int], list[int]] = {}
    for layer, src, dst in Partition(tuple(old), num_layers).moved_layers(Partition(tuple(new), num_layers)):
        plan.setdefault((src, dst), []).append(layer)
    return dict(sorted(plan.items()))


def _values(layer: nn.Module) -> list[torch.Tensor]:
    """A layer's parameters and buffers, in a fixed order."""
    return [p.data for _, p in sorted(layer.named_parameters())] + [b for _, b in sorted(layer.named_buffers())]


def _params(layer: nn.Module) -> list[nn.Parameter]:
    return [p for _, p in sorted(layer.named_parameters())]


def outgoing(layers: list[nn.Module], optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """What a sender sends, in order and without copying: per layer a float64 header (has Adam
    state, each parameter's step), its parameters and buffers, then each parameter's two moments
    (zeros before the optimizer's first step)."""
    tensors: list[torch.Tensor] = []
    for layer in layers:
        params = _params(layer)
        states = [optimizer.state.get(p, {}) for p in params]
        has_state = bool(params) and all(states)
        steps = [float(state["step"]) if has_state else 0.0 for state in states]
        tensors.append(torch.tensor([1.0 if has_state else 0.0, *steps], dtype=torch.float64))
        tensors += _values(layer)
        for p, state in zip(params, states):
            tensors += [state[key] if has_state else torch.zeros_like(p) for key in STATE_KEYS]
    return tensors


@dataclass
class Received:
    """What a receiver got for some layers. Values land directly in its (unused) copies of those
    layers; headers and Adam moments wait here until every rank agrees to commit."""

    layers: list[nn.Module]
    headers: list[torch.Tensor]
    moments: list[list[torch.Tensor]]

    @classmethod
    def buffers_for(cls, layers: list[nn.Module]) -> tuple[Received, list[torch.Tensor]]:
        """The receipt and the tensors to receive into, in the order :func:`outgoing` sends them."""
        receipt, targets = cls(layers, [], []), []
        for layer in layers:
            params = _params(layer)
            header = torch.empty(1 + len(params), dtype=torch.float64)
            moments = [torch.empty_like(p) for p in params for _ in STATE_KEYS]
            receipt.headers.append(header)
            receipt.moments.append(moments)
            targets += [header, *_values(layer), *moments]
        return receipt, targets

    def adam_states(self) -> dict[nn.Parameter, dict]:
        """``{param: adam_state}`` for the received layers that had optimizer state."""
        states = {}
        for layer, header, moments in zip(self.layers, self.headers, self.moments):
            if header[0].item():
                for k, p in enumerate(_params(layer)):
                    states[p] = {"step": torch.tensor(header[1 + k].item()),
                                 **{key: moments[2 * k + j] for j, key in enumerate(STATE_KEYS)}}
        return states


def _checksum(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The same data summed the same way gives the same bits at both ends."""
    return torch.tensor([sum(float(t.float().sum()) for t in tensors)], dtype=torch.float64)


def exchange(plan: dict[tuple[int, int], list[int]], rank: int, modules: list[nn.Module],
             optimizer: torch.optim.Optimizer, corrupt: bool = False) -> tuple[list[Received], bool, int]:
    """Send what this rank loses and receive what it gains; returns (receipts, ok, bytes sent).

    Every tensor of this rank's transfers is posted at once (single isend/irecv calls, not a
    coalesced batch, which can hang on gloo) and then awaited, so independent pairs move in parallel
    and nothing is copied into a staging buffer. A checksum closes each transfer; ``corrupt`` spoils
    it (the atomicity test's fault).
    """
    world = dist.get_world_size()
    works, receipts, checks, bytes_sent = [], [], [], 0
    for (src, dst), layers in plan.items():
        tag = src * world + dst
        if rank == src:
            tensors = outgoing([modules[i] for i in layers], optimizer)
            tensors.append(_checksum(tensors))
            works += [(t, dist.isend(t.contiguous(), dst, tag=tag)) for t in tensors]
            bytes_sent += sum(t.numel() * t.element_size() for t in tensors)
        elif rank == dst:
            receipt, targets = Received.buffers_for([modules[i] for i in layers])
            checksum = torch.empty(1, dtype=torch.float64)
            works += [(t, dist.irecv(t, src, tag=tag)) for t in targets + [checksum]]
            receipts.append(receipt)
            checks.append((targets, checksum))
    for _, work in works:
        work.wait()  # type: ignore[union-attr]  # point-to-point calls always return a Work
    ok = all(torch.equal(_checksum(targets) + (1.0 if corrupt else 0.0), checksum) for targets, checksum in checks)
    return receipts, ok, bytes_sent


def all_agree(ok: bool) -> bool:
    """True on every rank if ``ok`` is true on every rank."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
