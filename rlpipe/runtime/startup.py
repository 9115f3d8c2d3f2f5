"""What a stage process does before training: join the job's process group, learn the host it runs
on (processes per core, memory, GPU load), decide the launch plan (profile, device-time scale,
partition) and measure what the simulator needs to predict the run (point-to-point bandwidth, the
schedule's overhead per operation)."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

from rlpipe.partition import optimal_partition
from rlpipe.profile import LayerProfile, load_profile, measure_profile
from rlpipe.runtime.config import PipelineConfig
from rlpipe.runtime.device_time import DeviceClock, default_scale
from rlpipe.runtime.layers import is_materialised
from rlpipe.runtime.mesh import Mesh
from rlpipe.runtime.processes import start_heartbeat
from rlpipe.runtime.profiles import measured_profile, model_key, profile_id
from rlpipe.runtime.transport import Transport, join_process_group, staged_loss, staged_module
from rlpipe.simulator import Overheads, simulate_schedule


@dataclass(frozen=True)
class LaunchPlan:
    """What rank 0 decides at start-up and every rank needs (sent as one float64 tensor).

    Attributes:
        boundaries: the launch partition.
        forward_ms, backward_ms: per layer, its device time per micro-batch, ms (emulated: the
            profile's times x the scale; real: the profile's).
        device_time_scale: emulated device time over the profile's (1.0 in real mode).
    """

    boundaries: tuple[int, ...]
    forward_ms: np.ndarray
    backward_ms: np.ndarray
    device_time_scale: float

    def pack(self) -> torch.Tensor:
        return torch.tensor([*self.boundaries, *self.forward_ms, *self.backward_ms, self.device_time_scale],
                            dtype=torch.float64)

    @classmethod
    def unpack(cls, message: torch.Tensor, num_stages: int, num_layers: int) -> LaunchPlan:
        values = message.cpu().numpy()
        return cls(tuple(int(b) for b in values[:num_stages]), values[num_stages:num_stages + num_layers].copy(),
                   values[num_stages + num_layers:num_stages + 2 * num_layers].copy(), float(values[-1]))

    def compute_ms(self) -> np.ndarray:
        """Forward + backward device time of each layer, ms per micro-batch."""
        return self.forward_ms + self.backward_ms


def start_process_group(requested_transport: str = "auto", timeout_s: float = 120.0) -> Transport:
    """Join the job's process group with this process's transport (:mod:`rlpipe.runtime.transport`;
    returned) and start the heartbeat that names a dead peer."""
    already = dist.is_initialized()
    transport = join_process_group(requested_transport, timeout_s)
    if not already:
        start_heartbeat(dist.get_rank())
    return transport


def process_rss_bytes() -> int:
    """This process's resident memory (RSS) now, bytes, from ``/proc`` (-1 where there is none)."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return -1
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def gpu_load(device: torch.device) -> tuple[float, float]:
    """(utilisation %, memory in use in bytes) of a GPU from NVML, or (-1, -1) where there is none."""
    if device.type != "cuda":
        return -1.0, -1.0
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        return (float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                float(pynvml.nvmlDeviceGetMemoryInfo(handle).used))
    except Exception:  # no NVML here (not installed, no driver): the figures are optional
        return -1.0, -1.0


def local_processes_and_cores(world: int) -> tuple[int, int]:
    """(stage processes on this machine, cores this process may run on)."""
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return processes, len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class ProfileInfo:
    """Rank 0's account of the profile a run emulates or plans with.

    Attributes:
        device: the profile in device time (its times x the device-time scale): what the controller and
            the simulator's prediction use.
        identity: a short hash of the (unscaled) profile: two runs with the same one, at the same scale,
            emulate the same devices.
        source: where it came from: ``measured`` now, ``cached`` (measured by an earlier run here) or the
            file given.
    """

    device: LayerProfile
    identity: str
    source: str
    profile: LayerProfile


def plan_launch(config: PipelineConfig, layers: list[nn.Module], example: torch.Tensor, target: torch.Tensor,
                loss_fn: Callable, rank: int, num_stages: int, processes: int, cores: int, transport: Transport,
                init_layer: Callable[[int, nn.Module], None]) -> tuple[LaunchPlan, ProfileInfo | None]:
    """Rank 0 reads the profile, or the one measured for this model on this machine (kept from an earlier
    run, else measured now on its compute device, on copies of any layer that has only structure, given
    values by ``init_layer``), picks the device-time scale (for ``processes`` stage processes sharing
    ``cores`` compute units: cores, or GPUs) and the launch partition of ``num_stages`` stages, and
    shares them with every rank (collective); returns the plan and (on rank 0) the profile's account."""
    device = transport.compute
    message = torch.zeros(num_stages + 2 * len(layers) + 1, dtype=torch.float64, device=transport.wire)
    info = None
    if rank == 0:
        measured, source = None, ""
        # the default emulation scale compares the profile with real compute here; a given scale needs no measuring
        needs_scale = config.device_time == "emulated" and config.device_time_scale is None
        if not config.profile or needs_scale:
            def measure() -> LayerProfile:
                profile = measure_profile(_RealLayers(layers, init_layer), example.to(device),  # type: ignore[arg-type]
                                          target.to(device), loss_fn, repeats=3, device=device)
                for module in layers:
                    module.zero_grad(set_to_none=True)
                return profile

            measured, source = measured_profile(model_key(layers, example, target, device), measure)
        profile = load_profile(config.profile) if config.profile else measured
        assert profile is not None
        scale = 1.0
        if config.device_time == "emulated" and config.device_time_scale is not None:
            scale = config.device_time_scale
        elif config.device_time == "emulated":
            assert measured is not None  # needs_scale
            scale = default_scale(float(profile.compute_ms().sum()), float(measured.compute_ms().sum()), processes,
                                  cores)
        device_profile = profile.scaled(scale)
        info = ProfileInfo(device_profile, profile_id(profile), f"file {config.profile}" if config.profile else source,
                           profile)
        boundaries = config.boundaries or optimal_partition(
            device_profile, num_stages, microbatches=config.microbatches, schedule=config.schedule
        ).partition.boundaries
        plan = LaunchPlan(tuple(boundaries), device_profile.fwd_ms(), device_profile.bwd_ms(), scale)
        message = plan.pack().to(transport.wire)
    dist.broadcast(message, 0)
    return LaunchPlan.unpack(message, num_stages, len(layers)), info


class _RealLayers:
    """The layers as they are where they hold values; a layer that has only structure (the meta device)
    is given to the profiler as an initialised copy, one at a time, so that profiling never holds the
    whole model (its values do not matter to its time)."""

    def __init__(self, layers: list[nn.Module], init_layer: Callable[[int, nn.Module], None]):
        self.layers, self.init_layer = layers, init_layer

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[nn.Module]:
        for index, layer in enumerate(self.layers):
            if is_materialised(layer):
                yield layer
            else:
                copied = copy.deepcopy(layer)
                self.init_layer(index, copied)
                yield copied


def measure_p2p_bandwidth_gbps(rank: int, world: int, transport: Transport, megabytes: int = 8) -> float:
    """Round trip of a tensor between ranks 0 and 1, from compute device to compute device (through the
    host when staged), in Gbit/s one way (0 with a single rank)."""
    if world < 2:
        return 0.0
    payload = torch.zeros(megabytes * 2**20 // 4, device=transport.compute)
    buffer = torch.empty_like(payload, device=transport.wire)

    def send(peer: int) -> None:
        dist.send(payload.to(transport.wire), peer)

    def receive(peer: int) -> None:
        dist.recv(buffer, peer)
        payload.copy_(buffer)
        if payload.is_cuda:
            torch.cuda.synchronize(payload.device)

    dist.barrier()
    start = time.perf_counter()
    for _ in range(2):
        if rank == 0:
            send(1)
            receive(1)
        elif rank == 1:
            receive(0)
            send(0)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=transport.wire)
    dist.broadcast(elapsed, 0)
    return 4 * payload.numel() * 4 * 8 / elapsed.item() / 1e9


def measure_op_overhead_ms(mesh: Mesh, schedule: str, microbatches: int, transport: Transport,
                           steps: int = 8) -> float:
    """What the schedule costs per forward or backward operation beside compute, on this host now (its
    Python, point-to-point calls, loss): every replica runs a pipeline of one tiny layer per rank, timed
    over ``steps`` iterations, over the operations on its critical path (collective; every rank gets
    rank 0's figure)."""
    torch.manual_seed(0)
    num_stages = mesh.dims.stages
    last = mesh.stage == num_stages - 1
    module = staged_module(nn.Linear(4, 4).to(transport.compute), transport, last, DeviceClock("real"))
    stage = PipelineStage(module, mesh.stage, num_stages, transport.wire, group=mesh.pp_group)
    pipeline = get_schedule_class(schedule)(stage, microbatches, loss_fn=staged_loss(nn.functional.mse_loss))
    batch = torch.randn(2 * microbatches, 4, device=transport.wire)
    elapsed = torch.zeros(1, dtype=torch.float64, device=transport.wire)
    first = mesh.stage == 0
    for step in range(2 + steps):  # two warm-up steps infer shapes
        if step == 2:
            dist.barrier()
            start = time.perf_counter()
        if first and last:
            pipeline.step(batch, target=batch)
        elif first:
            pipeline.step(batch)
        elif last:
            pipeline.step(target=batch)
        else:
            pipeline.step()
    elapsed[0] = (time.perf_counter() - start) / steps * 1e3
    dist.broadcast(elapsed, 0)
    zero = np.zeros(num_stages)
    operations = simulate_schedule(zero, zero, np.zeros(max(num_stages - 1, 1)), schedule, microbatches,
                                   Overheads(op_ms=1.0)).iteration_ms  # ops on the critical path
    return float(elapsed.item()) / operations
