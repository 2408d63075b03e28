"""torchvision.datasets: MNIST and FashionMNIST built offline, and FakeData.

`MNIST` here is not LeCun's MNIST, which cannot be downloaded on this machine: it is scikit-learn's
bundled digits (1797 images of 8x8 at 17 grey levels), each scaled to 20x20 and centred in a 28x28
frame as MNIST's digits are: the first 1000 for training and the last 297 for testing (small, so
that a script's epoch takes seconds on one CPU thread).
`FashionMNIST` is the same images transposed, so that it is a different task of the same shapes.
Both have torchvision's interface: `data` (uint8, N x 28 x 28), `targets` (int64), `classes`, items
as (PIL image in mode L, int), `transform` and `target_transform`; `root` and `download` are
accepted and nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from PIL import Image

from torchvision import transforms

TRAIN_SIZE = 1000
TEST_SIZE = 297


@lru_cache(maxsize=1)
def _digits_28() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.zeros((len(digits.images), 28, 28), dtype=np.uint8)
    for index, image in enumerate(digits.images):
        small = Image.fromarray((image * (255.0 / 16.0)).round().astype(np.uint8), mode="L")
        images[index, 4:24, 4:24] = np.asarray(small.resize((20, 20), Image.BILINEAR))
    return images, digits.target.astype(np.int64)


class MNIST(torch.utils.data.Dataset):
    classes = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four",
               "5 - five", "6 - six", "7 - seven", "8 - eight", "9 - nine"]

    def __init__(self, root: Any, train: bool = True, transform: Callable | None = None,
                 target_transform: Callable | None = None, download: bool = False) -> None:
        self.root, self.train = root, train
        self.transform, self.target_transform = transform, target_transform
        images, labels = self._images()
        part = slice(0, TRAIN_SIZE) if train else slice(-TEST_SIZE, None)
        self.data = torch.from_numpy(images[part].copy())
        self.targets = torch.from_numpy(labels[part].copy())

    def _images(self) -> tuple[np.ndarray, np.ndarray]:
        return _digits_28()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        img, target = Image.fromarray(self.data[index].numpy(), mode="L"), int(self.targets[index])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


class FashionMNIST(MNIST):
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot"]

    def _images(self) -> tuple[np.ndarray, np.ndarray]:
        images, labels = _digits_28()
        return np.ascontiguousarray(images.transpose(0, 2, 1)), labels


class FakeData(torch.utils.data.Dataset):
    """Random images, each drawn from its own seed (index + random_offset), as torchvision's FakeData."""

    def __init__(self, size: int = 1000, image_size: tuple[int, ...] = (3, 224, 224), num_classes: int = 10,
                 transform: Callable | None = None, target_transform: Callable | None = None,
                 random_offset: int = 0) -> None:
        self.size, self.image_size, self.num_classes = size, image_size, num_classes
        self.transform, self.target_transform, self.random_offset = transform, target_transform, random_offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if index >= len(self):
            raise IndexError(f"{self.__class__.__name__} index out of range")
        rng_state = torch.get_rng_state()
        torch.manual_seed(index + self.random_offset)
        img = torch.randn(*self.image_size)
        target = torch.randint(0, self.num_classes, size=(1,), dtype=torch.long)[0]
        torch.set_rng_state(rng_state)
        img = transforms.ToPILImage()(img)
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target.item()
