"""The four events the watch function receives, parsed into typed models at its edge.

From the state machine (its own payloads, docs/contracts.md section 5):
- `AwaitJobChange`: `{"action": "await", "token", "state"}` from the `AwaitJobChange` task;
- `StopFailedLaunch`: `{"action": "stop_launch", "state"}` from `StopJobOfFailedLaunch`.

From EventBridge, read through Powertools' EventBridge envelope (`aws_lambda_powertools.utilities.
parser.envelopes.EventBridgeEnvelope`: it validates the envelope, `version`, `id`, `detail-type`,
`source`, `account`, `time`, `region`, `resources`, and hands `detail` to the model):
- `TrainingJobStateChange`, the `detail` of "SageMaker Training Job State Change": AWS's page
  "Events that Amazon SageMaker AI sends to Amazon EventBridge", section "Training job state
  change", and the EventBridge schema `aws.sagemaker@SageMakerTrainingJobStateChange`
  (tests/events/sagemaker-training-job-state-change.json);
- `ExecutionStatusChange`, the `detail` of "Step Functions Execution Status Change": the Step
  Functions developer guide, "EventBridge (CloudWatch Events) for Step Functions execution status
  changes" (tests/events/step-functions-execution-status-change.json).

The members the watch function reads are typed; the others AWS documents are declared, optional,
and loosely typed (a member the function does not read never refuses an event); unknown members
are kept. A malformed event raises `StateCorrupted`, naming the field and what was expected.

Powertools' parser is imported on the first EventBridge event, not at the cold start: importing it
builds every model Powertools ships (about 100 ms of CPU, `python -X importtime`), which the
state machine's own payloads do not need.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stabilizer_workflow.errors import StateCorrupted
from stabilizer_workflow.execution.execution_input import format_validation_error
from stabilizer_workflow.execution.state import WorkflowState

JOB_EVENT = "SageMaker Training Job State Change"
EXECUTION_EVENT = "Step Functions Execution Status Change"


class AwaitJobChange(BaseModel):
    """Park the execution until its job ends: keep `token` beside the current attempt."""

    model_config = ConfigDict(extra="allow")

    action: Literal["await"]
    token: str | None = None
    state: WorkflowState

    @model_validator(mode="after")
    def _token_given(self) -> AwaitJobChange:
        if not self.token:
            raise ValueError("token: expected the task token ($$.Task.Token) of AwaitJobChange")
        return self


class StopFailedLaunch(BaseModel):
    """`LaunchTrainingJob` failed: `state` is the state the launch started from."""

    model_config = ConfigDict(extra="allow")

    action: Literal["stop_launch"]
    state: WorkflowState


class _AwsModel(BaseModel):
    # AWS's member names (TrainingJobName, executionArn) are the aliases; unknown members are kept.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class OutputDataConfig(_AwsModel):
    s3_output_path: str | None = Field(None, alias="S3OutputPath")
    kms_key_id: str | None = Field(None, alias="KmsKeyId")


class Tag(_AwsModel):
    key: str = Field(alias="Key")
    value: str = Field(alias="Value")


class TrainingJobStateChange(_AwsModel):
    """The `detail` of "SageMaker Training Job State Change": part of the job's DescribeTrainingJob
    response, with the times as epoch milliseconds and `Tags` a map; never `CheckpointConfig`."""

    training_job_name: str = Field(alias="TrainingJobName")
    training_job_status: str = Field(alias="TrainingJobStatus")
    training_job_arn: str | None = Field(None, alias="TrainingJobArn")
    secondary_status: str | None = Field(None, alias="SecondaryStatus")
    failure_reason: str | None = Field(None, alias="FailureReason")  # a Failed job's, per the page
    output_data_config: OutputDataConfig | None = Field(None, alias="OutputDataConfig")
    # A map in the event (the page's example); DescribeTrainingJob's list of Key/Value is read too.
    tags: dict[str, str] | list[Tag] | None = Field(None, alias="Tags")
    hyper_parameters: dict[str, Any] | None = Field(None, alias="HyperParameters")
    algorithm_specification: dict[str, Any] | None = Field(None, alias="AlgorithmSpecification")
    role_arn: str | None = Field(None, alias="RoleArn")
    input_data_config: list[Any] | None = Field(None, alias="InputDataConfig")
    resource_config: dict[str, Any] | None = Field(None, alias="ResourceConfig")
    vpc_config: dict[str, Any] | None = Field(None, alias="VpcConfig")
    stopping_condition: dict[str, Any] | None = Field(None, alias="StoppingCondition")
    model_artifacts: dict[str, Any] | None = Field(None, alias="ModelArtifacts")
    creation_time: Any = Field(None, alias="CreationTime")
    training_start_time: Any = Field(None, alias="TrainingStartTime")
    training_end_time: Any = Field(None, alias="TrainingEndTime")
    last_modified_time: Any = Field(None, alias="LastModifiedTime")
    secondary_status_transitions: list[Any] | None = Field(None, alias="SecondaryStatusTransitions")

    @property
    def tag_map(self) -> dict[str, str]:
        if isinstance(self.tags, list):
            return {tag.key: tag.value for tag in self.tags}
        return dict(self.tags or {})

    @property
    def output_path(self) -> str | None:
        return self.output_data_config.s3_output_path if self.output_data_config else None


class ExecutionStatusChange(_AwsModel):
    """The `detail` of "Step Functions Execution Status Change": DescribeExecution's members, without
    the error and cause (the watch function asks DescribeExecution for those)."""

    execution_arn: str = Field(alias="executionArn")
    name: str
    status: str  # RUNNING, SUCCEEDED, FAILED, TIMED_OUT or ABORTED (the rule lets the last three through)
    state_machine_arn: str | None = Field(None, alias="stateMachineArn")
    start_date: int | None = Field(None, alias="startDate")  # epoch milliseconds
    stop_date: int | None = Field(None, alias="stopDate")
    # Left out when too large for EventBridge (inputDetails / outputDetails say so).
    input: str | None = None
    output: str | None = None
    input_details: dict[str, Any] | None = Field(None, alias="inputDetails")
    output_details: dict[str, Any] | None = Field(None, alias="outputDetails")


WatchEvent = AwaitJobChange | StopFailedLaunch | TrainingJobStateChange | ExecutionStatusChange
ACTIONS: dict[str, type[AwaitJobChange] | type[StopFailedLaunch]] = {
    "await": AwaitJobChange, "stop_launch": StopFailedLaunch,
}
DETAILS: dict[str, type[TrainingJobStateChange] | type[ExecutionStatusChange]] = {
    JOB_EVENT: TrainingJobStateChange, EXECUTION_EVENT: ExecutionStatusChange,
}


def parse_watch_event(event: Any) -> WatchEvent:
    """The event as one of the four models; `StateCorrupted` naming the field when it is malformed."""
    if not isinstance(event, dict):
        raise StateCorrupted(f"event: expected a JSON object, got {type(event).__name__}")
    action, detail_type = event.get("action"), event.get("detail-type")  # which event it is
    if action in ACTIONS:
        try:
            return ACTIONS[action].model_validate(event)
        except ValidationError as error:
            raise StateCorrupted(format_validation_error(error)) from None
    if detail_type in DETAILS:
        return _parse_eventbridge(event, DETAILS[detail_type])
    raise StateCorrupted(
        f"event: expected action 'await' or 'stop_launch', or the EventBridge events {JOB_EVENT!r} or "
        f"{EXECUTION_EVENT!r}"
    )


def _parse_eventbridge(
    event: dict[str, Any], model: type[TrainingJobStateChange] | type[ExecutionStatusChange]
) -> TrainingJobStateChange | ExecutionStatusChange:
    from aws_lambda_powertools.utilities.parser import envelopes, parse

    try:
        return parse(event=event, model=model, envelope=envelopes.EventBridgeEnvelope)
    except ValidationError as error:
        if error.title == model.__name__:  # the envelope's errors name the event's members, the model's its detail's
            error = ValidationError.from_exception_data(error.title, [_in_detail(item) for item in error.errors()])
        raise StateCorrupted(format_validation_error(error)) from None


def _in_detail(item: Any) -> Any:
    return {"type": item["type"], "loc": ("detail", *item["loc"]), "input": item["input"],
            **({"ctx": item["ctx"]} if "ctx" in item else {})}
