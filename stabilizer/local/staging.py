"""A job of your own in local mode: its directory and data on this machine become S3 objects.

On AWS a job's `source` is an S3 URI of `sourcedir.tar.gz` and its channels are S3 prefixes. In
local mode they may be paths on this machine: `localize()` makes them absolute (relative paths
are relative to the input file) and checks them before anything starts (the source exists, the
entry point is in it, every channel exists); `stage()` then packs the source as the SageMaker
Python SDK does and uploads source and channels to the local S3, so the state machine, the
Lambdas and the training-job emulator see exactly what they would see on AWS.

It knows paths and S3 keys, nothing about the workflow's decisions.
"""

from __future__ import annotations

import copy
import tarfile
from pathlib import Path
from typing import Any

from stabilizer.local.s3files import source_archive

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


class StagingError(ValueError):
    """A local path of the job is unusable; the message names the field."""


def _is_s3(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("s3://")


def _absolute(value: str, base: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def _archive_members(path: Path) -> list[str]:
    try:
        with tarfile.open(path, mode="r:*") as archive:
            return [m.name.removeprefix("./") for m in archive.getmembers() if m.isfile()]
    except (tarfile.TarError, OSError) as error:
        raise StagingError(f"job.source: {path} is not a tar archive: {error}") from None


def _check_source(source: str, entry_point: Any) -> None:
    path = Path(source)
    if path.is_dir():
        if isinstance(entry_point, str) and not (path / entry_point).is_file():
            scripts = sorted(p.name for p in path.glob("*.py"))[:8]
            found = f" (its scripts: {', '.join(scripts)})" if scripts else " (it holds no .py file)"
            raise StagingError(f"job.entry_point: {entry_point!r} is not in {path}{found}")
        return
    if path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES):
        if isinstance(entry_point, str) and entry_point.removeprefix("./") not in _archive_members(path):
            raise StagingError(f"job.entry_point: {entry_point!r} is not in the archive {path}")
        return
    if path.exists():
        raise StagingError(f"job.source: {path} is neither a directory nor a .tar.gz archive")
    raise StagingError(f"job.source: no such directory or archive: {path}")


def localize(execution_input: dict[str, Any], base: Path) -> dict[str, Any]:
    """The input with the job's local paths made absolute and checked; S3 URIs are left as they are."""
    job = execution_input.get("job")
    if not isinstance(job, dict):
        return execution_input
    result = copy.deepcopy(execution_input)
    job = result["job"]
    if "source" not in job:
        raise StagingError("job.source: missing; give your source directory (or its .tar.gz)")
    if isinstance(job["source"], str) and not _is_s3(job["source"]):
        job["source"] = _absolute(job["source"], base)
        _check_source(job["source"], job.get("entry_point"))
    channels = job.get("channels")
    if isinstance(channels, dict):
        for name, location in channels.items():
            if isinstance(location, str) and not _is_s3(location):
                channels[name] = _absolute(location, base)
                if not Path(channels[name]).exists():
                    raise StagingError(f"job.channels.{name}: no such file or directory: {channels[name]}")
    if job.get("instance_count", 1) != 1:
        raise StagingError("job.instance_count: local mode runs a job on one instance; give 1")
    return result


def _upload_tree(s3: Any, directory: Path, bucket: str, prefix: str) -> int:
    count = 0
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(directory).as_posix()}")
            count += 1
    return count


def stage(execution_input: dict[str, Any], s3: Any, bucket: str, prefix: str) -> dict[str, Any]:
    """Upload the job's local source and channels under `s3://bucket/prefix/`; returns the input with S3 URIs."""
    job = execution_input.get("job")
    if not isinstance(job, dict):
        return execution_input
    result = localize(execution_input, Path.cwd())
    job = result["job"]
    source = job.get("source")
    if isinstance(source, str) and not _is_s3(source):
        path = Path(source)
        body = source_archive(path) if path.is_dir() else path.read_bytes()
        key = f"{prefix}/source/sourcedir.tar.gz"
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        job["source"] = f"s3://{bucket}/{key}"
    for name, location in (job.get("channels") or {}).items():
        if isinstance(location, str) and not _is_s3(location):
            path = Path(location)
            key = f"{prefix}/channels/{name}"
            if path.is_dir():
                if _upload_tree(s3, path, bucket, key) == 0:
                    raise StagingError(f"job.channels.{name}: {path} holds no files")
            else:
                s3.upload_file(str(path), bucket, f"{key}/{path.name}")
            job["channels"][name] = f"s3://{bucket}/{key}/"
    return result


LIBRARY_PACKAGE = "rule_engine"


def upload_library(s3: Any, model_dir: Path, bucket: str, prefix: str) -> int:
    """Upload the in-job library (`model/rule_engine`) as `prefix/rule_engine/...`, as the stack deploys it.

    The training job receives that prefix as its `stabilizer` channel, with PYTHONPATH pointing at
    it (docs/contracts.md, section 8). Caches are left out.
    """
    package = Path(model_dir) / LIBRARY_PACKAGE
    if not package.is_dir():
        raise StagingError(f"no library to deliver: {package} is not a directory")
    count = 0
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(model_dir)
        if not path.is_file() or "__pycache__" in relative.parts or path.suffix == ".pyc":
            continue
        s3.upload_file(str(path), bucket, f"{prefix.rstrip('/')}/{relative.as_posix()}")
        count += 1
    return count
