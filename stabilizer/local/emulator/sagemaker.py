"""The SageMaker API for training jobs, served on this machine: each job a real process.

moto's SageMaker backend completes training jobs instantly and has no StopTrainingJob, so local
mode serves CreateTrainingJob, DescribeTrainingJob, StopTrainingJob and ListTrainingJobs here,
at the same API edge the Lambdas call through ``boto3.client("sagemaker")`` (``installed``), and
StopProcessingJob for the rule-evaluation jobs beside them:

- a request is validated against botocore's model and rejected with the service's error codes;
- each job lives on its own thread (``stabilizer.local.emulator.training_job``: statuses, stops, timings)
  in its own container (``stabilizer.local.emulator.container``: ``/opt/ml``, channels, ``SM_*``), one per
  host for ``InstanceCount`` > 1 (``<job>/algo-1`` .. ``<job>/algo-N``, the processes meeting on
  loopback: ``stabilizer.local.emulator.runners``);
- the matches of a job's ``MetricDefinitions`` in its log go to ``metrics`` as they are logged
  (the local engine sends them to CloudWatch, where SageMaker sends them);
- DescribeTrainingJob answers with what the service reports, and mirrors the job's checkpoints
  to S3 on every call, so findings reach S3 within one poll;
- ``interrupt_all`` is the local-only Ctrl-C, not a SageMaker operation: the user's own machine
  asks each script to end cleanly, killing it if it has not ended within a minute.

This module knows the service, not the training script or the workflow.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from stabilizer.local.emulator import runners
from stabilizer.local.emulator.container import Container
from stabilizer.local.emulator.rule_jobs import RuleEvaluatorFactory
from stabilizer.local.emulator.training_job import (
    HOST_FAILURE_GRACE_SECONDS,
    LOCAL_INTERRUPT_GRACE_SECONDS,
    SAGEMAKER_STOP_GRACE_SECONDS,
    TERMINAL_STATUSES,
    JobHost,
    LocalTrainingJob,
)
from stabilizer.local.emulator.validation import request_errors


class SageMakerRequestError(Exception):
    """A request the service rejects; ``code`` is the AWS error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class LocalSageMaker:
    """The four training-job operations, served by subprocesses under ``root``."""

    def __init__(
        self,
        root: Path,
        s3: Any,
        *,
        region: str = "us-east-1",
        account: str = "123456789012",
        python: str = sys.executable,
        stop_grace_seconds: float = SAGEMAKER_STOP_GRACE_SECONDS,
        rule_evaluator: RuleEvaluatorFactory | None = None,
        extra_env: dict[str, str] | None = None,
        on_job_end: Callable[[LocalTrainingJob], None] | None = None,
        admission: Callable[[dict[str, Any]], str | None] | None = None,
        host_failure_grace_seconds: float = HOST_FAILURE_GRACE_SECONDS,
        metrics: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.root = Path(root).resolve()  # the job runs in its code directory: every path is absolute
        self.region = region
        self.account = account
        self.host = JobHost(
            s3=s3,
            python=python,
            extra_env=dict(extra_env or {}),
            rule_evaluator=rule_evaluator,
            stop_grace_seconds=stop_grace_seconds,
            host_failure_grace_seconds=host_failure_grace_seconds,
            on_job_end=on_job_end,
            admission=admission,
            metrics=metrics,
        )
        self.jobs: dict[str, LocalTrainingJob] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # ---------------------------------------------------------------- API operations
    def create_training_job(self, request: dict[str, Any]) -> dict[str, Any]:
        problem = request_errors("sagemaker", "CreateTrainingJob", request) or _spot_problem(request)
        if problem:
            raise SageMakerRequestError("ValidationException", problem)
        name = request["TrainingJobName"]
        arn = f"arn:aws:sagemaker:{self.region}:{self.account}:training-job/{name.lower()}"
        with self._lock:
            if name in self.jobs:
                raise SageMakerRequestError(
                    "ResourceInUse",
                    "Training job names must be unique within an AWS account and region, and a "
                    f"training job with this name already exists ({arn})",
                )
            hosts = _containers(self.root / name, request)
            job = LocalTrainingJob(name=name, arn=arn, request=request, container=hosts[0], hosts=hosts)
            self.jobs[name] = job
        job.set_secondary("Starting", "Launching requested ML instances", status="InProgress")
        thread = threading.Thread(target=job.run, args=(self.host,), name=f"training-job-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return {"TrainingJobArn": arn}

    def describe_training_job(self, name: str) -> dict[str, Any]:
        job = self._job(name)
        if job.status not in TERMINAL_STATUSES:
            for container in job.hosts:
                container.sync_checkpoints()
        with job.lock:
            request = job.request
            response: dict[str, Any] = {
                "TrainingJobName": job.name,
                "TrainingJobArn": job.arn,
                "ModelArtifacts": {"S3ModelArtifacts": job.model_artifacts or ""},
                "TrainingJobStatus": job.status,
                "SecondaryStatus": job.secondary_status,
                "HyperParameters": request.get("HyperParameters", {}),
                "AlgorithmSpecification": request["AlgorithmSpecification"],
                "RoleArn": request["RoleArn"],
                "InputDataConfig": request.get("InputDataConfig", []),
                "OutputDataConfig": request["OutputDataConfig"],
                "ResourceConfig": request["ResourceConfig"],
                "StoppingCondition": request["StoppingCondition"],
                "CreationTime": job.creation_time,
                "LastModifiedTime": job.last_modified_time,
                "SecondaryStatusTransitions": [dict(t) for t in job.transitions],
                "EnableNetworkIsolation": request.get("EnableNetworkIsolation", False),
                "EnableInterContainerTrafficEncryption": request.get("EnableInterContainerTrafficEncryption", False),
                "EnableManagedSpotTraining": request.get("EnableManagedSpotTraining", False),
            }
            for optional in (
                "CheckpointConfig",
                "DebugHookConfig",
                "DebugRuleConfigurations",
                "ProfilerConfig",
                "ProfilerRuleConfigurations",
                "TensorBoardOutputConfig",
                "ExperimentConfig",
                "Environment",
                "VpcConfig",
                "RetryStrategy",
            ):
                if optional in request:
                    response[optional] = request[optional]
            if job.failure_reason:
                response["FailureReason"] = job.failure_reason
            if job.training_start_time:
                response["TrainingStartTime"] = job.training_start_time
            if job.training_end_time:
                response["TrainingEndTime"] = job.training_end_time
                seconds = max(1, round(job.seconds))
                response["TrainingTimeInSeconds"] = seconds
                response["BillableTimeInSeconds"] = seconds
            if job.final_metrics:
                response["FinalMetricDataList"] = list(job.final_metrics)
            if job.rules is not None:
                response["DebugRuleEvaluationStatuses"] = job.rules.statuses()
            elif request.get("DebugRuleConfigurations"):
                # Rule jobs are pending until the training job has its data and source.
                response["DebugRuleEvaluationStatuses"] = [
                    {
                        "RuleConfigurationName": rule["RuleConfigurationName"],
                        "RuleEvaluationStatus": "InProgress",
                        "LastModifiedTime": job.creation_time,
                    }
                    for rule in request["DebugRuleConfigurations"]
                ]
            if request.get("ProfilerRuleConfigurations"):
                # Debugger's profiler rules (BatchSize, StepOutlier, ...) read Debugger's profiler
                # output, which no local job writes: each reports Error, saying so, rather than nothing.
                response["ProfilerRuleEvaluationStatuses"] = [
                    {
                        "RuleConfigurationName": rule["RuleConfigurationName"],
                        "RuleEvaluationStatus": "Error",
                        "StatusDetails": "ClientError: Debugger's profiler rules do not run in local mode",
                        "LastModifiedTime": job.creation_time,
                    }
                    for rule in request["ProfilerRuleConfigurations"]
                ]
        return response

    def stop_training_job(self, name: str) -> dict[str, Any]:
        job = self._job(name)
        with job.lock:
            if job.status != "InProgress":
                raise SageMakerRequestError(
                    "ValidationException",
                    f"The request was rejected because the training job is in status {job.status}.",
                )
            job.request_stop("Stopped", "Stopping the training job", grace_seconds=self.host.stop_grace_seconds)
        return {}

    def list_training_jobs(self, request: dict[str, Any]) -> dict[str, Any]:
        problem = request_errors("sagemaker", "ListTrainingJobs", request)
        if problem:
            raise SageMakerRequestError("ValidationException", problem)
        jobs = list(self.jobs.values())
        if request.get("NameContains"):
            jobs = [j for j in jobs if request["NameContains"] in j.name]
        if request.get("StatusEquals"):
            jobs = [j for j in jobs if j.status == request["StatusEquals"]]
        for key, attr, after in (
            ("CreationTimeAfter", "creation_time", True),
            ("CreationTimeBefore", "creation_time", False),
            ("LastModifiedTimeAfter", "last_modified_time", True),
            ("LastModifiedTimeBefore", "last_modified_time", False),
        ):
            if key in request:
                bound = _as_datetime(request[key])
                jobs = [j for j in jobs if (getattr(j, attr) > bound) == after]
        sort_by = request.get("SortBy", "CreationTime")
        sort_key: Callable[[LocalTrainingJob], Any] = {
            "Name": lambda j: j.name,
            "CreationTime": lambda j: j.creation_time,
            "Status": lambda j: j.status,
        }[sort_by]
        jobs.sort(key=sort_key, reverse=request.get("SortOrder", "Descending") == "Descending")
        start = int(request.get("NextToken") or 0)
        size = int(request.get("MaxResults") or 10)
        page = jobs[start : start + size]
        summaries = []
        for job in page:
            summary: dict[str, Any] = {
                "TrainingJobName": job.name,
                "TrainingJobArn": job.arn,
                "CreationTime": job.creation_time,
                "LastModifiedTime": job.last_modified_time,
                "TrainingJobStatus": job.status,
                "SecondaryStatus": job.secondary_status,
            }
            if job.training_end_time:
                summary["TrainingEndTime"] = job.training_end_time
            summaries.append(summary)
        response: dict[str, Any] = {"TrainingJobSummaries": summaries}
        if start + size < len(jobs):
            response["NextToken"] = str(start + size)
        return response

    def stop_processing_job(self, name: str) -> dict[str, Any]:
        """StopProcessingJob for a rule-evaluation job started beside a training job."""
        for job in self.jobs.values():
            if job.rules is not None and job.rules.owns(name):
                already = job.rules.stop_processing_job(name)
                if already is not None:
                    raise SageMakerRequestError(
                        "ValidationException",
                        f"The request was rejected because the processing job is in status {already}.",
                    )
                return {}
        raise SageMakerRequestError("ValidationException", f"Could not find processing job '{name}'.")

    # ---------------------------------------------------------------- conveniences for the engine
    def running_jobs(self) -> list[LocalTrainingJob]:
        return [j for j in self.jobs.values() if j.status not in TERMINAL_STATUSES]

    def stop_all(self, reason: str = "Stopped") -> list[LocalTrainingJob]:
        """StopTrainingJob for every job still in progress; returns the ones stopped."""
        stopped = []
        for job in self.running_jobs():
            with job.lock:
                if job.status == "InProgress":
                    job.request_stop(reason, "Stopping the training job", grace_seconds=self.host.stop_grace_seconds)
                    stopped.append(job)
        return stopped

    def interrupt_all(self, grace_seconds: float = LOCAL_INTERRUPT_GRACE_SECONDS) -> list[LocalTrainingJob]:
        """Local Ctrl-C (not a SageMaker operation, which never signals the script): SIGTERM to
        every running job, SIGKILL after ``grace_seconds``; each ends ``Stopped``. Returns them."""
        interrupted = []
        for job in self.running_jobs():
            with job.lock:
                if job.status == "InProgress":
                    job.request_stop("Stopped", "Stopping the training job (interrupted)",
                                     grace_seconds=grace_seconds, signal_to_send=signal.SIGTERM)
                    interrupted.append(job)
                elif job.status == "Stopping":
                    job.kill_at_monotonic = min(job.kill_at_monotonic or math.inf, time.monotonic() + grace_seconds)
                    interrupted.append(job)
        return interrupted

    def wait_all(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for job in list(self.jobs.values()):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not job.done.wait(remaining):
                return False
        return True

    def _job(self, name: str) -> LocalTrainingJob:
        job = self.jobs.get(name)
        if job is None:
            raise SageMakerRequestError("ValidationException", "Requested resource not found.")
        return job

    # ---------------------------------------------------------------- the API edge
    @contextlib.contextmanager
    def installed(self) -> Iterator[LocalSageMaker]:
        """Serve the four operations from this emulator for every SageMaker client under mock_aws."""
        from moto.core.responses import ActionResult
        from moto.sagemaker.exceptions import SagemakerClientError
        from moto.sagemaker.responses import SageMakerResponse

        emulator = self

        class _RejectedError(SagemakerClientError):
            def __init__(self, code: str, message: str) -> None:
                self.code = code
                super().__init__(message)

        def serve(operation: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Any], Any]:
            def method(response: Any) -> ActionResult:
                body = response.body
                if isinstance(body, bytes):
                    body = body.decode()
                params = json.loads(body or "{}")
                try:
                    return ActionResult(operation(params))
                except SageMakerRequestError as exc:
                    raise _RejectedError(exc.code, exc.message) from exc

            return method

        patches = {
            "create_training_job": serve(emulator.create_training_job),
            "describe_training_job": serve(lambda p: emulator.describe_training_job(_name(p))),
            "stop_training_job": serve(lambda p: emulator.stop_training_job(_name(p))),
            "list_training_jobs": serve(emulator.list_training_jobs),
            "stop_processing_job": serve(lambda p: emulator.stop_processing_job(p.get("ProcessingJobName", ""))),
        }
        with contextlib.ExitStack() as stack:
            for attribute, method in patches.items():
                stack.enter_context(mock.patch.object(SageMakerResponse, attribute, method, create=True))
            yield self


def _spot_problem(request: dict[str, Any]) -> str | None:
    """Managed spot training's limit: MaxWaitTimeInSeconds, given and at least MaxRuntimeInSeconds
    (botocore's model, StoppingCondition). Locally there is no spot market: a spot job runs, is
    never interrupted and is billed its training time."""
    if not request.get("EnableManagedSpotTraining"):
        return None
    stopping = request.get("StoppingCondition") or {}
    wait, runtime = stopping.get("MaxWaitTimeInSeconds"), stopping.get("MaxRuntimeInSeconds", 86400)
    if wait is None:
        return "MaxWaitTimeInSeconds is required when EnableManagedSpotTraining is true"
    if wait < runtime:
        return f"MaxWaitTimeInSeconds ({wait}) must be equal to or greater than MaxRuntimeInSeconds ({runtime})"
    return None


def _containers(job_dir: Path, request: dict[str, Any]) -> list[Container]:
    """One container per host: the job directory itself for one instance, ``<job>/algo-<i>`` for several."""
    hosts = runners.hosts_of(request)
    port = runners.free_port()  # the job's rendezvous; a fixed one could collide between local jobs
    if len(hosts) == 1:
        return [Container(job_dir, request, master_port=port)]
    return [Container(job_dir / host, request, host=host, hosts=tuple(hosts), master_port=port) for host in hosts]


def _name(params: dict[str, Any]) -> str:
    name = params.get("TrainingJobName")
    if not isinstance(name, str) or not name:
        raise SageMakerRequestError(
            "ValidationException",
            "1 validation error detected: Value null at 'trainingJobName' failed to satisfy "
            "constraint: Member must not be null",
        )
    return name


def _as_datetime(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value, tz=dt.UTC)
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))

