"""The end of an iteration measured at start-up: real gloo processes in a 2 x 2 mesh time their stage
group's gradient sync and the optimizer step on stand-ins, leaving the real parameters as they were."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from rlpipe.runtime.mesh import GradientSync, Mesh, ParallelDims
from rlpipe.runtime.step_costs import MEGABYTE, StepCosts, measure_step_costs


def measure_in_process(rank: int, world: int, init_file: str, results: dict) -> None:
    """Rank ``rank`` of a 2 x 2 job measures its costs (Adam, and LBFGS, whose step needs a closure), and
    those of the same ranks laid out as one pipeline."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = Mesh(ParallelDims(2, world // 2), rank, "cpu")
        torch.manual_seed(rank)
        params = [nn.Parameter(torch.randn(256, 256)) for _ in range(4)]
        for p in params:
            p.grad = torch.randn_like(p)
        before = [(p.detach().clone(), p.grad.clone()) for p in params]
        sync = GradientSync(mesh.dp_group, 2)
        adam = measure_step_costs(params, torch.optim.Adam, sync, mesh, torch.device("cpu"))
        needs_closure = measure_step_costs(params, torch.optim.LBFGS, sync, mesh, torch.device("cpu"))
        pipeline = Mesh(ParallelDims(1, world), rank, "cpu")
        one_pipeline = measure_step_costs(params, torch.optim.Adam, GradientSync(pipeline.dp_group, 1), pipeline,
                                          torch.device("cpu"))
        untouched = all(torch.equal(p, value) and torch.equal(p.grad, grad) for p, (value, grad) in zip(params, before))
        results[rank] = (adam, needs_closure, one_pipeline, untouched)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_learns_the_same_sync_and_optimizer_costs_and_its_parameters_stay_as_they_were(tmp_path):
    shared = mp.Manager().dict()
    mp.spawn(measure_in_process, args=(4, str(tmp_path / "init"), shared), nprocs=4)
    results = dict(shared)
    adams = {adam for adam, _, _, _ in results.values()}
    assert len(results) == 4 and len(adams) == 1  # one figure for the whole job: the median over the ranks
    adam = adams.pop()
    # an all-reduce of 1 MB between two processes, and an Adam step over it: slower than a memory copy
    # could be, faster than anything but a broken measurement
    assert adam.sync_gbps is not None and 0.01 < adam.sync_gbps < 1000
    assert 0.01 < adam.optimizer_ms_per_mb < 1000
    assert all(untouched for _, _, _, untouched in results.values())
    assert {needs_closure.optimizer_ms_per_mb for _, needs_closure, _, _ in results.values()} == {0.0}  # not timed
    assert {one_pipeline.sync_gbps for _, _, one_pipeline, _ in results.values()} == {None}  # no gradient sync


def test_a_stage_steps_in_proportion_to_its_parameters():
    costs = StepCosts(sync_gbps=1.0, optimizer_ms_per_mb=4.0)
    assert costs.optimizer_ms(3 * MEGABYTE) == pytest.approx(12.0) and costs.optimizer_ms(0) == 0.0
