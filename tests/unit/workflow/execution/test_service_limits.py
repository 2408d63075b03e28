"""AWS limits caught at input, naming the field: the execution's timeout and history quota,
SageMaker's hyperparameter and tag limits; and the Lambda's per-invocation time budget."""

from __future__ import annotations

from dataclasses import dataclass

import botocore.session
import pytest
from botocore.stub import Stubber

from stabilizer_workflow import aws
from stabilizer_workflow.aws import sagemaker as aws_sagemaker
from stabilizer_workflow.errors import InvalidInput, TransientAwsError
from stabilizer_workflow.execution import execution_bounds, service_limits
from stabilizer_workflow.launch.attempts import prepare
from stabilizer_workflow.launch.requests import build_create_training_job
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import ENV, EXECUTION


def test_limits_are_sagemakers_own():
    model = botocore.session.get_session().get_service_model("sagemaker")
    assert model.shape_for("HyperParameterValue").metadata["max"] == service_limits.HYPERPARAMETER_VALUE_MAX
    tag = model.shape_for("TagValue").metadata
    assert tag["max"] == service_limits.TAG_VALUE_MAX
    assert tag["pattern"] == r"([\p{L}\p{Z}\p{N}_.:/=+\-@]*)"


def test_the_defaults_fit_the_execution_and_its_history(settings):
    state = prepare({}, EXECUTION, settings)
    assert execution_bounds.history_events(state) < service_limits.HISTORY_EVENT_QUOTA // 2
    assert execution_bounds.longest_execution_seconds(state) < service_limits.EXECUTION_TIMEOUT_SECONDS


def test_too_many_checks_for_the_history_quota_are_refused_naming_the_field(settings):
    with pytest.raises(InvalidInput) as error:
        prepare({"wait_seconds": 1, "limits": {"max_monitor_transitions": 3600}}, EXECUTION, settings)
    message = str(error.value)
    assert message.startswith("limits.max_monitor_transitions: 3600 checks")
    assert "25,000" in message and "at most 1601 checks fit" in message
    # The largest value it names is accepted, one more is not.
    prepare({"wait_seconds": 1, "limits": {"max_monitor_transitions": 1601}}, EXECUTION, settings)
    with pytest.raises(InvalidInput):
        prepare({"wait_seconds": 1, "limits": {"max_monitor_transitions": 1602}}, EXECUTION, settings)


def test_checks_that_could_outlive_the_execution_timeout_are_refused(settings):
    with pytest.raises(InvalidInput, match=r"^wait_seconds x limits\.max_monitor_transitions: 3600 s x 1500"):
        prepare({"wait_seconds": 3600, "limits": {"max_monitor_transitions": 1500}}, EXECUTION, settings)


def test_an_execution_name_sagemaker_cannot_tag_is_refused_before_launch(settings):
    for name in ("retry(2)", "now!", "it's"):
        with pytest.raises(InvalidInput, match=r"^execution name .*cannot be a SageMaker tag value"):
            prepare({}, {**EXECUTION, "name": name}, settings)
    prepare({}, {**EXECUTION, "name": "run_2026-11-23.a+b=c@d"}, settings)


@pytest.mark.parametrize(
    ("name", "refused"),
    [
        ("my run", "Step Functions refuses ' '"),  # StartExecution's documentation: "A name must not contain"
        ("run[1]", "Step Functions refuses '['"),
        ("a/b", "Step Functions refuses '/'"),
        ("n" * 81, "1 to 80 characters, got 81"),  # botocore's states model: Name, max 80
        ("", "1 to 80 characters, got 0"),
        ("retry(2)", "a SageMaker tag value holds letters"),  # Step Functions takes it; the job's tag does not
    ],
)
def test_an_execution_name_step_functions_or_a_tag_would_refuse_is_named(name, refused):
    assert refused in service_limits.execution_name_problem(name)


def test_execution_names_both_take_pass():
    for name in ("live2", "run_2026-11-23.a+b=c@d", "local-20261207-231500-ab12", "ünïcode-1"):
        assert service_limits.execution_name_problem(name) is None
    model = botocore.session.get_session().get_service_model("stepfunctions")
    assert model.operation_model("StartExecution").input_shape.members["name"].metadata["max"] == \
        service_limits.EXECUTION_NAME_MAX


def test_a_hyperparameter_over_2500_characters_is_refused_naming_its_field(settings):
    # Valid rules (each passes the catalogue) and collections that together outgrow one value.
    from stabilizer_contract.catalogue import CATALOGUE

    names = [name for name, entry in CATALOGUE.items()
             if entry.runs_in == "engine" and not entry.one_of and "tensor_regex" in entry.param_index]
    rules = [{"name": n, "parameters": {"tensor_regex": "x" * 250}} for n in names]
    capture = {f"collection_{index:02d}_{'c' * 80}": {"save_interval": 10} for index in range(10)}
    with pytest.raises(InvalidInput) as error:
        prepare({"run_spec": {"rules": rules, "capture": capture}}, EXECUTION, settings)
    assert str(error.value).startswith("monitoring: the rules, capture settings and loss regex take ")
    assert "SageMaker allows at most 2,500" in str(error.value)


def test_warm_pool_keeps_the_instance_for_the_next_attempt():
    settings = TrainSettings.from_env({**ENV, "WARM_POOL_SECONDS": "900"})
    request = build_create_training_job(prepare({}, EXECUTION, settings), settings, 1)
    assert request["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900
    plain = TrainSettings.from_env(ENV)
    assert "KeepAlivePeriodInSeconds" not in build_create_training_job(prepare({}, EXECUTION, plain), plain, 1)[
        "ResourceConfig"]


@dataclass
class Context:
    remaining_ms: int

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def test_a_call_that_could_outlast_the_invocation_is_not_started(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    aws_sagemaker.get_sagemaker.cache_clear()
    client = aws_sagemaker.get_sagemaker()
    try:
        with Stubber(client) as stub:
            stub.add_response("stop_training_job", {}, {"TrainingJobName": "stabilizer-x-1"})
            stub.add_response("stop_training_job", {}, {"TrainingJobName": "stabilizer-x-1"})
            aws.invocation_deadline(Context(900_000))
            assert aws_sagemaker.TrainingJobs(client).stop("stabilizer-x-1") is True
            # With less left than one worst-case call, the call is refused as a transient error,
            # which the state machine retries, instead of Lambda killing the invocation mid-way.
            aws.invocation_deadline(Context(int((aws.worst_case_call_seconds() + 1) * 1000)))
            with pytest.raises(TransientAwsError, match="StopTrainingJob: not started"):
                aws_sagemaker.TrainingJobs(client).stop("stabilizer-x-1")
            with pytest.raises(AssertionError):  # the second response was never asked for
                stub.assert_no_pending_responses()
    finally:
        aws.invocation_deadline(None)
        aws_sagemaker.get_sagemaker.cache_clear()


def test_the_worst_case_call_is_the_configured_arithmetic():
    # 3 tries x (3 s connect + 10 s read) + waits of at most 1 s and 2 s (+5 s retry-after each).
    assert aws.worst_case_call_seconds() == 3 * (3 + 10) + (1 + 5) + (2 + 5)


def test_a_job_hyperparameter_over_2500_characters_is_refused_naming_it():
    from stabilizer_workflow.execution.execution_input import parse_execution_input

    job = {"source": "s3://bucket/src/sourcedir.tar.gz", "entry_point": "fit.py",
           "hyperparameters": {"lr": 0.1, "notes": "x" * 2600}}
    with pytest.raises(InvalidInput) as error:
        parse_execution_input({"job": job})
    assert "job.hyperparameters" in str(error.value) and "notes" in str(error.value)
    assert "SageMaker allows at most 2,500" in str(error.value)


def test_a_job_hyperparameter_of_exactly_sagemakers_limit_is_accepted_and_one_more_is_not():
    from stabilizer_workflow.execution.execution_input import parse_execution_input

    limit = service_limits.HYPERPARAMETER_VALUE_MAX
    job = {"source": "s3://bucket/src/sourcedir.tar.gz", "entry_point": "fit.py"}
    # A string travels JSON-encoded: its two quotes count.
    fits = parse_execution_input({"job": {**job, "hyperparameters": {"notes": "x" * (limit - 2)}}})
    assert len(fits.job.hyperparameters["notes"]) == limit - 2
    with pytest.raises(InvalidInput, match=r"job\.hyperparameters\.notes: 2,501 characters as the training job's "
                                           r"hyperparameter 'notes' \(JSON-encoded\); SageMaker allows at most 2,500"):
        parse_execution_input({"job": {**job, "hyperparameters": {"notes": "x" * (limit - 1)}}})


def test_a_request_value_over_the_limit_is_named_by_its_source_or_as_a_hyperparameter():
    request = {"HyperParameters": {"lr": "0.1", "notes": "x" * 2501, "sagemaker_extra": "y" * 2600}}
    assert service_limits.request_problems(request, {"notes": "job.hyperparameters.notes"}) == [
        "job.hyperparameters.notes: 2,501 characters as the training job's hyperparameter 'notes' (JSON-encoded); "
        "SageMaker allows at most 2,500",
        "hyperparameter 'sagemaker_extra': 2,600 characters as the training job's hyperparameter 'sagemaker_extra' "
        "(JSON-encoded); SageMaker allows at most 2,500",
    ]
