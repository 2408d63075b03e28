"""A stand-in for the parts of torchvision that the vendored public scripts call, for this machine only.

torchvision from PyPI does not import beside the project's pinned torch build, and no dataset can be
downloaded here. This package implements what the scripts of `tests/public_scripts/` use, with
torchvision's signatures and behaviour: `datasets.MNIST` / `FashionMNIST` (built offline from
scikit-learn's bundled digits, see `datasets`), `datasets.FakeData`, the PIL transforms, `utils.save_image`
and `models.resnet18`; and, raising NotImplementedError if called, the names torchmetrics imports at its own
import (`models.resnet50`, `ops.box_iou`, ...). The public-scripts runner puts its parent directory on the scripts' PYTHONPATH;
nothing of the project imports it.
"""

from torchvision import datasets, models, ops, transforms, utils

__version__ = "0.0.0+standin"
__all__ = ["datasets", "models", "ops", "transforms", "utils"]
