"""A small network and its batches for the rule-engine unit tests (no data channels needed)."""

from __future__ import annotations

import torch
from torch import nn


class TinyBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.act = nn.ELU()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear(self.act(x))


class TinyNet(nn.Module):
    """stem -> two residual blocks -> ReLU -> head, so blocks, activations and biases all exist."""

    def __init__(self, inputs: int = 6, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Linear(inputs, width)
        self.blocks = nn.Sequential(TinyBlock(width), TinyBlock(width))
        self.head_act = nn.ReLU()
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.head_act(self.blocks(self.stem(x))))


def tiny_net(seed: int = 0) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet()


def batch(step: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(size, 6, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return x, y
