"""One local training job's life: the statuses the service reports, and its process from start to end.

A job goes ``Starting``, ``Downloading`` (its container is laid out and provisioned), ``Training``
(the script runs), ``Uploading``, then ``Completed``, ``Failed`` or ``Stopped``; every change is
a ``SecondaryStatusTransitions`` entry, as DescribeTrainingJob reports them. How the script's
world is set up is ``stabilizer.local.emulator.container``'s part; the API that creates, describes and
stops jobs is ``stabilizer.local.emulator.sagemaker``'s.

- a job that fails before training (an empty channel, a missing entry point) ends ``Failed`` with
  that reason at once, as the service does: the script is not started;
- a stop behaves as in SageMaker's framework containers: the job is ``Stopping``, the training
  script is sent nothing (the training toolkit that runs it as PID 1's child does not forward
  SIGTERM: aws/sagemaker-training-toolkit issues), and it is killed (SIGKILL) once the grace
  period (120 s, as SageMaker's) is over, then ``Stopped``. No final checkpoint is written at a
  stop; ``MaxRuntimeInSeconds`` is enforced the same way. A local Ctrl-C is the one stop that
  signals the script: SIGTERM to its process group, as ``docker stop`` does;
- ``FailureReason`` comes from the failure file; ``FinalMetricDataList`` from the job's log and
  its ``MetricDefinitions``;
- while the script runs, every line of every host's log that a ``MetricDefinitions`` regex
  matches is sent to CloudWatch as SageMaker sends it (``JobHost.metrics``: namespace
  ``/aws/sagemaker/TrainingJobs``, dimension ``TrainingJobName``, the time the line was read),
  about once a second: the job's metric stream, which the monitor reads for its hang check;
- a job of several instances runs one container per host, each its own process group: it
  completes when every host's script exits 0; the first host whose script fails fails the job
  (its failure file is the reason) and the other hosts are killed ``host_failure_grace_seconds``
  later (10 s: time for rank 0 to finish writing its findings); a stop or an interrupt reaches
  every host; checkpoints are mirrored from every host, the model and the log are the first
  host's (``algo-1``, where rank 0 runs);
- when ``DebugRuleConfigurations`` are given, the rule evaluation starts once the job has its
  data and source, and stops when the job ends.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabilizer.local.emulator.container import Container, ContainerError
from stabilizer.local.emulator.rule_jobs import RuleEvaluation, RuleEvaluatorFactory, UnavailableRuleEvaluation

TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
# StopTrainingJob "delays job termination for 120 seconds" after SIGTERM to the container
# (StopTrainingJob API reference); the script itself never sees that SIGTERM in the framework
# containers, so all it gets is the kill at the end of the window.
SAGEMAKER_STOP_GRACE_SECONDS = 120.0
# A local Ctrl-C gives the script this long to exit after SIGTERM before it is killed: it ends at
# the end of its current step, which on a busy laptop can take many seconds.
LOCAL_INTERRUPT_GRACE_SECONDS = 60.0
# How often the job's new log lines are read for its metric stream.
METRIC_PUBLISH_SECONDS = 1.0
# Once one host of a multi-instance job failed, the others are killed this much later.
HOST_FAILURE_GRACE_SECONDS = 10.0
FAILURE_REASON_LIMIT = 1024


def now() -> dt.datetime:
    return dt.datetime.now(tz=dt.UTC)


@dataclass(frozen=True)
class JobHost:
    """What the machine gives every job: S3, the interpreter, the environment added to the
    script's, the rule evaluator, the stop's grace period and who hears of each job's end."""

    s3: Any
    python: str = sys.executable
    extra_env: dict[str, str] = field(default_factory=dict)
    rule_evaluator: RuleEvaluatorFactory | None = None
    stop_grace_seconds: float = SAGEMAKER_STOP_GRACE_SECONDS
    host_failure_grace_seconds: float = HOST_FAILURE_GRACE_SECONDS
    # Called once a job reached Completed, Failed or Stopped: the local stand-in for the
    # "SageMaker Training Job State Change" event EventBridge delivers in the cloud.
    on_job_end: Callable[[LocalTrainingJob], None] | None = None
    # Why SageMaker could not run a request as its execution role (strict mode: the image it
    # cannot pull, an output path it cannot write), or None; the job then fails before training.
    admission: Callable[[dict[str, Any]], str | None] | None = None
    # Where the matches of the job's MetricDefinitions go (CloudWatch's PutMetricData: name, value,
    # timestamp, dimensions), or nowhere.
    metrics: Callable[[list[dict[str, Any]]], None] | None = None


@dataclass
class LocalTrainingJob:
    """One training job: its request, its container, its process and its statuses."""

    name: str
    arn: str
    request: dict[str, Any]
    container: Container  # the first host's (algo-1): its log, its checkpoint directory
    hosts: list[Container] = field(default_factory=list)  # every host's, the first one first
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
    process: subprocess.Popen[bytes] | None = None  # the first host's
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    failed_host: str | None = None
    stop_requested: str | None = None  # the secondary status the stop ends in
    rules: RuleEvaluation | None = None
    started_monotonic: float | None = None
    stopping_monotonic: float | None = None
    kill_at_monotonic: float | None = None  # SIGKILL once this passes, while stopping
    ended_monotonic: float | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    done: threading.Event = field(default_factory=threading.Event)
    log_read: dict[str, int] = field(default_factory=dict)  # host -> bytes of its log read for metrics

    def __post_init__(self) -> None:
        if not self.hosts:
            self.hosts = [self.container]

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

    # ---------------------------------------------------------------- statuses
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

    def request_stop(
        self, ends_in: str, message: str, *, grace_seconds: float, signal_to_send: int | None = None
    ) -> None:
        """Stopping: as SageMaker, the script gets no signal (unless ``signal_to_send``); it is
        killed after ``grace_seconds``. Call with the job's lock held."""
        self.stop_requested = ends_in
        self.stopping_monotonic = time.monotonic()
        self.kill_at_monotonic = self.stopping_monotonic + grace_seconds
        self.set_secondary("Stopping", message, status="Stopping")
        if signal_to_send is not None:
            for process in self.processes:
                if process.poll() is None:
                    _signal_group(process, signal_to_send)

    # ---------------------------------------------------------------- the life, on its own thread
    def run(self, host: JobHost) -> None:
        """From ``Starting`` to the end: prepare, train, upload, end; ``done`` is set after."""
        try:
            try:
                self._prepare(host)
            except ContainerError as error:
                self.fail(str(error))  # failed before training (a channel, the source): no script
                return
            if self.stop_requested is None:
                self._train(host)
            self._finish(host)
        except Exception as exc:  # an emulator fault must still end the job, visibly
            with self.lock:
                if self.status not in TERMINAL_STATUSES:  # never overwrite the job's own ending
                    self.fail(f"InternalServerError: {type(exc).__name__}: {exc}")
        finally:
            if self.rules is not None:
                self.rules.stop()
            if self.training_end_time is None:
                self.training_end_time = now()
            self.done.set()
            self._announce_end(host)

    def _announce_end(self, host: JobHost) -> None:
        if host.on_job_end is None:
            return
        try:
            host.on_job_end(self)
        except Exception as exc:  # like EventBridge: a failed delivery does not change the job
            print(f"training job {self.name}: end event not delivered: {type(exc).__name__}: {exc}",
                  file=sys.stderr)

    def _prepare(self, host: JobHost) -> None:
        refusal = host.admission(self.request) if host.admission else None
        if refusal:
            raise ContainerError(refusal)
        for container in self.hosts:
            container.lay_out()
        self.set_secondary("Downloading", "Downloading input data")
        for container in self.hosts:
            container.provision(host.s3)
        if self.request.get("DebugRuleConfigurations"):
            if host.rule_evaluator is None:
                self.rules = UnavailableRuleEvaluation(self.container, "no out-of-job rule evaluator is installed")
            else:
                self.rules = host.rule_evaluator(self.name, self.container)

    def _train(self, host: JobHost) -> None:
        max_runtime = float(self.request["StoppingCondition"].get("MaxRuntimeInSeconds", 86400))
        with self.lock:
            if self.stop_requested is not None:
                return
            self.processes = [
                container.start(host.python, job_name=self.name, job_arn=self.arn, extra_env=host.extra_env)
                for container in self.hosts
            ]
            self.process = self.processes[0]
            self.started_monotonic = time.monotonic()
            self.training_start_time = now()
            self.set_secondary("Training", "Training image download completed. Training in progress.")
        self._supervise(max_runtime, host.stop_grace_seconds, host.host_failure_grace_seconds, host.metrics)

    def _supervise(
        self,
        max_runtime: float,
        stop_grace_seconds: float,
        host_failure_grace: float,
        metrics: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        assert self.processes
        killed_at: float | None = None
        first_failure_at: float | None = None
        published_at = 0.0
        while True:
            if metrics is not None and time.monotonic() - published_at >= METRIC_PUBLISH_SECONDS:
                self.publish_metrics(metrics)
                published_at = time.monotonic()
            codes = [process.poll() for process in self.processes]
            if all(code is not None for code in codes):
                failed = [(i, code) for i, code in enumerate(codes) if code != 0]
                if self.failed_host is None and failed:
                    self.failed_host = self.hosts[failed[0][0]].host
                    self.exit_code = failed[0][1]
                elif self.failed_host is None:
                    self.exit_code = 0
                break
            if first_failure_at is None and any(code not in (None, 0) for code in codes):
                # The first host whose script failed fails the job; the others are torn down.
                index = next(i for i, code in enumerate(codes) if code not in (None, 0))
                self.failed_host, self.exit_code = self.hosts[index].host, codes[index]
                first_failure_at = time.monotonic()
            time.sleep(0.2)
            elapsed = self.seconds
            with self.lock:
                if self.stop_requested is None and elapsed > max_runtime:
                    self.request_stop("MaxRuntimeExceeded", "Training job reached MaxRuntimeInSeconds",
                                      grace_seconds=stop_grace_seconds)
                kill_at = self.kill_at_monotonic
            if first_failure_at is not None:
                torn_down = first_failure_at + host_failure_grace
                kill_at = torn_down if kill_at is None else min(kill_at, torn_down)
            grace_over = kill_at is not None and time.monotonic() >= kill_at
            if grace_over and killed_at is None:
                for process in self.processes:
                    _signal_group(process, signal.SIGKILL)
                killed_at = time.monotonic()
        self.ended_monotonic = time.monotonic()
        self.training_end_time = now()
        if metrics is not None:
            self.publish_metrics(metrics)

    def _finish(self, host: JobHost) -> None:
        if self.status in TERMINAL_STATUSES:
            return
        self.set_secondary("Uploading", "Uploading generated training model")
        for container in self.hosts:
            container.sync_checkpoints()
        self.model_artifacts = self.container.upload_outputs(host.s3, self.name)
        self.final_metrics = self._final_metrics()
        with self.lock:
            if self.stop_requested is not None:
                reason = self.stop_requested
                message = (
                    "Training job stopped because it exceeded MaxRuntimeInSeconds"
                    if reason == "MaxRuntimeExceeded"
                    else "Training job stopped"
                )
                self.set_secondary(reason, message, status="Stopped")
            elif self.exit_code == 0:
                self.set_secondary("Completed", "Training job completed", status="Completed")
            else:
                failing = next((c for c in self.hosts if c.host == self.failed_host), self.container)
                self.fail(failing.failure_reason(self.exit_code))

    def publish_metrics(self, send: Callable[[list[dict[str, Any]]], None]) -> int:
        """Send the metric definitions' matches in the complete lines each host logged since the last
        call, stamped now; returns how many. Non-finite values are not sent (CloudWatch refuses them)."""
        definitions = []
        for definition in self.request["AlgorithmSpecification"].get("MetricDefinitions", []):
            with contextlib.suppress(re.error):
                definitions.append((definition["Name"], re.compile(definition["Regex"])))
        if not definitions:
            return 0
        stamp = now()
        data = []
        for container in self.hosts:
            path = container.log_path
            start = self.log_read.get(container.host, 0)
            try:
                with path.open("rb") as log:
                    log.seek(start)
                    chunk = log.read()
            except OSError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.log_read[container.host] = start + len(complete)
            for line in complete.decode(errors="replace").splitlines():
                for name, pattern in definitions:
                    for match in pattern.findall(line):
                        with contextlib.suppress(ValueError):
                            value = float(match[0] if isinstance(match, tuple) else match)
                            if math.isfinite(value):
                                data.append({"MetricName": name, "Value": value, "Timestamp": stamp,
                                             "Dimensions": [{"Name": "TrainingJobName", "Value": self.name}]})
        if data:
            send(data)
        return len(data)

    def _final_metrics(self) -> list[dict[str, Any]]:
        """The last value of each MetricDefinitions regex in the job's log, as SageMaker reports them."""
        definitions = self.request["AlgorithmSpecification"].get("MetricDefinitions", [])
        if not definitions or not self.log_path.is_file():
            return []
        text = self.log_path.read_text(errors="replace")
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
            metrics.append(
                {"MetricName": definition["Name"], "Value": value, "Timestamp": self.training_end_time or now()}
            )
        return metrics


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
