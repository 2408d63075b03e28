"""The classifier both conformance scripts train: small enough for a few seconds of training.

Modules are named as torchvision names them (`relu` reused, `fc` last) plus a `relu1` of its own, so
Debugger's default regexes (`.*relu_output`, `.*relu_input`, `.*fc_output`) find tensors, and a
module whose name only starts with `relu` is there too. Data: the `train` and `test` channels
(x.npy: N x 1 x 8 x 8 float32, y.npy: N class indices).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn


class SmallNet(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.hidden = nn.Linear(32, 16)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu1(self.conv1(x))).flatten(1)
        return self.fc(self.relu(self.hidden(x)))


def load(channel: str) -> tuple[torch.Tensor, torch.Tensor]:
    folder = Path(os.environ[f"SM_CHANNEL_{channel.upper()}"])
    return torch.from_numpy(np.load(folder / "x.npy")), torch.from_numpy(np.load(folder / "y.npy")).long()
