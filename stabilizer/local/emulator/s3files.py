"""Move files between the local S3 and real disk, the way SageMaker does for a training job.

The training subprocess sees files, never S3: channels are downloaded into the job directory
before it starts, and its checkpoint directory is uploaded while it runs. This module holds
those copies and nothing else; it works against any S3 client (moto's in local mode).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabilizer_contract.s3_uris import parse_s3_uri


def join_uri(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def download_prefix(s3: Any, uri: str, dest: Path) -> int:
    """Copy every object under ``uri`` into ``dest`` (keys relative to the prefix); returns the count.

    A URI naming a single object (not ending in ``/``) that matches a key exactly downloads that
    object into ``dest`` under its base name, as SageMaker's S3Prefix channels do.
    """
    bucket, prefix = parse_s3_uri(uri)
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if key.endswith("/"):
                continue
            relative = key[len(prefix) :].lstrip("/") if key != prefix else Path(key).name
            target = dest / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, key, str(target))
            count += 1
    return count


@dataclass
class DirectorySync:
    """Upload a directory to an S3 prefix, sending only files that changed since the last call.

    SageMaker syncs ``/opt/ml/checkpoints`` continuously, both ways: a file the job deletes (an
    old checkpoint it rotates out, a temporary name it renames) is deleted from the prefix too.
    Calling ``sync()`` on each describe and at the end of the job gives the monitor the same view
    one poll later at most.
    """

    s3: Any
    local: Path
    uri: str
    _seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sync(self) -> int:
        """Upload new or changed files; returns how many were uploaded."""
        if not self.local.is_dir():
            return 0
        bucket, prefix = parse_s3_uri(self.uri)
        uploaded = 0
        with self._lock:
            present: set[str] = set()
            for root, _dirs, files in os.walk(self.local):
                for name in files:
                    # Files being written through a temporary name are picked up once renamed.
                    if name.endswith((".tmp", ".partial")) or name.startswith("."):
                        continue
                    path = Path(root) / name
                    relative = path.relative_to(self.local).as_posix()
                    # One open file is one version of it: a job that renames a new version over the
                    # name while it uploads (findings.json) leaves this one whole. Sized by path and
                    # read by path, an upload could take the size of one and the bytes of the other.
                    try:
                        with open(path, "rb") as handle:
                            stat = os.fstat(handle.fileno())
                            present.add(relative)
                            signature = (stat.st_size, stat.st_mtime_ns)
                            if self._seen.get(relative) == signature:
                                continue
                            key = f"{prefix.rstrip('/')}/{relative}" if prefix else relative
                            self.s3.upload_fileobj(handle, bucket, key)
                    except FileNotFoundError:
                        continue
                    self._seen[relative] = signature
                    uploaded += 1
            for relative in sorted(set(self._seen) - present):
                key = f"{prefix.rstrip('/')}/{relative}" if prefix else relative
                self.s3.delete_object(Bucket=bucket, Key=key)
                del self._seen[relative]
        return uploaded
