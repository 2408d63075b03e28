"""The S3 adapter: what a training job leaves in its checkpoint prefix, whether a data channel
holds anything, and the task tokens of parked executions.

URIs are split by stabilizer_contract.s3_uris, the one parser. One call per method, its errors
translated by stabilizer_workflow.aws; no decisions here.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from stabilizer_contract.s3_uris import split_s3_uri
from stabilizer_workflow.aws import NOT_THERE, error_code, new_client, translate
from stabilizer_workflow.evidence.sentinel_files import (
    FindingsDocument,
    StragglerReport,
    parse_findings,
    parse_stragglers,
)
from stabilizer_workflow.execution.hang_settings import PROGRESS_FILE, STRAGGLERS_FILE


@lru_cache(maxsize=1)
def get_s3() -> Any:
    return new_client("s3")


class Artifacts:
    """Reads what a training job leaves in its checkpoint prefix."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def _beside(self, operation: str, checkpoint_uri: str, name: str) -> dict[str, Any] | None:
        """GetObject or HeadObject of the file ``name`` beside findings.json; None when there is none
        yet (404). A 403 raises AccessDenied, never read as "no file yet"."""
        bucket, prefix = split_s3_uri(checkpoint_uri)
        key = f"{prefix.rstrip('/')}/{name}"
        call = self.client.get_object if operation == "GetObject" else self.client.head_object
        try:
            return call(Bucket=bucket, Key=key)
        except ClientError as error:
            if error_code(error) in NOT_THERE:
                return None
            raise translate(error, f"{operation} s3://{bucket}/{key}") from error
        except BotoCoreError as error:
            raise translate(error, f"{operation} s3://{bucket}/{key}") from error

    def findings(self, checkpoint_uri: str) -> tuple[FindingsDocument | None, str | None]:
        """(document, None), (None, None) when there is no file yet (404), or (None, why) when
        unreadable; a 403 raises AccessDenied, never read as "no file yet"."""
        response = self._beside("GetObject", checkpoint_uri, "findings.json")
        if response is None:
            return None, None
        try:
            return parse_findings(response["Body"].read()), None
        except ValueError as error:
            return None, str(error)

    def progress_time(self, checkpoint_uri: str) -> datetime | None:
        """When the job's progress.json last changed (its LastModified), or None when it has none yet."""
        response = self._beside("HeadObject", checkpoint_uri, PROGRESS_FILE)
        return None if response is None else response["LastModified"]

    def stragglers(self, checkpoint_uri: str) -> list[StragglerReport]:
        """The ranks the job's stragglers.json reports (beside findings.json), or none when it has no file."""
        response = self._beside("GetObject", checkpoint_uri, STRAGGLERS_FILE)
        return [] if response is None else parse_stragglers(response["Body"].read())

    def checkpoint_keys(self, checkpoint_uri: str) -> list[str]:
        bucket, prefix = split_s3_uri(checkpoint_uri)
        keys: list[str] = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            # Checkpoints sit directly under the prefix; tensors/ below it are not listed.
            for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix.rstrip('/')}/checkpoint-"):
                keys.extend(item["Key"] for item in page.get("Contents", []))
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"ListObjectsV2 s3://{bucket}/{prefix}") from error
        return keys


    def has_objects(self, uri: str) -> bool:
        """Whether any object lies under an S3 prefix (one ListObjectsV2 of one key)."""
        bucket, prefix = split_s3_uri(uri)
        try:
            listed = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"ListObjectsV2 s3://{bucket}/{prefix}") from error
        return bool(listed.get("KeyCount") or listed.get("Contents"))


def empty_channels(request: dict[str, Any], bucket: str, artifacts: Artifacts) -> list[tuple[str, str]]:
    """(channel, S3 URI) of the request's channels in `bucket` with no object under them.

    SageMaker would fail such a job minutes later ("No S3 objects found under S3 URL"); a freshly
    deployed stack has no data yet. Channels in other buckets are the user's to check (this
    stack's roles may not list them).
    """
    empty = []
    for channel in request.get("InputDataConfig", []):
        uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
        if split_s3_uri(uri)[0] == bucket and not artifacts.has_objects(uri):
            empty.append((channel["ChannelName"], uri))
    return empty


def missing_data_message(empty: list[tuple[str, str]]) -> str:
    where = "; ".join(f"channel {name}: nothing under {uri}" for name, uri in empty)
    return (
        f"{where}. Upload the training data before starting an execution: x.npy and y.npy under "
        f"each channel's prefix (docs/contracts.md, section 1), for the reference problem "
        f"`cd model && python data.py cifar10 --out ../data` then "
        f"`aws s3 cp ../data/<channel>/ <prefix> --recursive` (docs/deploy.md, Data)"
    )


class TaskTokens:
    """The task token of a parked execution, kept in S3 beside the attempt it waits for."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def put(self, uri: str, token: str, job_name: str) -> None:
        bucket, key = split_s3_uri(uri)
        body = json.dumps({"token": token, "job_name": job_name}).encode()
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"PutObject s3://{bucket}/{key}") from error

    def read(self, uri: str) -> str | None:
        """The token kept at `uri`; None when there is none (404) or it is unreadable; a 403 raises AccessDenied."""
        bucket, key = split_s3_uri(uri)
        try:
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            if error_code(error) in NOT_THERE:
                return None
            raise translate(error, f"GetObject s3://{bucket}/{key}") from error
        except BotoCoreError as error:
            raise translate(error, f"GetObject s3://{bucket}/{key}") from error
        try:
            return str(json.loads(body)["token"])
        except (ValueError, KeyError, TypeError):
            return None

    def forget(self, uri: str) -> None:
        bucket, key = split_s3_uri(uri)
        try:
            self.client.delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"DeleteObject s3://{bucket}/{key}") from error
