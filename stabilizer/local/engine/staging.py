"""A job of your own in local mode: its directory and data on this machine become S3 objects.

On AWS a job's `source` is an S3 URI of `sourcedir.tar.gz` and its channels are S3 prefixes. In
local mode they may be paths on this machine: `localize()` makes them absolute (relative paths
are relative to the input file) and checks them before anything starts (the source exists, the
entry point is in it, every channel exists, the source packs to an archive within the limit, the
instance type is one SageMaker trains on);
`stage()` then uploads the packed source and the channels to the local S3, so the state machine,
the Lambdas and the training-job emulator see exactly what they would see on AWS. What a source
directory packs to is `stabilizer.source.sourcedir`'s to say (the SageMaker SDK's whole `source_dir`,
less run directories, `.git`, virtual environments, caches and what `.stabilizerignore` names).

It knows paths and S3 keys, nothing about the workflow's decisions.
"""

from __future__ import annotations

import copy
import difflib
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import botocore

from stabilizer.local.emulator.runners import local_distribution_problem
from stabilizer.local.emulator.validation import operation_model
from stabilizer.source import sourcedir
from stabilizer.source.job_library import library_files
from stabilizer.source.sourcedir import Packed, SourceError, pack, plan_source, size_text

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


def packed_source(source: str, leave_out: Sequence[Path] = ()) -> Packed:
    """A source directory packed as it will go to the job; StagingError names `job.source`."""
    try:
        return pack(plan_source(Path(source), leave_out=leave_out), shown_as=source)
    except SourceError as error:
        raise StagingError(str(error)) from None


def _check_source(source: str, entry_point: Any, leave_out: Sequence[Path]) -> None:
    path = Path(source)
    if path.is_dir():
        if isinstance(entry_point, str) and not (path / entry_point).is_file():
            scripts = sorted(p.name for p in path.glob("*.py"))[:8]
            found = f" (its scripts: {', '.join(scripts)})" if scripts else " (it holds no .py file)"
            raise StagingError(f"job.entry_point: {entry_point!r} is not in {path}{found}")
        packed_source(source, leave_out)
        return
    if path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES):
        if path.stat().st_size > sourcedir.MAX_ARCHIVE_BYTES:
            raise StagingError(
                f"job.source: the archive {path} is {size_text(path.stat().st_size)}, over the "
                f"{size_text(sourcedir.MAX_ARCHIVE_BYTES)} limit for a source archive; give data to the job "
                "as a channel (job.channels)"
            )
        if isinstance(entry_point, str) and entry_point.removeprefix("./") not in _archive_members(path):
            raise StagingError(f"job.entry_point: {entry_point!r} is not in the archive {path}")
        return
    if path.exists():
        raise StagingError(f"job.source: {path} is neither a directory nor a .tar.gz archive")
    raise StagingError(f"job.source: no such directory or archive: {path}")


def localize(execution_input: dict[str, Any], base: Path, leave_out: Sequence[Path] = ()) -> dict[str, Any]:
    """The input with the job's local paths made absolute and checked; S3 URIs are left as they are.

    A source directory is packed here (and kept for `stage()`), so one over the size limit is
    refused before anything starts; `leave_out` names run directories to leave out of it.
    """
    job = execution_input.get("job")
    if not isinstance(job, dict):
        return execution_input
    result = copy.deepcopy(execution_input)
    job = result["job"]
    if "source" not in job:
        raise StagingError("job.source: missing; give your source directory (or its .tar.gz)")
    if isinstance(job["source"], str) and not _is_s3(job["source"]):
        job["source"] = _absolute(job["source"], base)
        _check_source(job["source"], job.get("entry_point"), leave_out)
    channels = job.get("channels")
    if isinstance(channels, dict):
        for name, location in channels.items():
            if isinstance(location, str) and not _is_s3(location):
                channels[name] = _absolute(location, base)
                if not Path(channels[name]).exists():
                    raise StagingError(f"job.channels.{name}: no such file or directory: {channels[name]}")
    problem = local_distribution_problem(job) or instance_type_problem(job)
    if problem:
        raise StagingError(problem)
    return result


def instance_type_problem(job: dict[str, Any]) -> str | None:
    """Why SageMaker would refuse the job's ``instance_type`` (a ValidationException at CreateTrainingJob, as
    local mode's emulator answers too), or None. Local mode only: botocore's list of training instance types is
    this machine's, and a deployed workflow leaves the judgement to SageMaker."""
    value = job.get("instance_type")
    if not isinstance(value, str):
        return None  # left out (the deployment's), or not text: ValidateInput names the field
    offered = operation_model("sagemaker", "CreateTrainingJob").input_shape.members["ResourceConfig"] \
        .members["InstanceType"].enum
    if not offered or value in offered:
        return None
    close = difflib.get_close_matches(value, offered, n=3)
    return (f"job.instance_type: SageMaker trains on no {value!r} (CreateTrainingJob's ResourceConfig.InstanceType, "
            f"botocore {botocore.__version__}){'; did you mean ' + ', '.join(close) if close else ''}")


def _upload_tree(s3: Any, directory: Path, bucket: str, prefix: str) -> int:
    count = 0
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(directory).as_posix()}")
            count += 1
    return count


def source_summary(execution_input: dict[str, Any], shown_as: str, leave_out: Sequence[Path] = ()) -> str | None:
    """One line on the job's local source directory as it will be packed, or None when there is none."""
    job = execution_input.get("job")
    source = job.get("source") if isinstance(job, dict) else None
    if not isinstance(source, str) or _is_s3(source) or not Path(source).is_dir():
        return None
    return packed_source(source, leave_out).summary(shown_as)


def stage(execution_input: dict[str, Any], s3: Any, bucket: str, prefix: str,
          leave_out: Sequence[Path] = ()) -> dict[str, Any]:
    """Upload the job's local source and channels under `s3://bucket/prefix/`; returns the input with S3 URIs."""
    job = execution_input.get("job")
    if not isinstance(job, dict):
        return execution_input
    result = localize(execution_input, Path.cwd(), leave_out)
    job = result["job"]
    source = job.get("source")
    if isinstance(source, str) and not _is_s3(source):
        path = Path(source)
        body = packed_source(source, leave_out).data if path.is_dir() else path.read_bytes()
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


def upload_library(s3: Any, model_dir: Path, bucket: str, prefix: str) -> int:
    """Upload the in-job library's files of `model/` (`library_files`) under `prefix`, as the stack deploys them.

    The training job receives that prefix as its `stabilizer` channel, with PYTHONPATH pointing at
    it (docs/contracts.md, section 8).
    """
    files = library_files(model_dir)
    for relative in files:
        s3.upload_file(str(Path(model_dir) / relative), bucket, f"{prefix.rstrip('/')}/{relative.as_posix()}")
    return len(files)
