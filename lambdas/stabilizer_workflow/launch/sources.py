"""Reads a job's source archive from S3 to check, before anything launches, that its entry point is in it.

Pure helpers plus one small S3 reader; boto3 is imported only when the reader is used.
SageMaker only finds a missing entry point after it has started an instance and downloaded the
archive; reading the archive's member list at ValidateInput turns that into an `InvalidInput`
naming `job.entry_point`. Archives are small (scripts, not data); one larger than
`MAX_ARCHIVE_BYTES` is not read and the check is skipped (SageMaker then reports it). The
clients never pack a local source larger than this (stabilizer/source/sourcedir.py, same limit), so
every archive they upload is checked here.
"""

from __future__ import annotations

import io
import tarfile
from typing import Any

from stabilizer_contract.s3_uris import split_s3_uri
from stabilizer_workflow.errors import InvalidInput

MAX_ARCHIVE_BYTES = 64 * 1024 * 1024
_MISSING = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "AllAccessDisabled"}


class SourceArchives:
    """Lists the members of `sourcedir.tar.gz` archives in S3 (HeadObject and GetObject)."""

    def __init__(self, s3: Any | None = None) -> None:
        self._s3 = s3

    @property
    def s3(self) -> Any:
        if self._s3 is None:
            from stabilizer_workflow.aws.s3 import get_s3

            self._s3 = get_s3()
        return self._s3

    def members(self, uri: str) -> list[str] | None:
        """The archive's file names (normalised, no leading `./`), or None when it is too large to read."""
        from botocore.exceptions import ClientError

        from stabilizer_workflow.aws import error_code, translate

        bucket, key = split_s3_uri(uri)
        try:
            size = int(self.s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
            if size > MAX_ARCHIVE_BYTES:
                return None
            body = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            code = error_code(error)
            if code in _MISSING:
                raise InvalidInput(f"job.source: no object at {uri}") from None
            if code in _DENIED:
                raise InvalidInput(
                    f"job.source: the workflow may not read {uri} ({code}); keep source archives where "
                    "the stack's roles can read them (see docs/contracts.md, section 8)"
                ) from None
            raise translate(error, f"reading the source archive {uri}") from error
        try:
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as archive:
                return [normalise(member.name) for member in archive.getmembers() if member.isfile()]
        except (tarfile.TarError, EOFError, OSError) as error:
            raise InvalidInput(f"job.source: {uri} is not a tar archive (sourcedir.tar.gz): {error}") from None


def normalise(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


def entry_point_problem(members: list[str], entry_point: str, where: str) -> str | None:
    """Why the entry point is not in the archive's members, or None when it is."""
    if normalise(entry_point) in members:
        return None
    scripts = sorted(name for name in members if name.endswith(".py") and "/" not in name)[:8]
    found = f"; its top-level scripts: {', '.join(scripts)}" if scripts else "; it holds no top-level .py file"
    return f"job.entry_point: {entry_point!r} is not in {where}{found}"
