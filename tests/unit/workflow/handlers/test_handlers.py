"""The two handlers end to end at the AWS edge: botocore Stubber where the exact request matters
(CreateTrainingJob, StopTrainingJob, StopProcessingJob), moto where service behaviour matters (S3
findings and checkpoints, SNS delivery)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from stabilizer_contract import s3_uris
from stabilizer_workflow.aws import s3 as aws_s3
from stabilizer_workflow.aws import sagemaker as aws_sagemaker
from stabilizer_workflow.aws import sns as aws_sns
from stabilizer_workflow.aws import stepfunctions as aws_stepfunctions
from stabilizer_workflow.errors import (
    AccessDenied,
    AwsRequestRejected,
    CapacityUnavailable,
    InvalidInput,
    MisconfiguredEnvironment,
    ServiceQuotaExceeded,
    StateCorrupted,
    TransientAwsError,
)
from stabilizer_workflow.execution.state import dump_state, load_state
from stabilizer_workflow.handlers import monitor as monitor_handler
from stabilizer_workflow.handlers import train as train_handler
from stabilizer_workflow.launch import requests
from stabilizer_workflow.settings import MonitorSettings
from tests.unit.workflow.conftest import ENV, RULE_STOP, T0, describe, launched, load_event, summary

REGION = "us-east-1"


@dataclass
class Context:
    """The attributes Powertools reads from a Lambda context."""

    function_name: str = "stabilizer-train"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:stabilizer-train"
    aws_request_id: str = "req-1"


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    for key, value in {
        **ENV,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "POWERTOOLS_METRICS_NAMESPACE": "Stabilizer",
    }.items():
        monkeypatch.setenv(key, value)
    # Settings and clients are cached per process, as in a warm Lambda: start every test cold.
    factories = (
        train_handler.get_settings,
        monitor_handler.get_settings,
        aws_sagemaker.get_sagemaker,
        aws_s3.get_s3,
        aws_sns.get_sns,
        aws_stepfunctions.get_stepfunctions,
    )
    for factory in factories:
        factory.cache_clear()
    yield
    for factory in factories:
        factory.cache_clear()


@pytest.fixture
def cloud():
    """moto S3 + SNS with the project bucket, the topic and an SQS queue subscribed to it."""
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=ENV["BUCKET"])
        for channel in ("train", "test"):  # a launch first checks that each channel has data
            s3.put_object(Bucket=ENV["BUCKET"], Key=f"data/{channel}/x.npy", Body=b"\x93NUMPY")
        sns = boto3.client("sns", region_name=REGION)
        topic = sns.create_topic(Name="stabilizer")["TopicArn"]
        sqs = boto3.client("sqs", region_name=REGION)
        queue = sqs.create_queue(QueueName="inbox")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
        yield {"s3": s3, "sns": sns, "sqs": sqs, "queue": queue, "topic": topic}


def messages(cloud) -> list[dict[str, Any]]:
    got = cloud["sqs"].receive_message(QueueUrl=cloud["queue"], MaxNumberOfMessages=10)
    return [json.loads(m["Body"]) for m in got.get("Messages", [])]


def stubbed_sagemaker():
    client = boto3.client("sagemaker", region_name=REGION)
    return client, Stubber(client)


# --- train: prepare ----------------------------------------------------------------------------


def test_prepare_from_the_console_gives_the_reference_problem():
    state = train_handler.lambda_handler(load_event("train-prepare-console.json"), Context())
    assert state["run_spec"]["warmup_learning_rate"] == 0.1
    assert state["run_spec"]["add_batch_norm"] == 0
    assert state["next_action"] == "launch_new"
    assert state["wait_seconds"] == 300
    assert state["policy"] == "default"
    load_state(state)  # what the handler returns is a valid state


def test_prepare_with_bad_input_raises_invalid_input_naming_the_field():
    event = {**load_event("train-prepare-console.json"), "input": {"run_spec": {"num_epochs": "3"}}}
    with pytest.raises(InvalidInput, match=r"run_spec\.num_epochs: expected a valid integer"):
        train_handler.lambda_handler(event, Context())


def test_prepare_reads_a_user_jobs_archive_from_s3_and_rejects_a_missing_entry_point(cloud, monkeypatch):
    import io
    import tarfile

    monkeypatch.setenv("LIBRARY_S3_URI", "s3://stabilizer-bucket/library/")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("train.py")
        archive.addfile(info, io.BytesIO(b""))
    cloud["s3"].put_object(Bucket=ENV["BUCKET"], Key="source/jobs/mine/sourcedir.tar.gz", Body=buffer.getvalue())
    job = {"source": f"s3://{ENV['BUCKET']}/source/jobs/mine/sourcedir.tar.gz", "entry_point": "fit.py"}
    event = {**load_event("train-prepare-console.json"), "input": {"job": job}}
    with pytest.raises(InvalidInput, match=r"job\.entry_point: 'fit\.py' is not in s3://"):
        train_handler.lambda_handler(event, Context())
    event["input"]["job"]["entry_point"] = "train.py"
    state = train_handler.lambda_handler(event, Context())
    assert state["job"]["entry_point"] == "train.py"


def test_a_missing_environment_variable_is_named(monkeypatch):
    monkeypatch.delenv("SAGEMAKER_ROLE_ARN")
    with pytest.raises(MisconfiguredEnvironment, match="SAGEMAKER_ROLE_ARN is not set"):
        train_handler.lambda_handler(load_event("train-prepare-console.json"), Context())


def test_an_unknown_action_is_refused():
    with pytest.raises(StateCorrupted, match="action"):
        train_handler.lambda_handler({"action": "train"}, Context())


# --- train: launch -----------------------------------------------------------------------------


def _prepared() -> dict[str, Any]:
    return train_handler.lambda_handler(load_event("train-prepare-original.json"), Context())


def test_launch_sends_exactly_the_built_request_and_notifies(cloud):
    state = _prepared()
    settings = train_handler.get_settings()
    expected = requests.build_create_training_job(load_state(state), settings, 1)
    client, stub = stubbed_sagemaker()
    stub.add_response(
        "create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"}, expected
    )
    with stub:
        new = train_handler.handle(
            {"action": "launch", "state": state}, jobs=aws_sagemaker.TrainingJobs(client), now=T0
        )
    stub.assert_no_pending_responses()
    assert new["next_action"] == "monitor"
    assert new["history"]["latest_job_name"] == expected["TrainingJobName"]
    assert new["attempts"][0]["checkpoint_s3_uri"] == expected["CheckpointConfig"]["S3Uri"]
    [message] = messages(cloud)
    assert message["Subject"] == "Attempt 1 launched: warm-up LR 0.1, LR 0.1, no BN"
    assert message["MessageAttributes"]["event_type"]["Value"] == "launched"
    assert message["MessageAttributes"]["attempt"]["Value"] == "1"


def _existing(request: dict[str, Any], checkpoint_uri: str) -> dict[str, Any]:
    name = request["TrainingJobName"]
    return _full(
        {
            "TrainingJobName": name,
            "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
            "TrainingJobStatus": "InProgress",
            "SecondaryStatus": "Starting",
            "CheckpointConfig": {"S3Uri": checkpoint_uri},
        }
    )


def test_a_retried_launch_adopts_the_job_its_first_try_created(cloud):
    state = _prepared()
    request = requests.build_create_training_job(load_state(state), train_handler.get_settings(), 1)
    client, stub = stubbed_sagemaker()
    stub.add_client_error("create_training_job", "ResourceInUse", "Training job names must be unique")
    stub.add_response(
        "describe_training_job",
        _existing(request, request["CheckpointConfig"]["S3Uri"]),
        {"TrainingJobName": request["TrainingJobName"]},
    )
    with stub:
        new = train_handler.handle(
            {"action": "launch", "state": state}, jobs=aws_sagemaker.TrainingJobs(client), now=T0
        )
    stub.assert_no_pending_responses()
    assert new["history"]["latest_job_name"] == request["TrainingJobName"]
    assert len(messages(cloud)) == 1


def test_a_name_clash_with_a_job_that_is_not_ours_is_rejected(cloud):
    state = _prepared()
    request = requests.build_create_training_job(load_state(state), train_handler.get_settings(), 1)
    client, stub = stubbed_sagemaker()
    stub.add_client_error("create_training_job", "ResourceInUse", "Training job names must be unique")
    stub.add_response(
        "describe_training_job",
        _existing(request, "s3://elsewhere/checkpoints"),
        {"TrainingJobName": request["TrainingJobName"]},
    )
    with stub, pytest.raises(AwsRequestRejected, match="ResourceInUse"):
        train_handler.handle({"action": "launch", "state": state}, jobs=aws_sagemaker.TrainingJobs(client), now=T0)


@pytest.mark.parametrize(
    ("code", "status", "error"),
    [
        ("ResourceLimitExceeded", 400, ServiceQuotaExceeded),
        ("InsufficientCapacityError", 400, CapacityUnavailable),
        ("ThrottlingException", 400, TransientAwsError),
        ("InternalFailure", 500, TransientAwsError),
        ("ValidationException", 400, AwsRequestRejected),
        ("AccessDeniedException", 400, AccessDenied),
    ],
)
def test_client_errors_become_named_errors_the_state_machine_can_catch(cloud, code, status, error):
    state = _prepared()
    client, stub = stubbed_sagemaker()
    stub.add_client_error("create_training_job", code, f"{code} happened", http_status_code=status)
    with stub, pytest.raises(error, match=code):
        train_handler.handle({"action": "launch", "state": state}, jobs=aws_sagemaker.TrainingJobs(client), now=T0)
    assert messages(cloud) == []  # nothing launched, nothing announced


class EndedExecution:
    """DescribeExecution of an execution that was aborted while its launch was under way."""

    def __init__(self, status: str) -> None:
        self.asked: list[str] = []
        self.answer = status

    def status(self, arn: str) -> str:
        self.asked.append(arn)
        return self.answer


def test_a_job_created_after_its_execution_was_aborted_is_stopped_at_once(cloud):
    state = _prepared()
    name = requests.job_name("stabilizer", load_state(state).execution.short_id, 1)
    client, stub = stubbed_sagemaker()
    stub.add_response("create_training_job", {"TrainingJobArn": f"arn:aws:sagemaker:{REGION}:1:training-job/{name}"})
    stub.add_response("stop_training_job", {}, {"TrainingJobName": name})
    executions = EndedExecution("ABORTED")
    with stub:
        train_handler.handle({"action": "launch", "state": state}, jobs=aws_sagemaker.TrainingJobs(client),
                             executions=executions, now=T0)
    stub.assert_no_pending_responses()
    assert executions.asked == [load_state(state).execution.id]
    assert messages(cloud) == []  # nothing announced as launched


def test_a_launch_of_a_running_execution_is_not_stopped(cloud):
    state = _prepared()
    client, stub = stubbed_sagemaker()
    stub.add_response("create_training_job", {"TrainingJobArn": f"arn:aws:sagemaker:{REGION}:1:training-job/x"})
    with stub:
        new = train_handler.handle({"action": "launch", "state": state}, jobs=aws_sagemaker.TrainingJobs(client),
                                   executions=EndedExecution("RUNNING"), now=T0)
    stub.assert_no_pending_responses()
    assert new["next_action"] == "monitor"
    assert [m["MessageAttributes"]["event_type"]["Value"] for m in messages(cloud)] == ["launched"]


def test_a_failure_is_raised_through_the_powertools_decorators_not_returned(cloud, monkeypatch):
    state = _prepared()
    client, stub = stubbed_sagemaker()
    stub.add_client_error("create_training_job", "ResourceLimitExceeded", "quota 0")
    monkeypatch.setattr(aws_sagemaker, "get_sagemaker", lambda: client)
    monkeypatch.setattr(train_handler, "get_sagemaker", lambda: client)
    with stub, pytest.raises(ServiceQuotaExceeded):
        train_handler.lambda_handler({"action": "launch", "state": state}, Context())


# --- monitor: check ----------------------------------------------------------------------------


def _put_findings(cloud, state) -> None:
    checkpoints = state.attempts[-1].checkpoint_s3_uri
    bucket, prefix = s3_uris.split_s3_uri(checkpoints)
    body = load_event("findings-exploding.json")
    cloud["s3"].put_object(Bucket=bucket, Key=f"{prefix}/findings.json", Body=json.dumps(body).encode())
    cloud["s3"].put_object(Bucket=bucket, Key=f"{prefix}/checkpoint-00000000.pt", Body=b"w")
    cloud["s3"].put_object(Bucket=bucket, Key=f"{prefix}/tensors/gradients/0.npy", Body=b"t")


def test_check_reads_the_findings_from_s3_and_relaunches(cloud, settings):
    state = launched(settings)
    _put_findings(cloud, state)
    client, stub = stubbed_sagemaker()
    name = state.history.latest_job_name
    stub.add_response(
        "describe_training_job",
        _full(describe(state, "Failed", failure_reason=RULE_STOP)),
        {"TrainingJobName": name},
    )
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    with stub:
        new = monitor_handler.handle(
            {"action": "check", "state": dump_state(state)}, deps, T0 + timedelta(minutes=5)
        )
    stub.assert_no_pending_responses()
    assert new["next_action"] == "launch_new"
    assert new["run_spec"]["add_batch_norm"] == 1
    assert new["attempts"][0]["finding"]["rule"] == "ExplodingTensor"
    # checkpoint-00000000.pt is before step 2, but batch norm changes the network: start fresh.
    assert new["resume_from"] is None
    [message] = messages(cloud)
    assert message["MessageAttributes"]["event_type"]["Value"] == "relaunching"
    assert "first_nonfinite_layer: layer1.0.conv1.weight" in message["Message"]


def test_check_stops_a_running_job_with_issues_and_its_request_is_exact(cloud, settings):
    state = launched(settings)
    name = state.history.latest_job_name
    client, stub = stubbed_sagemaker()
    statuses = [("VanishingGradient", "InProgress"), ("ExplodingTensor", "IssuesFound")]
    stub.add_response(
        "describe_training_job",
        _full(describe(state, "InProgress", rules=statuses)),
        {"TrainingJobName": name},
    )
    stub.add_response("stop_training_job", {}, {"TrainingJobName": name})
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    with stub:
        new = monitor_handler.handle({"action": "check", "state": dump_state(state)}, deps, T0)
    stub.assert_no_pending_responses()
    assert new["next_action"] == "monitor"
    [message] = messages(cloud)
    assert message["MessageAttributes"]["event_type"]["Value"] == "issue_found"


def test_a_findings_file_caught_half_synced_while_the_job_trains_is_read_again_not_acted_on(cloud, settings):
    """SageMaker syncs the checkpoint directory to S3 while the job runs, with no promise that an object
    is never read mid-update (docs.aws.amazon.com/sagemaker/latest/dg/model-checkpoints-enable.html):
    an unreadable findings.json stops nothing while the job trains; the next check reads it again.
    Once the job has ended it is the finding it always was (test_monitor)."""
    state = launched(settings)
    bucket, prefix = s3_uris.split_s3_uri(state.attempts[-1].checkpoint_s3_uri)
    whole = json.dumps(load_event("findings-exploding.json")).encode()
    cloud["s3"].put_object(Bucket=bucket, Key=f"{prefix}/findings.json", Body=whole[: len(whole) // 2])
    name = state.history.latest_job_name
    client, stub = stubbed_sagemaker()
    stub.add_response("describe_training_job", _full(describe(state, "InProgress")), {"TrainingJobName": name})
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    with stub:  # no StopTrainingJob: the stub refuses any request it was not given
        new = monitor_handler.handle({"action": "check", "state": dump_state(state)}, deps, T0)
    stub.assert_no_pending_responses()
    assert new["next_action"] == "monitor" and new["attempts"][-1].get("finding") is None
    assert messages(cloud) == []


def test_stopping_a_job_that_already_stopped_is_fine(cloud, settings):
    state = launched(settings)
    name = state.history.latest_job_name
    client, stub = stubbed_sagemaker()
    stub.add_response(
        "describe_training_job",
        _full(describe(state, "InProgress", rules=[("ExplodingTensor", "IssuesFound")])),
        {"TrainingJobName": name},
    )
    stub.add_client_error(
        "stop_training_job",
        "ValidationException",
        "The request was rejected because the training job is in status Stopped.",
        expected_params={"TrainingJobName": name},
    )
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    with stub:
        new = monitor_handler.handle({"action": "check", "state": dump_state(state)}, deps, T0)
    assert new["next_action"] == "monitor"


def test_lingering_rule_evaluation_jobs_are_stopped_when_the_attempt_ends(cloud, settings):
    state = launched(settings)
    name = state.history.latest_job_name
    client, stub = stubbed_sagemaker()
    statuses = [
        ("ExplodingTensor", "NoIssuesFound"),
        ("VanishingGradient", "NoIssuesFound"),
        ("LossNotDecreasing", "InProgress"),
        ("Overfit", "IssuesFound"),
    ]
    stub.add_response(
        "describe_training_job",
        _full(describe(state, "Completed", rules=statuses)),
        {"TrainingJobName": name},
    )
    stub.add_response("stop_processing_job", {}, {"ProcessingJobName": f"{name}-lossnotdecreasing"})
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    with stub:
        new = monitor_handler.handle({"action": "check", "state": dump_state(state)}, deps, T0)
    stub.assert_no_pending_responses()
    # Overfit with no step and no checkpoint: nothing to keep, no remedy left.
    assert new["outcome"] == "gave_up"


def test_check_with_a_corrupted_state_raises_state_corrupted(cloud):
    with pytest.raises(StateCorrupted):
        monitor_handler.handle(
            {"action": "check", "state": {"version": 1}},
            monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(None)),
        )


def test_throttled_describe_is_transient(cloud, settings):
    state = launched(settings)
    client, stub = stubbed_sagemaker()
    stub.add_client_error("describe_training_job", "ThrottlingException", "Rate exceeded")
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    with stub, pytest.raises(TransientAwsError, match="DescribeTrainingJob"):
        monitor_handler.handle({"action": "check", "state": dump_state(state)}, deps, T0)


def test_monitor_settings_need_only_the_topic():
    with pytest.raises(MisconfiguredEnvironment, match="TOPIC_ARN is not set"):
        MonitorSettings.from_env({})


# --- monitor: abort ----------------------------------------------------------------------------


def test_abort_stops_the_job_notifies_and_returns_a_failed_state(cloud, settings):
    state = launched(settings)
    name = state.history.latest_job_name
    client, stub = stubbed_sagemaker()
    stub.add_client_error("describe_training_job", "ThrottlingException", "Rate exceeded")
    stub.add_response("stop_training_job", {}, {"TrainingJobName": name})
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    event = {"action": "abort", "state": dump_state(state), "error": load_event("monitor-abort-error.json")}
    with stub:
        new = monitor_handler.handle(event, deps, T0)
    stub.assert_no_pending_responses()
    assert (new["outcome"], new["next_action"]) == ("failed", "end")
    assert new["reason"].startswith("CapacityUnavailable:")
    [message] = messages(cloud)
    assert message["MessageAttributes"]["event_type"]["Value"] == "failed"
    assert message["Subject"].startswith("Failed after 1 job: CapacityUnavailable")


def test_abort_that_cannot_stop_the_job_still_notifies_then_raises(cloud, settings):
    state = launched(settings)
    client, stub = stubbed_sagemaker()
    stub.add_client_error("describe_training_job", "ThrottlingException", "Rate exceeded")
    stub.add_client_error("stop_training_job", "AccessDeniedException", "not allowed")
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    event = {"action": "abort", "state": dump_state(state), "error": {"Error": "States.Timeout"}}
    with stub, pytest.raises(AwsRequestRejected, match="StopTrainingJob"):
        monitor_handler.handle(event, deps, T0)
    assert len(messages(cloud)) == 1


# --- helpers -----------------------------------------------------------------------------------


def _full(response: dict[str, Any]) -> dict[str, Any]:
    """Fill the members DescribeTrainingJob always returns, so Stubber accepts the response."""
    return {
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ModelArtifacts": {"S3ModelArtifacts": "s3://stabilizer-bucket/out/model.tar.gz"},
        "ResourceConfig": {"VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": T0,
        **response,
    }


# --- the whole loop on moto, through the real entry points and default clients ----------------


def running_execution(prepare: dict) -> dict:
    """The launch checks that its execution still runs: start one, as under the state machine."""
    sfn = boto3.client("stepfunctions", region_name=REGION)
    definition = json.dumps({"StartAt": "A", "States": {"A": {"Type": "Pass", "End": True}}})
    machine = sfn.create_state_machine(name="stabilizer", definition=definition,
                                       roleArn="arn:aws:iam::123456789012:role/sfn")["stateMachineArn"]
    sfn.start_execution(stateMachineArn=machine, name=prepare["execution"]["name"])
    return prepare


def test_prepare_launch_check_through_lambda_handler_on_moto(cloud):
    """Default lazily-created clients, Powertools decorators, moto's SageMaker: the shape of a run."""
    prepare = running_execution(load_event("train-prepare-console.json"))
    state = train_handler.lambda_handler(prepare, Context())
    state = train_handler.lambda_handler({"action": "launch", "state": state}, Context())
    name = state["history"]["latest_job_name"]
    described = boto3.client("sagemaker", region_name=REGION).describe_training_job(TrainingJobName=name)
    assert described["CheckpointConfig"]["S3Uri"] == state["attempts"][0]["checkpoint_s3_uri"]
    # moto's training jobs complete at once and report no rule statuses; the job's summary is
    # what the sentinel leaves beside the checkpoints.
    bucket, prefix = s3_uris.split_s3_uri(state["attempts"][0]["checkpoint_s3_uri"])
    document = {"version": 2, "job_action": "stop", "findings": [], "summary": summary()}
    cloud["s3"].put_object(Bucket=bucket, Key=f"{prefix}/findings.json", Body=json.dumps(document).encode())
    state = monitor_handler.lambda_handler({"action": "check", "state": state}, Context())
    assert state["job_status"] == "Completed"
    assert (state["next_action"], state["outcome"]) == ("end", "succeeded")
    assert state["attempts"][0]["watched"]["steps_observed"] == 36
    events = sorted(m["MessageAttributes"]["event_type"]["Value"] for m in messages(cloud))
    assert events == ["completed", "launched"]


def test_a_job_that_left_no_summary_ends_unwatched_through_the_handler(cloud):
    state = train_handler.lambda_handler(running_execution(load_event("train-prepare-console.json")), Context())
    state = train_handler.lambda_handler({"action": "launch", "state": state}, Context())
    state = monitor_handler.lambda_handler({"action": "check", "state": state}, Context())
    assert (state["next_action"], state["outcome"]) == ("end", "unwatched")
    assert "the script never called watch() and the launcher never attached" in state["reason"]
    events = sorted(m["MessageAttributes"]["event_type"]["Value"] for m in messages(cloud))
    assert events == ["launched", "unwatched"]


def test_abort_with_an_unreadable_state_still_stops_the_job_and_notifies(cloud):
    client, stub = stubbed_sagemaker()
    stub.add_response("stop_training_job", {}, {"TrainingJobName": "stabilizer-0a1b2c3d-4"})
    deps = monitor_handler.Collaborators(jobs=aws_sagemaker.TrainingJobs(client))
    event = {
        "action": "abort",
        "state": {"execution": {"name": "run-9"}, "history": {"latest_job_name": "stabilizer-0a1b2c3d-4"}},
        "error": {"Error": "StateCorrupted", "Cause": "run_spec: missing"},
    }
    with stub, pytest.raises(StateCorrupted):
        monitor_handler.handle(event, deps, T0)
    stub.assert_no_pending_responses()
    [message] = messages(cloud)
    assert message["Subject"] == "Failed: StateCorrupted; state payload unreadable"
    assert message["MessageAttributes"]["execution"]["Value"] == "run-9"
