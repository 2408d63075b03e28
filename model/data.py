"""Training and test channels: the offline digits set and CIFAR-10.

A channel is a directory holding `x.npy` (N x 32 x 32 x 3, NHWC; float32 in [0, 1] or uint8 in
[0, 255]) and `y.npy` (N integer labels, or N x C one-hot). `train.py` reads channels; this module
writes them and reads them back. It must not train or import torch.

    python data.py digits  --out /tmp/digits           # offline: scikit-learn's digits, 32x32x3
    python data.py cifar10 --out /tmp/cifar10          # downloads the official python tarball
    python data.py cifar10 --out /tmp/cifar10 --tarball cifar-10-python.tar.gz
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import tarfile
import urllib.request
from pathlib import Path

import numpy as np

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
CIFAR10_TEST_BATCH = "test_batch"
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0  # fixed, so every run of the offline problem sees the same split


def write_channel(directory: Path, x: np.ndarray, y: np.ndarray) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / "x.npy", x, allow_pickle=False)
    np.save(directory / "y.npy", y, allow_pickle=False)
    return directory


def write_channels(out: Path, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> dict:
    out = Path(out)
    return {"train": write_channel(out / "train", *train), "test": write_channel(out / "test", *test)}


def read_channel(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images as float32 NHWC in [0, 1] and labels as int64, whatever the stored layout."""
    directory = Path(directory)
    for name in ("x.npy", "y.npy"):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"channel {directory} has no {name} (expected x.npy and y.npy)")
    x = np.load(directory / "x.npy", allow_pickle=False)
    y = np.load(directory / "y.npy", allow_pickle=False)
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise ValueError(f"{directory}/x.npy must be N x H x W x C (NHWC), got shape {x.shape}")
    x = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)
    if y.ndim == 2:  # one-hot
        y = y.argmax(axis=1)
    if y.ndim != 1 or len(y) != len(x):
        raise ValueError(f"{directory}/y.npy must hold {len(x)} labels or one-hot rows, got shape {y.shape}")
    return x, y.astype(np.int64)


def digits_arrays() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's 8x8 digits (shipped with the package), upsampled to 32x32x3, fixed split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # 0..16 -> 0..1
    images = np.kron(images, np.ones((1, 4, 4), dtype=np.float32))  # nearest-neighbour 8 -> 32
    images = np.repeat(images[..., None], 3, axis=-1)
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(labels))
    n_test = round(len(labels) * DIGITS_TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return (images[train], labels[train]), (images[test], labels[test])


def prepare_digits(out: Path) -> dict[str, Path]:
    (x_train, y_train), (x_test, y_test) = digits_arrays()
    return write_channels(out, (x_train, y_train), (x_test, y_test))


def download_cifar10(destination: Path, url: str = CIFAR10_URL) -> Path:
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    partial.rename(destination)
    return destination


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with Path(path).open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _read_cifar_batch(archive: tarfile.TarFile, name: str) -> tuple[np.ndarray, np.ndarray]:
    member = next((m for m in archive.getmembers() if m.name.endswith(f"cifar-10-batches-py/{name}")), None)
    if member is None:
        raise ValueError(f"CIFAR-10 tarball has no cifar-10-batches-py/{name}")
    # The official python release is a pickle of {b"data": uint8 N x 3072, b"labels": [...]};
    # we only unpickle it after the tarball's checksum matched (or the caller vouched for it).
    batch = pickle.load(archive.extractfile(member), encoding="bytes")
    data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return data, np.asarray(batch[b"labels"], dtype=np.int64)


def prepare_cifar10(out: Path, tarball: Path | None = None, expected_md5: str | None = CIFAR10_MD5) -> dict[str, Path]:
    """Write CIFAR-10 channels (uint8 images) from the official tarball, downloading it if needed."""
    out = Path(out)
    if tarball is None:
        tarball = out / "cifar-10-python.tar.gz"
        if not tarball.exists():
            download_cifar10(tarball)
    if expected_md5 is not None and (actual := _md5(tarball)) != expected_md5:
        raise ValueError(f"{tarball} has md5 {actual}, expected {expected_md5} (a corrupt or different file)")
    with tarfile.open(tarball, "r:gz") as archive:
        parts = [_read_cifar_batch(archive, name) for name in CIFAR10_TRAIN_BATCHES]
        x_test, y_test = _read_cifar_batch(archive, CIFAR10_TEST_BATCH)
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    return write_channels(out, (x_train, y_train), (x_test, y_test))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write training/test channels (x.npy, y.npy).")
    parser.add_argument("dataset", choices=["digits", "cifar10"])
    parser.add_argument("--out", type=Path, required=True, help="directory that receives train/ and test/")
    parser.add_argument("--tarball", type=Path, help="cifar10: a local copy of cifar-10-python.tar.gz")
    args = parser.parse_args(argv)
    channels = prepare_digits(args.out) if args.dataset == "digits" else prepare_cifar10(args.out, args.tarball)
    for name, path in channels.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
