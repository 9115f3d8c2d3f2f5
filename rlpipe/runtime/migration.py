"""Moving layers between live stages: parameters, buffers and optimizer state, point to point.

A rank holds only the layers its stage owns; the others keep their structure without storage (the
``meta`` device). A receiver materialises a layer it gains (empty storage on its device) and the
owner's current values land straight in it. The layer's optimizer state, whatever the optimizer keeps
per parameter (Adam's step and moments, SGD's momentum buffer), follows: a small JSON header describes
it first, so that the receiver can allocate it. A transfer is atomic: every rank reports whether its
part arrived intact, and all commit together (the giver then frees the layers) or all keep the old
partition (the receiver frees its copies again).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlpipe.partition import Partition
from rlpipe.runtime.layers import materialise

HOLD_IN_FLIGHT_ENV = "RLPIPE_TEST_HOLD_IN_FLIGHT"  # tests only: a sender announces (PATH.rankN) and holds its
# transfers in flight, so that a test can kill it mid-migration


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


def describe_state(layers: list[nn.Module], optimizer: torch.optim.Optimizer) -> list[list[list[list[Any]]]]:
    """Per layer, per parameter, the optimizer's state as ``[key, "tensor", dtype, shape, on_cpu]`` or
    ``[key, "value", number]`` entries (keys sorted): what a receiver needs to allocate it."""
    description = []
    for layer in layers:
        per_param = []
        for p in _params(layer):
            entries: list[list[Any]] = []
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    entries.append([key, "tensor", str(value.dtype).removeprefix("torch."), list(value.shape),
                                    value.device.type == "cpu"])
                else:
                    entries.append([key, "value", value])
            per_param.append(entries)
        description.append(per_param)
    return description


def outgoing(layers: list[nn.Module], optimizer: torch.optim.Optimizer, device: torch.device) -> list[torch.Tensor]:
    """What a sender transfers for ``layers``, in the order :meth:`Received.allocate` receives it: their
    parameters and buffers, then the optimizer state tensors of :func:`describe_state`, on ``device``."""
    state = [value.to(device) for layer in layers for p in _params(layer)
             for _, value in sorted(optimizer.state.get(p, {}).items()) if isinstance(value, torch.Tensor)]
    return [t for layer in layers for t in _values(layer)] + state


@dataclass
class Received:
    """What a receiver got for some layers: values land in its materialised copies; the optimizer state
    waits here until every rank agrees to commit."""

    layers: list[nn.Module]
    description: list[list[list[list[Any]]]]
    state: list[torch.Tensor] = field(default_factory=list)

    def allocate(self, device: torch.device) -> list[torch.Tensor]:
        """Materialise the layers and allocate their state; the tensors to receive into, in sending order."""
        for layer in self.layers:
            materialise(layer, device)
        self.state = [torch.empty(entry[3], dtype=getattr(torch, entry[2]), device=device)
                      for per_param in self.description for entries in per_param for entry in entries
                      if entry[1] == "tensor"]
        return [t for layer in self.layers for t in _values(layer)] + self.state

    def optimizer_states(self) -> dict[nn.Parameter, dict[str, Any]]:
        """``{param: state}`` for the received parameters that had optimizer state."""
        states: dict[nn.Parameter, dict[str, Any]] = {}
        tensors = iter(self.state)
        for layer, per_param in zip(self.layers, self.description, strict=True):
            for p, entries in zip(_params(layer), per_param, strict=True):
                state: dict[str, Any] = {}
                for entry in entries:
                    if entry[1] == "tensor":
                        value = next(tensors)
                        state[entry[0]] = value.cpu() if entry[4] else value
                    else:
                        state[entry[0]] = entry[2]
                if state:
                    states[p] = state
        return states


def _checksum(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The same data summed the same way gives the same bits at both ends."""
    total = sum(float(t.double().sum()) for t in tensors)
    return torch.tensor([total], dtype=torch.float64, device=device)


def _wait(works: list) -> None:
    for work in works:
        work.wait()


def exchange(plan: dict[tuple[int, int], list[int]], stage: int, pipeline_ranks: list[int], modules: list[nn.Module],
             optimizer: torch.optim.Optimizer, device: torch.device, wire: torch.device | None = None,
             corrupt: bool = False) -> tuple[list[Received], bool, int]:
    """Send what this stage loses and receive what it gains; returns (receipts, ok, bytes sent).

    ``plan`` names stages; ``pipeline_ranks`` maps them to the global ranks of this rank's replica, so
    every replica of a hybrid job moves its own layers, all at the same time. First the headers (their
    lengths, then their bytes), then every tensor of this stage's transfers, posted at once (single
    isend/irecv calls, not a coalesced batch, which can hang on gloo) and then awaited, so independent
    pairs move in parallel; a checksum closes each transfer (``corrupt`` spoils it: the atomicity
    test's fault). The layers live on ``device``; with a ``wire`` (the host, when the transport stages:
    gloo sends no CUDA tensor point to point) everything sent and received passes through it.
    """
    staged, wire = wire is not None, wire or device
    world = dist.get_world_size()
    rank_of = pipeline_ranks
    sends = {pair: layers for pair, layers in plan.items() if pair[0] == stage}
    receives = {pair: layers for pair, layers in plan.items() if pair[1] == stage}
    headers = {pair: torch.tensor(bytearray(json.dumps(describe_state([modules[i] for i in layers], optimizer)),
                                            "utf-8"), dtype=torch.uint8, device=wire)
               for pair, layers in sends.items()}
    lengths = {pair: torch.zeros(1, dtype=torch.int64, device=wire) for pair in receives}
    def tag(src: int, dst: int) -> int:  # one per pair of global ranks
        return rank_of[src] * world + rank_of[dst]

    _wait([dist.isend(torch.tensor([len(h)], dtype=torch.int64, device=wire), rank_of[dst], tag=tag(src, dst))
           for (src, dst), h in headers.items()]
          + [dist.irecv(lengths[(src, dst)], rank_of[src], tag=tag(src, dst)) for src, dst in receives])
    texts = {pair: torch.empty(int(lengths[pair].item()), dtype=torch.uint8, device=wire) for pair in receives}
    _wait([dist.isend(h, rank_of[dst], tag=tag(src, dst)) for (src, dst), h in headers.items()]
          + [dist.irecv(texts[(src, dst)], rank_of[src], tag=tag(src, dst)) for src, dst in receives])

    works, receipts, checks, landings, in_flight, bytes_sent = [], [], [], [], [], 0
    for (src, dst), layers in plan.items():
        if stage == src:
            owned = [modules[i] for i in layers]
            tensors = outgoing(owned, optimizer, device)
            tensors.append(_checksum(tensors, wire))
            on_wire = [t.to(wire, copy=True) if staged else t.contiguous() for t in tensors]
            in_flight += on_wire  # held until every transfer is done
            works += [dist.isend(t, rank_of[dst], tag=tag(src, dst)) for t in on_wire]
            bytes_sent += sum(t.numel() * t.element_size() for t in tensors) + len(headers[(src, dst)])
        elif stage == dst:
            description = json.loads(bytes(texts[(src, dst)].cpu().tolist()).decode("utf-8"))
            receipt = Received([modules[i] for i in layers], description)
            targets = receipt.allocate(device)
            buffers = [torch.empty_like(t, device=wire) for t in targets] if staged else targets
            landings += list(zip(targets, buffers, strict=True)) if staged else []
            checksum = torch.empty(1, dtype=torch.float64, device=wire)
            works += [dist.irecv(t, rank_of[src], tag=tag(src, dst)) for t in buffers + [checksum]]
            receipts.append(receipt)
            checks.append((targets, checksum))
    if sends and HOLD_IN_FLIGHT_ENV in os.environ:  # the test of a peer killed while its layers are in flight
        Path(f"{os.environ[HOLD_IN_FLIGHT_ENV]}.rank{dist.get_rank()}").touch()
        time.sleep(120)
    _wait(works)
    for target, buffer in landings:  # from the host onto the device
        target.copy_(buffer)
    spoil = 1.0 if corrupt else 0.0
    ok = all(torch.equal(_checksum(targets, wire) + spoil, checksum) for targets, checksum in checks)
    return receipts, ok, bytes_sent


def all_agree(ok: bool, device: torch.device) -> bool:
    """True on every rank if ``ok`` is true on every rank."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
