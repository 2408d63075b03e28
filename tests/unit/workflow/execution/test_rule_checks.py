"""ValidateInput checks rule lists with the rule engine's own catalogue, before anything is launched."""

from __future__ import annotations

import inspect

import pytest

from stabilizer_contract import catalogue as engine_catalogue
from stabilizer_contract import catalogue as rule_catalogue
from stabilizer_sentinel.rules import RULES, parse_rule_list, rule_parameters
from stabilizer_workflow.errors import InvalidInput
from stabilizer_workflow.execution.execution_input import parse_execution_input


def rules_input(*rules: dict) -> dict:
    return {"run_spec": {"rules": list(rules)}}


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        ({"name": "VanishingGradient", "parameters": {"thresold": "1e-6"}}, "unknown parameter 'thresold'"),
        ({"name": "VanishingGradient", "parameters": {"threshold": "-1"}}, "VanishingGradient).threshold: expected"),
        ({"name": "LossNotDecreasing", "parameters": {"num_steps": "ten"}}, "num_steps: expected an integer"),
        ({"name": "ExplodingTensor", "parameters": {"only_nan": "maybe"}}, "only_nan: expected True or False"),
        ({"name": "LossNotDecreasing", "parameters": {"mode": "SOMETIMES"}}, "mode: expected one of"),
        ({"name": "Confusion", "parameters": {"min_diag": "1.5"}}, "min_diag: expected a number in [0, 1]"),
        ({"name": "AllZero"}, "specify collection_names or tensor_regex"),
        ({"name": "ExplodingTensors"}, "unknown rule 'ExplodingTensors'"),
    ],
)
def test_a_rule_the_engine_cannot_run_is_rejected_naming_rule_and_parameter(rule, said):
    with pytest.raises(InvalidInput) as error:
        parse_execution_input(rules_input(rule), debugger_rules_enabled=False)
    assert said in str(error.value) and "run_spec.rules.0" in str(error.value)


def test_every_documented_value_is_accepted():
    given = rules_input(
        {"name": "LossNotDecreasing", "parameters": {"mode": "GLOBAL", "num_steps": "10", "diff_percent": "0.1",
                                                     "use_losses_collection": "False", "tensor_regex": "loss"}},
        {"name": "DeadRelu", "parameters": {"tensor_regex": ".*relu_output", "threshold_layer": "50.0"}},
        {"name": "Confusion", "parameters": {"category_no": "10", "min_diag": "0.8", "max_off_diag": "0.2"}},
        {"name": "CheckInputImages", "parameters": {"regex": ".*hybridsequential0_input_0", "channel": "1"}},
        {"name": "LowGPUUtilization", "parameters": {"threshold_p95": "70", "patience": "1000"}},
    )
    assert [r.name for r in parse_execution_input(given, debugger_rules_enabled=False).run_spec.rules] == [
        "LossNotDecreasing", "DeadRelu", "Confusion", "CheckInputImages", "LowGPUUtilization"]


def test_debugger_only_rules_only_where_debugger_rules_are_enabled():
    given = rules_input({"name": "NLPSequenceRatio", "parameters": {"token_values": "0"}})
    with pytest.raises(InvalidInput, match="only SageMaker Debugger runs NLPSequenceRatio"):
        parse_execution_input(given, debugger_rules_enabled=False)
    assert parse_execution_input(given, debugger_rules_enabled=True).run_spec.rules[0].name == "NLPSequenceRatio"
    with pytest.raises(InvalidInput, match="token_values: expected comma-separated numbers"):
        parse_execution_input(rules_input({"name": "NLPSequenceRatio", "parameters": {"token_values": "x"}}),
                              debugger_rules_enabled=True)


def test_the_workflow_and_the_engine_check_with_the_same_catalogue():
    # One file: the Lambda package's module is a link to the engine's (the asset copies it).
    assert inspect.getsource(rule_catalogue) == inspect.getsource(engine_catalogue)
    # Every rule the catalogue says the engine runs is registered with the catalogue's parameters
    # and defaults, and every registered built-in is in the catalogue: the two sides cannot drift.
    engine = {name for name, entry in rule_catalogue.CATALOGUE.items() if entry.runs_in == rule_catalogue.ENGINE}
    assert engine == {name for name in RULES if name in rule_catalogue.CATALOGUE}
    for name in engine:
        entry = rule_catalogue.CATALOGUE[name]
        assert list(rule_parameters(RULES[name])) == [p.name for p in entry.params], name
    # What ValidateInput accepts, the job's parser accepts, and what one refuses the other refuses.
    for name in engine:
        entry = rule_catalogue.CATALOGUE[name]
        params = {p.name: str(p.default) for p in entry.params if p.default is not None}
        for group in entry.one_of:  # "You must specify either ...": give the first of each group
            params.setdefault(group[0], "1" if "threshold" in group[0] else "weights")
        raw = [{"name": name, "parameters": params}]
        parse_execution_input(rules_input(*raw), debugger_rules_enabled=False)
        parse_rule_list(raw)


def test_debugger_s_own_rule_configuration_shape_is_accepted_as_it_is():
    given = rules_input({"RuleConfigurationName": "ClassImbalance",
                         "RuleEvaluatorImage": "DEFAULT_RULE_EVALUATOR_IMAGE",
                         "RuleParameters": {"rule_to_invoke": "ClassImbalance",
                                            "labels_regex": "CrossEntropyLoss_input_1",
                                            "action_json": '[{"name": "email", "endpoint": "mlteam@example.com"}]'}})
    (rule,) = parse_execution_input(given, debugger_rules_enabled=False).run_spec.rules
    assert rule.name == "ClassImbalance" and rule.parameters["labels_regex"] == "CrossEntropyLoss_input_1"
    custom = rules_input({"name": "CheckAccuracy", "parameters": {
        "source_s3_uri": "stabilizer_custom_rules/check.py", "rule_to_invoke": "CheckAccuracy", "threshold": "0.05"}})
    assert parse_execution_input(custom, debugger_rules_enabled=False).run_spec.rules[0].name == "CheckAccuracy"
    bad_action = rules_input({"name": "Overfit", "parameters": {"action_json": '[{"name": "pager"}]'}})
    with pytest.raises(InvalidInput, match=r"\(Overfit\)\.action_json: expected StopTraining, Email"):
        parse_execution_input(bad_action, debugger_rules_enabled=False)
    in_s3 = rules_input({"name": "R", "parameters": {"source_s3_uri": "s3://b/r.py", "rule_to_invoke": "R"}})
    with pytest.raises(InvalidInput, match=r"source_s3_uri: expected the rule's \.py file, relative"):
        parse_execution_input(in_s3, debugger_rules_enabled=False)


def test_capture_accepts_debugger_s_include_regex_and_start_step_and_names_a_bad_regex():
    given = {"run_spec": {"capture": {"custom_collection": {"include_regex": ".*relu|.*CrossEntropyLoss",
                                                            "save_interval": 100, "start_step": 5}}}}
    capture = parse_execution_input(given).run_spec.capture["custom_collection"]
    assert capture.include_regex == ".*relu|.*CrossEntropyLoss" and capture.start_step == 5
    with pytest.raises(InvalidInput, match=r"capture\.custom_collection\.include_regex.*'\(' is not a regular"):
        parse_execution_input({"run_spec": {"capture": {"custom_collection": {"include_regex": "(",
                                                                              "save_interval": 1}}}})
