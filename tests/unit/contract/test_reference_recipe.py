"""The reference recipe has one home (stabilizer_contract.reference_recipe): the job's defaults and
help, the `run_spec` section's defaults and bounds, and the reference knobs' bounds all come from it."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from stabilizer_contract.reference_recipe import RECIPE, problem
from stabilizer_workflow.execution.execution_input import RunSpec
from stabilizer_workflow.execution.reference import KNOBS
from tests.helpers import model_module

recipe = model_module("recipe")


def test_the_job_and_the_run_spec_section_have_the_recipes_defaults():
    job_defaults = {f.name: f.default for f in dataclasses.fields(recipe.Config) if f.name in RECIPE}
    assert set(job_defaults) == set(RECIPE) == set(RunSpec().hyperparameters())
    for name, hyperparameter in RECIPE.items():
        assert job_defaults[name] == hyperparameter.default == RunSpec().hyperparameters()[name], name
        assert recipe.HELP[name] == hyperparameter.help


@pytest.mark.parametrize("name", sorted(RECIPE))
def test_the_run_spec_section_refuses_what_the_recipe_refuses_at_each_bound(name):
    hyperparameter = RECIPE[name]
    refused = [*(["tanh"] if hyperparameter.choices else []),
               *([hyperparameter.low] if hyperparameter.low is not None and hyperparameter.low_open else []),
               *([hyperparameter.low - 1] if hyperparameter.low is not None else []),
               *([hyperparameter.high * 2] if hyperparameter.high is not None else [])]
    for value in refused:
        assert problem(name, value) is not None
        with pytest.raises(ValidationError, match=name):
            RunSpec(**{name: value})
    RunSpec(**{name: hyperparameter.default})  # and takes the default


def test_the_depth_rule_is_the_recipes():
    assert problem("depth", 21) == "ResNet depth must be 6n+2 (20, 32, 44, 56, ...), got 21"
    with pytest.raises(ValidationError, match="6n\\+2"):
        RunSpec(depth=21)
    assert problem("depth", 32) is None


def test_every_reference_knob_stays_inside_the_recipes_bounds():
    for role in ("learning_rate", "warmup_learning_rate", "normalization", "grad_clip", "batch_size", "activation"):
        knob = getattr(KNOBS, role)
        hyperparameter = RECIPE[knob.hyperparameter]
        if hyperparameter.choices:
            assert tuple(knob.values) == hyperparameter.choices
            continue
        assert problem(knob.hyperparameter, knob.min) is None and problem(knob.hyperparameter, knob.max) is None
