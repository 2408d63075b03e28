"""The local SageMaker emulator, driven through a real boto3 SageMaker client under mock_aws.

Each job is a real subprocess of a small stand-in training script; the assertions are on what
a caller of the SageMaker API sees: statuses, secondary statuses, failure reasons, S3 uploads.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from stabilizer.local.emulator.rule_jobs import rule_evaluator_factory
from stabilizer.local.emulator.sagemaker import LocalSageMaker
from tests.unit.local.support import aws_env_fixture, s3_fixture, staged_fixture  # noqa: F401 fixtures

BUCKET = "stabilizer-test"  # the bucket of tests/unit/local/support.py
RULES_IMAGE = "503895931360.dkr.ecr.us-east-1.amazonaws.com/sagemaker-debugger-rules:latest"
ROLE = "arn:aws:iam::123456789012:role/stabilizer-sagemaker"


def request(staged: dict[str, str], name: str, **hyperparameters: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "AlgorithmSpecification": {
            "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5-cpu-py311",
            "TrainingInputMode": "File",
            "MetricDefinitions": [{"Name": "loss", "Regex": r"\bloss=([0-9.]+)"}],
        },
        "HyperParameters": {
            "sagemaker_program": json.dumps("train.py"),
            "sagemaker_submit_directory": json.dumps(staged["source"]),
            **hyperparameters,
        },
        "RoleArn": ROLE,
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": staged["train"]}},
            }
        ],
        "OutputDataConfig": {"S3OutputPath": staged["output"]},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 60},
        "CheckpointConfig": {"S3Uri": staged["checkpoints"]},
    }


@pytest.fixture
def sagemaker(tmp_path: Path, s3: Any) -> Any:
    emulator = LocalSageMaker(tmp_path / "jobs", s3, stop_grace_seconds=1)  # a job left running is killed 1 s after
    with emulator.installed():
        yield boto3.client("sagemaker", region_name="us-east-1"), emulator
    emulator.stop_all()
    emulator.wait_all(timeout=10)


def wait_for(client: Any, name: str, statuses: set[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described = client.describe_training_job(TrainingJobName=name)
        if described["TrainingJobStatus"] in statuses:
            return described
        time.sleep(0.1)
    raise AssertionError(f"{name} did not reach {statuses}: {described['TrainingJobStatus']}")


def keys(s3: Any, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


@pytest.mark.slow
def test_completed_job_runs_the_script_under_the_container_contract(sagemaker: Any, staged: Any, s3: Any):
    client, emulator = sagemaker
    client.create_training_job(**request(staged, "job-ok", steps="3", rules='[{"name": "ExplodingTensor"}]'))
    described = wait_for(client, "job-ok", {"Completed", "Failed", "Stopped"})

    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    assert described["SecondaryStatus"] == "Completed"
    assert [t["Status"] for t in described["SecondaryStatusTransitions"]] == [
        "Starting",
        "Downloading",
        "Training",
        "Uploading",
        "Completed",
    ]
    log = emulator.jobs["job-ok"].log_path.read_text()
    assert "channel files: ['x.npy', 'y.npy']" in log
    # The toolkit passes decoded values: a JSON list reaches argv as its Python repr, SM_HPS as JSON.
    assert "\"--rules\", \"[{'name': 'ExplodingTensor'}]\"" in log
    assert '"rules": [{"name": "ExplodingTensor"}]' in log
    assert "sagemaker_program" not in log.split("argv:")[1]
    assert described["ModelArtifacts"]["S3ModelArtifacts"] == f"s3://{BUCKET}/output/job-ok/output/model.tar.gz"
    assert "output/job-ok/output/model.tar.gz" in keys(s3, "output/")
    checkpoints = keys(s3, "executions/e1/attempt-1/checkpoints/")
    assert sorted(Path(k).name for k in checkpoints) == [f"checkpoint-{i}.pt" for i in range(3)]
    assert described["FinalMetricDataList"][0]["MetricName"] == "loss"
    assert described["FinalMetricDataList"][0]["Value"] == pytest.approx(2.3 / 3, abs=1e-3)
    assert described["TrainingTimeInSeconds"] >= 1


@pytest.mark.slow
def test_rule_stop_fails_with_the_failure_file_and_findings_already_in_s3(sagemaker: Any, staged: Any, s3: Any):
    client, _ = sagemaker
    client.create_training_job(**request(staged, "job-rulestop", mode="rulestop"))
    described = wait_for(client, "job-rulestop", {"Completed", "Failed", "Stopped"})

    assert described["TrainingJobStatus"] == "Failed"
    assert described["FailureReason"] == "AlgorithmError: RuleStop: ExplodingTensor fired at step 1"
    body = s3.get_object(Bucket=BUCKET, Key="executions/e1/attempt-1/checkpoints/findings.json")["Body"]
    assert json.loads(body.read())["findings"][0]["rule"] == "ExplodingTensor"


@pytest.mark.slow
def test_crash_reports_the_reason_written_by_the_script(sagemaker: Any, staged: Any):
    client, _ = sagemaker
    client.create_training_job(**request(staged, "job-crash", mode="fail"))
    described = wait_for(client, "job-crash", {"Completed", "Failed", "Stopped"})
    assert described["TrainingJobStatus"] == "Failed"
    assert described["FailureReason"] == "AlgorithmError: ValueError: the data is bad"


@pytest.mark.slow
def test_findings_reach_s3_on_the_next_describe_while_the_job_runs(sagemaker: Any, staged: Any, s3: Any):
    client, emulator = sagemaker
    client.create_training_job(**request(staged, "job-live", mode="hang", step_seconds="0.05"))
    wait_for(client, "job-live", {"InProgress"})
    job = emulator.jobs["job-live"]
    deadline = time.monotonic() + 20
    while not job.checkpoint_dir.joinpath("checkpoint-1.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (job.checkpoint_dir / "findings.json").write_text('{"version": 1, "findings": []}')
    client.describe_training_job(TrainingJobName="job-live")
    assert "executions/e1/attempt-1/checkpoints/findings.json" in keys(s3, "executions/")


def _wait_for_line(job: Any, text: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while text not in (job.log_path.read_text() if job.log_path.exists() else ""):
        assert time.monotonic() < deadline, f"{job.name}: no {text!r} in its log"
        time.sleep(0.05)


@pytest.mark.slow
def test_stop_sends_the_script_nothing_and_kills_it_after_the_grace_period(tmp_path: Path, staged: Any, s3: Any):
    # SageMaker's framework containers do not forward StopTrainingJob's SIGTERM to the script:
    # it trains on, unaware, until the container is killed at the end of the window. The stand-in
    # script would checkpoint and exit 0 on SIGTERM; here it must never get the chance.
    emulator = LocalSageMaker(tmp_path / "jobs", s3, stop_grace_seconds=1.5)
    with emulator.installed():
        client = boto3.client("sagemaker", region_name="us-east-1")
        client.create_training_job(**request(staged, "job-stop", mode="hang"))
        job = emulator.jobs["job-stop"]
        _wait_for_line(job, "step=2 ")
        asked = time.monotonic()
        client.stop_training_job(TrainingJobName="job-stop")
        assert client.describe_training_job(TrainingJobName="job-stop")["TrainingJobStatus"] == "Stopping"
        described = wait_for(client, "job-stop", {"Stopped", "Failed", "Completed"}, timeout=15)
        waited = time.monotonic() - asked
        with pytest.raises(ClientError) as error:
            client.stop_training_job(TrainingJobName="job-stop")
    assert "in status Stopped" in str(error.value)
    assert described["TrainingJobStatus"] == "Stopped"
    assert described["SecondaryStatus"] == "Stopped"
    assert job.exit_code == -9  # SIGKILL
    assert waited >= 1.5
    log = job.log_path.read_text()
    assert "stopped at step=" not in log  # no final checkpoint at a stop
    last_logged = int(log.rsplit("step=", 1)[1].split()[0])
    assert last_logged > 2  # it kept training while Stopping


@pytest.mark.slow
def test_local_interrupt_asks_the_script_to_end_without_sagemakers_grace(tmp_path: Path, staged: Any, s3: Any):
    emulator = LocalSageMaker(tmp_path / "jobs", s3)  # SageMaker's 120 s
    with emulator.installed():
        client = boto3.client("sagemaker", region_name="us-east-1")
        client.create_training_job(**request(staged, "job-ctrl-c", mode="hang"))
        job = emulator.jobs["job-ctrl-c"]
        _wait_for_line(job, "step=1 ")
        asked = time.monotonic()
        [interrupted] = emulator.interrupt_all(grace_seconds=5)
        assert job.done.wait(15)
        waited = time.monotonic() - asked
    assert interrupted is job
    assert job.status == "Stopped"
    # This machine's own Ctrl-C (not StopTrainingJob) reaches the script, which checkpoints and exits.
    assert "stopped at step=" in job.log_path.read_text()
    assert job.exit_code == 0
    assert waited < 5


@pytest.mark.slow
def test_checkpoint_deletions_are_mirrored_to_s3(sagemaker: Any, staged: Any, s3: Any):
    client, emulator = sagemaker
    client.create_training_job(**request(staged, "job-rotate", mode="rotate", steps="6", step_seconds="0.2"))
    job = emulator.jobs["job-rotate"]
    seen: set[str] = set()
    while client.describe_training_job(TrainingJobName="job-rotate")["TrainingJobStatus"] == "InProgress":
        seen |= set(keys(s3, "executions/e1/attempt-1/checkpoints/"))
        time.sleep(0.05)
    wait_for(client, "job-rotate", {"Completed", "Failed", "Stopped"})
    final = set(keys(s3, "executions/e1/attempt-1/checkpoints/"))
    local = {f"executions/e1/attempt-1/checkpoints/{p.name}" for p in job.checkpoint_dir.iterdir() if p.is_file()}
    assert final == local == {
        "executions/e1/attempt-1/checkpoints/checkpoint-4.pt", "executions/e1/attempt-1/checkpoints/checkpoint-5.pt",
    }
    # Older checkpoints did reach S3 while they existed, and were deleted there after the job deleted them.
    assert len({k for k in seen if k.endswith(".pt")}) > 2
    assert not any(k.endswith(".partial") for k in seen | final)


def test_a_job_that_fails_before_training_never_starts_its_script(sagemaker: Any, staged: Any):
    client, emulator = sagemaker
    missing = request(staged, "job-noprogram")
    missing["HyperParameters"]["sagemaker_program"] = json.dumps("missing.py")
    client.create_training_job(**missing)
    described = wait_for(client, "job-noprogram", {"Completed", "Failed", "Stopped"})
    job = emulator.jobs["job-noprogram"]
    assert job.done.wait(5)
    assert described["TrainingJobStatus"] == "Failed"
    # The service's own reason, not an emulator fault the monitor would retry as SageMaker's.
    assert described["FailureReason"] == f"ClientError: entry point missing.py not found in {staged['source']}"
    assert client.describe_training_job(TrainingJobName="job-noprogram")["FailureReason"] == described["FailureReason"]
    assert job.process is None and not job.log_path.exists()


@pytest.mark.slow
def test_the_end_of_every_job_is_announced_once(tmp_path: Path, staged: Any, s3: Any):
    ended: list[tuple[str, str]] = []
    emulator = LocalSageMaker(tmp_path / "jobs", s3, on_job_end=lambda job: ended.append((job.name, job.status)))
    with emulator.installed():
        client = boto3.client("sagemaker", region_name="us-east-1")
        client.create_training_job(**request(staged, "job-a", steps="2"))
        nodata = request(staged, "job-b")
        nodata["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = f"s3://{BUCKET}/nothing/"
        client.create_training_job(**nodata)
        assert emulator.wait_all(timeout=30)
    assert sorted(ended) == [("job-a", "Completed"), ("job-b", "Failed")]


@pytest.mark.slow
def test_max_runtime_stops_the_job(sagemaker: Any, staged: Any):
    client, _ = sagemaker
    job_request = request(staged, "job-slow", mode="hang")
    job_request["StoppingCondition"] = {"MaxRuntimeInSeconds": 1}
    client.create_training_job(**job_request)
    described = wait_for(client, "job-slow", {"Stopped", "Failed", "Completed"})
    assert described["TrainingJobStatus"] == "Stopped"
    assert described["SecondaryStatus"] == "MaxRuntimeExceeded"


@pytest.mark.slow
def test_a_script_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path, staged: Any, s3: Any):
    emulator = LocalSageMaker(tmp_path / "jobs", s3, stop_grace_seconds=0.5)
    with emulator.installed():
        client = boto3.client("sagemaker", region_name="us-east-1")
        client.create_training_job(**request(staged, "job-stubborn", mode="ignore-term"))
        job = emulator.jobs["job-stubborn"]
        deadline = time.monotonic() + 20
        while "step=1" not in (job.log_path.read_text() if job.log_path.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        client.stop_training_job(TrainingJobName="job-stubborn")
        described = wait_for(client, "job-stubborn", {"Stopped", "Failed", "Completed"}, timeout=10)
    assert described["TrainingJobStatus"] == "Stopped"
    assert job.exit_code == -9


@pytest.mark.slow
def test_resumes_from_checkpoints_already_under_the_checkpoint_uri(sagemaker: Any, staged: Any, s3: Any):
    s3.put_object(Bucket=BUCKET, Key="executions/e1/attempt-1/checkpoints/checkpoint-7.pt", Body=b"{}")
    client, emulator = sagemaker
    client.create_training_job(**request(staged, "job-resume", steps="1"))
    wait_for(client, "job-resume", {"Completed", "Failed", "Stopped"})
    assert "resumed_from=8" in emulator.jobs["job-resume"].log_path.read_text()


def test_empty_channel_fails_like_sagemaker(sagemaker: Any, staged: Any):
    client, _ = sagemaker
    job_request = request(staged, "job-nodata")
    job_request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = f"s3://{BUCKET}/nothing/"
    client.create_training_job(**job_request)
    described = wait_for(client, "job-nodata", {"Completed", "Failed", "Stopped"})
    assert described["TrainingJobStatus"] == "Failed"
    assert described["FailureReason"].startswith("ClientError: No S3 objects found under S3 URL")
    # Stopped at the first failure, as the service does: no training process, no other reason later.
    job = sagemaker[1].jobs["job-nodata"]
    assert job.done.wait(5)
    assert job.process is None
    assert client.describe_training_job(TrainingJobName="job-nodata")["FailureReason"] == described["FailureReason"]


def test_invalid_requests_are_rejected_before_anything_runs(sagemaker: Any, staged: Any):
    client, emulator = sagemaker
    bad_name = request(staged, "bad_name_with_underscores")
    with pytest.raises(ClientError) as error:
        client.create_training_job(**bad_name)
    assert error.value.response["Error"]["Code"] == "ValidationException"
    assert "trainingJobName" in error.value.response["Error"]["Message"]
    assert emulator.jobs == {}

    # An instance type outside CreateTrainingJob's enum: the service's ValidationException, no job.
    fake = request(staged, "job-fake-instance")
    fake["ResourceConfig"]["InstanceType"] = "ml.fake.xlarge"
    with pytest.raises(ClientError) as error:
        client.create_training_job(**fake)
    assert error.value.response["Error"]["Code"] == "ValidationException"
    assert "'resourceConfig.instanceType' failed to satisfy constraint: Member must satisfy enum value set: [" in \
        error.value.response["Error"]["Message"]
    assert emulator.jobs == {}

    # A request that botocore's client-side validation would not catch (the interpreter's
    # clients turn it off): the emulator still checks it against the service model.
    problem = emulator.create_training_job.__func__  # type: ignore[attr-defined]
    missing_role = request(staged, "job-norole")
    del missing_role["RoleArn"]
    from stabilizer.local.emulator.sagemaker import SageMakerRequestError

    with pytest.raises(SageMakerRequestError, match="RoleArn"):
        problem(emulator, missing_role)

    client.create_training_job(**request(staged, "job-dup", steps="1"))
    with pytest.raises(ClientError) as error:
        client.create_training_job(**request(staged, "job-dup", steps="1"))
    assert error.value.response["Error"]["Code"] == "ResourceInUse"

    with pytest.raises(ClientError) as error:
        client.describe_training_job(TrainingJobName="no-such-job")
    assert error.value.response["Error"]["Message"] == "Requested resource not found."


@pytest.mark.slow
def test_list_training_jobs_filters_and_sorts(sagemaker: Any, staged: Any):
    client, _ = sagemaker
    client.create_training_job(**request(staged, "list-a", steps="1"))
    client.create_training_job(**request(staged, "list-b", mode="hang"))
    wait_for(client, "list-a", {"Completed"})
    listed = client.list_training_jobs(NameContains="list-", SortBy="Name", SortOrder="Ascending")
    assert [j["TrainingJobName"] for j in listed["TrainingJobSummaries"]] == ["list-a", "list-b"]
    in_progress = client.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in in_progress] == ["list-b"]
    page = client.list_training_jobs(MaxResults=1, SortBy="Name", SortOrder="Ascending")
    assert [j["TrainingJobName"] for j in page["TrainingJobSummaries"]] == ["list-a"]
    assert "NextToken" in page


@pytest.mark.slow
def test_debugger_rules_without_an_evaluator_are_reported_as_errors(sagemaker: Any, staged: Any):
    client, _ = sagemaker
    job_request = request(staged, "job-rules", steps="1")
    job_request["DebugRuleConfigurations"] = [
        {
            "RuleConfigurationName": "ExplodingTensor",
            "RuleEvaluatorImage": RULES_IMAGE,
            "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
        }
    ]
    client.create_training_job(**job_request)
    described = wait_for(client, "job-rules", {"Completed", "Failed", "Stopped"})
    statuses = described["DebugRuleEvaluationStatuses"]
    assert [(s["RuleConfigurationName"], s["RuleEvaluationStatus"]) for s in statuses] == [("ExplodingTensor", "Error")]


@pytest.mark.slow
def test_debugger_profiler_rules_report_in_their_own_member_as_errors_locally(sagemaker: Any, staged: Any):
    """DescribeTrainingJob reports profiler rules in ProfilerRuleEvaluationStatuses (SageMaker API
    Reference); none runs locally, and each says so."""
    client, _ = sagemaker
    job_request = request(staged, "job-profiler-rules", steps="1")
    job_request["ProfilerConfig"] = {"S3OutputPath": "s3://bucket/profiler", "ProfilingIntervalInMilliseconds": 500}
    job_request["ProfilerRuleConfigurations"] = [
        {"RuleConfigurationName": "StepOutlier", "RuleEvaluatorImage": RULES_IMAGE,
         "RuleParameters": {"rule_to_invoke": "StepOutlier"}},
    ]
    client.create_training_job(**job_request)
    described = wait_for(client, "job-profiler-rules", {"Completed", "Failed", "Stopped"})
    (status,) = described["ProfilerRuleEvaluationStatuses"]
    assert (status["RuleConfigurationName"], status["RuleEvaluationStatus"]) == ("StepOutlier", "Error")
    assert "local mode" in status["StatusDetails"]
    assert "DebugRuleEvaluationStatuses" not in described


def rules_request(staged: dict[str, str], name: str, **hyperparameters: str) -> dict[str, Any]:
    job_request = request(staged, name, **hyperparameters)
    job_request["DebugRuleConfigurations"] = [
        {
            "RuleConfigurationName": "ExplodingTensor",
            "RuleEvaluatorImage": RULES_IMAGE,
            "RuleParameters": {"rule_to_invoke": "ExplodingTensor", "only_nan": "False"},
        }
    ]
    return job_request


@pytest.fixture
def sagemaker_with_rules(tmp_path: Path, s3: Any) -> Any:
    factory = rule_evaluator_factory(python=sys.executable, region="us-east-1", account="123456789012")
    emulator = LocalSageMaker(tmp_path / "jobs", s3, stop_grace_seconds=1, rule_evaluator=factory)
    with emulator.installed():
        yield boto3.client("sagemaker", region_name="us-east-1"), emulator
    emulator.stop_all()
    emulator.wait_all(timeout=30)


@pytest.mark.slow
def test_rule_statuses_come_from_an_evaluator_process_per_rule(sagemaker_with_rules: Any, staged: Any):
    client, _ = sagemaker_with_rules
    client.create_training_job(**rules_request(staged, "job-rules-fire", mode="rulestop"))
    deadline = time.monotonic() + 30
    while True:
        statuses = client.describe_training_job(TrainingJobName="job-rules-fire")["DebugRuleEvaluationStatuses"]
        if statuses[0]["RuleEvaluationStatus"] != "InProgress" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert statuses[0]["RuleConfigurationName"] == "ExplodingTensor"
    assert statuses[0]["RuleEvaluationStatus"] == "IssuesFound"
    # The evaluator got the rule list entry built from the configuration, parameters included.
    assert 'ExplodingTensor {"only_nan": "False"}' in statuses[0]["StatusDetails"]
    assert statuses[0]["RuleEvaluationJobArn"].startswith(
        "arn:aws:sagemaker:us-east-1:123456789012:processing-job/job-rules-fire-explodingtensor-"
    )


@pytest.mark.slow
def test_stop_processing_job_stops_one_rule_evaluation(sagemaker_with_rules: Any, staged: Any):
    client, _ = sagemaker_with_rules
    client.create_training_job(**rules_request(staged, "job-rules-stop", mode="hang"))
    wait_for(client, "job-rules-stop", {"InProgress"})
    deadline = time.monotonic() + 30
    while True:
        first = client.describe_training_job(TrainingJobName="job-rules-stop")["DebugRuleEvaluationStatuses"][0]
        if "RuleEvaluationJobArn" in first:
            break
        assert first["RuleEvaluationStatus"] == "InProgress"  # pending until the job has started
        assert time.monotonic() < deadline
        time.sleep(0.1)
    arn = first["RuleEvaluationJobArn"]
    name = arn.split("/")[-1]
    client.stop_processing_job(ProcessingJobName=name)
    while True:
        status = client.describe_training_job(TrainingJobName="job-rules-stop")["DebugRuleEvaluationStatuses"][0]
        if status["RuleEvaluationStatus"] == "Stopped" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status["RuleEvaluationStatus"] == "Stopped"
    with pytest.raises(ClientError, match="in status Stopped"):
        client.stop_processing_job(ProcessingJobName=name)
    with pytest.raises(ClientError, match="Could not find processing job"):
        client.stop_processing_job(ProcessingJobName="no-such-rule-job")
    # The training job itself keeps running.
    assert client.describe_training_job(TrainingJobName="job-rules-stop")["TrainingJobStatus"] == "InProgress"



@pytest.mark.slow
def test_a_spot_request_sagemaker_would_refuse_is_refused_and_a_valid_one_is_billed_as_trained(
        sagemaker: Any, staged: Any):
    """Managed spot training: StoppingCondition.MaxWaitTimeInSeconds "must be equal to or greater than
    MaxRuntimeInSeconds" (botocore's model, StoppingCondition). Locally there is no spot market, so
    BillableTimeInSeconds is the training time (no savings) and no instance is taken away."""
    client, emulator = sagemaker
    for stopping in ({"MaxRuntimeInSeconds": 60}, {"MaxRuntimeInSeconds": 60, "MaxWaitTimeInSeconds": 30}):
        spot = {**request(staged, "job-spot-bad"), "EnableManagedSpotTraining": True, "StoppingCondition": stopping}
        with pytest.raises(ClientError) as error:
            client.create_training_job(**spot)
        assert error.value.response["Error"]["Code"] == "ValidationException"
        assert "MaxWaitTimeInSeconds" in error.value.response["Error"]["Message"]
    assert emulator.jobs == {}
    good = {**request(staged, "job-spot", steps="1"), "EnableManagedSpotTraining": True,
            "StoppingCondition": {"MaxRuntimeInSeconds": 60, "MaxWaitTimeInSeconds": 120}}
    client.create_training_job(**good)
    described = wait_for(client, "job-spot", {"Completed", "Failed", "Stopped"})
    assert described["EnableManagedSpotTraining"] is True
    assert described["BillableTimeInSeconds"] == described["TrainingTimeInSeconds"]
    assert described["StoppingCondition"]["MaxWaitTimeInSeconds"] == 120
