"""CreateTrainingJob requests: valid against botocore's SageMaker model, names, Debugger config."""

from __future__ import annotations

import json
import re
from typing import Any

import botocore.session
import pytest
from botocore.validate import ParamValidator

from stabilizer_workflow.errors import MisconfiguredEnvironment
from stabilizer_workflow.execution import reference
from stabilizer_workflow.launch import attempts as launching
from stabilizer_workflow.launch import requests
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import ENV, EXECUTION, launched, new_state

MODEL = botocore.session.get_session().get_service_model("sagemaker")
CREATE = MODEL.operation_model("CreateTrainingJob")


def _python_regex(pattern: str) -> str:
    # The model uses Java's Unicode classes; these ASCII subsets are stricter, never looser.
    return pattern.replace(r"\p{L}", "a-zA-Z").replace(r"\p{Z}", " ").replace(r"\p{N}", "0-9")


def _limits(shape, value: Any, path: str, problems: list[str]) -> None:
    """What botocore's validator leaves out: max lengths, max counts and patterns of the model."""
    meta = shape.metadata
    if shape.type_name == "structure":
        for key, item in value.items():
            _limits(shape.members[key], item, f"{path}.{key}", problems)
    elif shape.type_name == "list":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} items > {meta['max']}")
        for index, item in enumerate(value):
            _limits(shape.member, item, f"{path}[{index}]", problems)
    elif shape.type_name == "map":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} entries > {meta['max']}")
        for key, item in value.items():
            _limits(shape.key, key, f"{path} key", problems)
            _limits(shape.value, item, f"{path}[{key}]", problems)
    elif shape.type_name == "string":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} characters > {meta['max']}")
        if "pattern" in meta and not re.fullmatch(_python_regex(meta["pattern"]), value):
            problems.append(f"{path}: {value!r} does not match {meta['pattern']}")
        if shape.enum and value not in shape.enum:
            problems.append(f"{path}: {value!r} not one of the model's values")


def assert_valid(request: dict[str, Any]) -> None:
    report = ParamValidator().validate(request, CREATE.input_shape)
    assert not report.has_errors(), report.generate_report()
    problems: list[str] = []
    _limits(CREATE.input_shape, request, "", problems)
    assert not problems, problems


def _request(state, settings, attempt=1):
    return requests.build_create_training_job(state, settings, attempt)


def test_request_is_valid_against_the_service_model(settings):
    assert_valid(_request(new_state(settings), settings))


def test_request_with_debugger_rules_is_valid_against_the_service_model(debugger_settings):
    raw = {"run_spec": {"rules": [{"name": "ExplodingTensor"}, NLP_RULE, {"name": "StepOutlier"}]}}
    request = _request(new_state(debugger_settings, raw), debugger_settings)
    assert {"DebugHookConfig", "ProfilerRuleConfigurations"} <= set(request)
    assert_valid(request)


def test_request_carries_the_recipe_as_sdk_style_hyperparameters(settings):
    state = new_state(settings, {"run_spec": {"warmup_learning_rate": 0.05, "add_batch_norm": 1}})
    hps = _request(state, settings)["HyperParameters"]
    decoded = {key: json.loads(value) for key, value in hps.items()}
    assert decoded["sagemaker_program"] == "train.py"
    assert decoded["sagemaker_submit_directory"] == settings.source_s3_uri
    assert decoded["warmup_learning_rate"] == 0.05
    assert decoded["add_batch_norm"] == 1
    assert decoded["activation"] == "elu"
    # The sentinel configuration travels once, in sagemaker_stabilizer, as for any other job.
    assert not {"sentinel_rules", "capture", "sentinel_action"} & set(hps)
    config = json.loads(hps["sagemaker_stabilizer"])
    assert config["rules"][0] == {
        "name": "ExplodingTensor",
        "parameters": {"collection_names": "gradients", "only_nan": "False"},
    }
    assert config["capture"] == {
        "losses": {"save_interval": 10},
        "gradients": {"save_interval": 100},
    }
    assert config["action"] == "stop"


def test_request_layout_follows_the_s3_contract(settings):
    request = _request(new_state(settings), settings, attempt=3)
    base = "s3://stabilizer-bucket/executions/run-1/attempt-3"
    assert request["CheckpointConfig"] == {"S3Uri": f"{base}/checkpoints", "LocalPath": "/opt/ml/checkpoints"}
    assert request["OutputDataConfig"] == {"S3OutputPath": f"{base}/output"}
    channels = {
        c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]
    }
    assert channels == {"train": settings.train_data_s3_uri, "test": settings.test_data_s3_uri}
    assert {"Key": "stabilizer:attempt", "Value": "3"} in request["Tags"]
    assert {"Key": "stabilizer:execution", "Value": "run-1"} in request["Tags"]
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == 3600
    assert "DebugHookConfig" not in request
    names = {metric["Name"] for metric in request["AlgorithmSpecification"]["MetricDefinitions"]}
    assert {"train:loss", "train:grad_norm", "test:accuracy", "train:step"} <= names


def test_metric_regexes_read_the_training_log_lines(settings):
    metrics = {m["Name"]: re.compile(m["Regex"]) for m in reference.METRIC_DEFINITIONS}
    train = "step=12 epoch=1 loss=2.3012 lr=0.1 grad_norm=4.52"
    test = "eval epoch=3 test_loss=0.61 test_accuracy=0.8111"
    assert metrics["train:step"].search(train).group(1) == "12"
    assert metrics["train:loss"].search(train).group(1) == "2.3012"
    assert metrics["train:lr"].search(train).group(1) == "0.1"
    assert metrics["train:grad_norm"].search(train).group(1) == "4.52"
    assert metrics["test:loss"].search(test).group(1) == "0.61"
    assert metrics["test:accuracy"].search(test).group(1) == "0.8111"
    assert metrics["train:loss"].search(test) is None  # test_loss never feeds the training loss


def test_a_resumed_attempt_gets_the_resume_channel(settings):
    state = new_state(settings).model_copy(
        update={
            "resume_from": "s3://stabilizer-bucket/executions/run-1/attempt-1/checkpoints/checkpoint-00000450.pt"
        }
    )
    request = _request(state, settings, attempt=2)
    resume = [c for c in request["InputDataConfig"] if c["ChannelName"] == "resume"]
    assert resume[0]["DataSource"]["S3DataSource"]["S3Uri"].endswith(
        "attempt-1/checkpoints/checkpoint-00000450.pt"
    )
    assert_valid(request)


def test_max_runtime_never_exceeds_what_is_left_of_the_training_budget(settings):
    state = launched(settings, {"limits": {"max_total_training_seconds": 1000}})
    state.attempts[0].seconds = 700
    state = state.model_copy(update={"next_action": "launch_new"})
    assert _request(state, settings, attempt=2)["StoppingCondition"]["MaxRuntimeInSeconds"] == 300


def test_job_names_are_unique_per_attempt_and_execution_and_within_limits(settings):
    first = new_state(settings)
    other = launching.prepare({}, {**EXECUTION, "id": EXECUTION["id"] + "-b", "name": "run-2"}, settings)
    names = {
        requests.job_name(settings.job_name_prefix, state.execution.short_id, attempt)
        for state in (first, other)
        for attempt in range(1, 31)
    }
    assert len(names) == 60  # all launched "in the same second": no clock involved, no collision
    pattern = re.compile(CREATE.input_shape.members["TrainingJobName"].metadata["pattern"])
    for name in names:
        assert len(name) <= 63 and pattern.fullmatch(name) and re.fullmatch(r"[a-zA-Z0-9-]+", name)
    assert requests.job_name("stabilizer", first.execution.short_id, 2).startswith("stabilizer-")


def test_longest_allowed_prefix_still_fits_a_four_digit_attempt():
    assert len(requests.job_name("p" * 49, "0123abcd", 9999)) == 63


@pytest.mark.parametrize("prefix", ["p" * 50, "-bad", "under_score", "bad-"])
def test_a_prefix_that_cannot_make_valid_names_is_rejected_at_cold_start(prefix):
    from tests.unit.workflow.conftest import ENV

    with pytest.raises(MisconfiguredEnvironment, match="JOB_NAME_PREFIX"):
        TrainSettings.from_env({**ENV, "JOB_NAME_PREFIX": prefix})


# A rule only Debugger runs (the catalogue's runs_in "debugger"): the one kind that needs Debugger.
NLP_RULE = {"name": "NLPSequenceRatio", "parameters": {"token_values": "0"}}
DEBUGGER_FIELDS = ("DebugHookConfig", "DebugRuleConfigurations", "ProfilerConfig", "ProfilerRuleConfigurations")


def test_no_debugger_configuration_is_sent_when_the_engine_runs_every_rule(debugger_settings):
    """Debugger is closed to new customers since 2026-07-30 ("Debugger availability change",
    https://docs.aws.amazon.com/sagemaker/latest/dg/debugger-availability-change.html): a request that
    carries DebugHookConfig needs an account that still has Debugger. With Debugger rules enabled, a
    job whose rules the engine all runs (the defaults, a profiler rule it runs) carries none of
    CreateTrainingJob's Debugger members (botocore's model: DebugHookConfig, DebugRuleConfigurations,
    ProfilerConfig, ProfilerRuleConfigurations)."""
    assert set(DEBUGGER_FIELDS) <= set(CREATE.input_shape.members)
    for raw in ({}, {"run_spec": {"rules": [{"name": "ExplodingTensor"}, {"name": "LowGPUUtilization"},
                                            {"name": "LossNotDecreasing"}]}}):
        request = _request(new_state(debugger_settings, raw), debugger_settings)
        assert not set(DEBUGGER_FIELDS) & set(request), raw
        assert_valid(request)


def test_debugger_gets_only_the_rules_it_alone_runs(debugger_settings):
    raw = {"run_spec": {"rules": [
        {"name": "ExplodingTensor", "parameters": {"collection_names": "gradients", "only_nan": "False"}},
        {"name": "LossNotDecreasing", "parameters": {"num_steps": "10", "diff_percent": "0.1"}},
        NLP_RULE,
    ]}}
    request = _request(new_state(debugger_settings, raw), debugger_settings)
    (rule,) = request["DebugRuleConfigurations"]
    assert rule["RuleConfigurationName"] == "NLPSequenceRatio"
    assert rule["RuleParameters"] == {"rule_to_invoke": "NLPSequenceRatio", "token_values": "0"}
    assert rule["RuleEvaluatorImage"] == "503895931360.dkr.ecr.us-east-1.amazonaws.com/sagemaker-debugger-rules:latest"
    hook = request["DebugHookConfig"]
    assert hook["S3OutputPath"] == "s3://stabilizer-bucket/executions/run-1/attempt-1/debug"
    collections = {c["CollectionName"]: c["CollectionParameters"] for c in hook["CollectionConfigurations"]}
    assert collections == {"gradients": {"save_interval": "100"}, "losses": {"save_interval": "10"}}
    assert "ProfilerConfig" not in request  # no profiler rule only Debugger runs
    # The engine still runs all three in the job.
    sentinel = json.loads(request["HyperParameters"]["sagemaker_stabilizer"])
    assert [r["name"] for r in sentinel["rules"]] == ["ExplodingTensor", "LossNotDecreasing"]
    assert_valid(request)


def test_the_sentinels_own_check_settings_never_reach_debugger(debugger_settings):
    """NotLearning and Diverging entries set the sentinel's thresholds; Debugger has no such rules."""
    raw = {"run_spec": {"rules": [
        {"name": "ExplodingTensor"},
        {"name": "NotLearning", "parameters": {"patience": "200"}},
        {"name": "Diverging", "parameters": {"persistence": "2"}},
        NLP_RULE,
    ]}}
    request = _request(new_state(debugger_settings, raw), debugger_settings)
    assert [r["RuleConfigurationName"] for r in request["DebugRuleConfigurations"]] == ["NLPSequenceRatio"]
    sentinel = json.loads(request["HyperParameters"]["sagemaker_stabilizer"])
    assert [rule["name"] for rule in sentinel["rules"]] == ["ExplodingTensor", "NotLearning", "Diverging"]
    assert_valid(request)


def test_a_rule_collection_the_capture_does_not_save_is_added_to_the_hook(debugger_settings):
    raw = {"run_spec": {"capture": {"losses": {"save_steps": [0, 5, 10]}}, "rules": [
        {"name": "SimilarAcrossRuns", "parameters": {"other_trials": "s3://b/other", "collection_names": "weights"}},
    ]}}
    request = _request(new_state(debugger_settings, raw), debugger_settings)
    collections = {
        c["CollectionName"]: c["CollectionParameters"]
        for c in request["DebugHookConfig"]["CollectionConfigurations"]
    }
    assert collections == {"weights": {"save_interval": "10"}, "losses": {"save_steps": "0,5,10"}}


def test_rule_image_is_the_one_the_deployment_baked_in(debugger_settings):
    request = _request(new_state(debugger_settings, {"run_spec": {"rules": [NLP_RULE]}}), debugger_settings)
    images = {rule["RuleEvaluatorImage"] for rule in request["DebugRuleConfigurations"]}
    assert images == {ENV["DEBUGGER_RULE_IMAGE"]}


def test_rule_image_missing_with_debugger_enabled_is_a_clear_configuration_error():
    settings = TrainSettings.from_env({**ENV, "DEBUGGER_RULES_ENABLED": "true", "DEBUGGER_RULE_IMAGE": ""})
    with pytest.raises(MisconfiguredEnvironment, match="DEBUGGER_RULE_IMAGE"):
        requests.rule_image(settings)


def test_rule_parameters_longer_than_256_characters_never_reach_a_request(settings):
    from stabilizer_workflow.errors import InvalidInput

    with pytest.raises(InvalidInput, match="at most 256"):
        new_state(
            settings,
            {"run_spec": {"rules": [{"name": "ExplodingTensor", "parameters": {"tensor_regex": "a" * 300}}]}},
        )


def test_the_validity_check_itself_catches_what_the_service_would_reject(debugger_settings):
    good = _request(new_state(debugger_settings, {"run_spec": {"rules": [NLP_RULE]}}), debugger_settings)
    too_long_name = {**good, "TrainingJobName": "a" * 64}
    with pytest.raises(AssertionError, match="TrainingJobName"):
        assert_valid(too_long_name)
    long_value = json.loads(json.dumps(good))
    long_value["DebugRuleConfigurations"][0]["RuleParameters"]["tensor_regex"] = "x" * 257
    with pytest.raises(AssertionError, match="RuleParameters"):
        assert_valid(long_value)
    missing_role = {key: value for key, value in good.items() if key != "RoleArn"}
    with pytest.raises(AssertionError, match="RoleArn"):
        assert_valid(missing_role)


def test_profiler_and_debugger_only_rules_go_to_debugger_and_the_sentinel_gets_what_it_runs(debugger_settings):
    raw = {"run_spec": {"rules": [
        {"name": "ExplodingTensor"},
        NLP_RULE,
        {"name": "LowGPUUtilization", "parameters": {"threshold_p95": "70"}},
        {"name": "StepOutlier", "parameters": {"stddev": "3"}},
    ]}}
    request = _request(new_state(debugger_settings, raw), debugger_settings)
    assert [r["RuleConfigurationName"] for r in request["DebugRuleConfigurations"]] == ["NLPSequenceRatio"]
    (profiler_rule,) = request["ProfilerRuleConfigurations"]
    assert profiler_rule["RuleParameters"] == {"rule_to_invoke": "StepOutlier", "stddev": "3"}
    assert request["ProfilerConfig"]["S3OutputPath"] == "s3://stabilizer-bucket/executions/run-1/attempt-1/profiler"
    sentinel = json.loads(request["HyperParameters"]["sagemaker_stabilizer"])["rules"]
    assert [r["name"] for r in sentinel] == ["ExplodingTensor", "LowGPUUtilization"]
    assert_valid(request)


def test_debugger_collection_limits_are_sagemakers_own():
    """CollectionConfiguration (SageMaker API Reference, "CollectionConfiguration": CollectionName and
    each CollectionParameters value at most 256 characters) in DebugHookConfig's
    CollectionConfigurations (at most 20 items)."""
    from stabilizer_workflow.execution import service_limits

    hook = MODEL.shape_for("DebugHookConfig").members["CollectionConfigurations"]
    assert hook.metadata["max"] == service_limits.DEBUGGER_COLLECTIONS_MAX
    entry = hook.member.members
    assert entry["CollectionName"].metadata["max"] == service_limits.DEBUGGER_COLLECTION_TEXT_MAX
    assert entry["CollectionParameters"].value.metadata["max"] == service_limits.DEBUGGER_COLLECTION_TEXT_MAX


def _capture_input(capture: dict, rules: list | None = None) -> dict:
    return {"run_spec": {"capture": capture, "rules": [NLP_RULE, *(rules or [])]}}


def test_a_collection_value_debugger_would_reject_is_refused_at_validation_naming_its_field(debugger_settings):
    from stabilizer_workflow.errors import InvalidInput

    # Each regex is fine on its own; joined with "|" they make one 259-character value.
    regexes = ["layer" + "a" * 80, "layer" + "b" * 80, "layer" + "c" * 82]
    too_long = _capture_input({"custom": {"save_interval": 5, "include_regex": regexes}})
    with pytest.raises(InvalidInput, match=r"^run_spec\.capture\.custom\.include_regex: 259 characters .* at most 256"):
        new_state(debugger_settings, too_long)
    # The same capture with rules the engine runs reaches only the sentinel, which takes it.
    engine_only = {"run_spec": {"capture": too_long["run_spec"]["capture"]}}
    assert "DebugHookConfig" not in _request(new_state(debugger_settings, engine_only), debugger_settings)
    # save_steps joined with "," likewise.
    steps = _capture_input({"losses": {"save_steps": list(range(10_000, 10_043))}}, [])
    with pytest.raises(InvalidInput, match=r"^run_spec\.capture\.losses\.save_steps: 257 characters"):
        new_state(debugger_settings, steps)
    # 256 characters exactly is what SageMaker takes; the request is then valid against the model.
    fits = _capture_input({"custom": {"save_interval": 5, "include_regex": [*regexes[:2], "layer" + "c" * 79]}})
    assert_valid(_request(new_state(debugger_settings, fits), debugger_settings))


def test_more_collections_than_debugger_takes_are_refused_at_validation(debugger_settings):
    from stabilizer_workflow.errors import InvalidInput

    capture = {f"c{i}": {"save_interval": 10} for i in range(20)}  # the capture's own bound
    reader = {"name": "SimilarAcrossRuns", "parameters": {"other_trials": "s3://b/o", "collection_names": "weights"}}
    with pytest.raises(InvalidInput, match=r"^run_spec\.capture and run_spec\.rules \(SimilarAcrossRuns\)"
                                           r"\.collection_names: 21 Debugger collections .* at most 20"):
        new_state(debugger_settings, _capture_input(capture, [reader]))
    request = _request(new_state(debugger_settings, _capture_input(capture)), debugger_settings)
    assert len(request["DebugHookConfig"]["CollectionConfigurations"]) == 20
    assert_valid(request)


def test_a_rules_debugger_actions_are_not_forwarded_to_debugger(debugger_settings):
    """Debugger's built-in actions run inside its rule job as the training job's execution role
    ("Use Debugger built-in actions for rules", https://docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-actions.html):
    StopTraining lists and stops the job named by the action's `training_job_prefix` (which the SDK
    adds and this request would lack), Email and SMS publish to an `SMDebugRules` topic, each needing
    permissions the execution role does not have; and they cannot be used for profiler rules nor on
    spot training. The workflow carries the actions out instead (the monitor: stop, or notify and run
    on), so the rule configuration Debugger gets has no `action_json`."""
    actions = '[{"name": "stoptraining"}, {"name": "email", "endpoint": "mlteam@example.com"}]'
    raw = {"run_spec": {"rules": [{"name": "NLPSequenceRatio", "parameters": {"token_values": "0",
                                                                             "action_json": actions}},
                                  {"name": "StepOutlier", "parameters": {"action_json": actions}}]}}
    state = new_state(debugger_settings, raw)
    assert state.monitoring.rules[0].parameters["action_json"] == actions  # kept for the monitor
    request = _request(state, debugger_settings)
    for rule in request["DebugRuleConfigurations"] + request["ProfilerRuleConfigurations"]:
        assert "action_json" not in rule["RuleParameters"], rule
    assert request["DebugRuleConfigurations"][0]["RuleParameters"] == {"rule_to_invoke": "NLPSequenceRatio",
                                                                       "token_values": "0"}
    assert_valid(request)
