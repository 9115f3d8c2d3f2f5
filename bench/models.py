"""Models for the runtime benchmarks, written to the user-model factory contract."""

import torch
from torch import nn


def wide_mlp():
    """Ten 1024-wide layers: ~10.5M parameters (126 MB with Adam state), for stall measurements."""
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(9)] + [nn.Linear(1024, 16)]
    return layers, torch.randn(4, 1024), torch.randint(0, 16, (4,)), nn.functional.cross_entropy


def soak_mlp():
    """Eight 512-wide layers (~0.26M parameters, ~3 MB with Adam state each): small enough for 2,000
    iterations in about a minute, large enough that every move has a measurable bandwidth floor."""
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(7)] + [nn.Linear(512, 16)]
    return layers, torch.randn(4, 512), torch.randint(0, 16, (4,)), nn.functional.cross_entropy
