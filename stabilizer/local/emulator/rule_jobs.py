"""The out-of-job rule evaluators beside a local training job (Debugger's rule jobs, locally).

When a job asks for Debugger built-in rules (``DebugRuleConfigurations``), SageMaker runs one
rule-evaluation processing job per rule beside the training job and reports
``DebugRuleEvaluationStatuses``. Locally, each rule is one process of the rule engine's evaluator
(``python -m stabilizer_sentinel.evaluator``, from the job's own source directory) following the tensor
store the job writes. This module starts and stops those processes and translates their status
files into the shapes DescribeTrainingJob reports (every rule ``Error``, with the reason, where no
evaluator can run); it must not evaluate rules itself.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stabilizer.local.emulator.container import Container

# After the training process ends, an evaluator that has not seen the end-of-job marker gets this
# long to catch up before it is stopped.
FINISH_GRACE_SECONDS = 15.0
PROCESSING_JOB_NAME_MAX = 63


class RuleEvaluation(Protocol):
    """An out-of-job evaluator of one job's Debugger rules (the stand-in for Debugger's rule jobs)."""

    def statuses(self) -> list[dict[str, Any]]:
        """DebugRuleEvaluationStatuses entries, one per rule configuration."""
        ...

    def owns(self, name: str) -> bool:
        """Whether the processing job ``name`` is one of these rule jobs."""
        ...

    def stop_processing_job(self, name: str) -> str | None:
        """StopProcessingJob: None when stopped, else the status it is already in."""
        ...

    def stop(self) -> None: ...


# Starts the rule evaluation of one training job, given its name and its container.
RuleEvaluatorFactory = Callable[[str, Container], RuleEvaluation]


class UnavailableRuleEvaluation:
    """Reports every rule as Error when no out-of-job evaluator is available, instead of hiding it."""

    def __init__(self, container: Container, reason: str) -> None:
        self._names = [r["RuleConfigurationName"] for r in container.request.get("DebugRuleConfigurations", [])]
        self._reason = reason
        self._time = dt.datetime.now(tz=dt.UTC)

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

    def owns(self, name: str) -> bool:
        return False  # no processing job was started

    def stop_processing_job(self, name: str) -> str | None:
        raise KeyError(name)

    def stop(self) -> None:
        return None


def processing_job_name(training_job: str, rule: str) -> str:
    """Debugger's naming: ``<training job>-<rule>-<hash>``, cut to SageMaker's 63 characters."""
    digest = hashlib.sha256(f"{training_job}/{rule}".encode()).hexdigest()[:8]
    head = f"{training_job}-{rule}"[: PROCESSING_JOB_NAME_MAX - 9].rstrip("-")
    return f"{head}-{digest}"


def rule_list_entry(configuration: dict[str, Any]) -> dict[str, Any]:
    """A DebugRuleConfiguration as an entry of the rule list (docs/contracts.md section 3)."""
    parameters = dict(configuration.get("RuleParameters") or {})
    name = parameters.pop("rule_to_invoke", None) or configuration["RuleConfigurationName"]
    return {"name": name, "parameters": parameters}


def _timestamp(text: Any) -> dt.datetime:
    if isinstance(text, str) and text:
        with contextlib.suppress(ValueError):
            return dt.datetime.fromisoformat(text)
    return dt.datetime.now(tz=dt.UTC)


@dataclass
class _RuleProcess:
    configuration_name: str
    job_name: str
    arn: str
    status_file: Path
    process: subprocess.Popen[bytes] | None
    stop_requested: bool = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def status(self) -> dict[str, Any]:
        entry: dict[str, Any] = {}
        with contextlib.suppress(FileNotFoundError, ValueError):
            document = json.loads(self.status_file.read_text())
            entries = document.get("DebugRuleEvaluationStatuses") or []
            entry = entries[0] if entries else {}
        status = entry.get("RuleEvaluationStatus", "InProgress")
        details = entry.get("StatusDetails")
        if status == "InProgress" and self.stop_requested:
            status = "Stopping" if self.running else "Stopped"
        elif status == "InProgress" and self.process is not None and not self.running:
            code = self.process.returncode
            status, details = "Error", f"InternalServerError: the rule evaluator exited with code {code}"
        result = {
            "RuleConfigurationName": self.configuration_name,
            "RuleEvaluationJobArn": self.arn,
            "RuleEvaluationStatus": status,
            "LastModifiedTime": _timestamp(entry.get("LastModifiedTime")),
        }
        if details:
            result["StatusDetails"] = details
        return result

    def signal(self, sig: int) -> None:
        if self.running and self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)


class ProcessRuleEvaluation:
    """One evaluator process per rule configuration of a training job."""

    def __init__(
        self,
        training_job: str,
        container: Container,
        *,
        python: str,
        region: str,
        account: str,
        poll_seconds: float = 1.0,
        finish_grace_seconds: float = FINISH_GRACE_SECONDS,
    ) -> None:
        self.finish_grace_seconds = finish_grace_seconds
        self._lock = threading.Lock()
        directory = container.job_dir / "rules"
        directory.mkdir(parents=True, exist_ok=True)
        tensors = _tensor_dir(container)
        self.processes: list[_RuleProcess] = []
        for configuration in container.request.get("DebugRuleConfigurations", []):
            name = configuration["RuleConfigurationName"]
            job_name = processing_job_name(training_job, name)
            status_file = directory / f"{name}.status.json"
            rules_file = directory / f"{name}.rules.json"
            rules_file.write_text(json.dumps([rule_list_entry(configuration)]))
            log = (directory / f"{name}.log").open("wb")
            process = subprocess.Popen(
                [
                    python,
                    "-m",
                    "stabilizer_sentinel.evaluator",
                    "--tensors",
                    str(tensors),
                    "--rules",
                    f"@{rules_file}",
                    "--status-file",
                    str(status_file),
                    "--poll-seconds",
                    str(poll_seconds),
                ],
                cwd=container.opt_ml("code"),
                env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            self.processes.append(
                _RuleProcess(
                    configuration_name=name,
                    job_name=job_name,
                    arn=f"arn:aws:sagemaker:{region}:{account}:processing-job/{job_name.lower()}",
                    status_file=status_file,
                    process=process,
                )
            )

    def statuses(self) -> list[dict[str, Any]]:
        return [p.status() for p in self.processes]

    def stop_processing_job(self, name: str) -> str | None:
        """StopProcessingJob for one rule job (names compare as SageMaker's ARNs do, ignoring case).

        Returns None when it was stopped, else the status it is already in.
        """
        for rule in self.processes:
            if rule.job_name.lower() == name.lower():
                if rule.stop_requested or not rule.running:  # the evaluator may still be exiting
                    return rule.status()["RuleEvaluationStatus"]
                rule.stop_requested = True
                rule.signal(signal.SIGTERM)
                return None
        raise KeyError(name)

    def owns(self, name: str) -> bool:
        return any(rule.job_name.lower() == name.lower() for rule in self.processes)

    def stop(self) -> None:
        """The training job ended: let each evaluator finish reading, then stop the stragglers."""
        for rule in self.processes:
            if rule.process is None:
                continue
            try:
                rule.process.wait(self.finish_grace_seconds)
            except subprocess.TimeoutExpired:
                rule.stop_requested = True
                rule.signal(signal.SIGTERM)
                try:
                    rule.process.wait(10)
                except subprocess.TimeoutExpired:
                    rule.signal(signal.SIGKILL)


def _tensor_dir(container: Container) -> Path:
    configured = container.request.get("Environment", {}).get("STABILIZER_TENSOR_DIR")
    return container.opt_ml(configured) if configured else container.checkpoint_dir / "tensors"


def rule_evaluator_factory(*, python: str, region: str, account: str) -> RuleEvaluatorFactory:
    """Start evaluators for a job, or report every rule as Error when its source has no evaluator."""

    def start(training_job: str, container: Container) -> RuleEvaluation:
        if not (container.opt_ml("code") / "stabilizer_sentinel" / "evaluator.py").is_file():
            return UnavailableRuleEvaluation(container, "the source directory has no stabilizer_sentinel/evaluator.py")
        return ProcessRuleEvaluation(training_job, container, python=python, region=region, account=account)

    return start
