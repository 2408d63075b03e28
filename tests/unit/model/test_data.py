"""Channels: the offline digits set and CIFAR-10 from its official python tarball format."""

import hashlib
import io
import pickle
import tarfile

import numpy as np
import pytest

from tests.helpers import model_module

_data = model_module("data")
digits_arrays, prepare_cifar10 = _data.digits_arrays, _data.prepare_cifar10
read_channel, write_channel = _data.read_channel, _data.write_channel


def _fake_cifar_tarball(path, per_batch=4):
    """A tarball in the official cifar-10-python layout, with a few random images per batch."""
    rng = np.random.default_rng(1)
    batches = {}
    with tarfile.open(path, "w:gz") as archive:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
            labels = [int(v) for v in rng.integers(0, 10, per_batch)]
            batches[name] = (data, labels)
            payload = pickle.dumps({b"batch_label": name.encode(), b"data": data, b"labels": labels})
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return batches


def test_cifar10_channels_from_the_official_tarball_layout(tmp_path):
    tarball = tmp_path / "cifar-10-python.tar.gz"
    batches = _fake_cifar_tarball(tarball)
    md5 = hashlib.md5(tarball.read_bytes(), usedforsecurity=False).hexdigest()
    channels = prepare_cifar10(tmp_path / "out", tarball=tarball, expected_md5=md5)
    x_train = np.load(channels["train"] / "x.npy")
    assert x_train.shape == (20, 32, 32, 3) and x_train.dtype == np.uint8
    # Row-major 3072 = 3 planes of 32x32: pixel (0, 0) of the red plane is the first byte.
    first = batches["data_batch_1"][0][0]
    assert x_train[0, 0, 0].tolist() == [first[0], first[1024], first[2048]]
    x_test, y_test = read_channel(channels["test"])
    assert x_test.shape == (4, 32, 32, 3) and x_test.dtype == np.float32 and x_test.max() <= 1.0
    assert y_test.tolist() == batches["test_batch"][1]


def test_cifar10_rejects_a_tarball_with_the_wrong_checksum(tmp_path):
    tarball = tmp_path / "cifar-10-python.tar.gz"
    _fake_cifar_tarball(tarball)
    with pytest.raises(ValueError, match="md5"):
        prepare_cifar10(tmp_path / "out", tarball=tarball)  # the official checksum cannot match


def test_digits_are_32x32x3_with_a_fixed_split():
    (x_train, y_train), (x_test, _y_test) = digits_arrays()
    assert x_train.shape[1:] == (32, 32, 3) and len(x_train) + len(x_test) == 1797
    assert len(x_test) == 359 and set(y_train.tolist()) == set(range(10))
    (x_again, _), _ = digits_arrays()
    assert np.array_equal(x_train, x_again)


def test_read_channel_names_what_is_wrong(tmp_path):
    write_channel(tmp_path / "bad", np.zeros((4, 32, 32), np.float32), np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="NHWC"):
        read_channel(tmp_path / "bad")
    write_channel(tmp_path / "short", np.zeros((4, 32, 32, 3), np.float32), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="4 labels"):
        read_channel(tmp_path / "short")


def test_one_hot_labels_read_back_as_the_integer_labels_they_encode(tmp_path):
    # What train.py reads from a channel whose y.npy is N x C one-hot (its own run on such a channel: make test-all).
    x = np.arange(4 * 8 * 8 * 3, dtype=np.uint8).reshape(4, 8, 8, 3)
    labels = np.array([3, 0, 9, 3])
    channel = _data.write_channel(tmp_path / "onehot", x, np.eye(10, dtype=np.float32)[labels])
    read_x, read_y = _data.read_channel(channel)
    assert read_y.tolist() == labels.tolist() and len(read_x) == 4
