"""torchvision.ops: the box functions torchmetrics imports at its own import (its detection metrics); no vendored
script calls them, and calling one raises NotImplementedError."""

from torchvision._imported_only import not_here

box_area = not_here("torchvision.ops.box_area")
box_convert = not_here("torchvision.ops.box_convert")
box_iou = not_here("torchvision.ops.box_iou")
complete_box_iou = not_here("torchvision.ops.complete_box_iou")
distance_box_iou = not_here("torchvision.ops.distance_box_iou")
generalized_box_iou = not_here("torchvision.ops.generalized_box_iou")

__all__ = ["box_area", "box_convert", "box_iou", "complete_box_iou", "distance_box_iou", "generalized_box_iou"]
