"""Models for the runtime benchmarks, written to the user-model factory contract."""

import torch
from torch import nn


def wide_mlp():
    """Ten 1024-wide layers: ~10.5M parameters (126 MB with Adam state), for stall measurements."""
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(9)] + [nn.Linear(1024, 16)]
    return layers, torch.randn(4, 1024), torch.randint(0, 16, (4,)), nn.functional.cross_entropy
