"""The train Lambda's decisions: the initial state from the execution input, and the next attempt.

`prepare()` validates the raw input, resolves the job against the deployment (the reference job
when none is given, the default image and instance, the source archive's entry point) and
returns the first state; every problem is an `InvalidInput` naming the field, before anything
is launched. `launch()` returns the CreateTrainingJob request, the state with the new attempt
recorded and the `launched` notification. Calling SageMaker, S3 and SNS is the handler's job;
reading the source archive goes through the `sources` reader it passes in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from stabilizer_contract.job import CONFIG_HYPERPARAMETER
from stabilizer_contract.s3_uris import is_s3_uri
from stabilizer_workflow import notifications
from stabilizer_workflow.errors import InvalidInput, MisconfiguredEnvironment, StateCorrupted
from stabilizer_workflow.execution.distribution import image_problem
from stabilizer_workflow.execution.execution_bounds import execution_problems
from stabilizer_workflow.execution.execution_input import (
    Monitoring,
    RunSpec,
    format_validation_error,
    parse_execution_input,
)
from stabilizer_workflow.execution.job import Job
from stabilizer_workflow.execution.reference import is_reference, reference_job
from stabilizer_workflow.execution.rule_checks import custom_rule_sources
from stabilizer_workflow.execution.service_limits import request_problems
from stabilizer_workflow.execution.state import Attempt, ExecutionRef, WorkflowState
from stabilizer_workflow.launch.access import check_job_access
from stabilizer_workflow.launch.images import default_image, training_image_for
from stabilizer_workflow.launch.requests import (
    build_create_training_job,
    checkpoint_uri,
    configuration_problem,
    hook_problems,
)
from stabilizer_workflow.launch.sources import entry_point_problem
from stabilizer_workflow.notifications import Notification
from stabilizer_workflow.settings import TrainSettings


class ArchiveReader(Protocol):
    """Lists a source archive's members (launch.sources.SourceArchives); None when too large to read."""

    def members(self, uri: str) -> list[str] | None: ...


def _resolve(job: Job, settings: TrainSettings, instance_field: str = "job.instance_type") -> Job:
    """The job with its image and instance type filled in and its locations checked.

    `instance_field` is where the person gave the instance type (`run_spec.instance_type` in the
    older form), so an error names what they typed.
    """
    reference = is_reference(job, settings)
    if not is_s3_uri(job.source) or job.source.endswith("/"):
        raise InvalidInput(
            f"job.source: expected the s3:// URI of a source archive (sourcedir.tar.gz), got {job.source!r} "
            "(a local directory works in local mode only)"
        )
    for name, uri in job.channels.items():
        if not is_s3_uri(uri):
            raise InvalidInput(
                f"job.channels.{name}: expected an s3:// prefix, got {uri!r} (local paths work in local mode only)"
            )
    if not reference and settings.library_s3_uri is None:
        raise MisconfiguredEnvironment(
            "LIBRARY_S3_URI is not set, so the stabilizer library cannot reach a job of your own"
        )
    instance_type = job.instance_type or settings.default_instance_type
    if not isinstance(job.image, str):  # the deployment's framework image, as the SDK would pick it
        problem = image_problem(job.distribution, instance_type)
        if problem:
            raise InvalidInput(problem)
    if job.image is None:  # the deployment's image for this instance; an error names the field the person typed
        image = default_image(instance_type, settings, field=instance_field)
    else:
        image = training_image_for(instance_type, job.image, settings)
    return job.model_copy(update={"image": image, "instance_type": instance_type})


def _check_entry_point(job: Job, sources: ArchiveReader, monitoring: Monitoring) -> None:
    members = sources.members(job.source)
    if members is None:
        return  # too large to read here; SageMaker reports a missing entry point itself
    problem = entry_point_problem(members, job.entry_point, job.source)
    if problem:
        raise InvalidInput(problem)
    for name, path in custom_rule_sources(monitoring.rules).items():  # a custom rule's file travels in the source
        if path not in members:
            raise InvalidInput(f"monitoring.rules ({name}).source_s3_uri: {path!r} is not in {job.source}")


def prepare(
    raw_input: Any, execution: Any, settings: TrainSettings, sources: ArchiveReader | None = None
) -> WorkflowState:
    """Validate the execution input (raises InvalidInput) and build the first state.

    `sources` reads source archives; without it the entry point is not checked against the
    archive. The deployment's own archive (the reference job) is never read: its `train.py` is
    part of the project.
    """
    given = parse_execution_input(raw_input, debugger_rules_enabled=settings.debugger_rules_enabled)
    if not isinstance(execution, dict) or not execution.get("id") or not execution.get("name"):
        raise StateCorrupted("execution: expected {'id': ..., 'name': ...} from the state machine's context")
    if given.job is None:
        spec = given.run_spec or RunSpec()
        try:
            job = reference_job(spec, settings)
        except ValidationError as error:  # a run_spec value the reference job's knobs do not admit
            raise InvalidInput(f"run_spec: {format_validation_error(error)}") from None
        monitoring = given.monitoring or spec.monitoring()
    else:
        job, monitoring = given.job, given.monitoring or Monitoring()
    job = _resolve(job, settings, "job.instance_type" if given.job else "run_spec.instance_type")
    check_job_access(job, settings)  # what the execution role could not read or pull
    too_big = configuration_problem(job, monitoring)
    if too_big:
        raise InvalidInput(too_big)
    if sources is not None and not is_reference(job, settings):
        _check_entry_point(job, sources, monitoring)
    state = WorkflowState(
        execution=ExecutionRef.create(str(execution["id"]), str(execution["name"]), execution.get("start_time")),
        policy=given.policy,
        wait_seconds=given.wait_seconds,
        next_action="launch_new",
        job=job,
        monitoring=monitoring,
        run_spec=dict(job.hyperparameters),
        limits=given.limits,
    )
    # AWS limits the execution and its first request must fit, found now rather than mid-run.
    problems = execution_problems(state) + request_problems(
        build_create_training_job(state, settings, 1), _hyperparameter_sources(given.job is not None, job)
    )
    if settings.debugger_rules_enabled:
        section = "run_spec" if given.job is None and given.monitoring is None and given.run_spec else "monitoring"
        problems += hook_problems(monitoring, section)
    if problems:
        raise InvalidInput("; ".join(problems))
    return state


def _hyperparameter_sources(own_job: bool, job: Job) -> dict[str, str]:
    """The input field behind each hyperparameter of the request, for messages."""
    section = "job.hyperparameters" if own_job else "run_spec"
    return {
        **{name: f"{section}.{name}" for name in job.hyperparameters},
        CONFIG_HYPERPARAMETER: "monitoring",
    }


@dataclass(frozen=True)
class LaunchPlan:
    state: WorkflowState
    request: dict[str, Any]
    attempt: Attempt
    notification: Notification


def launch(state: WorkflowState, settings: TrainSettings, now: datetime) -> LaunchPlan:
    """The next attempt: its request, and the state that records it."""
    if state.next_action != "launch_new" or state.outcome is not None:
        raise StateCorrupted(
            f"next_action: launch needs 'launch_new' and no outcome, got {state.next_action!r} "
            f"(outcome {state.outcome!r})"
        )
    number = len(state.attempts) + 1
    request = build_create_training_job(state, settings, number)
    s = state.model_copy(deep=True)
    attempt = Attempt(
        number=number,
        job_name=request["TrainingJobName"],
        run_spec=dict(s.run_spec),
        checkpoint_s3_uri=checkpoint_uri(settings.bucket, s.execution.name, number),
        resumed_from=s.resume_from,
        started_at=now,
    )
    s.attempts.append(attempt)
    s.history.latest_job_name = attempt.job_name
    s.next_action = "monitor"
    s.job_status = "InProgress"
    s.rule_status = None
    s.resume_from = None
    return LaunchPlan(s, request, attempt, notifications.launched(s, attempt))
