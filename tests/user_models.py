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
