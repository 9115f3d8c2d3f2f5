"""A user's own model, imported by tests as ``user_models:tiny`` (the factory contract)."""

import torch
from torch import nn


def tiny():
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    return layers, x, torch.randn(4, 4), nn.functional.mse_loss


def broken():
    return "not a tuple"


class _LossThatFailsLater:
    """Mean-squared error that raises after a number of calls: only the last stage computes the loss
    during training, so that stage fails first."""

    def __init__(self, calls_before_failing: int):
        self.calls_left = calls_before_failing

    def __call__(self, output, target):
        self.calls_left -= 1
        if self.calls_left < 0:
            raise RuntimeError("the loss failed on purpose")
        return nn.functional.mse_loss(output, target)


def fails_on_the_last_stage():
    """``tiny`` whose loss fails in the 5th iteration of 4 micro-batches (the start-up profile calls it 5 times)."""
    layers, x, target, _ = tiny()
    return layers, x, target, _LossThatFailsLater(5 + 4 * 4)


def _make_layers():
    raise ValueError("the checkpoint path is wrong")


def raises():
    """A factory with a bug of its own: a user's traceback, not rlpipe's, should show it."""
    return _make_layers()


class _SlowsDown(nn.Module):
    """A linear layer whose compute takes 5 ms more once it has run ``after`` times (the start-up profile
    measures it fast; training then finds it slower than its emulated device time)."""

    def __init__(self, after: int):
        super().__init__()
        self.linear, self.calls, self.after = nn.Linear(8, 8), 0, after

    def forward(self, x):
        import time

        self.calls += 1
        if self.calls > self.after:
            time.sleep(0.005)
        return self.linear(x)


def slows_after_profiling():
    torch.manual_seed(0)
    layers = [_SlowsDown(12), nn.Tanh(), _SlowsDown(12), nn.Linear(8, 4)]
    return layers, torch.randn(4, 8), torch.randn(4, 4), nn.functional.mse_loss
