"""A warm pool is kept only for an attempt that will reuse it.

SageMaker's managed warm pools ("Train Using SageMaker Managed Warm Pools", SageMaker developer guide,
https://docs.aws.amazon.com/sagemaker/latest/dg/train-warm-pools.html): a kept pool moves to the next
training job only if, among others, its `InstanceCount`, `InstanceType` and `VolumeSizeInGB` are
identical ("Matching training jobs"); it is billed while it waits ("Billing"); and it is released with
UpdateTrainingJob setting `ResourceConfig.KeepAlivePeriodInSeconds` to 0 ("Terminate a warm pool").
DescribeTrainingJob reports it in `WarmPoolStatus` (`Available`, `InUse`, `Reused`, `Terminated`).
So the monitor releases the pool of an attempt whose relaunch changes the number of hosts (it could
never match), of an attempt that hung (its hosts are not to be reused), and of the last attempt of an
execution (nothing will come to reuse it).
"""

from __future__ import annotations

from datetime import timedelta

import botocore.session
from botocore.stub import Stubber

from stabilizer_workflow.aws import sagemaker as aws_sagemaker
from stabilizer_workflow.evidence.observation import observe
from stabilizer_workflow.execution.state import dump_state
from stabilizer_workflow.handlers import monitor as monitor_handler
from stabilizer_workflow.monitoring import monitor
from tests.unit.workflow.conftest import T0, describe, launched, sentinel_findings, watched_findings
from tests.unit.workflow.handlers.test_handlers import _full, cloud, environment, stubbed_sagemaker  # noqa: F401 - the fixtures
from tests.unit.workflow.remedies.test_hangs import HELD_UP, HUNG, on_hosts

LATER = T0 + timedelta(minutes=5)
KEPT = (600, "Available")
MODEL = botocore.session.get_session().get_service_model("sagemaker")


def test_the_doubles_follow_sagemakers_model():
    status = MODEL.shape_for("WarmPoolStatus")
    assert set(status.members["Status"].enum) == {"Available", "Terminated", "Reused", "InUse"}
    update = MODEL.operation_model("UpdateTrainingJob").input_shape.members["ResourceConfig"]
    assert list(update.members) == ["KeepAlivePeriodInSeconds"]
    assert update.members["KeepAlivePeriodInSeconds"].metadata["min"] == 0


def _hung(state, message: str | None = None):
    findings = sentinel_findings(rule="Hang", step=8, phase="main")
    if message:
        findings.findings[0].message = message
    seen = observe(describe(state, "Failed", failure_reason=HUNG, warm_pool=KEPT), findings=findings)
    return monitor.check(state, seen, LATER)


def test_a_relaunch_on_fewer_hosts_releases_the_pool_it_could_never_match(settings):
    state = on_hosts(settings, 3, 2)
    result = _hung(state, HELD_UP)
    assert result.state.job.instance_count == 2 and result.state.next_action == "launch_new"
    assert result.effects.release_warm_pool == state.history.latest_job_name


def test_a_relaunch_after_a_hang_on_the_same_hosts_does_not_reuse_them(settings):
    state = on_hosts(settings, 2, None)
    result = _hung(state, HELD_UP)
    assert result.state.job.instance_count == 2 and result.state.next_action == "launch_new"
    assert result.effects.release_warm_pool == state.history.latest_job_name


def test_a_relaunch_on_the_same_hosts_after_an_instability_keeps_the_pool_for_it(settings):
    state = launched(settings)
    seen = observe(describe(state, "Failed", failure_reason="AlgorithmError: RuleStop: ExplodingTensor",
                            warm_pool=KEPT), findings=sentinel_findings())
    result = monitor.check(state, seen, LATER)
    assert result.state.next_action == "launch_new"
    assert result.effects.release_warm_pool is None


def test_the_last_attempt_releases_its_pool_and_a_pool_already_gone_is_left_alone(settings):
    state = launched(settings)
    done = monitor.check(state, observe(describe(state, "Completed", warm_pool=KEPT), findings=watched_findings()),
                         LATER)
    assert done.state.next_action == "end" and done.effects.release_warm_pool == state.history.latest_job_name
    for status in ("Terminated", "Reused"):
        gone = observe(describe(state, "Completed", warm_pool=(600, status)), findings=watched_findings())
        assert monitor.check(state, gone, LATER).effects.release_warm_pool is None
    no_pool = observe(describe(state, "Completed"), findings=watched_findings())
    assert monitor.check(state, no_pool, LATER).effects.release_warm_pool is None


def test_the_release_is_update_training_job_with_a_keep_alive_of_zero(cloud, settings):  # noqa: F811
    state = on_hosts(settings, 2, None)
    name = state.history.latest_job_name
    client, stub = stubbed_sagemaker()
    findings = sentinel_findings(rule="Hang", step=8, phase="main")
    stub.add_response("describe_training_job",
                      _full(describe(state, "Failed", failure_reason=HUNG, warm_pool=KEPT)), {"TrainingJobName": name})
    stub.add_response("update_training_job", {"TrainingJobArn": f"arn:aws:sagemaker:us-east-1:1:training-job/{name}"},
                      {"TrainingJobName": name, "ResourceConfig": {"KeepAlivePeriodInSeconds": 0}})
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    deps.artifacts.findings = lambda uri: (findings, None)
    with stub:
        new = monitor_handler.handle({"action": "check", "state": dump_state(state)}, deps, LATER)
    stub.assert_no_pending_responses()
    assert new["next_action"] == "launch_new"


def test_a_pool_sagemaker_no_longer_holds_is_not_an_error(cloud, settings):  # noqa: F811
    state = launched(settings)
    name = state.history.latest_job_name
    client = botocore.session.get_session().create_client("sagemaker", region_name="us-east-1")
    stub = Stubber(client)
    stub.add_client_error("update_training_job", "ValidationException",
                          "The warm pool of the training job is not available.",
                          expected_params={"TrainingJobName": name, "ResourceConfig": {"KeepAlivePeriodInSeconds": 0}})
    with stub:
        assert aws_sagemaker.TrainingJobs(client).release_warm_pool(name) is False
