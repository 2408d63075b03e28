"""torchvision.models: resnet18 (He et al. 2015), built as torchvision builds it; `weights` must be None (offline).

`resnet50`, `vgg16` and `VGG16_Weights` are here only because torchmetrics imports them at its own import
wherever a torchvision imports (`lightning__kfold_cv` imports torchmetrics): no vendored script calls them, and
calling one raises NotImplementedError."""

from typing import Any

from torchvision._imported_only import not_here
from torchvision.models.resnet import ResNet, resnet18

resnet50 = not_here("torchvision.models.resnet50")
vgg16 = not_here("torchvision.models.vgg16")


class VGG16_Weights:  # noqa: N801 (torchvision's name)
    """torchvision's enum of VGG-16's pretrained weights: none here, offline."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("the torchvision stand-in has no VGG16_Weights: no vendored script uses them")


__all__ = ["ResNet", "VGG16_Weights", "resnet18", "resnet50", "vgg16"]
