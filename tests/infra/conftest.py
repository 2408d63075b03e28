"""Session fixtures: the default synth, shared by every infra test (see tests/infra/synth.py).

Synths are cached per process, so under pytest-xdist every infra test runs on one worker
(`xdist_group`): each context is synthesized once per run, not once per worker.
"""

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.xdist_group("synth"))
