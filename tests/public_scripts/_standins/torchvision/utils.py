"""torchvision.utils: make_grid and save_image (PNG through PIL)."""

from __future__ import annotations

import math
from typing import Any

import torch
from PIL import Image


def make_grid(tensor: torch.Tensor | list[torch.Tensor], nrow: int = 8, padding: int = 2, normalize: bool = False,
              value_range: tuple[float, float] | None = None, scale_each: bool = False,
              pad_value: float = 0.0) -> torch.Tensor:
    if isinstance(tensor, list):
        tensor = torch.stack(tensor, dim=0)
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() == 3:
        tensor = tensor.unsqueeze(0)
    if tensor.size(1) == 1:
        tensor = torch.cat((tensor, tensor, tensor), 1)
    if normalize:
        tensor = tensor.clone()

        def norm_range(t: torch.Tensor) -> None:
            low, high = value_range if value_range is not None else (float(t.min()), float(t.max()))
            t.clamp_(min=low, max=high).sub_(low).div_(max(high - low, 1e-5))

        for t in (tensor if scale_each else [tensor]):
            norm_range(t)
    if tensor.size(0) == 1:
        return tensor.squeeze(0)
    count = tensor.size(0)
    columns = min(nrow, count)
    rows = math.ceil(count / columns)
    height, width = int(tensor.size(2) + padding), int(tensor.size(3) + padding)
    grid = tensor.new_full((tensor.size(1), height * rows + padding, width * columns + padding), pad_value)
    k = 0
    for y in range(rows):
        for x in range(columns):
            if k >= count:
                break
            grid.narrow(1, y * height + padding, height - padding).narrow(
                2, x * width + padding, width - padding).copy_(tensor[k])
            k += 1
    return grid


def save_image(tensor: torch.Tensor | list[torch.Tensor], fp: Any, format: str | None = None, **kwargs: Any) -> None:
    grid = make_grid(tensor, **kwargs)
    array = grid.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to("cpu", torch.uint8).numpy()
    Image.fromarray(array).save(fp, format=format)
