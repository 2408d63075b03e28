"""The reference network: a CIFAR-style ResNet with the ELU-Conv-ELU-Conv residual block.

Shah et al. 2016 ("Deep Residual Networks with Exponential Linear Unit", section 3.2.2, figure 3b)
put ELU before each convolution and nothing after the addition. Without batch normalisation this
network diverges at learning rate 0.1, which is the failure stabilizer exists to catch; the
`add_batch_norm` option puts BatchNorm before each residual addition, which is the fix.

This module only defines the network; it must not read configuration or touch the file system.
"""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = {"elu": nn.ELU, "relu": nn.ReLU}
STAGE_WIDTHS = (16, 32, 64)
WEIGHT_DECAY = 1e-4  # L2 on convolution and linear kernels, as the reference network
HEAD_INIT_STD = 0.01


class ResidualBlock(nn.Module):
    """x + [BN](Conv(act(Conv(act(x))))), with a 1x1 projection shortcut when downsampling."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, activation: str, add_batch_norm: bool):
        super().__init__()
        self.act1 = ACTIVATIONS[activation]()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1)
        self.act2 = ACTIVATIONS[activation]()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(out_channels) if add_batch_norm else nn.Identity()
        needs_projection = stride != 1 or in_channels != out_channels
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=stride) if needs_projection else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = self.bn(self.conv2(self.act2(self.conv1(self.act1(x)))))
        return self.shortcut(x) + residual


class ResNet(nn.Module):
    """ResNet of depth 6n+2 for 32x32 images: a stem, three stages of n blocks, pooling, a linear head."""

    def __init__(
        self,
        depth: int = 20,
        num_classes: int = 10,
        activation: str = "elu",
        add_batch_norm: bool = False,
        in_channels: int = 3,
    ):
        super().__init__()
        if (depth - 2) % 6 != 0 or depth < 8:
            raise ValueError(f"depth must be 6n+2 with n >= 1 (8, 14, 20, 32, ...), got {depth}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        blocks_per_stage = (depth - 2) // 6
        self.stem = nn.Conv2d(in_channels, STAGE_WIDTHS[0], 3, padding=1)
        blocks: list[nn.Module] = []
        width = STAGE_WIDTHS[0]
        for stage, stage_width in enumerate(STAGE_WIDTHS):
            for index in range(blocks_per_stage):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(ResidualBlock(width, stage_width, stride, activation, add_batch_norm))
                width = stage_width
        self.blocks = nn.Sequential(*blocks)
        self.head_act = ACTIVATIONS[activation]()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(width, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        # He-normal on convolution kernels (fan-in, as Keras' he_normal), zero biases.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
                nn.init.zeros_(module.bias)
        # The un-normalised trunk grows with depth; a small head starts the loss near log(classes)
        # (He-normal here starts it above 30 and even the batch-norm variant diverges at LR 0.1).
        nn.init.normal_(self.head.weight, std=HEAD_INIT_STD)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        x = self.pool(self.head_act(x)).flatten(1)
        return self.head(x)

    @torch.no_grad()
    def recalibrate_batch_norm(self, x: torch.Tensor, batch_size: int, max_examples: int = 1280) -> None:
        """Re-estimate BatchNorm statistics with the current weights before evaluating.

        At LR 0.1 the weights move faster than BatchNorm's running averages follow, so the
        running statistics are stale and evaluation mode scores near chance while training mode
        scores well. A pass over a few training batches with a cumulative average fixes that.
        """
        norms = [m for m in self.modules() if isinstance(m, nn.BatchNorm2d)]
        if not norms or len(x) == 0:
            return
        was_training = self.training
        saved_momentum = [m.momentum for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative moving average over the batches below
        self.train()
        device = next(self.parameters()).device
        with torch.no_grad():
            for start in range(0, min(len(x), max_examples), batch_size):
                self(x[start:start + batch_size].to(device))
        for m, momentum in zip(norms, saved_momentum, strict=True):
            m.momentum = momentum
        self.train(was_training)

    def parameter_groups(self) -> list[dict]:
        """Kernels get L2 weight decay; biases and BatchNorm parameters do not."""
        decayed, plain = [], []
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                decayed.append(module.weight)
                plain.append(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                plain.extend([module.weight, module.bias])
        return [{"params": decayed, "weight_decay": WEIGHT_DECAY}, {"params": plain, "weight_decay": 0.0}]
