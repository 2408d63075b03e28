"""A user of the original AWS sample starts an execution with its flat input: what has a home in
today's input runs as meant; deployment settings get one message naming where every field lives."""

from __future__ import annotations

import json

import pytest

from stabilizer_workflow.errors import InvalidInput
from stabilizer_workflow.execution.execution_input import parse_execution_input
from stabilizer_workflow.execution.migration import SAMPLE_FIELDS
from stabilizer_workflow.execution.state import load_state
from stabilizer_workflow.handlers import train as train_handler
from tests.helpers import SAMPLE_DEPLOYMENT_FIELDS, SAMPLE_INPUT
from tests.unit.workflow.conftest import load_event


def test_the_sample_fields_without_deployment_settings_run_what_was_meant():
    given = {k: v for k, v in SAMPLE_INPUT.items() if k not in SAMPLE_DEPLOYMENT_FIELDS}
    given.update(init_warmup_learning_rate="0.05", add_batch_norm="True")  # the sample's text hyperparameters
    parsed = parse_execution_input(given)
    spec = parsed.run_spec
    assert (spec.warmup_learning_rate, spec.learning_rate, spec.add_batch_norm, spec.num_epochs) == (0.05, 0.1, 1, 3)
    assert spec.instance_type == "ml.p3.2xlarge"
    assert {name: c.save_interval for name, c in spec.capture.items()} == {"losses": 100, "gradients": 100}
    assert (parsed.limits.max_num_retraining, parsed.limits.max_monitor_transitions) == (10, 300)


def test_the_whole_sample_input_gets_one_message_naming_every_field():
    with pytest.raises(InvalidInput) as raised:
        parse_execution_input(SAMPLE_INPUT)
    message = str(raised.value)
    assert message.startswith("input: this is the original sample's flat input")
    assert "unknown field" not in message and "remove it" in message
    lines = message.splitlines()
    for field in SAMPLE_INPUT:
        (line,) = [line for line in lines if line.startswith(f"  {field}: ")]
        assert ("deployment setting" in line) == (field in SAMPLE_DEPLOYMENT_FIELDS), line
        assert ("remove it" in line) == (field in SAMPLE_DEPLOYMENT_FIELDS), line
    assert "  learning_rate: now run_spec.learning_rate" in lines
    assert "  base_job_name: a deployment setting: jobs are named <job_name_prefix>-" in message
    # The input to use instead is given, and it runs.
    suggested = json.loads(lines[-1])
    assert not set(suggested) & set(SAMPLE_FIELDS)
    assert parse_execution_input(suggested).run_spec.instance_type == "ml.p3.2xlarge"


def test_a_flat_field_that_disagrees_with_todays_field_is_named():
    with pytest.raises(InvalidInput, match=r"learning_rate: now run_spec\.learning_rate, which the input also gives"):
        parse_execution_input({"learning_rate": 0.1, "run_spec": {"learning_rate": 0.2}})
    # The same value twice is what was meant.
    same = parse_execution_input({"learning_rate": 0.2, "run_spec": {"learning_rate": 0.2}})
    assert same.run_spec.learning_rate == 0.2


def test_a_wrong_value_in_the_flat_shape_is_named_at_its_new_place():
    with pytest.raises(InvalidInput, match=r"run_spec\.num_epochs"):
        parse_execution_input({"num_epochs": "three"})


def test_validate_input_from_the_console_accepts_the_sample_shape(settings):
    """ValidateInput (the train Lambda's prepare) with the sample's input as a console user pastes it."""
    state = train_handler.handle(load_event("train-prepare-sample-input.json"), settings=settings)
    assert state["run_spec"]["warmup_learning_rate"] == 0.05
    assert state["run_spec"]["learning_rate"] == 0.1
    assert state["job"]["instance_type"] == "ml.p3.2xlarge"
    assert state["limits"]["max_monitor_transitions"] == 300
    load_state(state)


def test_validate_input_from_the_console_explains_the_deployment_settings(settings):
    event = {**load_event("train-prepare-console.json"), "input": SAMPLE_INPUT}
    with pytest.raises(InvalidInput, match=r"(?s)bucket: a deployment setting.*region: a deployment setting"):
        train_handler.handle(event, settings=settings)
