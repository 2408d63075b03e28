"""Builders shared by the Lambda unit tests: settings, states, DescribeTrainingJob responses, and a
simulator that drives the pure launch/check loop the way the state machine does."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from stabilizer_workflow.evidence.observation import Observation, observe
from stabilizer_workflow.evidence.sentinel_files import FindingsDocument, Probed, SentinelRollback
from stabilizer_workflow.execution.state import WorkflowState
from stabilizer_workflow.launch import attempts as launching
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.settings import TrainSettings

PROCESSING_ARN = "arn:aws:sagemaker:us-east-1:123456789012:processing-job"
EVENTS = Path(__file__).resolve().parents[2] / "events"
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

ENV = {
    "BUCKET": "stabilizer-bucket",
    "TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:stabilizer",
    "SAGEMAKER_ROLE_ARN": "arn:aws:iam::123456789012:role/stabilizer-sagemaker",
    "TRAINING_IMAGE_URI": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-gpu-py311",
    "SOURCE_S3_URI": "s3://stabilizer-bucket/source/sourcedir.tar.gz",
    "TRAIN_DATA_S3_URI": "s3://stabilizer-bucket/data/train",
    "TEST_DATA_S3_URI": "s3://stabilizer-bucket/data/test",
    "JOB_NAME_PREFIX": "stabilizer",
    "DEFAULT_INSTANCE_TYPE": "ml.p3.2xlarge",
    "DEBUGGER_RULES_ENABLED": "false",
    "DEBUGGER_RULE_IMAGE": "503895931360.dkr.ecr.us-east-1.amazonaws.com/sagemaker-debugger-rules:latest",
    "AWS_REGION": "us-east-1",
}
EXECUTION = {
    "id": "arn:aws:states:us-east-1:123456789012:execution:stabilizer:run-1",
    "name": "run-1",
    "start_time": "2025-01-01T12:00:00.000Z",
}


def load_event(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / name).read_text())


@pytest.fixture
def settings() -> TrainSettings:
    return TrainSettings.from_env(ENV)


@pytest.fixture
def debugger_settings() -> TrainSettings:
    return TrainSettings.from_env({**ENV, "DEBUGGER_RULES_ENABLED": "true"})


def new_state(settings: TrainSettings, raw_input: dict | None = None) -> WorkflowState:
    return launching.prepare(raw_input or {}, EXECUTION, settings)


def launched(settings: TrainSettings, raw_input: dict | None = None, now: datetime = T0) -> WorkflowState:
    return launching.launch(new_state(settings, raw_input), settings, now).state


def describe(
    state: WorkflowState,
    status: str,
    *,
    failure_reason: str | None = None,
    secondary: str | None = None,
    rules: list[tuple[str, str]] | None = None,
    profiler_rules: list[tuple[str, str]] | None = None,
    seconds: int | None = 120,
    start: datetime = T0,
    warm_pool: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """A DescribeTrainingJob response for the current attempt. `warm_pool`: (KeepAlivePeriodInSeconds,
    WarmPoolStatus.Status) of a job launched with a warm pool."""
    name = state.history.latest_job_name
    response: dict[str, Any] = {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary
        or {
            "InProgress": "Training",
            "Completed": "Completed",
            "Failed": "Failed",
            "Stopping": "Stopping",
            "Stopped": "Stopped",
        }[status],
        "TrainingStartTime": start,
    }
    if status in ("Completed", "Failed", "Stopped"):
        response["TrainingEndTime"] = start + timedelta(seconds=seconds or 0)
        if seconds is not None:
            response["TrainingTimeInSeconds"] = seconds
    if failure_reason:
        response["FailureReason"] = failure_reason
    if warm_pool is not None:
        keep_alive, pool = warm_pool
        response["ResourceConfig"] = {"InstanceType": state.job.instance_type,
                                      "InstanceCount": state.job.instance_count,
                                      "VolumeSizeInGB": 30, "KeepAlivePeriodInSeconds": keep_alive}
        response["WarmPoolStatus"] = {"Status": pool, "ResourceRetainedBillableTimeInSeconds": 0}
    # DebugRuleEvaluationStatuses and ProfilerRuleEvaluationStatuses: the same entry shape
    # (botocore's model: DebugRuleEvaluationStatus, ProfilerRuleEvaluationStatus).
    for member, given in (("DebugRuleEvaluationStatuses", rules), ("ProfilerRuleEvaluationStatuses", profiler_rules)):
        if given:
            response[member] = [
                {
                    "RuleConfigurationName": rule,
                    "RuleEvaluationJobArn": f"{PROCESSING_ARN}/{name}-{rule.lower()}",
                    "RuleEvaluationStatus": rule_status,
                    "LastModifiedTime": start,
                }
                for rule, rule_status in given
            ]
    return response


def sentinel_findings(
    rule: str = "ExplodingTensor",
    step: int = 2,
    phase: str = "warmup",
    learning_rate: float = 0.1,
    job_action: str = "stop",
    **summary_changes: Any,
) -> FindingsDocument:
    """The sentinel's findings.json with one finding; its summary is the event file's (a job
    stopped at step 2 by a non-finite loss, whose script restores) with `summary_changes`."""
    doc = load_event("findings-exploding.json")
    finding = doc["findings"][0]
    finding.update(rule=rule, step=step, phase=phase, learning_rate=learning_rate)
    doc["job_action"] = job_action
    doc["summary"].update(summary_changes)
    return FindingsDocument.model_validate(doc)


RULE_STOP = "AlgorithmError: RuleStop: ExplodingTensor fired at step 2"


def summary(**changes: Any) -> dict[str, Any]:
    """findings.json's summary (docs/contracts.md, section 2) of a watched job that completed healthy:
    every step it took checked, a finite falling loss, learned. `changes` override keys."""
    base: dict[str, Any] = {
        "integration": "library",
        "ended": "completed",
        "exception": None,
        "steps_taken": 36,
        "steps_observed": 36,
        "steps_skipped": 0,
        "first_step": 0,
        "last_step": 35,
        "first_loss": 2.3,
        "last_loss": 0.41,
        "best_loss": 0.41,
        "learned": True,
        "started_from": None,
        "restores": True,
        "evaluations": [],
        "log_loss": {"last": 0.41, "nonfinite_step": None, "lines": 4},
    }
    return {**base, **changes}


def watched_findings(
    *, findings: list[dict] | None = None, job_action: str = "stop", **changes: Any
) -> FindingsDocument:
    """A version 2 findings.json: the given findings (none by default) and a summary."""
    return FindingsDocument.model_validate(
        {"version": 2, "job_action": job_action, "findings": findings or [], "summary": summary(**changes)}
    )


def state_with_exploded_attempts(settings: TrainSettings, count: int, rollbacks: int = 0) -> WorkflowState:
    """A state whose every attempt exploded, so each records a finding and a decision (and, with
    `rollbacks`, that many in-job rollbacks before it, each as the sentinel writes one after probing
    four rates).

    Once the ladder is used up the execution is reopened with a fresh seed: what is under test is
    the payload's size, not the policy.
    """
    # More relaunches than ValidateInput accepts for the worst case: these attempts are typical ones.
    state = new_state(settings)
    state = state.model_copy(update={"limits": state.limits.model_copy(update={"max_num_retraining": count + 10})})
    now = T0
    for number in range(count):
        spec = {**state.run_spec, "seed": number}
        state = state.model_copy(
            update={"run_spec": spec, "next_action": "launch_new", "outcome": None, "reason": None}
        )
        state = launching.launch(state, settings, now).state
        now += timedelta(minutes=5)
        seen = observe(
            describe(state, "Failed", failure_reason="AlgorithmError: RuleStop: ExplodingTensor"),
            findings=sentinel_findings(step=number + 2).model_copy(update={"rollbacks": [
                SentinelRollback(rule="ExplodingTensor", step=n * 40 + 4, message="gradient norm is non-finite",
                                 restored_step=n * 40, steps_lost=5, probe_steps=15, learning_rate_before=0.1 / 3**n,
                                 learning_rate_after=0.01 / 3**n, factor=0.1 / 3**n, seconds=0.8,
                                 probed=[Probed(learning_rate=0.1 * f / 3**n, steps=5)
                                         for f in (1 / 3, 1 / 10, 1 / 30, 1 / 100)])
                for n in range(rollbacks)]}),
        )
        state = monitor.check(state, seen, now).state
    return state


def explodes_without_batch_norm(spec: dict[str, Any]) -> bool:
    """The reference problem: it explodes in warm-up until batch norm is added."""
    return spec["add_batch_norm"] == 0


def simulate(
    settings: TrainSettings,
    raw_input: dict,
    explodes: Callable[[dict[str, Any]], bool] = explodes_without_batch_norm,
    *,
    max_jobs: int = 40,
) -> WorkflowState:
    """Drive prepare -> (launch -> check)* through the pure functions, as the ASL does."""
    state = new_state(settings, raw_input)
    now = T0
    for _ in range(max_jobs):
        if state.next_action == "end":
            return state
        assert state.next_action == "launch_new"
        state = launching.launch(state, settings, now).state
        now += timedelta(minutes=10)
        if explodes(state.run_spec):
            obs = observe(
                describe(state, "Failed", failure_reason=RULE_STOP, seconds=30),
                findings=sentinel_findings(learning_rate=state.run_spec.get("warmup_learning_rate", 0.1)),
            )
        else:
            obs = observe(describe(state, "Completed", seconds=300), findings=watched_findings())
        state = monitor.check(state, obs, now).state
    raise AssertionError("the simulated execution did not end")


def observation(state: WorkflowState, status: str, **kwargs: Any) -> Observation:
    findings = kwargs.pop("findings", None)
    keys = kwargs.pop("checkpoint_keys", None)
    return observe(describe(state, status, **kwargs), findings=findings, checkpoint_keys=keys)
