"""The end of an iteration measured at start-up, on stand-ins of a stage's parameters (the live prediction
tests in test_device_time.py read the measured figures from their logs' headers)."""

import pytest
import torch
from torch import nn

from rlpipe.runlog import MEBIBYTE
from rlpipe.runtime.step_costs import STAND_IN_BYTES, StepCosts, optimizer_step_s, stand_ins_of


def trained_parameters(count: int = 4, side: int = 256) -> list[nn.Parameter]:
    params = [nn.Parameter(torch.randn(side, side)) for _ in range(count)]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def test_stand_ins_are_zero_copies_and_the_parameters_stay_as_they_were():
    params = trained_parameters()
    before = [(p.detach().clone(), p.grad.clone()) for p in params]
    stand_ins = stand_ins_of(params)
    assert optimizer_step_s(stand_ins, torch.optim.Adam, repeats=3) > 0
    assert [s.shape for s in stand_ins] == [p.shape for p in params]
    assert all(not s.any() and s.grad is not None for s in stand_ins)  # zero, with (zero) gradients: steppable
    assert all(torch.equal(p, value) and torch.equal(p.grad, grad) for p, (value, grad) in zip(params, before))


def test_a_large_stage_is_timed_on_part_of_it():
    side = 2048  # 16 MiB a tensor
    params = [nn.Parameter(torch.empty(side, side, device="meta")) for _ in range(3 * STAND_IN_BYTES // (4 * side**2))]
    stand_ins = stand_ins_of(params)
    assert 0 < len(stand_ins) < len(params) and sum(s.numel() * 4 for s in stand_ins) == STAND_IN_BYTES


def test_an_optimizer_whose_step_needs_a_closure_is_not_timed():
    assert optimizer_step_s(stand_ins_of(trained_parameters()), torch.optim.LBFGS, repeats=3) == 0.0
    assert optimizer_step_s([], torch.optim.Adam, repeats=3) == 0.0


def test_a_stage_steps_in_proportion_to_its_parameters():
    costs = StepCosts(sync_gbps=1.0, optimizer_ms_per_mb=4.0)
    assert costs.optimizer_ms(3 * MEBIBYTE) == pytest.approx(12.0) and costs.optimizer_ms(0) == 0.0
