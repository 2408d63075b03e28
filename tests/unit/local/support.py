"""Fixtures for the local-mode unit tests: a mocked AWS account and the emulator's stand-in script.

Imported by name by the test modules that use them, in local/engine/, local/emulator/ and
client/test_client.py (the notebook client's local side).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from moto import mock_aws

from stabilizer.source.sourcedir import source_archive

FIXTURES = Path(__file__).parent / "fixtures"
BUCKET = "stabilizer-test"


@pytest.fixture(name="aws_env")
def aws_env_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture(name="s3")
def s3_fixture(aws_env: None) -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def put_array(s3: Any, key: str, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array)
    s3.put_object(Bucket=BUCKET, Key=key, Body=buffer.getvalue())


@pytest.fixture(name="staged")
def staged_fixture(s3: Any) -> dict[str, str]:
    """Channels and the stand-in source archive in the mocked bucket; returns their URIs."""
    put_array(s3, "data/train/x.npy", np.zeros((4, 32, 32, 3), dtype=np.float32))
    put_array(s3, "data/train/y.npy", np.arange(4))
    s3.put_object(Bucket=BUCKET, Key="source/sourcedir.tar.gz", Body=source_archive(FIXTURES / "fake_model"))
    return {
        "train": f"s3://{BUCKET}/data/train/",
        "source": f"s3://{BUCKET}/source/sourcedir.tar.gz",
        "output": f"s3://{BUCKET}/output/",
        "checkpoints": f"s3://{BUCKET}/executions/e1/attempt-1/checkpoints",
    }
