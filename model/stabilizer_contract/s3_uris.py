"""S3 URIs: the one parser (``s3://bucket/key``) the workflow, the client, local mode and the in-job
library's tensor store use.

Pure: no AWS calls, no SDK import, so input validation can use it without loading boto3; part of
the dependency-free contract, so the library installed alone has it too.
"""

from __future__ import annotations

import re

# A bucket name (3-63 characters: lowercase letters, digits, dots, hyphens), then an optional key.
_S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")


def is_s3_uri(value: str) -> bool:
    return bool(_S3_URI.match(value))


def split_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key or prefix) of ``s3://bucket/key``. The key is taken as it is: S3 keys may hold
    ``?`` and ``#``, which a URL parser would read as a query or a fragment."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key or prefix) of ``s3://bucket/key``, checked: a ValueError says what was expected
    when ``uri`` is not an S3 URI or names no bucket."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise ValueError(f"expected an s3://bucket/key URI, got {uri!r}")
    bucket, key = split_s3_uri(uri)
    if not bucket:
        raise ValueError(f"expected an s3://bucket/key URI with a bucket, got {uri!r}")
    return bucket, key


def bucket_of(uri: str) -> str:
    return split_s3_uri(uri)[0]
