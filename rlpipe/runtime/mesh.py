"""Where a rank sits in a hybrid job, and the gradient sync between replicas.

A job runs D data-parallel replicas of an S-stage pipeline: world = D x S ranks laid out as a 2-D
device mesh with dims ``dp`` and ``pp`` (torch's ``init_device_mesh``). Replica r's stage s is rank
``r x S + s``, and so is its device index in interference traces. Each replica's stages talk over its
``pp`` group; the D ranks that hold the same layers (a stage group) average their gradients over their
``dp`` group, once per iteration, in one bucketed all-reduce.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from rlpipe.errors import InputError


@dataclass(frozen=True)
class ParallelDims:
    """The job's layout: ``replicas`` (D) data-parallel copies of a ``stages``-stage (S) pipeline."""

    replicas: int
    stages: int

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.stages < 1:
            raise InputError(f"data parallel {self.replicas} x {self.stages} stages: both must be >= 1")

    @classmethod
    def of_world(cls, world: int, replicas: int) -> ParallelDims:
        """The layout of ``world`` ranks as ``replicas`` replicas; the world must divide evenly."""
        if replicas < 1 or world % replicas:
            raise InputError(f"--data-parallel {replicas}: {world} processes do not divide into {replicas} replicas")
        return cls(replicas, world // replicas)

    @property
    def world(self) -> int:
        return self.replicas * self.stages

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def rank_of(self, replica: int, stage: int) -> int:
        return replica * self.stages + stage

    def describe(self, rank: int) -> str:
        """``"replica 1, stage 0, rank 2"`` (``"rank 2"`` for a single pipeline)."""
        if self.replicas == 1:
            return f"rank {rank}"
        return f"replica {self.replica_of(rank)}, stage {self.stage_of(rank)}, rank {rank}"


class Mesh:
    """This rank's place in the job and its process groups (collective: every rank builds it).

    Attributes:
        dims: the layout.
        rank: this rank.
        replica, stage: where it sits.
        pp_group: the replica's pipeline (S ranks).
        dp_group: the stage group (D ranks holding this stage's layers).
        pipeline_ranks: the global rank of each stage of this rank's replica.
    """

    def __init__(self, dims: ParallelDims, rank: int, device_type: str):
        self.dims, self.rank = dims, rank
        self.replica, self.stage = dims.replica_of(rank), dims.stage_of(rank)
        device_mesh = init_device_mesh(device_type, (dims.replicas, dims.stages), mesh_dim_names=("dp", "pp"))
        self.pp_group = device_mesh["pp"].get_group()
        self.dp_group = device_mesh["dp"].get_group()
        self.pipeline_ranks = [dims.rank_of(self.replica, s) for s in range(dims.stages)]

    def release(self) -> None:
        """Let go of the process groups (after ``destroy_process_group``), so that nothing of this mesh
        keeps them alive until the interpreter exits."""
        self.__dict__.pop("pp_group", None)
        self.__dict__.pop("dp_group", None)


class GradientSync:
    """Weights one stage's gradients and sums them over its stage group, in one bucket per dtype.

    Each replica's schedule leaves the sum of its micro-batches' gradients; multiplied by
    ``1 / (micro-batches of the whole job)`` and summed over the replicas, that is the gradient of the
    job's mean loss, whatever the split (:mod:`rlpipe.split`).

    Args:
        group: the stage group's process group.
        replicas: D (1: nothing to sum, only the weighting).
        wire: where the bucket must be for the group's backend to sum it (the host when staged;
            ``None``: where the gradients are).
    """

    def __init__(self, group: dist.ProcessGroup | None, replicas: int, wire: torch.device | None = None):
        self.group, self.replicas, self.wire = group, replicas, wire

    def __call__(self, params: list[nn.Parameter], scale: float) -> float:
        """Weight and sum the gradients of ``params`` in place; returns the seconds it took."""
        start = time.perf_counter()
        for p in params:
            if p.grad is None:  # a parameter this step did not reach: its gradient is zero here
                p.grad = torch.zeros_like(p)
        if self.replicas == 1:
            for p in params:
                p.grad.mul_(scale)  # type: ignore[union-attr]
            return time.perf_counter() - start
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for grad in (p.grad for p in params if p.grad is not None):
            by_dtype.setdefault(grad.dtype, []).append(grad)
        for grads in by_dtype.values():
            bucket = torch.cat([g.reshape(-1) for g in grads]).mul_(scale)
            if self.wire is not None:
                bucket = bucket.to(self.wire)
            dist.all_reduce(bucket, group=self.group)
            offset = 0
            for g in grads:
                g.copy_(bucket[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        return time.perf_counter() - start
