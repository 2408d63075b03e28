"""The execution input and the state payload: defaults, clear errors, schema files, size."""

from __future__ import annotations

import json

import pytest

from stabilizer_workflow.errors import InvalidInput, StateCorrupted
from stabilizer_workflow.execution import schemas
from stabilizer_workflow.execution.execution_input import ExecutionInput, RunSpec, parse_execution_input
from stabilizer_workflow.execution.state import dump_state, load_state
from stabilizer_workflow.launch import attempts as launching
from tests.unit.workflow.conftest import EXECUTION, new_state, state_with_exploded_attempts

SCHEMAS = schemas.Path(schemas.__file__).resolve().parents[3] / "schemas"


def test_console_empty_input_runs_the_reference_problem(settings):
    state = new_state(settings, {})
    spec = state.run_spec
    assert (spec["warmup_learning_rate"], spec["learning_rate"], spec["add_batch_norm"]) == (0.1, 0.1, 0)
    assert (spec["depth"], spec["activation"], spec["num_epochs"]) == (20, "elu", 3)
    # The reference job: the deployment's source, train.py, its channels, its knobs declared.
    job = state.job
    assert (job.source, job.entry_point) == (settings.source_s3_uri, "train.py")
    assert job.channels == {"train": settings.train_data_s3_uri, "test": settings.test_data_s3_uri}
    assert job.instance_type == "ml.p3.2xlarge"  # from DEFAULT_INSTANCE_TYPE
    assert job.image == settings.training_image_uri
    assert job.knobs.normalization.hyperparameter == "add_batch_norm"
    assert set(job.knobs.declared()) == {
        "learning_rate", "warmup_learning_rate", "normalization", "grad_clip", "batch_size", "activation"
    }
    assert [rule.name for rule in state.monitoring.rules] == ["ExplodingTensor", "VanishingGradient"]
    assert state.policy == "default"
    assert state.wait_seconds == 300
    assert state.next_action == "launch_new"
    assert state.limits.max_num_retraining == 10
    assert state.execution.name == "run-1"


def test_none_input_is_the_same_as_empty():
    assert parse_execution_input(None) == parse_execution_input({})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"learnig_rate": 0.1}, "learnig_rate: unknown field"),
        ({"run_spec": {"learnig_rate": 0.1}}, "run_spec.learnig_rate: unknown field"),
        (
            {"run_spec": {"learning_rate": "0.1"}},
            "run_spec.learning_rate: expected a valid number (got '0.1' of type str)",
        ),
        (
            {"run_spec": {"num_epochs": True}},
            "run_spec.num_epochs: expected a valid integer (got True of type bool)",
        ),
        ({"run_spec": {"add_batch_norm": 2}}, "run_spec.add_batch_norm: expected less than or equal to 1"),
        ({"run_spec": {"learning_rate": 0}}, "run_spec.learning_rate: expected greater than 0"),
        ({"policy": "fastest"}, "policy: expected 'original' or 'default' (got 'fastest' of type str)"),
        ({"wait_seconds": 0}, "wait_seconds: expected greater than or equal to 1"),
        ({"run_spec": {"depth": 21}}, "run_spec.depth: ResNet depth must be 6n+2"),
        ({"run_spec": {"activation": "tanh"}}, "run_spec.activation: expected 'elu' or 'relu'"),
        (
            {"run_spec": {"instance_type": "p3.2xlarge"}},
            "run_spec.instance_type: expected a SageMaker instance type",
        ),
        (
            {"run_spec": {"rules": [{"name": "Exploding"}]}},
            "run_spec.rules.0: unknown rule 'Exploding'; rules: AllZero, ",
        ),
        (
            {"run_spec": {"rules": [{"name": "ExplodingTensor", "parameters": {"only_nan": False}}]}},
            "run_spec.rules.0.parameters.only_nan: expected a valid string",
        ),
        (
            {"run_spec": {"rules": [{"name": "ExplodingTensor", "parameters": {"tensor_regex": "x" * 257}}]}},
            "parameter 'tensor_regex' is 257 characters; at most 256 allowed",
        ),
        ({"run_spec": {"capture": {"losses": {}}}}, "give exactly one of save_interval or save_steps"),
        (
            {"limits": {"max_num_retraining": -1}},
            "limits.max_num_retraining: expected greater than or equal to 0",
        ),
        ([], "input: expected a JSON object, got list"),
    ],
)
def test_bad_input_names_the_field_and_what_was_expected(raw, expected):
    with pytest.raises(InvalidInput) as caught:
        parse_execution_input(raw)
    assert expected in str(caught.value)


def test_prepare_rejects_bad_input_with_invalid_input(settings):
    with pytest.raises(InvalidInput, match=r"run_spec\.batch_size"):
        launching.prepare({"run_spec": {"batch_size": "big"}}, EXECUTION, settings)


def test_prepare_requires_the_execution_context(settings):
    with pytest.raises(StateCorrupted, match="execution"):
        launching.prepare({}, {"name": "x"}, settings)


def test_state_round_trips_through_json(settings):
    state = new_state(settings, {"policy": "original", "wait_seconds": 5})
    raw = json.loads(json.dumps(dump_state(state)))
    assert load_state(raw) == state
    assert raw["wait_seconds"] == 5
    assert raw["history"]["latest_job_name"] is None


def test_a_state_that_does_not_validate_is_state_corrupted(settings):
    raw = dump_state(new_state(settings))
    raw["next_action"] = "celebrate"
    with pytest.raises(StateCorrupted, match="next_action"):
        load_state(raw)
    with pytest.raises(StateCorrupted, match="expected a JSON object"):
        load_state("state")


def test_short_execution_id_differs_for_a_reused_name(settings):
    first = launching.prepare({}, EXECUTION, settings).execution.short_id
    again = launching.prepare(
        {}, {**EXECUTION, "start_time": "2025-06-01T00:00:00Z"}, settings
    ).execution.short_id
    assert first != again


def test_schema_files_are_up_to_date():
    for name, text in schemas.documents().items():
        assert (SCHEMAS / name).read_text() == text, (
            f"schemas/{name} is stale: run python -m stabilizer_workflow.execution.schemas"
        )


def test_example_input_file_is_valid_input():
    raw = json.loads((SCHEMAS / "execution-input.example.json").read_text())
    assert parse_execution_input(raw) == ExecutionInput(run_spec=RunSpec())
    mine = parse_execution_input(json.loads((SCHEMAS / "execution-input.job-example.json").read_text()))
    assert mine.job is not None
    assert mine.job.knobs.learning_rate.hyperparameter == "lr"


def test_input_schema_forbids_unknown_keys():
    schema = json.loads((SCHEMAS / "execution-input.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["RunSpec"]["additionalProperties"] is False
    assert "required" not in schema  # every field is optional


def test_thirty_attempts_serialise_under_64_kb(settings):
    """Step Functions allows 256 KB; 30 fully recorded attempts must stay under 64 KB."""
    state = state_with_exploded_attempts(settings, 30)
    assert len(state.attempts) == 30
    assert all(attempt.finding and attempt.decision for attempt in state.attempts)
    size = len(json.dumps(dump_state(state)).encode())
    assert size < 64 * 1024, f"{size} bytes"


def test_run_spec_is_immutable_so_policies_cannot_mutate_history():
    spec = RunSpec()
    with pytest.raises(Exception, match="frozen"):
        spec.learning_rate = 0.5  # type: ignore[misc]
