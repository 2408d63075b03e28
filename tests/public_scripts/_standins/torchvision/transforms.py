"""torchvision.transforms, the PIL-image subset: Compose, ToTensor, ToPILImage, Normalize, Lambda, Resize,
CenterCrop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for transform in self.transforms:
            img = transform(img)
        return img


class ToTensor:
    """A PIL image or an HxW(xC) uint8 array to a CxHxW float tensor in [0, 1]."""

    def __call__(self, pic: Any) -> torch.Tensor:
        array = np.array(pic, copy=True)
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(array.transpose(2, 0, 1)).contiguous()
        return tensor.to(torch.get_default_dtype()).div(255) if tensor.dtype == torch.uint8 else tensor


class ToPILImage:
    """A CxHxW tensor to a PIL image; a float tensor is scaled by 255 and cast to bytes, as torchvision does."""

    def __call__(self, pic: torch.Tensor) -> Image.Image:
        if pic.is_floating_point():
            pic = pic.mul(255).byte()
        array = pic.numpy().transpose(1, 2, 0)
        if array.shape[2] == 1:
            return Image.fromarray(array[:, :, 0], mode="L")
        return Image.fromarray(array, mode="RGB")


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean, self.std, self.inplace = mean, std, inplace

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor if self.inplace else tensor.clone()
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return tensor.sub_(mean).div_(std)


class Lambda:
    def __init__(self, lambd: Callable[[Any], Any]) -> None:
        self.lambd = lambd

    def __call__(self, img: Any) -> Any:
        return self.lambd(img)


class Resize:
    """An int resizes the smaller edge to it, keeping the aspect ratio; a pair is (height, width)."""

    def __init__(self, size: int | Sequence[int], interpolation: int = Image.BILINEAR) -> None:
        self.size, self.interpolation = size, interpolation

    def __call__(self, img: Image.Image) -> Image.Image:
        width, height = img.size
        if isinstance(self.size, int):
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = self.size, int(self.size * long / short)
            new_width, new_height = (new_short, new_long) if width <= height else (new_long, new_short)
        else:
            new_height, new_width = self.size
        if (new_width, new_height) == (width, height):
            return img
        return img.resize((new_width, new_height), self.interpolation)


class CenterCrop:
    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, img: Image.Image) -> Image.Image:
        width, height = img.size
        crop_height, crop_width = self.size
        top = round((height - crop_height) / 2.0)
        left = round((width - crop_width) / 2.0)
        return img.crop((left, top, left + crop_width, top + crop_height))
