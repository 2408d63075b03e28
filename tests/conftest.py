"""Fixtures shared by every tier: the offline data set and a job directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import JobDirs, model_module


@pytest.fixture(scope="session")
def digits_channels(tmp_path_factory) -> dict[str, Path]:
    """scikit-learn's digits as train/test channels, written once per test session."""
    _data = model_module("data")
    prepare_digits = _data.prepare_digits

    return prepare_digits(tmp_path_factory.mktemp("digits"))


@pytest.fixture
def job_dirs(tmp_path) -> JobDirs:
    return JobDirs(tmp_path / "job")
