"""The watch function's four events, parsed at its edge: the events AWS documents parse as AWS sends
them (tests/events/README.md), and a malformed one is refused with `StateCorrupted` naming the field,
before anything is called, never with a KeyError or an AttributeError."""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stabilizer_workflow.errors import StateCorrupted
from stabilizer_workflow.execution.state import dump_state
from stabilizer_workflow.handlers import watch as watch_handler
from tests.unit.workflow.conftest import EVENTS, new_state

LAMBDAS = Path(__file__).resolve().parents[4] / "lambdas"


def _event(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


JOB = "sagemaker-training-job-state-change.json"
EXECUTION = "step-functions-execution-status-change.json"


class Untouchable:
    """Collaborators a refused event must never reach."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the malformed event reached {name}")


def test_the_documented_training_job_event_parses_with_every_member_it_carries():
    from stabilizer_workflow.monitoring.watch_events import TrainingJobStateChange, parse_watch_event

    event = _event(JOB)
    detail = parse_watch_event(event)
    assert isinstance(detail, TrainingJobStateChange)
    assert (detail.training_job_name, detail.training_job_status) == ("example-job", "Completed")
    assert detail.output_path == "s3://example-bucket/output"
    assert detail.tag_map == {}
    assert detail.creation_time == "1764063000000" and detail.resource_config["InstanceCount"] == 1
    # Nothing the event carries is dropped: every member of its detail is a field or kept as extra.
    kept = set(detail.model_dump(by_alias=True, exclude_unset=True))
    assert kept == set(event["detail"])


def test_the_documented_execution_event_parses():
    from stabilizer_workflow.monitoring.watch_events import ExecutionStatusChange, parse_watch_event

    detail = parse_watch_event(_event(EXECUTION))
    assert isinstance(detail, ExecutionStatusChange)
    assert (detail.name, detail.status) == ("example-run", "TIMED_OUT")
    assert detail.execution_arn.endswith(":execution:stabilizer:example-run")
    assert (detail.output, detail.input_details) == (None, {"included": True})


def test_a_failed_jobs_event_with_tags_as_a_list_and_a_member_aws_adds_later_parses():
    from stabilizer_workflow.monitoring.watch_events import parse_watch_event

    event = _event(JOB)
    event["detail"].update(TrainingJobStatus="Failed", FailureReason="AlgorithmError: exit 86",
                           Tags=[{"Key": "stabilizer:execution", "Value": "run-1"}], WarmPoolStatus={"Status": "x"})
    detail = parse_watch_event(event)
    assert detail.failure_reason == "AlgorithmError: exit 86"
    assert detail.tag_map == {"stabilizer:execution": "run-1"}
    assert detail.model_extra == {"WarmPoolStatus": {"Status": "x"}}


def test_the_local_engines_job_event_parses_as_sagemakers_does():
    from stabilizer.local.emulator.job_state_events import job_state_change
    from stabilizer_workflow.monitoring.watch_events import parse_watch_event

    t0 = dt.datetime(2026, 11, 25, 9, 0, tzinfo=dt.UTC)
    described = {"TrainingJobName": "stabilizer-0a1b2c3d-1", "TrainingJobStatus": "Stopped",
                 "TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/stabilizer-0a1b2c3d-1",
                 "OutputDataConfig": {"S3OutputPath": "s3://b/executions/e/attempt-1/output"}, "CreationTime": t0}
    event = json.loads(json.dumps(job_state_change(described, [], account="123456789012", region="us-east-1", now=t0)))
    detail = parse_watch_event(event)
    assert (detail.training_job_status, detail.output_path) == ("Stopped", "s3://b/executions/e/attempt-1/output")


def _without(event: dict, *path: str) -> dict:
    event = copy.deepcopy(event)
    holder = event
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    return event


def _with(event: dict, value, *path: str) -> dict:
    event = copy.deepcopy(event)
    holder = event
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return event


MALFORMED = {
    "job event without the job's name": (lambda: _without(_event(JOB), "detail", "TrainingJobName"),
                                         r"detail\.TrainingJobName: Field required"),
    "job event whose detail is text": (lambda: _with(_event(JOB), "example-job", "detail"),
                                       r"^detail\b.*expected a valid dictionary"),
    "job event whose output config is text": (lambda: _with(_event(JOB), "s3://b/o", "detail", "OutputDataConfig"),
                                              r"detail\.OutputDataConfig: .*dictionary"),
    "job event without its time": (lambda: _without(_event(JOB), "time"), r"^time: Field required"),
    "execution event without its ARN": (lambda: _without(_event(EXECUTION), "detail", "executionArn"),
                                        r"detail\.executionArn: Field required"),
    "execution event whose status is a number": (lambda: _with(_event(EXECUTION), 3, "detail", "status"),
                                                 r"detail\.status: expected a valid string"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_eventbridge_event_is_refused_naming_the_field(case):
    build, message = MALFORMED[case]
    with pytest.raises(StateCorrupted, match=message):
        watch_handler.handle(build(), Untouchable())


def test_an_await_without_its_token_or_with_a_broken_state_is_refused_naming_the_field(settings):
    state = dump_state(new_state(settings))
    with pytest.raises(StateCorrupted, match=r"token: expected the task token"):
        watch_handler.handle({"action": "await", "state": state}, Untouchable())
    with pytest.raises(StateCorrupted, match=r"state\.wait_seconds: "):
        watch_handler.handle({"action": "await", "token": "t", "state": {**state, "wait_seconds": "soon"}},
                             Untouchable())
    with pytest.raises(StateCorrupted, match=r"state: .*dictionary"):
        watch_handler.handle({"action": "stop_launch", "state": None}, Untouchable())
    with pytest.raises(StateCorrupted, match=r"event: expected a JSON object, got list"):
        watch_handler.handle([], Untouchable())


@pytest.mark.slow
def test_the_watch_functions_cold_start_does_not_import_powertools_parser():
    # Importing the parser builds every model Powertools ships; only EventBridge's events need it.
    probe = ("import sys, stabilizer_workflow.handlers.watch; "
             "print('aws_lambda_powertools.utilities.parser' in sys.modules)")
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=LAMBDAS, env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
