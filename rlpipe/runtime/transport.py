"""How a stage process reaches its device and the other stages: the transport, chosen at start-up.

- ``nccl``: every stage process on this host has a GPU of its own (``cuda:LOCAL_RANK``); tensors go
  from GPU to GPU.
- ``host-staged``: more stage processes than GPUs (one GPU and four stages, say). The processes share
  the GPUs (local rank modulo their count), since NCCL refuses two ranks on one device and gloo sends
  no CUDA tensor point to point. Layers, activations, gradients, optimizer state and received layers
  stay on the GPU; every tensor handed to torch.distributed (a stage boundary's activations and
  gradients, a gradient bucket, a moving layer) is copied to the host, gloo carries it, and it is copied
  back. Those copies are communication: the device clock leaves them out of compute.
- ``gloo``: no GPU; the stages compute on the CPU and nothing is staged.

The user may force ``nccl`` or ``host-staged`` (``--transport``); ``auto`` picks as above.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from rlpipe.errors import InputError
from rlpipe.runtime.config import TRANSPORTS

if TYPE_CHECKING:
    from rlpipe.runtime.device_time import DeviceClock

STAGED_ON_CPU = "host-staged-on-cpu"  # the tests of staging on a host without a GPU: every copy runs, host to host


@dataclass(frozen=True)
class Transport:
    """The transport of one stage process.

    Attributes:
        name: ``nccl``, ``host-staged`` or ``gloo``.
        backend: the torch.distributed backend (``nccl`` or ``gloo``).
        compute: where the stage's layers and their state live.
        wire: where a tensor must be for torch.distributed to carry it (the host when staged).
        shared_device: other stage processes on this host compute on the same device.
    """

    name: str
    backend: str
    compute: torch.device
    wire: torch.device
    shared_device: bool

    @property
    def staged(self) -> bool:
        """Whether tensors pass through the host between the stage and the others (``host-staged``)."""
        return self.name == "host-staged"

    @property
    def staging_wire(self) -> torch.device | None:
        """The host, for the collectives that stage through it; ``None`` when nothing is staged."""
        return self.wire if self.staged else None


def choose_transport(requested: str, gpus: int, local_processes: int, local_rank: int) -> Transport:
    """The transport of the stage process ``local_rank`` of ``local_processes`` on a host with ``gpus``
    GPUs, as ``requested`` (``auto``, ``nccl`` or ``host-staged``); raises InputError for a forced
    choice this host cannot give."""
    if requested == STAGED_ON_CPU:
        return Transport("host-staged", "gloo", torch.device("cpu"), torch.device("cpu"), shared_device=False)
    if requested not in TRANSPORTS:
        raise InputError(f"--transport {requested}: expected one of {', '.join(TRANSPORTS)}")
    if requested != "auto" and gpus == 0:
        raise InputError(f"--transport {requested}: needs a GPU, and this host has none (auto runs on the CPU)")
    if requested == "nccl" and gpus < local_processes:
        raise InputError(f"--transport nccl: {local_processes} stage processes on this host and {gpus} GPU(s); "
                         f"NCCL needs one each (--transport host-staged shares them)")
    if gpus == 0:
        cpu = torch.device("cpu")
        return Transport("gloo", "gloo", cpu, cpu, shared_device=False)
    if requested == "nccl" or (requested == "auto" and gpus >= local_processes):
        gpu = torch.device(f"cuda:{local_rank}")
        return Transport("nccl", "nccl", gpu, gpu, shared_device=False)
    return Transport("host-staged", "gloo", torch.device(f"cuda:{local_rank % gpus}"), torch.device("cpu"),
                     shared_device=local_processes > gpus)


def this_process_transport(requested: str) -> Transport:
    """:func:`choose_transport` for this stage process, from torchrun's environment; when the process
    group is already up (a user's own script started it), the transport its backend allows."""
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dist.is_initialized():
        backend = str(dist.get_backend())
        if "nccl" in backend:
            if requested == "host-staged":
                raise InputError("transport host-staged: the process group was started with NCCL; start it "
                                 "with gloo")
            return choose_transport("nccl", gpus, local_processes, local_rank)
        if requested == "nccl":
            raise InputError(f"transport nccl: the process group was started with {backend}")
        return choose_transport("host-staged" if gpus else "auto", gpus, local_processes, local_rank)
    return choose_transport(requested, gpus, local_processes, local_rank)


def join_process_group(requested: str = "auto", timeout_s: float = 120.0) -> Transport:
    """Join the job's process group (torchrun's environment) with the backend of this process's
    transport, which it returns. With NCCL, collectives of host tensors go over gloo
    (``cpu:gloo,cuda:nccl``). A collective or a transfer that waits longer than ``timeout_s`` for
    another stage raises, so a hung stage ends the run."""
    transport = this_process_transport(requested)
    if transport.compute.type == "cuda":
        torch.cuda.set_device(transport.compute)
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if transport.backend == "nccl" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return transport


class HostStaged(nn.Module):
    """A stage's layers on ``device`` behind a host boundary: what comes in (from the host, or the
    batch) is copied to the device, what goes out to the next stage is copied to the host, and in the
    backward pass their gradients cross the same way. The last stage's output stays on the device,
    where the loss is computed. Every copy is synchronised and its seconds are added to
    ``clock.staging_s``, so that the device clock counts them as communication, not compute.

    Args:
        layers: the stage's layers, on ``device``.
        device: the stage's compute device.
        last: whether the stage is its pipeline's last (its output goes to the loss, not the host).
        clock: the stage's :class:`~rlpipe.runtime.device_time.DeviceClock`.
    """

    def __init__(self, layers: nn.Module, device: torch.device, last: bool, clock: DeviceClock):
        super().__init__()
        self.layers, self.device, self.last, self.clock = layers, device, last, clock

    def forward(self, *inputs: Any) -> Any:
        output = self.layers(*_cross(inputs, self.device, self.clock))
        return output if self.last else _cross(output, torch.device("cpu"), self.clock)


class _Crossing(torch.autograd.Function):
    """A timed copy to another device whose gradient is a timed copy back."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, device: torch.device, clock: DeviceClock) -> torch.Tensor:
        ctx.source, ctx.clock = tensor.device, clock
        return _timed_copy(tensor, device, clock)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _timed_copy(grad, ctx.source, ctx.clock), None, None


def _timed_copy(tensor: torch.Tensor, device: torch.device, clock: DeviceClock) -> torch.Tensor:
    start = time.perf_counter()
    copied = tensor.to(device, copy=True)  # a copy even where both ends are the host (the CPU tests of staging)
    gpu = device if device.type == "cuda" else tensor.device
    if gpu.type == "cuda":
        torch.cuda.synchronize(gpu)
    clock.staging_s += time.perf_counter() - start
    return copied


def _cross(value: Any, device: torch.device, clock: DeviceClock) -> Any:
    """``value``'s tensors (in tuples and lists too) moved to ``device`` by :class:`_Crossing`."""
    if isinstance(value, torch.Tensor):
        return _Crossing.apply(value, device, clock)
    if isinstance(value, (tuple, list)):
        return type(value)(_cross(v, device, clock) for v in value)
    return value


def staged_module(layers: nn.Module, transport: Transport, last: bool, clock: DeviceClock) -> nn.Module:
    """The module a stage's PipelineStage runs: ``layers`` behind a host boundary when the transport
    stages (:class:`HostStaged`), else ``layers`` themselves."""
    return HostStaged(layers, transport.compute, last, clock) if transport.staged else layers


def staged_loss(loss_fn: Callable) -> Callable:
    """``loss_fn`` with the target moved to the output's device: a host-staged last stage receives its
    target on the host and keeps its output on the GPU (elsewhere a no-op)."""
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output, target.to(output.device))
    return loss
