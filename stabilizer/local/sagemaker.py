"""SageMaker training jobs on this machine: the API and each job's life, one real process a job.

moto's SageMaker backend completes training jobs instantly and has no StopTrainingJob, so local
mode serves CreateTrainingJob, DescribeTrainingJob, StopTrainingJob and ListTrainingJobs here,
at the same API edge the Lambdas call through ``boto3.client("sagemaker")``, with the statuses,
secondary statuses and timings the service reports:

- a request is validated against botocore's model; a job runs in its container
  (``stabilizer.local.container``: ``/opt/ml``, channels, ``SM_*``, the entry point) and goes
  ``Starting``, ``Downloading``, ``Training``, ``Uploading``, then ``Completed``, ``Failed`` or
  ``Stopped``;
- a job that fails before training (an empty channel, a missing entry point) ends ``Failed`` with
  that reason at once, as the service does: the script is not started;
- checkpoints reach S3 while the job runs (on every describe and at the end), so findings reach
  S3 within one poll;
- ``StopTrainingJob`` behaves as in SageMaker's framework containers: the job is ``Stopping``,
  the training script is sent nothing (the training toolkit that runs it as PID 1's child does
  not forward SIGTERM: aws/sagemaker-training-toolkit issues), and it is killed (SIGKILL) once
  the grace period (120 s, as SageMaker's) is over, then ``Stopped``. No final checkpoint is
  written at a stop; ``MaxRuntimeInSeconds`` is enforced the same way. ``interrupt_all`` is the
  local-only Ctrl-C, not a SageMaker operation: the user's own machine asks the script to end
  cleanly (SIGTERM to its process group, as ``docker stop`` does), killing it if it has not ended
  within a minute;
- ``FailureReason`` comes from the failure file; ``FinalMetricDataList`` from the job's log and
  its ``MetricDefinitions``;
- when ``DebugRuleConfigurations`` are given, ``DebugRuleEvaluationStatuses`` come from
  out-of-job rule evaluators running beside the job (``stabilizer.local.rule_jobs``), and
  StopProcessingJob is served for them.

This module knows the service, not the training script or the workflow.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from stabilizer.local.container import Container, ContainerError
from stabilizer.local.rule_jobs import RuleEvaluation, RuleEvaluatorFactory, UnavailableRuleEvaluation
from stabilizer.local.validation import request_errors

TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
# StopTrainingJob "delays job termination for 120 seconds" after SIGTERM to the container
# (StopTrainingJob API reference); the script itself never sees that SIGTERM in the framework
# containers, so all it gets is the kill at the end of the window.
SAGEMAKER_STOP_GRACE_SECONDS = 120.0
# A local Ctrl-C gives the script this long to exit after SIGTERM before it is killed: it ends at
# the end of its current step, which on a busy laptop can take many seconds.
LOCAL_INTERRUPT_GRACE_SECONDS = 60.0
FAILURE_REASON_LIMIT = 1024


def now() -> dt.datetime:
    return dt.datetime.now(tz=dt.UTC)


class SageMakerRequestError(Exception):
    """A request the service rejects; ``code`` is the AWS error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class LocalTrainingJob:
    """One training job: its request, its container, its process and its statuses."""

    name: str
    arn: str
    request: dict[str, Any]
    container: Container
    creation_time: dt.datetime = field(default_factory=now)
    status: str = "InProgress"
    secondary_status: str = "Starting"
    transitions: list[dict[str, Any]] = field(default_factory=list)
    failure_reason: str | None = None
    training_start_time: dt.datetime | None = None
    training_end_time: dt.datetime | None = None
    last_modified_time: dt.datetime = field(default_factory=now)
    model_artifacts: str | None = None
    final_metrics: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    process: subprocess.Popen[bytes] | None = None
    stop_requested: str | None = None  # the secondary status the stop ends in
    rules: RuleEvaluation | None = None
    started_monotonic: float | None = None
    stopping_monotonic: float | None = None
    kill_at_monotonic: float | None = None  # SIGKILL once this passes, while stopping
    ended_monotonic: float | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def log_path(self) -> Path:
        return self.container.log_path

    @property
    def checkpoint_dir(self) -> Path:
        return self.container.checkpoint_dir

    @property
    def seconds(self) -> float:
        """Wall time of the training process so far (or in total, once it ended)."""
        if self.started_monotonic is None:
            return 0.0
        end = self.ended_monotonic if self.ended_monotonic is not None else time.monotonic()
        return end - self.started_monotonic

    def set_secondary(self, secondary: str, message: str, status: str | None = None) -> None:
        with self.lock:
            stamp = now()
            if self.transitions and "EndTime" not in self.transitions[-1]:
                self.transitions[-1]["EndTime"] = stamp
            self.transitions.append({"Status": secondary, "StartTime": stamp, "StatusMessage": message})
            self.secondary_status = secondary
            if status:
                self.status = status
            if status in TERMINAL_STATUSES:
                self.transitions[-1]["EndTime"] = stamp
            self.last_modified_time = stamp

    def fail(self, reason: str) -> None:
        """End the job as Failed with ``reason``, cut to the service's length."""
        with self.lock:
            self.failure_reason = reason[:FAILURE_REASON_LIMIT]
            self.set_secondary("Failed", "Training job failed", status="Failed")


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
    ) -> None:
        self.root = Path(root).resolve()  # the job runs in its code directory: every path is absolute
        self.s3 = s3
        self.region = region
        self.account = account
        self.python = python
        self.stop_grace_seconds = stop_grace_seconds
        self.rule_evaluator = rule_evaluator
        self.extra_env = dict(extra_env or {})
        # Called once a job reached Completed, Failed or Stopped: the local stand-in for the
        # "SageMaker Training Job State Change" event EventBridge delivers in the cloud.
        self.on_job_end = on_job_end
        self.jobs: dict[str, LocalTrainingJob] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # ---------------------------------------------------------------- API operations
    def create_training_job(self, request: dict[str, Any]) -> dict[str, Any]:
        problem = request_errors("sagemaker", "CreateTrainingJob", request)
        if problem:
            raise SageMakerRequestError("ValidationException", problem)
        name = request["TrainingJobName"]
        resources = request.get("ResourceConfig", {})
        if resources.get("InstanceCount", 1) != 1:
            raise SageMakerRequestError(
                "ValidationException", "local mode runs training jobs on one instance (InstanceCount 1)"
            )
        arn = f"arn:aws:sagemaker:{self.region}:{self.account}:training-job/{name.lower()}"
        with self._lock:
            if name in self.jobs:
                raise SageMakerRequestError(
                    "ResourceInUse",
                    "Training job names must be unique within an AWS account and region, and a "
                    f"training job with this name already exists ({arn})",
                )
            job = LocalTrainingJob(name=name, arn=arn, request=request, container=Container(self.root / name, request))
            self.jobs[name] = job
        job.set_secondary("Starting", "Launching requested ML instances", status="InProgress")
        thread = threading.Thread(target=self._run, args=(job,), name=f"training-job-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return {"TrainingJobArn": arn}

    def describe_training_job(self, name: str) -> dict[str, Any]:
        job = self._job(name)
        if job.status not in TERMINAL_STATUSES:
            job.container.sync_checkpoints()
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
        return response

    def stop_training_job(self, name: str) -> dict[str, Any]:
        job = self._job(name)
        with job.lock:
            if job.status != "InProgress":
                raise SageMakerRequestError(
                    "ValidationException",
                    f"The request was rejected because the training job is in status {job.status}.",
                )
            self._request_stop(job, "Stopped", "Stopping the training job")
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
                    self._request_stop(job, reason, "Stopping the training job")
                    stopped.append(job)
        return stopped

    def interrupt_all(self, grace_seconds: float = LOCAL_INTERRUPT_GRACE_SECONDS) -> list[LocalTrainingJob]:
        """Local Ctrl-C (not a SageMaker operation, which never signals the script): SIGTERM to
        every running job, SIGKILL after ``grace_seconds``; each ends ``Stopped``. Returns them."""
        interrupted = []
        for job in self.running_jobs():
            with job.lock:
                if job.status == "InProgress":
                    self._request_stop(job, "Stopped", "Stopping the training job (interrupted)",
                                       signal_to_send=signal.SIGTERM, grace_seconds=grace_seconds)
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

    # ---------------------------------------------------------------- the job's life
    def _job(self, name: str) -> LocalTrainingJob:
        job = self.jobs.get(name)
        if job is None:
            raise SageMakerRequestError("ValidationException", "Requested resource not found.")
        return job

    def _request_stop(
        self,
        job: LocalTrainingJob,
        ends_in: str,
        message: str,
        *,
        signal_to_send: int | None = None,
        grace_seconds: float | None = None,
    ) -> None:
        """Stopping: as SageMaker, the script gets no signal; it is killed after the grace period."""
        job.stop_requested = ends_in
        job.stopping_monotonic = time.monotonic()
        job.kill_at_monotonic = job.stopping_monotonic + (
            self.stop_grace_seconds if grace_seconds is None else grace_seconds
        )
        job.set_secondary("Stopping", message, status="Stopping")
        if signal_to_send is not None and job.process is not None and job.process.poll() is None:
            _signal_group(job.process, signal_to_send)

    def _run(self, job: LocalTrainingJob) -> None:
        try:
            try:
                self._prepare(job)
            except ContainerError as error:
                job.fail(str(error))  # failed before training (a channel, the source): no script
                return
            if job.stop_requested is None:
                self._train(job)
            self._finish(job)
        except Exception as exc:  # an emulator fault must still end the job, visibly
            with job.lock:
                if job.status not in TERMINAL_STATUSES:  # never overwrite the job's own ending
                    job.fail(f"InternalServerError: {type(exc).__name__}: {exc}")
        finally:
            if job.rules is not None:
                job.rules.stop()
            if job.training_end_time is None:
                job.training_end_time = now()
            job.done.set()
            self._announce_end(job)

    def _announce_end(self, job: LocalTrainingJob) -> None:
        if self.on_job_end is None:
            return
        try:
            self.on_job_end(job)
        except Exception as exc:  # like EventBridge: a failed delivery does not change the job
            print(f"training job {job.name}: end event not delivered: {type(exc).__name__}: {exc}",
                  file=sys.stderr)

    def _prepare(self, job: LocalTrainingJob) -> None:
        job.container.lay_out()
        job.set_secondary("Downloading", "Downloading input data")
        job.container.provision(self.s3)
        if job.request.get("DebugRuleConfigurations"):
            if self.rule_evaluator is None:
                job.rules = UnavailableRuleEvaluation(job.container, "no out-of-job rule evaluator is installed")
            else:
                job.rules = self.rule_evaluator(job.name, job.container)

    def _train(self, job: LocalTrainingJob) -> None:
        max_runtime = float(job.request["StoppingCondition"].get("MaxRuntimeInSeconds", 86400))
        with job.lock:
            if job.stop_requested is not None:
                return
            job.process = job.container.start(
                self.python, job_name=job.name, job_arn=job.arn, extra_env=self.extra_env
            )
            job.started_monotonic = time.monotonic()
            job.training_start_time = now()
            job.set_secondary("Training", "Training image download completed. Training in progress.")
        self._supervise(job, max_runtime)

    def _supervise(self, job: LocalTrainingJob, max_runtime: float) -> None:
        assert job.process is not None
        killed_at: float | None = None
        while True:
            try:
                job.exit_code = job.process.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            elapsed = job.seconds
            with job.lock:
                if job.stop_requested is None and elapsed > max_runtime:
                    self._request_stop(job, "MaxRuntimeExceeded", "Training job reached MaxRuntimeInSeconds")
                kill_at = job.kill_at_monotonic
            grace_over = kill_at is not None and time.monotonic() >= kill_at
            if grace_over and killed_at is None:
                _signal_group(job.process, signal.SIGKILL)
                killed_at = time.monotonic()
        job.ended_monotonic = time.monotonic()
        job.training_end_time = now()

    def _finish(self, job: LocalTrainingJob) -> None:
        if job.status in TERMINAL_STATUSES:
            return
        job.set_secondary("Uploading", "Uploading generated training model")
        job.container.sync_checkpoints()
        job.model_artifacts = job.container.upload_outputs(self.s3, job.name)
        job.final_metrics = _final_metrics(job)
        with job.lock:
            if job.stop_requested is not None:
                reason = job.stop_requested
                message = (
                    "Training job stopped because it exceeded MaxRuntimeInSeconds"
                    if reason == "MaxRuntimeExceeded"
                    else "Training job stopped"
                )
                job.set_secondary(reason, message, status="Stopped")
            elif job.exit_code == 0:
                job.set_secondary("Completed", "Training job completed", status="Completed")
            else:
                job.fail(job.container.failure_reason(job.exit_code))

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


def _name(params: dict[str, Any]) -> str:
    name = params.get("TrainingJobName")
    if not isinstance(name, str) or not name:
        raise SageMakerRequestError(
            "ValidationException",
            "1 validation error detected: Value null at 'trainingJobName' failed to satisfy "
            "constraint: Member must not be null",
        )
    return name


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _as_datetime(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value, tz=dt.UTC)
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _final_metrics(job: LocalTrainingJob) -> list[dict[str, Any]]:
    """The last value of each MetricDefinitions regex in the job's log, as SageMaker reports them."""
    definitions = job.request["AlgorithmSpecification"].get("MetricDefinitions", [])
    if not definitions or not job.log_path.is_file():
        return []
    text = job.log_path.read_text(errors="replace")
    metrics = []
    for definition in definitions:
        try:
            matches = re.findall(definition["Regex"], text)
        except re.error:
            continue
        if not matches:
            continue
        last = matches[-1]
        last = last[0] if isinstance(last, tuple) else last
        try:
            value = float(last)
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        metrics.append({"MetricName": definition["Name"], "Value": value, "Timestamp": job.training_end_time or now()})
    return metrics
