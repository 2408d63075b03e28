"""The data channels a notebook trains on: the offline digits here, CIFAR-10 uploaded to a stack.

``model/data.py`` is the single definition of the channels (``x.npy`` and ``y.npy`` under
``train/`` and ``test/``); this module only runs it (as a separate process, the way the job runs
the training source) and, for a deployed stack, uploads the result
to the bucket's default channel prefixes. It never starts or changes an execution.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stabilizer.local.checkout import reference_source
from stabilizer.local.offline_digits import DataPreparationError, ensure_offline_digits, run_data_script

CHANNELS = ("train", "test")
CHANNEL_FILES = ("x.npy", "y.npy")


def prepare_digits(directory: Path) -> Path:
    """The offline digits channels, written once under ``directory``."""
    return ensure_offline_digits(Path(directory), reference_source())


def prepare_cifar10(directory: Path, tarball: Path | None = None) -> Path:
    """CIFAR-10 channels under ``directory`` (downloads the official tarball unless one is given)."""
    directory = Path(directory)
    if not all((directory / c / f).is_file() for c in CHANNELS for f in CHANNEL_FILES):
        arguments = ["cifar10", "--out", str(directory.resolve())]
        if tarball is not None:
            arguments += ["--tarball", str(Path(tarball).resolve())]
        result = run_data_script(reference_source(), arguments)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no message"])[-1]
            raise DataPreparationError(f"could not prepare CIFAR-10 in {directory}: {last}")
    return directory


def upload_channels(client: Any, directory: Path, prefix: str = "data") -> dict[str, str]:
    """Upload ``train/`` and ``test/`` to ``s3://<bucket>/<prefix>/<channel>/`` (the stack's default channels).

    A file already there with the same size is not sent again. Returns channel -> S3 URI.
    """
    directory = Path(directory)
    uris = {}
    for channel in CHANNELS:
        for name in CHANNEL_FILES:
            path = directory / channel / name
            if not path.is_file():
                raise FileNotFoundError(f"{channel} channel: expected {name} in {directory / channel}")
            key = f"{prefix}/{channel}/{name}"
            if _object_size(client.s3, client.bucket, key) != path.stat().st_size:
                client.s3.upload_file(str(path), client.bucket, key)
        uris[channel] = f"s3://{client.bucket}/{prefix}/{channel}/"
    return uris


def _object_size(s3: Any, bucket: str, key: str) -> int | None:
    from botocore.exceptions import ClientError

    try:
        return int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
