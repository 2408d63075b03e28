"""torchvision.models: resnet18 (He et al. 2015), built as torchvision builds it; `weights` must be None (offline)."""

from torchvision.models.resnet import ResNet, resnet18

__all__ = ["ResNet", "resnet18"]
