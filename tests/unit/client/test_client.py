"""The notebook client: the AWS side against moto (stack outputs, executions, S3 layout, the SNS
mailbox) and the local side against the local engine on the stand-in project."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from stabilizer.client.aws_client import AwsClient
from stabilizer.client.local_client import LocalClient
from stabilizer.local.engine.deployment import Project
from stabilizer.local.engine.engine import LocalEngine
from tests.unit.local.support import FIXTURES, aws_env_fixture  # noqa: F401 fixture

ROLE = "arn:aws:iam::123456789012:role/states"

# A definition that publishes once itself and ends with a state payload, like the project's.
DEFINITION = {
    "StartAt": "Publish",
    "States": {
        "Publish": {
            "Type": "Task",
            "Resource": "arn:aws:states:::sns:publish",
            "Parameters": {
                "TopicArn": "TOPIC",
                "Subject": "stabilizer: execution failed",
                "Message": {"event": "execution_failed", "execution.$": "$$.Execution.Id"},
            },
            "ResultPath": None,
            "Next": "Done",
        },
        "Done": {
            "Type": "Pass",
            "Result": {"attempts": [{"number": 1, "job_name": "stabilizer-abcd1234-1"}], "policy": "default"},
            "ResultPath": "$.state",
            "OutputPath": "$.state",
            "End": True,
        },
    },
}


@pytest.fixture
def stack(aws_env: None) -> Any:
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="stabilizer-bucket")
        topic = boto3.client("sns").create_topic(Name="stabilizer-topic")["TopicArn"]
        definition = json.dumps(DEFINITION).replace("TOPIC", topic)
        machine = boto3.client("stepfunctions").create_state_machine(
            name="stabilizer", definition=definition, roleArn=ROLE
        )["stateMachineArn"]
        outputs = {"StateMachineArn": machine, "BucketName": "stabilizer-bucket", "TopicArn": topic}
        yield {"machine": machine, "topic": topic, "s3": s3, "outputs": outputs}


def cloudformation(stack_name: str, outputs: dict[str, str]) -> Any:
    """A CloudFormation client that answers DescribeStacks for one stack, exactly as asked."""
    client = boto3.client("cloudformation", region_name="us-east-1")
    stubber = Stubber(client)
    stubber.add_response(
        "describe_stacks",
        {
            "Stacks": [
                {
                    "StackName": stack_name,
                    "CreationTime": "2026-01-01T00:00:00Z",
                    "StackStatus": "CREATE_COMPLETE",
                    "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()],
                }
            ]
        },
        {"StackName": stack_name},
    )
    stubber.activate()
    return client


def aws_client(stack: Any) -> AwsClient:
    return AwsClient(
        "Stabilizer", region_name="us-east-1", cloudformation=cloudformation("Stabilizer", stack["outputs"])
    )


def test_aws_client_reads_the_stack_outputs(stack: Any):
    client = aws_client(stack)
    assert client.state_machine_arn == stack["machine"]
    assert client.bucket == "stabilizer-bucket"
    assert client.topic_arn == stack["topic"]


def test_aws_client_rejects_a_stack_without_the_outputs(stack: Any):
    with pytest.raises(LookupError, match="StateMachineArn, BucketName"):
        AwsClient("Other", cloudformation=cloudformation("Other", {"TopicArn": stack["topic"]}))


def test_aws_client_starts_describes_and_reads_the_state_and_notifications(stack: Any):
    client = aws_client(stack)
    client.subscribe_mailbox()
    arn = client.start({"policy": "original"}, name="exec-1")
    view = client.wait(arn, timeout=30, poll_seconds=0.1)

    assert view.status == "SUCCEEDED"
    assert view.input == {"policy": "original"}
    assert [a["job_name"] for a in view.attempts] == ["stabilizer-abcd1234-1"]
    assert any(e["type"] == "ExecutionSucceeded" for e in client.history(arn))

    sns = boto3.client("sns")
    sns.publish(
        TopicArn=stack["topic"],
        Subject="Relaunching",
        Message="attempt 1 exploded",
        MessageAttributes={"execution": {"DataType": "String", "StringValue": "exec-1"}},
    )
    sns.publish(
        TopicArn=stack["topic"],
        Subject="Someone else's",
        Message="-",
        MessageAttributes={"execution": {"DataType": "String", "StringValue": "exec-2"}},
    )
    notes = client.notifications(arn)
    subjects = [n.subject for n in notes]
    assert "Relaunching" in subjects
    assert "Someone else's" not in subjects
    # The state machine's own publish reached the mailbox too (it names the execution): listed once.
    assert subjects.count("stabilizer: execution failed") == 1
    failed = next(n for n in notes if n.subject == "stabilizer: execution failed")
    assert json.loads(failed.message)["execution"] == arn


def test_aws_client_without_a_mailbox_still_lists_what_the_state_machine_published(stack: Any):
    client = aws_client(stack)
    arn = client.start({}, name="exec-3")
    client.wait(arn, timeout=30, poll_seconds=0.1)
    notes = client.notifications(arn)
    assert [(n.subject, n.attributes["source"]) for n in notes] == [("stabilizer: execution failed", "state machine")]
    assert json.loads(notes[0].message) == {"event": "execution_failed", "execution": arn}


def test_aws_client_reads_findings_and_names_the_tensor_store_by_the_s3_layout(stack: Any):
    client = aws_client(stack)
    arn = client.start({}, name="exec-2")
    findings = {"version": 1, "job_action": "stop", "findings": [{"rule": "ExplodingTensor", "step": 2}]}
    stack["s3"].put_object(
        Bucket="stabilizer-bucket",
        Key="executions/exec-2/attempt-1/checkpoints/findings.json",
        Body=json.dumps(findings).encode(),
    )
    assert client.findings(arn, 1) == findings
    assert client.findings(arn, 2) is None
    assert client.tensor_store(arn, 3) == "s3://stabilizer-bucket/executions/exec-2/attempt-3/checkpoints/tensors/"


@pytest.mark.slow
def test_local_client_drives_the_local_engine(tmp_path: Path):
    root = FIXTURES / "project"
    project = Project(root, root / "statemachine" / "loop.asl.json", root / "lambdas", FIXTURES / "fake_model")
    for channel in ("train", "test"):
        (tmp_path / "data" / channel).mkdir(parents=True)
        np.save(tmp_path / "data" / channel / "x.npy", np.zeros((4, 32, 32, 3), dtype=np.float32))
        np.save(tmp_path / "data" / channel / "y.npy", np.arange(4))
    with LocalEngine(tmp_path / "run", tmp_path / "data", project=project) as engine:
        client = LocalClient(engine)
        arn = client.start({"poll_seconds": 1}, name="exec-local")
        view = client.wait(arn, timeout=120)
        notes = client.notifications(arn)
        findings = client.findings(arn, 1)
        store = client.tensor_store(arn, 2)
        record = client.record(arn)
        second_job = engine.sagemaker.jobs[record.attempts[1].job_name]

    assert view.status == "SUCCEEDED"
    assert [a["job_name"] for a in view.attempts] == [a.job_name for a in record.attempts]
    assert [n.body["decision"] for n in notes] == ["relaunch", "end"]
    assert findings["findings"][0]["rule"] == "ExplodingTensor"
    assert store == str(second_job.checkpoint_dir / "tensors")
    assert Path(store).parent.is_dir()
    assert len(record.attempts[1].metrics) == 3


def test_aws_client_opens_an_attempts_tensor_store_on_s3_with_the_trial_api(stack: Any, tmp_path: Path):
    from stabilizer_sentinel.capture import store

    writer = store.StoreWriter(tmp_path / "tensors")
    writer.write_collections({"gradients": {"save_interval": 1}})
    gradient = np.full((2, 2), 0.5, dtype=np.float32)
    writer.write_step(store.StepRecord(step=3, mode="TRAIN", tensors={"gradients/w": (("gradients",), gradient)}))
    writer.write_end(3, "completed")
    client = aws_client(stack)
    arn = client.start({}, name="exec-4")
    prefix = "executions/exec-4/attempt-1/checkpoints/tensors"
    for path in (tmp_path / "tensors").rglob("*"):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(tmp_path / 'tensors').as_posix()}"
            stack["s3"].put_object(Bucket="stabilizer-bucket", Key=key, Body=path.read_bytes())

    trial = client.open_tensor_store(arn, 1)
    assert "gradients/w" in trial.tensor_names()
    assert trial.tensor("gradients/w").value(3).tolist() == gradient.tolist()
