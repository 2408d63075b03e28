"""The network: shapes, depth, batch-norm placement, initialisation, weight decay groups."""

import pytest
import torch
from torch import nn

from tests.helpers import model_module

_resnet = model_module("resnet")
WEIGHT_DECAY, ResidualBlock, ResNet = _resnet.WEIGHT_DECAY, _resnet.ResidualBlock, _resnet.ResNet


def test_resnet20_has_three_stages_of_three_blocks_and_classifies_32x32_images():
    model = ResNet()
    blocks = list(model.blocks)
    assert len(blocks) == 9
    assert [b.conv2.out_channels for b in blocks] == [16] * 3 + [32] * 3 + [64] * 3
    assert model(torch.randn(4, 3, 32, 32)).shape == (4, 10)


def test_depth_is_configurable_and_validated():
    assert len(list(ResNet(depth=32).blocks)) == 15
    with pytest.raises(ValueError, match="6n\\+2"):
        ResNet(depth=21)
    with pytest.raises(ValueError, match="activation"):
        ResNet(activation="tanh")


def test_downsampling_blocks_use_a_1x1_projection_shortcut():
    model = ResNet()
    projections = [b for b in model.blocks if isinstance(b.shortcut, nn.Conv2d)]
    assert len(projections) == 2
    assert all(p.shortcut.kernel_size == (1, 1) and p.shortcut.stride == (2, 2) for p in projections)


@pytest.mark.parametrize("activation,kind", [("elu", nn.ELU), ("relu", nn.ReLU)])
def test_block_is_activation_conv_activation_conv(activation, kind):
    block = ResidualBlock(16, 16, 1, activation, add_batch_norm=False)
    assert [type(m) for m in (block.act1, block.conv1, block.act2, block.conv2)] == [kind, nn.Conv2d, kind, nn.Conv2d]
    assert isinstance(block.bn, nn.Identity)


def test_batch_norm_is_the_last_operation_before_the_residual_addition():
    torch.manual_seed(0)
    block = ResidualBlock(16, 16, 1, "elu", add_batch_norm=True).train()
    x = torch.randn(64, 16, 8, 8) * 5
    residual = block(x) - block.shortcut(x)
    # In training mode a fresh BatchNorm makes each channel of what is added zero-mean, unit-variance.
    assert torch.allclose(residual.mean(dim=(0, 2, 3)), torch.zeros(16), atol=1e-4)
    assert torch.allclose(residual.var(dim=(0, 2, 3), unbiased=False), torch.ones(16), atol=1e-2)
    without = ResidualBlock(16, 16, 1, "elu", add_batch_norm=False)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in without.modules())


def test_convolutions_are_he_normal_initialised():
    torch.manual_seed(0)
    conv = ResNet().blocks[8].conv2  # 64 x 64 x 3 x 3: fan-in 576
    expected_std = (2 / 576) ** 0.5
    assert abs(conv.weight.std().item() - expected_std) / expected_std < 0.05
    assert torch.count_nonzero(conv.bias) == 0


def test_weight_decay_applies_to_kernels_only():
    model = ResNet(add_batch_norm=True)
    decayed, plain = model.parameter_groups()
    assert decayed["weight_decay"] == WEIGHT_DECAY == 1e-4 and plain["weight_decay"] == 0.0
    assert all(p.dim() > 1 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_batch_norm_recalibration_replaces_stale_statistics():
    torch.manual_seed(0)
    model = ResNet(depth=8, add_batch_norm=True)
    x = torch.randn(256, 3, 32, 32)
    model.recalibrate_batch_norm(x, batch_size=64)
    bn = model.blocks[0].bn
    assert bn.momentum == 0.1  # restored after the cumulative pass
    assert bn.num_batches_tracked.item() == 4
