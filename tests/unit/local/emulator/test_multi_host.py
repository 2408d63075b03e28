"""A training job on several instances, locally: each host a process group of its own with the files
and environment SageMaker gives a host, torchrun across them on loopback, and the job's status, failure
and stop as SageMaker reports them for a multi-instance job."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from stabilizer.local.emulator.sagemaker import LocalSageMaker
from stabilizer.source.sourcedir import source_archive
from tests.helpers import MODEL_DIR, ROOT, in_make_test_all
from tests.unit.local.emulator.test_sagemaker_emulator import request, wait_for
from tests.unit.local.support import BUCKET, FIXTURES, aws_env_fixture, s3_fixture  # noqa: F401 fixtures

pytestmark = pytest.mark.slow  # every job runs its hosts as processes

DDP_FIXTURE = ROOT / "tests" / "fixtures" / "ddp"  # a DDP loop whose rank --bad-rank reports a NaN loss


@pytest.fixture
def hosts_source(s3: Any) -> dict[str, str]:
    s3.put_object(Bucket=BUCKET, Key="data/train/x.npy", Body=b"x")
    s3.put_object(Bucket=BUCKET, Key="source/hosts.tar.gz", Body=source_archive(FIXTURES / "hosts"))
    return {
        "train": f"s3://{BUCKET}/data/train/",
        "source": f"s3://{BUCKET}/source/hosts.tar.gz",
        "output": f"s3://{BUCKET}/output/",
        "checkpoints": f"s3://{BUCKET}/executions/e1/attempt-1/checkpoints",
    }


@pytest.fixture
def sagemaker(tmp_path: Path, s3: Any) -> Any:
    emulator = LocalSageMaker(tmp_path / "jobs", s3, stop_grace_seconds=1, host_failure_grace_seconds=1)
    with emulator.installed():
        yield boto3.client("sagemaker", region_name="us-east-1"), emulator
    emulator.stop_all()
    emulator.wait_all(timeout=10)


def on_hosts(staged: dict[str, str], name: str, count: int, **hyperparameters: str) -> dict[str, Any]:
    job = request(staged, name, **hyperparameters)
    job["ResourceConfig"]["InstanceCount"] = count
    return job


@pytest.mark.long
def test_torch_distributed_on_two_hosts_runs_torchrun_on_each_with_sagemakers_host_files(sagemaker, hosts_source):
    client, emulator = sagemaker
    client.create_training_job(**on_hosts(hosts_source, "job-ddp", 2, mode='"ddp"',
                                          sagemaker_torch_distributed_enabled="true",
                                          sagemaker_mpi_num_of_processes_per_host="2"))
    described = wait_for(client, "job-ddp", {"Completed", "Failed", "Stopped"}, timeout=120)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    reports = []
    for container in emulator.jobs["job-ddp"].hosts:
        text = container.log_path.read_text()
        reports += [json.loads(line) for line in re.findall(r"report (\{.*\})", text)]
    assert sorted((r["host"], r["rank"]) for r in reports) == [
        ("algo-1", 0), ("algo-1", 1), ("algo-2", 2), ("algo-2", 3)]
    for report in reports:
        assert report["hosts"] == report["resource_hosts"] == ["algo-1", "algo-2"]
        assert report["resource_host"] == report["host"] and report["num_gpus"] == "0"
        assert (report["world"], report["sum"]) == (4, 0 + 1 + 2 + 3)


def test_one_failing_host_fails_the_job_and_the_other_hosts_are_torn_down(sagemaker, hosts_source):
    client, emulator = sagemaker
    client.create_training_job(**on_hosts(hosts_source, "job-fail", 3, mode='"fail"', host='"algo-2"'))
    described = wait_for(client, "job-fail", {"Completed", "Failed", "Stopped"}, timeout=60)
    assert described["TrainingJobStatus"] == "Failed"
    assert described["FailureReason"] == "AlgorithmError: RuntimeError: algo-2 lost its data"
    job = emulator.jobs["job-fail"]
    assert [process.returncode for process in job.processes] == [-9, 3, -9]  # the sleepers were killed


def test_a_stop_reaches_every_host(sagemaker, hosts_source):
    client, emulator = sagemaker
    client.create_training_job(**on_hosts(hosts_source, "job-stop", 2, mode='"sleep"'))
    wait_for(client, "job-stop", {"InProgress"})
    job = emulator.jobs["job-stop"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
            c.log_path.is_file() and "sleeping" in c.log_path.read_text() for c in job.hosts):
        time.sleep(0.1)
    client.stop_training_job(TrainingJobName="job-stop")
    described = wait_for(client, "job-stop", {"Completed", "Failed", "Stopped"}, timeout=30)
    assert described["TrainingJobStatus"] == "Stopped"
    assert [process.returncode for process in job.processes] == [-9, -9]


# make test runs one rank a host (two processes); make test-all two (four).
@pytest.mark.parametrize("per_host", [1, *in_make_test_all(2)])
def test_a_rule_firing_on_host_2s_last_rank_stops_every_rank_of_both_hosts_at_that_step(tmp_path, s3, per_host):
    s3.put_object(Bucket=BUCKET, Key="data/train/x.npy", Body=b"x")
    s3.put_object(Bucket=BUCKET, Key="source/ddp.tar.gz", Body=source_archive(DDP_FIXTURE))
    staged = {"train": f"s3://{BUCKET}/data/train/", "source": f"s3://{BUCKET}/source/ddp.tar.gz",
              "output": f"s3://{BUCKET}/output/", "checkpoints": f"s3://{BUCKET}/executions/e1/attempt-1/checkpoints"}
    emulator = LocalSageMaker(tmp_path / "jobs", s3, stop_grace_seconds=1, extra_env={"PYTHONPATH": str(MODEL_DIR)})
    with emulator.installed():
        client = boto3.client("sagemaker", region_name="us-east-1")
        # The last global rank is host algo-2's last; its loss goes NaN at step 5.
        client.create_training_job(**on_hosts(staged, "job-rank3", 2, **{
            "bad-rank": str(2 * per_host - 1), "bad-step": "5", "steps": "20",
            "sagemaker_torch_distributed_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": str(per_host)}))
        described = wait_for(client, "job-rank3", {"Completed", "Failed", "Stopped"}, timeout=180)
    assert described["TrainingJobStatus"] == "Failed"
    assert "RuleStop: ExplodingTensor at step 5" in described["FailureReason"]
    logs = {c.host: c.log_path.read_text() for c in emulator.jobs["job-rank3"].hosts}
    stopped = [re.findall(r"sentinel stopped the job at step (\d+)", text) for text in logs.values()]
    assert [sorted(steps) for steps in stopped] == [["5"] * per_host] * 2, logs  # every rank, one step
    taken = [int(step) for text in logs.values() for step in re.findall(r"rank=\d step=(\d+)", text)]
    assert max(taken) == 4  # no rank took the stopped step
    body = s3.get_object(Bucket=BUCKET, Key="executions/e1/attempt-1/checkpoints/findings.json")["Body"].read()
    (finding,) = json.loads(body)["findings"]  # one file, written by rank 0 on algo-1
    assert (finding["rank"], finding["step"]) == (2 * per_host - 1, 5)
