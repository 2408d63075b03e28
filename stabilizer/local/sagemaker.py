"""SageMaker training jobs on this machine: each job is a real subprocess of the training script.

moto's SageMaker backend completes training jobs instantly and has no StopTrainingJob, so local
mode serves CreateTrainingJob, DescribeTrainingJob, StopTrainingJob and ListTrainingJobs here,
at the same API edge the Lambdas call through ``boto3.client("sagemaker")``. A job runs under
the SageMaker container contract (script mode, as the framework containers run it):

- a job directory standing for ``/opt/ml``: ``input/config/*.json``, ``input/data/<channel>``
  (downloaded from S3 before the script starts), ``code`` (the extracted source archive),
  ``model``, ``output/failure``, ``output/data`` and the checkpoint directory;
- ``SM_*`` environment and the hyperparameters decoded and passed as ``--name value``, exactly as
  the training toolkit does (values that parse as JSON are decoded first);
- checkpoints downloaded from ``CheckpointConfig.S3Uri`` before the start and uploaded while the
  job runs (on every describe and at the end), so findings reach S3 within one poll;
- ``StopTrainingJob`` behaves as in SageMaker's framework containers: the job is ``Stopping``,
  the training script is sent nothing (the training toolkit that runs it as PID 1's child does
  not forward SIGTERM: aws/sagemaker-training-toolkit issues), and it is killed (SIGKILL) once
  the grace period (120 s, as SageMaker's) is over, then ``Stopped``. No final checkpoint is
  written at a stop; ``MaxRuntimeInSeconds`` is enforced the same way. ``interrupt_all`` is the
  local-only Ctrl-C, not a SageMaker operation: the user's own machine asks the script to end
  cleanly (SIGTERM to its process group, as ``docker stop`` does), killing it if it has not ended
  within a minute;
- the checkpoint directory is mirrored to ``CheckpointConfig.S3Uri`` both ways, deletions included;
- a job that fails before training (an empty channel, a missing entry point) ends ``Failed`` with
  that reason at once, as the service does: the script is not started;
- ``FailureReason`` comes from the failure file; requests are validated against botocore's model;
- when ``DebugRuleConfigurations`` are given, ``DebugRuleEvaluationStatuses`` come from an
  out-of-job rule evaluator process running beside the job.

StopProcessingJob is served for those rule-evaluation jobs. This module knows the container
contract, not the training script or the workflow.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from unittest import mock

from stabilizer.local.s3files import DirectorySync, download_prefix, join_uri, parse_s3_uri
from stabilizer.local.validation import request_errors

TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
DEFAULT_CHECKPOINT_PATH = "/opt/ml/checkpoints"
OPT_ML = "/opt/ml"
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


class RuleEvaluation(Protocol):
    """An out-of-job evaluator of one job's Debugger rules (the stand-in for Debugger's rule jobs)."""

    def statuses(self) -> list[dict[str, Any]]:
        """DebugRuleEvaluationStatuses entries, one per rule configuration."""
        ...

    def stop(self) -> None: ...


RuleEvaluatorFactory = Callable[["LocalTrainingJob"], RuleEvaluation]


class UnavailableRuleEvaluation:
    """Reports every rule as Error when no out-of-job evaluator is available, instead of hiding it."""

    def __init__(self, job: LocalTrainingJob, reason: str) -> None:
        self._names = [r["RuleConfigurationName"] for r in job.request.get("DebugRuleConfigurations", [])]
        self._reason = reason
        self._time = now()

    def statuses(self) -> list[dict[str, Any]]:
        return [
            {
                "RuleConfigurationName": name,
                "RuleEvaluationStatus": "Error",
                "StatusDetails": self._reason,
                "LastModifiedTime": self._time,
            }
            for name in self._names
        ]

    def stop(self) -> None:
        return None


def decode_hyperparameters(raw: dict[str, str]) -> dict[str, Any]:
    """The training toolkit's reading of hyperparameters.json: each value JSON-decoded when it can be."""
    decoded: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            decoded[key] = json.loads(value)
        except (ValueError, TypeError):
            decoded[key] = value
    return decoded


def _arg_value(value: Any) -> str:
    # The toolkit's to_cmd_args: mappings become k=v pairs, everything else str(); a JSON list
    # therefore reaches the script as its Python repr. The script reads SM_HPS for exact values.
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return str(value)


def to_cmd_args(hyperparameters: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key in sorted(hyperparameters):
        args += [f"--{key}" if len(key) > 1 else f"-{key}", _arg_value(hyperparameters[key])]
    return args


def _env_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass
class LocalTrainingJob:
    """One training job: its request, its directory, its process and its statuses."""

    name: str
    arn: str
    request: dict[str, Any]
    job_dir: Path
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
    checkpoint_sync: DirectorySync | None = None
    rules: RuleEvaluation | None = None
    started_monotonic: float | None = None
    stopping_monotonic: float | None = None
    kill_at_monotonic: float | None = None  # SIGKILL once this passes, while stopping
    ended_monotonic: float | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    done: threading.Event = field(default_factory=threading.Event)

    # Paths inside the job directory, each standing for its /opt/ml counterpart.
    def opt_ml(self, path: str) -> Path:
        """Map a container path under /opt/ml to the job directory."""
        if path == OPT_ML or path.startswith(OPT_ML + "/"):
            return self.job_dir / path[len(OPT_ML) :].lstrip("/")
        return self.job_dir / path.lstrip("/")

    @property
    def log_path(self) -> Path:
        return self.job_dir / "logs" / "training.log"

    @property
    def checkpoint_dir(self) -> Path:
        local = self.request.get("CheckpointConfig", {}).get("LocalPath") or DEFAULT_CHECKPOINT_PATH
        return self.opt_ml(local)

    @property
    def failure_file(self) -> Path:
        return self.job_dir / "output" / "failure"

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
            job = LocalTrainingJob(name=name, arn=arn, request=request, job_dir=self.root / name)
            self.jobs[name] = job
        job.set_secondary("Starting", "Launching requested ML instances", status="InProgress")
        thread = threading.Thread(target=self._run, args=(job,), name=f"training-job-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return {"TrainingJobArn": arn}

    def describe_training_job(self, name: str) -> dict[str, Any]:
        job = self._job(name)
        if job.checkpoint_sync is not None and job.status not in TERMINAL_STATUSES:
            job.checkpoint_sync.sync()
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
            owns = getattr(job.rules, "owns", None)
            if owns is not None and owns(name):
                already = job.rules.stop_processing_job(name)  # type: ignore[union-attr]
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
            self._prepare(job)
            if job.status in TERMINAL_STATUSES:
                return  # failed before training (a channel, the source): the script never starts
            if job.stop_requested is None:
                self._train(job)
            self._finish(job)
        except Exception as exc:  # an emulator fault must still end the job, visibly
            with job.lock:
                if job.status not in TERMINAL_STATUSES:  # never overwrite the job's own ending
                    reason = f"InternalServerError: {type(exc).__name__}: {exc}"
                    job.failure_reason = reason[:FAILURE_REASON_LIMIT]
                    job.set_secondary("Failed", "Training job failed", status="Failed")
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
        request = job.request
        for sub in ("input/config", "input/data", "model", "output/data", "code", "logs"):
            job.opt_ml(sub).mkdir(parents=True, exist_ok=True)
        job.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        job.set_secondary("Downloading", "Downloading input data")
        hyperparameters = request.get("HyperParameters", {})
        channels = {c["ChannelName"]: c for c in request.get("InputDataConfig", [])}
        _write_json(job.opt_ml("input/config/hyperparameters.json"), hyperparameters)
        _write_json(
            job.opt_ml("input/config/inputdataconfig.json"),
            {
                name: {
                    "TrainingInputMode": c.get("InputMode", "File"),
                    "S3DistributionType": c["DataSource"]["S3DataSource"].get(
                        "S3DataDistributionType", "FullyReplicated"
                    ),
                    "RecordWrapperType": c.get("RecordWrapperType", "None"),
                    **({"ContentType": c["ContentType"]} if "ContentType" in c else {}),
                }
                for name, c in channels.items()
                if "S3DataSource" in c.get("DataSource", {})
            },
        )
        _write_json(
            job.opt_ml("input/config/resourceconfig.json"),
            {
                "current_host": "algo-1",
                "hosts": ["algo-1"],
                "current_instance_type": request["ResourceConfig"].get("InstanceType", "local"),
                "current_group_name": "homogeneousCluster",
                "network_interface_name": "eth0",
            },
        )
        for name, channel in channels.items():
            source = channel.get("DataSource", {}).get("S3DataSource")
            if source is None:
                raise_client_error(job, f"channel {name}: only S3DataSource is supported in local mode")
                return
            count = download_prefix(self.s3, source["S3Uri"], job.opt_ml(f"input/data/{name}"))
            if count == 0:
                raise_client_error(
                    job,
                    f'ClientError: No S3 objects found under S3 URL "{source["S3Uri"]}" given in '
                    f"input data source. Please ensure that the bucket exists in the selected region, "
                    f"that objects exist under that S3 prefix, and that the role has access to it.",
                )
                return
        checkpoint = request.get("CheckpointConfig")
        if checkpoint:
            # SageMaker restores the checkpoint prefix into the local path before the script starts.
            download_prefix(self.s3, checkpoint["S3Uri"], job.checkpoint_dir)
            job.checkpoint_sync = DirectorySync(self.s3, job.checkpoint_dir, checkpoint["S3Uri"])
            job.checkpoint_sync.sync()  # files just downloaded are already there
        submit = _plain(hyperparameters.get("sagemaker_submit_directory"))
        program = _plain(hyperparameters.get("sagemaker_program"))
        if not submit or not program:
            raise_client_error(
                job,
                "ClientError: the hyperparameters sagemaker_program and sagemaker_submit_directory "
                "are required by the framework container",
            )
            return
        _extract_source(self.s3, submit, job.opt_ml("code"))
        if not (job.opt_ml("code") / program).is_file():
            raise_client_error(job, f"ClientError: entry point {program} not found in {submit}")
            return
        if request.get("DebugRuleConfigurations"):
            if self.rule_evaluator is None:
                job.rules = UnavailableRuleEvaluation(job, "no out-of-job rule evaluator is installed")
            else:
                job.rules = self.rule_evaluator(job)

    def _environment(self, job: LocalTrainingJob, hyperparameters: dict[str, Any]) -> dict[str, str]:
        request = job.request
        channels = [c["ChannelName"] for c in request.get("InputDataConfig", [])]
        program = _plain(hyperparameters.get("sagemaker_program")) or "train.py"
        user_hps = {k: v for k, v in hyperparameters.items() if not k.startswith("sagemaker_")}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SM_")}
        env.update(self.extra_env)
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "TRAINING_JOB_NAME": job.name,
                "TRAINING_JOB_ARN": job.arn,
                "SM_CURRENT_HOST": "algo-1",
                "SM_HOSTS": '["algo-1"]',
                "SM_NUM_GPUS": "0",
                "SM_NUM_CPUS": str(os.cpu_count() or 1),
                "SM_MODEL_DIR": str(job.opt_ml("model")),
                "SM_INPUT_DIR": str(job.opt_ml("input")),
                "SM_INPUT_CONFIG_DIR": str(job.opt_ml("input/config")),
                "SM_OUTPUT_DIR": str(job.opt_ml("output")),
                "SM_OUTPUT_DATA_DIR": str(job.opt_ml("output/data")),
                "SM_MODULE_DIR": str(job.opt_ml("code")),
                "SM_MODULE_NAME": program.removesuffix(".py"),
                "SM_USER_ENTRY_POINT": program,
                "SM_CHANNELS": json.dumps(sorted(channels)),
                "SM_HPS": json.dumps(user_hps, sort_keys=True),
                "SM_USER_ARGS": json.dumps(to_cmd_args(user_hps)),
                "SM_LOG_LEVEL": "20",
                "STABILIZER_CHECKPOINT_DIR": str(job.checkpoint_dir),
                "STABILIZER_FAILURE_FILE": str(job.failure_file),
                "STABILIZER_TENSOR_DIR": str(job.checkpoint_dir / "tensors"),
            }
        )
        for name in channels:
            env[f"SM_CHANNEL_{name.upper()}"] = str(job.opt_ml(f"input/data/{name}"))
        env["SM_TRAINING_ENV"] = json.dumps(_training_env(job, hyperparameters, channels, program))
        for key, value in user_hps.items():
            env[f"SM_HP_{key.upper()}"] = _env_value(value)
        for key, value in request.get("Environment", {}).items():
            # The request's environment speaks of container paths; they live in the job directory.
            env[key] = value.replace(OPT_ML, str(job.job_dir)) if OPT_ML in value else value
        return env

    def _train(self, job: LocalTrainingJob) -> None:
        hyperparameters = decode_hyperparameters(job.request.get("HyperParameters", {}))
        program = _plain(hyperparameters.get("sagemaker_program"))
        user_hps = {k: v for k, v in hyperparameters.items() if not k.startswith("sagemaker_")}
        command = [self.python, program, *to_cmd_args(user_hps)]
        max_runtime = float(job.request["StoppingCondition"].get("MaxRuntimeInSeconds", 86400))
        with job.lock:
            if job.stop_requested is not None:
                return
            log = job.log_path.open("wb")
            job.process = subprocess.Popen(
                command,
                cwd=job.opt_ml("code"),
                env=self._environment(job, hyperparameters),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: Ctrl-C at the terminal reaches the engine, which interrupts the
                # job itself (interrupt_all).
                start_new_session=True,
            )
            job.started_monotonic = time.monotonic()
            job.training_start_time = now()
            job.set_secondary("Training", "Training image download completed. Training in progress.")
        try:
            self._supervise(job, max_runtime)
        finally:
            log.close()

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
        if job.checkpoint_sync is not None:
            job.checkpoint_sync.sync()
        self._upload_outputs(job)
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
                job.failure_reason = _failure_reason(job)
                job.set_secondary("Failed", "Training job failed", status="Failed")

    def _upload_outputs(self, job: LocalTrainingJob) -> None:
        output = job.request["OutputDataConfig"]["S3OutputPath"]
        base = join_uri(output, job.name, "output")
        model_uri = join_uri(base, "model.tar.gz")
        _upload_tar(self.s3, job.opt_ml("model"), model_uri)
        job.model_artifacts = model_uri
        data_dir = job.opt_ml("output/data")
        if data_dir.is_dir() and any(data_dir.iterdir()):
            _upload_tar(self.s3, data_dir, join_uri(base, "output.tar.gz"))

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


# The hyperparameters the training toolkit consumes itself (sagemaker-training-toolkit,
# sagemaker_training/params.py, SAGEMAKER_HYPERPARAMETERS); any other `sagemaker_*` one, such as
# `sagemaker_stabilizer`, is an "additional framework parameter", kept out of the script's arguments.
TOOLKIT_HYPERPARAMETERS = frozenset(
    {
        "sagemaker_program",
        "sagemaker_submit_directory",
        "sagemaker_enable_cloudwatch_metrics",
        "sagemaker_region",
        "sagemaker_container_log_level",
        "sagemaker_job_name",
        "default_user_module_name",
        "_tuning_objective_metric",
        "sagemaker_s3_output",
    }
)


def _training_env(
    job: LocalTrainingJob, hyperparameters: dict[str, Any], channels: list[str], program: str
) -> dict[str, Any]:
    """The toolkit's SM_TRAINING_ENV: one JSON object with the job's whole environment."""
    return {
        "job_name": job.name,
        "current_host": "algo-1",
        "hosts": ["algo-1"],
        "num_gpus": 0,
        "num_cpus": os.cpu_count() or 1,
        "module_name": program.removesuffix(".py"),
        "user_entry_point": program,
        "module_dir": str(job.opt_ml("code")),
        "model_dir": str(job.opt_ml("model")),
        "input_dir": str(job.opt_ml("input")),
        "input_config_dir": str(job.opt_ml("input/config")),
        "output_dir": str(job.opt_ml("output")),
        "output_data_dir": str(job.opt_ml("output/data")),
        "channel_input_dirs": {name: str(job.opt_ml(f"input/data/{name}")) for name in channels},
        "hyperparameters": {k: v for k, v in hyperparameters.items() if not k.startswith("sagemaker_")},
        "additional_framework_parameters": {
            k: v for k, v in hyperparameters.items() if k.startswith("sagemaker_") and k not in TOOLKIT_HYPERPARAMETERS
        },
        "log_level": 20,
    }


def raise_client_error(job: LocalTrainingJob, reason: str) -> None:
    """End the job as Failed with ``reason`` (the service's way for a bad channel or source)."""
    with job.lock:
        job.failure_reason = reason[:FAILURE_REASON_LIMIT]
        job.set_secondary("Failed", "Training job failed", status="Failed")


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _plain(value: Any) -> str | None:
    """A hyperparameter as the SDK writes it: framework values are JSON-encoded strings."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return decoded if isinstance(decoded, str) else value
    return str(value)


def _as_datetime(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value, tz=dt.UTC)
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def _extract_source(s3: Any, uri: str, dest: Path) -> None:
    bucket, key = parse_s3_uri(uri)
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        archive.extractall(dest, filter="data")


def _upload_tar(s3: Any, directory: Path, uri: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            archive.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
    bucket, key = parse_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=buffer.getvalue())


def _failure_reason(job: LocalTrainingJob) -> str:
    text = ""
    if job.failure_file.is_file():
        text = job.failure_file.read_text(errors="replace").strip()
    if not text:
        text = f"ExecuteUserScriptError: ExitCode {job.exit_code}"
    return f"AlgorithmError: {text}"[:FAILURE_REASON_LIMIT]


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
