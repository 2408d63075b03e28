"""The client's AWS path, at the AWS edge: exact Step Functions requests with botocore's Stubber,
S3 (findings, tensor stores, data channels) with moto.

What a notebook on AWS relies on: the execution it starts gets the input it was given; describing
a running execution finds the newest state payload even when the history spans several pages; a
finished one is read from its output; findings and captured tensors are read from the attempt's
place in the bucket (docs/contracts.md, S3 layout) through the same Trial API as locally.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws

from stabilizer.client import channels
from stabilizer.client.aws_client import AwsClient
from stabilizer.reports import executions, tensors

REGION = "us-east-1"
BUCKET = "stabilizer-bucket"
MACHINE = f"arn:aws:states:{REGION}:123456789012:stateMachine:stabilizer"
TOPIC = f"arn:aws:sns:{REGION}:123456789012:stabilizer"
NAME = "exec-1"
ARN = f"arn:aws:states:{REGION}:123456789012:execution:stabilizer:{NAME}"
WHEN = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def attempt(number: int, **extra: Any) -> dict[str, Any]:
    return {
        "number": number,
        "job_name": f"stabilizer-abcd1234-{number}",
        "run_spec": {"warmup_learning_rate": 0.1, "learning_rate": 0.1, "add_batch_norm": number - 1},
        "status": "InProgress",
        **extra,
    }


def state(*attempts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"version": 1, "policy": "default", "attempts": list(attempts), **extra}


@pytest.fixture
def account(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in {
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        yield s3


def stack_outputs_client(stack_name: str = "Stabilizer") -> Any:
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    stubber = Stubber(cloudformation)
    stubber.add_response(
        "describe_stacks",
        {
            "Stacks": [
                {
                    "StackName": stack_name,
                    "CreationTime": WHEN,
                    "StackStatus": "CREATE_COMPLETE",
                    "Outputs": [
                        {"OutputKey": "StateMachineArn", "OutputValue": MACHINE},
                        {"OutputKey": "BucketName", "OutputValue": BUCKET},
                        {"OutputKey": "TopicArn", "OutputValue": TOPIC},
                        {"OutputKey": "ConsoleLink", "OutputValue": "https://console.aws.amazon.com/states"},
                    ],
                }
            ]
        },
        {"StackName": stack_name},
    )
    stubber.activate()
    return cloudformation


@pytest.fixture
def client(account: Any) -> AwsClient:
    return AwsClient("Stabilizer", region_name=REGION, cloudformation=stack_outputs_client())


@pytest.fixture
def sfn(client: AwsClient) -> Iterator[Stubber]:
    """Step Functions as the client sees it, every request checked; nothing left unanswered."""
    client.sfn = boto3.client("stepfunctions", region_name=REGION)
    with Stubber(client.sfn) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def described(status: str, **extra: Any) -> dict[str, Any]:
    return {
        "executionArn": ARN,
        "stateMachineArn": MACHINE,
        "name": NAME,
        "status": status,
        "startDate": WHEN,
        "input": json.dumps({"policy": "original"}),
        **extra,
    }


def exited(event_id: int, name: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "timestamp": WHEN,
        "type": "TaskStateExited",
        "id": event_id,
        "stateExitedEventDetails": {"name": name, "output": json.dumps({"state": payload})},
    }


# ------------------------------------------------------------------------------------------ start
def test_start_sends_the_input_as_json_to_the_stacks_state_machine(client: AwsClient, sfn: Stubber):
    given = {"policy": "original", "run_spec": {"capture": {"losses": {"save_interval": 1}}}}
    sfn.add_response(
        "start_execution",
        {"executionArn": ARN, "startDate": WHEN},
        {"stateMachineArn": MACHINE, "name": NAME, "input": json.dumps(given)},
    )
    assert client.start(given, name=NAME) == ARN


def test_start_with_no_input_sends_an_empty_object_the_reference_problem(client: AwsClient, sfn: Stubber):
    sfn.add_response(
        "start_execution",
        {"executionArn": ARN, "startDate": WHEN},
        {"stateMachineArn": MACHINE, "name": NAME, "input": "{}"},
    )
    assert client.start(None, name=NAME) == ARN


def test_start_without_a_name_gives_each_execution_its_own_valid_name(client: AwsClient):
    names: list[str] = []
    client.sfn = boto3.client("stepfunctions", region_name=REGION)
    client.sfn.meta.events.register(
        "before-parameter-build.sfn.StartExecution", lambda params, **_: names.append(params["name"])
    )
    with Stubber(client.sfn) as stubber:
        for _ in range(2):
            stubber.add_response("start_execution", {"executionArn": ARN, "startDate": WHEN})
        client.start({})
        client.start({})
    assert names[0] != names[1]
    for name in names:
        # Step Functions' rule for execution names: 1..80 of letters, digits, - and _.
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,80}", name), name


# ------------------------------------------------------------------------------- describe, history
def test_describe_a_running_execution_reads_the_newest_state_across_history_pages(client: AwsClient, sfn: Stubber):
    sfn.add_response("describe_execution", described("RUNNING"), {"executionArn": ARN})
    sfn.add_response(
        "get_execution_history",
        {"events": [exited(3, "LaunchTrainingJob", state(attempt(1)))], "nextToken": "page-2"},
        {"executionArn": ARN, "maxResults": 1000},
    )
    newest = state(attempt(1, status="Stopped", finding={"rule": "ExplodingTensor", "step": 3}), attempt(2))
    sfn.add_response(
        "get_execution_history",
        {"events": [exited(9, "LaunchTrainingJob", newest)]},
        {"executionArn": ARN, "maxResults": 1000, "nextToken": "page-2"},
    )
    view = client.describe(ARN)

    assert (view.name, view.status, view.done) == (NAME, "RUNNING", False)
    assert view.input == {"policy": "original"}
    assert [a["number"] for a in view.attempts] == [1, 2]
    assert view.attempts[0]["finding"]["rule"] == "ExplodingTensor"


def test_describe_a_finished_execution_reads_its_output_and_not_the_history(client: AwsClient, sfn: Stubber):
    final = state(attempt(1, status="Completed"), outcome="succeeded", reason="attempt 1 completed")
    sfn.add_response(
        "describe_execution",
        described("SUCCEEDED", output=json.dumps({"state": final}), stopDate=WHEN),
        {"executionArn": ARN},
    )
    view = client.describe(ARN)  # a history call would find no stubbed response and fail

    assert view.done
    assert view.state["outcome"] == "succeeded"
    assert executions.policy_summary(view)["outcome"] == "succeeded"


def test_describe_a_failed_execution_keeps_its_error_cause_and_last_state(client: AwsClient, sfn: Stubber):
    sfn.add_response(
        "describe_execution",
        described("FAILED", error="TrainingNotRecovered", cause="no remedy left (outcome gave_up)", stopDate=WHEN),
        {"executionArn": ARN},
    )
    last = state(attempt(1, status="Failed"), outcome="gave_up", reason="no remedy left")
    sfn.add_response(
        "get_execution_history",
        {"events": [exited(5, "CheckJobAndRules", last)]},
        {"executionArn": ARN, "maxResults": 1000},
    )
    view = client.describe(ARN)

    assert (view.status, view.error, view.cause) == (
        "FAILED",
        "TrainingNotRecovered",
        "no remedy left (outcome gave_up)",
    )
    assert view.state["outcome"] == "gave_up"
    assert "outcome: gave_up" in executions.status_text(view)


def test_history_returns_every_event_of_every_page(client: AwsClient, sfn: Stubber):
    first = [{"timestamp": WHEN, "type": "ExecutionStarted", "id": 1}]
    second = [{"timestamp": WHEN, "type": "ExecutionSucceeded", "id": 2}]
    sfn.add_response(
        "get_execution_history", {"events": first, "nextToken": "t"}, {"executionArn": ARN, "maxResults": 1000}
    )
    sfn.add_response(
        "get_execution_history", {"events": second}, {"executionArn": ARN, "maxResults": 1000, "nextToken": "t"}
    )
    assert [e["type"] for e in client.history(ARN)] == ["ExecutionStarted", "ExecutionSucceeded"]


def test_a_throttled_history_read_is_raised_not_swallowed(client: AwsClient, sfn: Stubber):
    sfn.add_response("describe_execution", described("RUNNING"), {"executionArn": ARN})
    sfn.add_client_error("get_execution_history", service_error_code="ThrottlingException", http_status_code=400)
    with pytest.raises(ClientError, match="ThrottlingException"):
        client.describe(ARN)


# --------------------------------------------------------------------------------------- findings
FINDINGS = {
    "version": 1,
    "job_action": "stop",
    "findings": [
        {
            "rule": "ExplodingTensor",
            "step": 2,
            "tensor": "gradients/stem.weight",
            "value": "nan",
            "evidence": {"first_nonfinite_layer": "stem.weight"},
        }
    ],
}


def test_findings_are_read_from_the_attempts_checkpoint_prefix(client: AwsClient, account: Any):
    account.put_object(
        Bucket=BUCKET, Key=f"executions/{NAME}/attempt-2/checkpoints/findings.json", Body=json.dumps(FINDINGS)
    )
    assert client.findings(ARN, 2) == FINDINGS
    assert client.findings(ARN, 1) is None  # no rule fired in attempt 1: no file


def test_findings_that_cannot_be_read_raise(client: AwsClient):
    with Stubber(client.s3) as s3:
        s3.add_client_error(
            "get_object",
            service_error_code="AccessDenied",
            http_status_code=403,
            expected_params={"Bucket": BUCKET, "Key": f"executions/{NAME}/attempt-1/checkpoints/findings.json"},
        )
        with pytest.raises(ClientError, match="AccessDenied"):
            client.findings(ARN, 1)


# ---------------------------------------------------------------------------------------- tensors
LAYERS = ("stem.weight", "blocks.0.conv1.weight", "head.weight")


def write_store(directory: Path) -> dict[int, dict[str, np.ndarray]]:
    """A store as a job writes it: loss and gradients at steps 0..2, non-finite from the middle layer at 2."""
    from stabilizer_sentinel.capture.store import StepRecord, StoreWriter

    rng = np.random.default_rng(0)
    writer = StoreWriter(directory)
    writer.write_collections({"losses": {"save_interval": 1}, "gradients": {"save_interval": 1}})
    written: dict[int, dict[str, np.ndarray]] = {}
    for step in range(3):
        grads = {f"gradients/{layer}": rng.normal(size=(4, 3)).astype(np.float32) * 10**step for layer in LAYERS}
        if step == 2:
            grads["gradients/blocks.0.conv1.weight"][0, 0] = np.inf
            grads["gradients/head.weight"][1, 1] = np.nan
        loss = np.array(2.3 * 10**step, dtype=np.float32)
        tensors = {"losses/loss": (("losses",), loss)} | {k: (("gradients",), v) for k, v in grads.items()}
        writer.write_step(StepRecord(step=step, mode="TRAIN", tensors=tensors))
        written[step] = {"losses/loss": loss, **grads}
    writer.write_end(2, "rule_stop")
    return written


def upload_directory(s3: Any, directory: Path, uri: str) -> None:
    bucket, prefix = uri.removeprefix("s3://").split("/", 1)
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            s3.put_object(Bucket=bucket, Key=prefix + path.relative_to(directory).as_posix(), Body=path.read_bytes())


def test_tensors_are_read_from_s3_through_the_trial_api(client: AwsClient, account: Any, tmp_path: Path):
    written = write_store(tmp_path / "tensors")
    store = client.tensor_store(ARN, 1)
    assert store == f"s3://{BUCKET}/executions/{NAME}/attempt-1/checkpoints/tensors/"
    upload_directory(account, tmp_path / "tensors", store)

    trial = client.open_tensor_store(ARN, 1)

    assert trial.loaded_all_steps
    assert trial.steps(mode="TRAIN") == [0, 1, 2]
    assert trial.tensor_names(collection="gradients") == [f"gradients/{layer}" for layer in LAYERS]
    np.testing.assert_array_equal(
        trial.tensor("gradients/stem.weight").value(1, mode="TRAIN"), written[1]["gradients/stem.weight"]
    )

    curves = tensors.curves(trial)
    assert curves.loss_steps == [0, 1, 2]
    assert curves.loss == pytest.approx([2.3, 23.0, 230.0], rel=1e-6)
    expected = [
        math.sqrt(sum(float(np.sum(written[s][f"gradients/{layer}"].astype(np.float64) ** 2)) for layer in LAYERS))
        for s in (0, 1)
    ]
    assert curves.grad_norm[:2] == pytest.approx(expected, rel=1e-9)
    assert not math.isfinite(curves.grad_norm[2])

    nonfinite = tensors.first_nonfinite(trial)
    assert nonfinite is not None
    assert (nonfinite.step, nonfinite.layers, nonfinite.total_layers) == (
        2,
        ["blocks.0.conv1.weight", "head.weight"],
        3,
    )
    norms = tensors.layer_norms(trial, 1)
    assert list(norms) == list(LAYERS)
    assert norms["stem.weight"] == pytest.approx(float(np.linalg.norm(written[1]["gradients/stem.weight"])), rel=1e-6)


def test_a_store_still_being_synced_shows_only_complete_steps(client: AwsClient, account: Any, tmp_path: Path):
    write_store(tmp_path / "tensors")
    (tmp_path / "tensors" / "training_end.json").unlink()
    (tmp_path / "tensors" / "steps" / "000000000002_TRAIN.npz").unlink()  # its index entry arrived first
    upload_directory(account, tmp_path / "tensors", client.tensor_store(ARN, 1))

    trial = client.open_tensor_store(ARN, 1)

    assert not trial.loaded_all_steps
    assert trial.steps(mode="TRAIN") == [0, 1]
    assert tensors.first_nonfinite(trial) is None


# ------------------------------------------------------------------------------------ data upload
def tiny_channels(directory: Path) -> Path:
    for channel in ("train", "test"):
        (directory / channel).mkdir(parents=True)
        np.save(directory / channel / "x.npy", np.zeros((2, 32, 32, 3), dtype=np.uint8))
        np.save(directory / channel / "y.npy", np.arange(2))
    return directory


def test_data_channels_go_to_the_stacks_default_channel_prefixes_once(
    client: AwsClient, account: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data = tiny_channels(tmp_path / "cifar10")
    uris = channels.upload_channels(client, data)

    assert uris == {"train": f"s3://{BUCKET}/data/train/", "test": f"s3://{BUCKET}/data/test/"}
    body = account.get_object(Bucket=BUCKET, Key="data/test/y.npy")["Body"].read()
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), np.arange(2))

    sent: list[str] = []
    monkeypatch.setattr(client.s3, "upload_file", lambda path, bucket, key: sent.append(key))
    channels.upload_channels(client, data)
    assert sent == []  # already there with the same size
    np.save(data / "train" / "y.npy", np.arange(5))
    channels.upload_channels(client, data)
    assert sent == ["data/train/y.npy"]


def test_a_missing_channel_file_is_named(client: AwsClient, tmp_path: Path):
    data = tiny_channels(tmp_path / "cifar10")
    (data / "test" / "x.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"test channel: expected x\.npy"):
        channels.upload_channels(client, data)
