"""Managed spot training: the request SageMaker documents, its limits checked at input, and a spot
interruption told apart from a failure, a hang and an explosion.

SageMaker's documentation, as botocore's model carries it: CreateTrainingJob's
`EnableManagedSpotTraining`; `StoppingCondition.MaxWaitTimeInSeconds`, "the amount of time spent
waiting for Spot capacity plus the amount of time the job can run. It must be equal to or greater
than MaxRuntimeInSeconds"; DescribeTrainingJob's SecondaryStatus `Interrupted` ("the job stopped
because the managed spot training instances were interrupted") and `MaxWaitTimeExceeded`; and
`BillableTimeInSeconds`, with the savings "(1 - BillableTimeInSeconds / TrainingTimeInSeconds) * 100".
Warm pools "cannot be used with spot instances" ("Train Using SageMaker Managed Warm Pools",
Considerations).
"""

from __future__ import annotations

from datetime import timedelta

import botocore.session
import pytest
from test_requests import assert_valid

from stabilizer_workflow.errors import InvalidInput
from stabilizer_workflow.evidence.observation import observe
from stabilizer_workflow.launch import requests
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import ENV, T0, describe, launched, new_state, sentinel_findings, watched_findings

MODEL = botocore.session.get_session().get_service_model("sagemaker")
LATER = T0 + timedelta(minutes=30)


def spot(**changes) -> dict:
    return {"job": {"source": "s3://stabilizer-bucket/source/sourcedir.tar.gz", "entry_point": "train.py",
                    "hyperparameters": {"lr": 0.1}, "max_runtime_seconds": 3600,
                    "use_spot_instances": True, "max_wait_seconds": 7200, **changes}}


@pytest.fixture
def spot_settings() -> TrainSettings:
    return TrainSettings.from_env({**ENV, "LIBRARY_S3_URI": "s3://stabilizer-bucket/library/",
                                   "WARM_POOL_SECONDS": "600"})


def test_the_documentation_the_doubles_follow():
    described = MODEL.operation_model("DescribeTrainingJob").output_shape.members
    assert {"Interrupted", "MaxWaitTimeExceeded", "Training"} <= set(described["SecondaryStatus"].enum)
    assert "(1 - BillableTimeInSeconds / TrainingTimeInSeconds) * 100" in " ".join(
        described["BillableTimeInSeconds"].documentation.replace("<code>", "").replace("</code>", "").split())
    assert "equal to or greater than" in MODEL.shape_for("StoppingCondition").members[
        "MaxWaitTimeInSeconds"].documentation


def test_a_spot_job_is_requested_as_sagemaker_documents_it_without_a_warm_pool(spot_settings):
    state = new_state(spot_settings, spot())
    request = requests.build_create_training_job(state, spot_settings, 1)
    assert request["EnableManagedSpotTraining"] is True
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    assert request["CheckpointConfig"]["S3Uri"].endswith("/attempt-1/checkpoints")  # resumed after an interruption
    assert "KeepAlivePeriodInSeconds" not in request["ResourceConfig"]
    assert_valid(request)
    on_demand = requests.build_create_training_job(new_state(spot_settings, spot(use_spot_instances=False,
                                                                                  max_wait_seconds=None)),
                                                   spot_settings, 1)
    assert "EnableManagedSpotTraining" not in on_demand
    assert on_demand["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 600


@pytest.mark.parametrize(("changes", "refused"), [
    ({"max_wait_seconds": None}, r"^job\.max_wait_seconds: a spot job needs one"),
    ({"max_wait_seconds": 1800}, r"^job\.max_wait_seconds: 1800 s is less than job\.max_runtime_seconds 3600"),
    ({"use_spot_instances": False}, r"^job\.max_wait_seconds: .*only with use_spot_instances"),
])
def test_spot_limits_sagemaker_would_reject_are_refused_at_input(spot_settings, changes, refused):
    with pytest.raises(InvalidInput, match=refused):
        new_state(spot_settings, spot(**changes))


def test_the_wait_never_falls_under_the_runtime_the_budget_leaves(spot_settings):
    state = new_state(spot_settings, {**spot(), "limits": {"max_total_training_seconds": 600}})
    stopping = requests.build_create_training_job(state, spot_settings, 1)["StoppingCondition"]
    assert stopping["MaxRuntimeInSeconds"] == 600 and stopping["MaxWaitTimeInSeconds"] == 7200


def _checkpoints(state) -> list[str]:
    prefix = state.current.checkpoint_s3_uri.split("/", 3)[3]
    return [f"{prefix}/checkpoint-00000040.pt"]


def test_a_job_that_waited_past_its_spot_wait_relaunches_the_same_recipe_from_its_checkpoint(spot_settings):
    state = launched(spot_settings, spot())
    # Its summary says the script restores from a checkpoint, so the relaunch resumes.
    ended = observe(describe(state, "Stopped", secondary="MaxWaitTimeExceeded"), checkpoint_keys=_checkpoints(state),
                    findings=watched_findings(ended="stopped"))
    result = monitor.check(state, ended, LATER)
    decision = result.state.attempts[-1].decision
    assert result.state.next_action == "launch_new" and result.state.run_spec == state.run_spec
    assert decision.remedy == "retry" and "spot" in decision.reason and "MaxWaitTimeInSeconds" in decision.reason
    assert decision.resume_from.endswith("checkpoint-00000040.pt")
    assert result.state.history.num_infrastructure_retries == 1
    assert result.state.outcome is None and "failed" not in result.effects.notification.subject.lower()


def test_spot_capacity_that_never_comes_back_ends_as_gave_up_saying_so(spot_settings):
    state = launched(spot_settings, {**spot(), "limits": {"max_infrastructure_retries": 0}})
    ended = observe(describe(state, "Stopped", secondary="MaxWaitTimeExceeded"))
    result = monitor.check(state, ended, LATER)
    assert result.state.outcome == "gave_up" and "spot" in result.state.reason


def test_an_interruption_is_not_a_hang_and_silence_counts_from_the_return_to_training(spot_settings):
    state = launched(spot_settings, spot(hang={"monitor_seconds": 600}))
    last = T0 + timedelta(minutes=5)  # the last sign of life, before the interruption
    back = T0 + timedelta(minutes=40)  # SageMaker restarted it on new spot capacity
    transitions = [{"Status": "Training", "StartTime": T0, "EndTime": last},
                   {"Status": "Interrupted", "StartTime": last, "EndTime": back - timedelta(minutes=2)},
                   {"Status": "Starting", "StartTime": back - timedelta(minutes=2), "EndTime": back},
                   {"Status": "Training", "StartTime": back, "StatusMessage": "Training in progress"}]
    interrupted = describe(state, "InProgress", secondary="Interrupted")
    assert monitor.check(state, observe(interrupted, progress_at=last), back).effects.stop_job is None
    training = {**describe(state, "InProgress"), "SecondaryStatusTransitions": transitions}
    soon = monitor.check(state, observe(training, progress_at=last), back + timedelta(minutes=5))
    assert soon.effects.stop_job is None and soon.state.attempts[-1].finding is None
    stale = monitor.check(state, observe(training, progress_at=last), back + timedelta(minutes=11))
    assert stale.state.attempts[-1].finding.rule == "Hang"
    assert stale.state.attempts[-1].interruptions == 1


def test_billable_time_and_the_savings_are_recorded_and_told(spot_settings):
    state = launched(spot_settings, spot())
    completed = {**describe(state, "Completed", seconds=500), "BillableTimeInSeconds": 100}
    result = monitor.check(state, observe(completed, findings=watched_findings()), LATER)
    attempt = result.state.attempts[-1]
    assert (attempt.seconds, attempt.billable_seconds) == (500, 100)
    body = result.effects.notification.body
    assert "billed 100 s of 500 s trained (80% saved with spot)" in body


def test_an_explosion_on_a_spot_job_is_still_an_explosion(spot_settings):
    state = launched(spot_settings, spot())
    failed = describe(state, "Failed", failure_reason="AlgorithmError: RuleStop: ExplodingTensor fired at step 2")
    result = monitor.check(state, observe(failed, findings=sentinel_findings()), LATER)
    assert result.state.attempts[-1].finding.rule == "ExplodingTensor"
    assert result.state.history.num_infrastructure_retries == 0
