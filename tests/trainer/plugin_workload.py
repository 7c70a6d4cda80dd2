"""A user plugin for the trainer tests: `plugin_workload:build` (two interleaved spirals)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from ddp_trainer.data.workloads import Workload


def build(config) -> Workload:
    generator = torch.Generator().manual_seed(3)
    t = torch.rand(1200, generator=generator) * 3 * torch.pi
    label = torch.randint(0, 2, (1200,), generator=generator)
    radius = t / (3 * torch.pi)
    angle = t + label * torch.pi
    x = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    model = nn.Sequential(
        nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)
    )
    return Workload(
        model,
        TensorDataset(x[:1000], label[:1000]),
        TensorDataset(x[1000:], label[1000:]),
        F.cross_entropy,
    )
