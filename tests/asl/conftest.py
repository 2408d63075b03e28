"""The `workflow` fixture: the real definition in moto's interpreter (see tests/asl/harness.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from moto import mock_aws

from stabilizer.local.engine import history_events
from tests.asl.harness import REGION, Workflow


@pytest.fixture
def workflow(monkeypatch: pytest.MonkeyPatch) -> Iterator[Workflow]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    config = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}
    # As the local engine does: the history stays in GetExecutionHistory's shape (tests/asl/test_history_shape.py).
    with mock_aws(config=config), history_events.installed():
        yield Workflow(monkeypatch)
