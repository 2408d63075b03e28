"""What an SDK job needs to run on AWS: the image URI the SDK's lookup names, and its local files in
the stack's bucket (its source packed as the SDK packs it, its channels as they are, under
content-hashed keys). `stabilizer.client.sdk` describes the job; the clients call these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stabilizer.client.sdk_errors import SdkJobError
from stabilizer.source.sourcedir import ARCHIVE_NAME, SourceError, pack, plan_source


def _is_s3(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("s3://")


def _refused(message: str) -> Exception:
    return SdkJobError(message)


def _packed(path: Path, shown_as: str) -> Any:
    try:
        return pack(plan_source(path), shown_as=shown_as)
    except SourceError as error:
        raise _refused(str(error)) from None


def image_uri_for(spec: dict[str, Any], instance_type: str, region: str) -> str:
    """`{"framework", "version"[, "python_version"]}` as the SDK's image URI lookup names it for
    this instance type and region (`sagemaker.image_uris.retrieve`)."""
    from sagemaker import image_uris

    framework, version = spec.get("framework", "pytorch"), spec.get("version")
    try:
        # Without python_version the SDK picks the version's only Python, or says which to choose.
        return image_uris.retrieve(framework, region, version=version, py_version=spec.get("python_version"),
                                   instance_type=instance_type, image_scope="training")
    except (ValueError, KeyError) as error:
        raise _refused(f"job.image: the SageMaker Python SDK cannot name {spec}: {error}") from None


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        sha.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        sha.update(file.read_bytes())
    return sha.hexdigest()[:16]


def upload_local_files(job: dict[str, Any], s3: Any, bucket: str,
                       say: Callable[[str], None] = print) -> dict[str, Any]:
    """The job with a local source packed and uploaded under `source/`, local channels under `data/`.

    A source directory is packed by `stabilizer.source.sourcedir` (what goes up, what is left out, the
    size limit); `say` receives one line on it (files, sizes, left out) before the upload.

    Keys carry the content's hash, so a rerun of the same code and data uploads nothing new under
    a new name and a running job's archive is never replaced. The stack's SageMaker execution role
    reads `source/*` and `data/*`.
    """
    result = dict(job)
    source = result.get("source")
    if isinstance(source, str) and not _is_s3(source):
        path = Path(source)
        if path.is_dir():
            packed = _packed(path, shown_as=source)
            say(f"uploading {packed.summary(source)}")  # before anything goes up
            key = f"source/jobs/{packed.digest[:16]}/{ARCHIVE_NAME}"
            s3.put_object(Bucket=bucket, Key=key, Body=packed.data)
        elif path.is_file():
            key = f"source/jobs/{_digest(path)}/{ARCHIVE_NAME}"
            s3.upload_file(str(path), bucket, key)
        else:
            raise _refused(f"job.source: no such directory or archive: {path}")
        result["source"] = f"s3://{bucket}/{key}"
    channels = {}
    for name, location in (result.get("channels") or {}).items():
        channels[name] = location
        if isinstance(location, str) and not _is_s3(location):
            path = Path(location)
            if not path.exists():
                raise _refused(f"channels.{name}: no such file or directory {path}")
            prefix = f"data/jobs/{_digest(path)}/{name}/"
            for file in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
                relative = file.relative_to(path) if path.is_dir() else file.name
                s3.upload_file(str(file), bucket, f"{prefix}{relative}")
            channels[name] = f"s3://{bucket}/{prefix}"
    result["channels"] = channels
    return result
