"""The tensor store: where captured tensors live on disk (or under an S3 prefix) and how they are named.

This module owns the on-disk layout described in the package docstring and in docs/contracts.md
section 7: the writer used by the training job and the two read-only backends (a local directory
and an ``s3://`` prefix) used by the Trial API. It must not know about rules or training loops,
and it must never unpickle anything: tensors are NumPy ``.npz`` archives read with
``allow_pickle=False``; metadata is JSON.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from stabilizer_contract.s3_uris import parse_s3_uri

FORMAT = "stabilizer-tensors/1"
MODES = ("TRAIN", "EVAL")
COLLECTIONS_FILE = "collections.json"
END_MARKER = "training_end.json"
STEPS_DIR = "steps"
INDEX_DIR = "index"

_STEM = re.compile(r"^(?P<step>\d{12})_(?P<mode>[A-Z]+)$")


def step_stem(step: int, mode: str) -> str:
    """The shared file name of one step's archive and index entry, e.g. ``000000000010_TRAIN``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"{step:012d}_{mode}"


def parse_stem(stem: str) -> tuple[int, str] | None:
    match = _STEM.match(stem)
    if not match or match["mode"] not in MODES:
        return None
    return int(match["step"]), match["mode"]


def _atomic_write(path: Path, write: Any) -> None:
    """Write through a temporary file in the same directory, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, payload: Any) -> None:
    # Key order is kept: tensors are listed in the order the job saved them (network order).
    data = json.dumps(payload, indent=1, allow_nan=False).encode()
    _atomic_write(path, lambda handle: handle.write(data))


@dataclass(frozen=True)
class StepRecord:
    """One step's tensors, as the writer receives them: name -> (collection names, array)."""

    step: int
    mode: str
    tensors: Mapping[str, tuple[tuple[str, ...], np.ndarray]]
    # name -> the name smdebug's PyTorch hook gives the tensor (stabilizer_sentinel.capture.trial.smdebug_name)
    aliases: Mapping[str, str] = field(default_factory=dict)


class StoreWriter:
    """Writes the layout under a local directory. Not thread-safe: one writer thread owns it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        (self.root / STEPS_DIR).mkdir(parents=True, exist_ok=True)
        (self.root / INDEX_DIR).mkdir(parents=True, exist_ok=True)
        # A job resumed in the same checkpoint directory writes on: readers must not take the
        # previous run's end marker for this one's.
        (self.root / END_MARKER).unlink(missing_ok=True)

    def write_collections(self, collections: Mapping[str, Mapping[str, Any]]) -> None:
        write_json_atomic(self.root / COLLECTIONS_FILE, {"format": FORMAT, "collections": collections})

    def write_step(self, record: StepRecord) -> None:
        stem = step_stem(record.step, record.mode)
        # np.require keeps 0-d arrays 0-d (np.ascontiguousarray would make scalars 1-d).
        arrays = {name: np.require(array, requirements="C") for name, (_, array) in record.tensors.items()}
        # The archive first, the index entry second: an index entry means the archive is complete.
        _atomic_write(self.root / STEPS_DIR / f"{stem}.npz", lambda handle: np.savez(handle, **arrays))
        index = {
            "format": FORMAT,
            "step": record.step,
            "mode": record.mode,
            "file": f"{STEPS_DIR}/{stem}.npz",
            "tensors": {
                name: {
                    "collections": list(collections),
                    "shape": list(array.shape),
                    "dtype": str(array.dtype),
                    **({"smdebug": record.aliases[name]} if name in record.aliases else {}),
                }
                for name, (collections, array) in record.tensors.items()
            },
        }
        write_json_atomic(self.root / INDEX_DIR / f"{stem}.json", index)

    def write_end(self, last_step: int | None, status: str) -> None:
        write_json_atomic(self.root / END_MARKER, {"format": FORMAT, "last_step": last_step, "status": status})


class Storage(Protocol):
    """Read-only access to a store, local or remote. Keys are paths relative to the store root."""

    def list(self, folder: str) -> list[str]: ...

    def read(self, key: str) -> bytes | None: ...


class LocalStorage:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def list(self, folder: str) -> list[str]:
        base = self.root / folder
        if not base.is_dir():
            return []
        return [f"{folder}/{entry.name}" for entry in base.iterdir() if not entry.name.startswith(".")]

    def read(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"


class S3Storage:
    """An ``s3://bucket/prefix`` store. boto3 is imported here, lazily: the training container lacks it."""

    def __init__(self, uri: str, client: Any = None) -> None:
        self.bucket, prefix = parse_s3_uri(uri)
        self.prefix = prefix.rstrip("/")
        if client is None:
            import boto3

            client = boto3.client("s3")
        self.client = client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def list(self, folder: str) -> list[str]:
        base = self._key(folder) + "/"
        keys: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            for item in page.get("Contents", []):
                keys.append(f"{folder}/{item['Key'][len(base) :]}")
        return keys

    def read(self, key: str) -> bytes | None:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except self.client.exceptions.NoSuchKey:
            return None
        return response["Body"].read()

    def __repr__(self) -> str:
        return f"S3Storage('s3://{self.bucket}/{self.prefix}')"


def open_storage(path: str | os.PathLike[str], client: Any = None) -> Storage:
    text = str(path)
    if text.startswith("s3://"):
        return S3Storage(text, client=client)
    return LocalStorage(text)


def load_archive(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def list_steps(storage: Storage) -> dict[tuple[int, str], str]:
    """Steps whose index entry and archive are both present: (step, mode) -> index key.

    Both are required because a synced copy (SageMaker uploads checkpoint files one by one) can
    show the small index entry before the archive it describes.
    """
    archives = {Path(key).stem for key in storage.list(STEPS_DIR) if key.endswith(".npz")}
    found: dict[tuple[int, str], str] = {}
    for key in storage.list(INDEX_DIR):
        if not key.endswith(".json"):
            continue
        stem = Path(key).stem
        parsed = parse_stem(stem)
        if parsed is not None and stem in archives:
            found[parsed] = key
    return found


def read_json(storage: Storage, key: str) -> Any:
    data = storage.read(key)
    return None if data is None else json.loads(data)


def iter_names(index: Mapping[str, Any]) -> Iterable[str]:
    return index.get("tensors", {}).keys()
