"""Session fixtures: the default synth, shared by every infra test (see tests/infra/synth.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from tests.infra.synth import synth, synthesized


@pytest.fixture(scope="session")
def default_synth() -> tuple[Template, dict]:
    return synth()


@pytest.fixture(scope="session")
def default_outdir() -> Path:
    return synthesized(())[2]
