"""The watch function at the AWS edge: parking an execution, waking it on the job's end event,
and cleaning up after an execution that ended abnormally. moto for S3, SNS and Step Functions;
botocore Stubber where the exact SageMaker requests matter (ListTrainingJobs, StopTrainingJob)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from stabilizer_workflow.aws import s3 as aws_s3
from stabilizer_workflow.aws import sagemaker as aws_sagemaker
from stabilizer_workflow.aws import sns as aws_sns
from stabilizer_workflow.errors import AccessDenied
from stabilizer_workflow.execution.state import dump_state
from stabilizer_workflow.handlers import watch as watch_handler
from stabilizer_workflow.monitoring import watch
from stabilizer_workflow.monitoring.watch_events import parse_watch_event
from stabilizer_workflow.settings import WatchSettings
from tests.unit.workflow.conftest import ENV, EVENTS, T0, new_state

REGION = "us-east-1"
BUCKET = ENV["BUCKET"]


def described(name: str, status: str) -> dict[str, Any]:
    """A DescribeTrainingJob response with the members it always has, so Stubber accepts it."""
    return {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{name}",
        "TrainingJobStatus": status,
        "SecondaryStatus": "Training" if status == "InProgress" else status,
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://{BUCKET}/out/model.tar.gz"},
        "ResourceConfig": {"VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": T0,
    }


class FakeExecutions:
    """SendTaskSuccess and DescribeExecution as the watch function uses them (no interpreter here)."""

    def __init__(self, error: str | None = None, gone: bool = False) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.error = error
        self.gone = gone

    def wake(self, token: str, output: dict[str, Any]) -> bool:
        self.sent.append((token, output))
        return not self.gone

    def describe(self, arn: str) -> dict[str, Any]:
        return {"executionArn": arn, "status": "FAILED", "error": self.error, "cause": "boom"}


@pytest.fixture
def cloud(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        sns = boto3.client("sns", region_name=REGION)
        topic = sns.create_topic(Name="stabilizer")["TopicArn"]
        sqs = boto3.client("sqs", region_name=REGION)
        queue = sqs.create_queue(QueueName="inbox")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
        yield {"s3": s3, "sns": sns, "sqs": sqs, "queue": queue, "topic": topic}


def _deps(cloud, sagemaker, executions) -> watch_handler.Collaborators:
    settings = WatchSettings(bucket=BUCKET, topic_arn=cloud["topic"], job_name_prefix="stabilizer")
    return watch_handler.Collaborators(
        settings=settings,
        jobs=aws_sagemaker.TrainingJobs(sagemaker),
        tokens=aws_s3.TaskTokens(cloud["s3"]),
        executions=executions,
        notifier=aws_sns.Notifier(cloud["sns"], cloud["topic"]),
    )


def _launched(settings) -> dict:
    return dump_state(_plan(settings).state)


def _plan(settings):
    from stabilizer_workflow.launch.attempts import launch

    return launch(new_state(settings), settings, T0)


def _inbox(cloud) -> list[dict]:
    got = cloud["sqs"].receive_message(QueueUrl=cloud["queue"], MaxNumberOfMessages=10,
                                       MessageAttributeNames=["All"])
    return got.get("Messages", [])


def _documented_event() -> dict:
    """AWS's "SageMaker Training Job State Change" example (tests/events/README.md)."""
    return json.loads((EVENTS / "sagemaker-training-job-state-change.json").read_text())


def _job_event(request: dict, status: str, *, output: bool = True, tags: bool = True) -> dict:
    """The event SageMaker sends for the job `request` created: the documented shape, filled with
    that job's values; no member the documented event lacks."""
    event = _documented_event()
    detail = event["detail"]
    detail["TrainingJobName"] = request["TrainingJobName"]
    detail["TrainingJobStatus"] = detail["SecondaryStatus"] = status
    detail["HyperParameters"] = dict(request["HyperParameters"])
    detail["OutputDataConfig"]["S3OutputPath"] = request["OutputDataConfig"]["S3OutputPath"]
    detail["Tags"] = {tag["Key"]: tag["Value"] for tag in request["Tags"]}
    if not output:
        del detail["OutputDataConfig"]
    if not tags:
        detail["Tags"] = {}
    if status == "Failed":
        detail["FailureReason"] = "AlgorithmError: the sentinel stopped training (exit 86)"
    assert "CheckpointConfig" not in detail
    return event


def _park(cloud, settings, executions, token="tok-1"):
    plan = _plan(settings)
    state = dump_state(plan.state)
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with Stubber(sagemaker) as stub:
        stub.add_response("describe_training_job", described(plan.attempt.job_name, "InProgress"),
                          {"TrainingJobName": plan.attempt.job_name})
        parked = watch_handler.handle({"action": "await", "token": token, "state": state},
                                      _deps(cloud, sagemaker, executions))
    assert parked["parked"] is True
    return plan, sagemaker


def test_parking_keeps_the_token_beside_the_attempt_and_the_job_end_sends_it(cloud, settings):
    executions = FakeExecutions()
    plan, sagemaker = _park(cloud, settings, executions)
    attempt = plan.attempt
    token_key = attempt.checkpoint_s3_uri.split(BUCKET + "/")[1].rsplit("/", 1)[0] + "/wake-token.json"
    assert json.loads(cloud["s3"].get_object(Bucket=BUCKET, Key=token_key)["Body"].read())["token"] == "tok-1"
    assert executions.sent == []

    woken = watch_handler.handle(_job_event(plan.request, "Failed"), _deps(cloud, sagemaker, executions))
    assert woken["woken"] is True
    assert executions.sent == [("tok-1", {"job_name": attempt.job_name, "status": "Failed"})]
    # Sent once: the token is gone, a repeated event (SageMaker may send several) wakes nothing.
    again = watch_handler.handle(_job_event(plan.request, "Failed"), _deps(cloud, sagemaker, executions))
    assert again["woken"] is False and len(executions.sent) == 1


def test_the_job_end_event_as_aws_documents_it_wakes_the_execution_without_waiting_for_the_check(
        cloud, settings):
    # The documented event carries no CheckpointConfig: the execution is found from what it does carry.
    event = _job_event(_plan(settings).request, "Completed")
    documented = _documented_event()["detail"]
    assert set(event["detail"]) <= set(documented)
    executions = FakeExecutions()
    plan, sagemaker = _park(cloud, settings, executions, token="tok-doc")
    result = watch_handler.handle(event, _deps(cloud, sagemaker, executions))
    assert result == {"woken": True, "job_name": plan.attempt.job_name, "status": "Completed"}
    assert executions.sent == [("tok-doc", {"job_name": plan.attempt.job_name, "status": "Completed"})]


def test_the_jobs_tags_find_the_execution_when_the_event_has_no_output_path(cloud, settings):
    executions = FakeExecutions()
    plan, sagemaker = _park(cloud, settings, executions, token="tok-tags")
    result = watch_handler.handle(_job_event(plan.request, "Stopped", output=False),
                                  _deps(cloud, sagemaker, executions))
    assert result["woken"] is True and executions.sent[0][0] == "tok-tags"


def test_the_token_is_found_where_parking_kept_it_from_the_event_alone(settings):
    plan = _plan(settings)
    from_checkpoints = watch.token_uri(plan.attempt.checkpoint_s3_uri)
    for output, tags in ((True, True), (False, True)):
        detail = parse_watch_event(_job_event(plan.request, "Completed", output=output, tags=tags))
        assert watch.attempt_token_uri(watch.attempt_of(detail, BUCKET)) == from_checkpoints
    untraceable = parse_watch_event(_job_event(plan.request, "Completed", output=False, tags=False))
    assert watch.attempt_of(untraceable, BUCKET) is None


def test_a_job_that_ended_before_parking_wakes_the_execution_at_once(cloud, settings):
    state = _launched(settings)
    attempt = state["attempts"][-1]
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    executions = FakeExecutions()
    with Stubber(sagemaker) as stub:
        stub.add_response("describe_training_job", described(attempt["job_name"], "Completed"),
                          {"TrainingJobName": attempt["job_name"]})
        parked = watch_handler.handle({"action": "await", "token": "tok-2", "state": state},
                                      _deps(cloud, sagemaker, executions))
    assert parked["parked"] is False
    assert executions.sent == [("tok-2", {"job_name": attempt["job_name"], "status": "Completed"})]
    listed = cloud["s3"].list_objects_v2(Bucket=BUCKET, Prefix="executions/").get("Contents", [])
    assert [o["Key"] for o in listed if o["Key"].endswith("wake-token.json")] == []


def test_another_deployments_job_is_ignored(cloud, settings):
    executions = FakeExecutions()
    event = _documented_event()
    event["detail"]["TrainingJobName"] = "stabilizer-abc-1"
    event["detail"]["OutputDataConfig"]["S3OutputPath"] = "s3://someone-else/executions/x/attempt-1/output"
    result = watch_handler.handle(event, _deps(cloud, boto3.client("sagemaker", region_name=REGION), executions))
    assert result["woken"] is False and executions.sent == []


def _execution_event(name: str, status: str) -> dict:
    """AWS's "Step Functions Execution Status Change" example (tests/events/README.md) for execution `name`."""
    event = json.loads((EVENTS / "step-functions-execution-status-change.json").read_text())
    arn = f"arn:aws:states:{REGION}:123456789012:execution:sm:{name}"
    event["resources"] = [arn]
    event["detail"].update(executionArn=arn, name=name, status=status,
                           stateMachineArn=f"arn:aws:states:{REGION}:123456789012:stateMachine:sm")
    return event


def _summary(name: str) -> dict:
    return {"TrainingJobName": name, "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{name}",
            "CreationTime": T0, "TrainingJobStatus": "InProgress"}


def _running(name: str, execution: str, bucket: str = BUCKET) -> dict:
    description = described(name, "InProgress")
    description["CheckpointConfig"] = {"S3Uri": f"s3://{bucket}/executions/{execution}/attempt-2/checkpoints"}
    return description


def test_a_timed_out_execution_gets_its_job_stopped_and_someone_told(cloud):
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with Stubber(sagemaker) as stub:
        stub.add_response("list_training_jobs", {"TrainingJobSummaries": [
            _summary("stabilizer-aaaa-2"), _summary("stabilizer-bbbb-1"), _summary("stabilizer-cccc-1")]},
            {"NameContains": "stabilizer-", "StatusEquals": "InProgress"})
        stub.add_response("describe_training_job", _running("stabilizer-aaaa-2", "run-7"), {"TrainingJobName": ANY})
        stub.add_response("describe_training_job", _running("stabilizer-bbbb-1", "run-8"), {"TrainingJobName": ANY})
        stub.add_response("describe_training_job", _running("stabilizer-cccc-1", "run-7", bucket="other"),
                          {"TrainingJobName": ANY})
        stub.add_response("stop_training_job", {}, {"TrainingJobName": "stabilizer-aaaa-2"})
        result = watch_handler.handle(_execution_event("run-7", "TIMED_OUT"),
                                      _deps(cloud, sagemaker, FakeExecutions(error="States.Timeout")))
        stub.assert_no_pending_responses()
    assert result == {"stopped": ["stabilizer-aaaa-2"], "notified": True}
    [message] = _inbox(cloud)
    body = message["Body"]
    assert "run-7" in body and "timed out" in body and "stabilizer-aaaa-2" in body
    assert message["MessageAttributes"]["event_type"]["StringValue"] == "failed"


def test_a_failed_execution_whose_own_path_already_stopped_and_told_stays_quiet(cloud):
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with Stubber(sagemaker) as stub:
        stub.add_response("list_training_jobs", {"TrainingJobSummaries": []},
                          {"NameContains": "stabilizer-", "StatusEquals": "InProgress"})
        result = watch_handler.handle(_execution_event("run-9", "FAILED"),
                                      _deps(cloud, sagemaker, FakeExecutions(error="AwsRequestRejected")))
    assert result == {"stopped": [], "notified": False}
    assert _inbox(cloud) == []


def test_an_uncatchable_failure_is_told_even_with_no_job_left(cloud):
    # The history quota or a data limit fails the execution with no Catch able to run.
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with Stubber(sagemaker) as stub:
        stub.add_response("list_training_jobs", {"TrainingJobSummaries": []},
                          {"NameContains": "stabilizer-", "StatusEquals": "InProgress"})
        result = watch_handler.handle(_execution_event("run-10", "FAILED"),
                                      _deps(cloud, sagemaker, FakeExecutions(error="States.Runtime")))
    assert result["notified"] is True
    [message] = _inbox(cloud)
    assert "States.Runtime" in message["Body"]


def test_token_location_is_beside_the_checkpoints_not_in_them():
    uri = "s3://b/executions/run-1/attempt-3/checkpoints"
    assert watch.token_uri(uri) == "s3://b/executions/run-1/attempt-3/wake-token.json"
    assert watch.token_uri(uri + "/") == "s3://b/executions/run-1/attempt-3/wake-token.json"


def test_an_event_of_no_known_kind_is_refused(cloud):
    with pytest.raises(Exception, match="expected action 'await'"):
        watch_handler.handle({"detail-type": "Something Else"},
                             _deps(cloud, boto3.client("sagemaker", region_name=REGION), FakeExecutions()))


# --- a launch that failed ---------------------------------------------------------------------


def _launch_failed(settings) -> tuple[dict, dict]:
    """The state the failed launch started from (no new attempt recorded) and the request it sent."""
    plan = _plan(settings)
    return dump_state(new_state(settings)), plan.request


def test_a_failed_launch_whose_job_was_created_gets_that_job_stopped(cloud, settings):
    state, request = _launch_failed(settings)
    name = request["TrainingJobName"]
    created = described(name, "InProgress")
    created["OutputDataConfig"] = request["OutputDataConfig"]
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with Stubber(sagemaker) as stub:
        stub.add_response("describe_training_job", created, {"TrainingJobName": name})
        stub.add_response("stop_training_job", {}, {"TrainingJobName": name})
        result = watch_handler.handle({"action": "stop_launch", "state": state},
                                      _deps(cloud, sagemaker, FakeExecutions()))
        stub.assert_no_pending_responses()
    assert result == {"stopped": [name], "job_name": name}


def test_a_failed_launch_that_created_nothing_stops_nothing(cloud, settings):
    state, request = _launch_failed(settings)
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with Stubber(sagemaker) as stub:
        stub.add_client_error("describe_training_job", "ValidationException", "Requested resource not found.")
        result = watch_handler.handle({"action": "stop_launch", "state": state},
                                      _deps(cloud, sagemaker, FakeExecutions()))
    assert result == {"stopped": [], "job_name": request["TrainingJobName"]}


def test_a_job_of_the_same_name_from_another_deployment_is_left_alone(cloud, settings):
    state, request = _launch_failed(settings)
    name = request["TrainingJobName"]
    theirs = described(name, "InProgress")
    theirs["OutputDataConfig"] = {"S3OutputPath": "s3://someone-else/executions/x/attempt-1/output"}
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    with Stubber(sagemaker) as stub:
        stub.add_response("describe_training_job", theirs, {"TrainingJobName": name})
        result = watch_handler.handle({"action": "stop_launch", "state": state},
                                      _deps(cloud, sagemaker, FakeExecutions()))
        stub.assert_no_pending_responses()
    assert result["stopped"] == []


# --- S3: not there yet is not access denied ---------------------------------------------------


def test_a_missing_token_is_not_there_yet_but_a_denied_read_is_a_named_error():
    s3 = boto3.client("s3", region_name=REGION)
    uri = f"s3://{BUCKET}/executions/run-1/attempt-1/wake-token.json"
    with Stubber(s3) as stub:
        stub.add_client_error("get_object", "NoSuchKey", "The specified key does not exist.", 404)
        assert aws_s3.TaskTokens(s3).read(uri) is None
        stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403)
        with pytest.raises(AccessDenied, match="403"):
            aws_s3.TaskTokens(s3).read(uri)


def test_missing_findings_are_not_there_yet_but_denied_findings_are_a_named_error():
    s3 = boto3.client("s3", region_name=REGION)
    uri = f"s3://{BUCKET}/executions/run-1/attempt-1/checkpoints"
    with Stubber(s3) as stub:
        stub.add_client_error("get_object", "NoSuchKey", "The specified key does not exist.", 404)
        assert aws_s3.Artifacts(s3).findings(uri) == (None, None)
        stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403)
        with pytest.raises(AccessDenied, match=r"findings\.json"):
            aws_s3.Artifacts(s3).findings(uri)
