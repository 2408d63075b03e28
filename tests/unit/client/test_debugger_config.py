"""An estimator's Debugger configuration, built with the SageMaker Python SDK's own objects, becomes the
execution input's rule list and capture with Debugger's semantics; what the job cannot do is refused
naming the SDK attribute. No AWS call: the estimators only hold configuration."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from stabilizer.client.debugger import DebuggerConfigError, monitoring_from_estimator

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
debugger = pytest.importorskip("sagemaker.debugger")
Rule, ProfilerRule, rule_configs = debugger.Rule, debugger.ProfilerRule, debugger.rule_configs
CollectionConfig, DebuggerHookConfig = debugger.CollectionConfig, debugger.DebuggerHookConfig


def estimator(**attributes: object) -> SimpleNamespace:
    """The Debugger attributes an SDK estimator keeps (the translation reads nothing else)."""
    base = {"rules": None, "debugger_hook_config": None, "profiler_config": None, "tensorboard_output_config": None}
    return SimpleNamespace(**{**base, **attributes})


def test_rule_parameters_and_collections_go_in_as_debugger_has_them() -> None:
    rule = Rule.sagemaker(
        base_config=rule_configs.class_imbalance(),
        rule_parameters={"labels_regex": "CrossEntropyLoss_input_1", "argmax": "True"},
        collections_to_save=[CollectionConfig(name="custom_output_collection",
                                              parameters={"include_regex": ".*labels|.*predictions",
                                                          "save_interval": "500"})],
    )
    out = monitoring_from_estimator(estimator(rules=[rule]))
    assert out.rules == [{"name": "ClassImbalance",
                          "parameters": {"labels_regex": "CrossEntropyLoss_input_1", "argmax": "True"}}]
    assert out.capture == {
        "custom_output_collection": {"save_interval": 500, "include_regex": ".*labels|.*predictions"},
        "losses": {"save_interval": 500},  # smdebug's PyTorch hook always saves losses
    }


def test_a_collection_s_own_interval_wins_over_the_hook_s_and_modes_over_general_ones() -> None:
    hook = DebuggerHookConfig(
        hook_parameters={"train.save_interval": "100", "eval.save_interval": "10", "start_step": "5"},
        collection_configs=[CollectionConfig(name="custom_collection", parameters={
            "include_regex": ".*relu|.*weight", "save_interval": "20", "train.save_interval": "7"})],
    )
    rules = [Rule.sagemaker(rule_configs.vanishing_gradient())]  # its gradients collection: save_interval 500
    out = monitoring_from_estimator(estimator(rules=rules, debugger_hook_config=hook))
    assert out.capture["custom_collection"] == {"save_interval": 7, "start_step": 5, "include_regex": ".*relu|.*weight"}
    assert out.capture["gradients"] == {"save_interval": 500, "start_step": 5}
    assert out.capture["losses"] == {"save_interval": 100, "start_step": 5}


def test_stop_training_and_messages_travel_as_debugger_s_action_json() -> None:
    actions = rule_configs.ActionList(rule_configs.StopTraining(), rule_configs.Email("mlteam@example.com"),
                                      rule_configs.SMS("+15555550100"))
    notify = rule_configs.ActionList(rule_configs.Email("mlteam@example.com"))
    out = monitoring_from_estimator(estimator(rules=[
        Rule.sagemaker(rule_configs.loss_not_decreasing(), actions=actions),
        Rule.sagemaker(rule_configs.overfit(), actions=notify),
    ]))
    assert json.loads(out.rules[0]["parameters"]["action_json"]) == [
        {"name": "stoptraining"}, {"name": "email", "endpoint": "mlteam@example.com"},
        {"name": "sms", "endpoint": "+15555550100"}]
    assert json.loads(out.rules[1]["parameters"]["action_json"]) == [
        {"name": "email", "endpoint": "mlteam@example.com"}]


def test_profiler_report_runs_the_engine_s_profiler_rules_with_its_parameters() -> None:
    rules = [ProfilerRule.sagemaker(rule_configs.LowGPUUtilization()),
             ProfilerRule.sagemaker(rule_configs.ProfilerReport(CPUBottleneck_cpu_threshold=90))]
    out = monitoring_from_estimator(estimator(rules=rules))
    names = [rule["name"] for rule in out.rules]
    assert names == ["LowGPUUtilization", "CPUBottleneck", "IOBottleneck", "OverallSystemUsage"]
    assert out.rules[1]["parameters"] == {"cpu_threshold": "90"}
    assert out.rules[0]["parameters"]["threshold_p95"] == "70"  # the rule's own, as the SDK filled them


def test_a_profiler_report_parameter_of_a_debugger_only_rule_is_refused_naming_it() -> None:
    rule = ProfilerRule.sagemaker(rule_configs.ProfilerReport(StepOutlier_stddev=3))
    with pytest.raises(DebuggerConfigError,
                       match=r"rules\[0\] \(ProfilerReport\)\.rule_parameters\.StepOutlier_stddev"):
        monitoring_from_estimator(estimator(rules=[rule]))


def test_a_custom_rule_file_is_shipped_inside_the_job_s_source(tmp_path: Path) -> None:
    rule_file = tmp_path / "custom_rule" / "check_accuracy.py"
    rule_file.parent.mkdir()
    rule_file.write_text("class check_accuracy: ...\n")
    rule = Rule.custom(name="CheckAccuracy", image_uri="759209512951.dkr.ecr.us-west-2.amazonaws.com/x:latest",
                       instance_type="ml.c4.xlarge", volume_size_in_gb=400, source=str(rule_file),
                       rule_to_invoke="check_accuracy", rule_parameters={"threshold": "0.05"})
    out = monitoring_from_estimator(estimator(rules=[rule]), source_dir=tmp_path / "src")
    assert out.rules == [{"name": "CheckAccuracy", "parameters": {
        "source_s3_uri": "stabilizer_custom_rules/check_accuracy.py", "rule_to_invoke": "check_accuracy",
        "threshold": "0.05"}}]
    assert out.custom_rule_files == {"stabilizer_custom_rules/check_accuracy.py": rule_file.resolve()}


def test_what_the_job_cannot_do_is_refused_naming_the_sdk_attribute(tmp_path: Path) -> None:
    profiler = debugger.ProfilerConfig(system_monitor_interval_millis=500,
                                       framework_profile_params=debugger.FrameworkProfile(num_steps=10))
    with pytest.raises(DebuggerConfigError, match=r"profiler_config\.framework_profile_params: .* PyTorch 1\.12"):
        monitoring_from_estimator(estimator(profiler_config=profiler, framework_version="1.12"))
    # From PyTorch 2.0 on, SageMaker collects no framework metrics (the SDK warns); nor does the job.
    with pytest.warns(UserWarning, match="no framework metrics are collected"):
        monitoring_from_estimator(estimator(profiler_config=profiler, framework_version="2.8.0"))
    with pytest.raises(DebuggerConfigError, match=r"system_monitor_interval_millis: .* got 100"):
        monitoring_from_estimator(estimator(profiler_config=debugger.ProfilerConfig(system_monitor_interval_millis=100)))
    with pytest.raises(DebuggerConfigError, match="tensorboard_output_config"):
        monitoring_from_estimator(estimator(tensorboard_output_config=debugger.TensorBoardOutputConfig("s3://b/tb")))
    renamed = Rule.sagemaker(rule_configs.loss_not_decreasing(), name="LossNotDecreasingEval")
    with pytest.raises(DebuggerConfigError, match=r"rules\[0\] \(LossNotDecreasingEval\)\.name"):
        monitoring_from_estimator(estimator(rules=[renamed]))
    with pytest.raises(DebuggerConfigError, match=r"hook_parameters\.save_everything: not a Debugger hook parameter"):
        monitoring_from_estimator(estimator(debugger_hook_config=DebuggerHookConfig(
            hook_parameters={"save_everything": "true"})))
    hook = DebuggerHookConfig(hook_parameters={"predict.save_interval": "1"})
    with pytest.raises(DebuggerConfigError, match=r"hook_parameters\.predict\.save_interval"):
        monitoring_from_estimator(estimator(rules=[Rule.sagemaker(rule_configs.overfit())], debugger_hook_config=hook))
    in_s3 = Rule.custom(name="R", image_uri="i", instance_type="ml.c4.xlarge", volume_size_in_gb=1,
                        source="s3://bucket/rule.py", rule_to_invoke="R")
    with pytest.raises(DebuggerConfigError, match=r"rules\[0\] \(R\)\.source: s3://bucket/rule.py is in S3"):
        monitoring_from_estimator(estimator(rules=[in_s3]))


def test_an_estimator_s_debugger_configuration_becomes_the_execution_input_s_monitoring(tmp_path, monkeypatch):
    import tarfile

    from sagemaker.local import LocalSession
    from sagemaker.pytorch import PyTorch

    from stabilizer.client.sdk import SdkJobError, execution_input_for

    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print('training')\n")
    rule_file = tmp_path / "rules" / "check.py"
    rule_file.parent.mkdir()
    rule_file.write_text("class CheckAccuracy: ...\n")
    rules = [Rule.sagemaker(rule_configs.vanishing_gradient()),
             Rule.custom(name="CheckAccuracy", image_uri="i", instance_type="ml.c4.xlarge", volume_size_in_gb=1,
                         source=str(rule_file), rule_to_invoke="CheckAccuracy")]
    estimator = PyTorch(entry_point="train.py", source_dir=str(source), role="arn:aws:iam::123456789012:role/r",
                        framework_version="2.8.0", py_version="py312", instance_type="ml.m5.xlarge", instance_count=1,
                        rules=rules, sagemaker_session=LocalSession())
    given = execution_input_for({"monitoring": {"sentinel_action": "stop"}}, estimator)
    assert [rule["name"] for rule in given["monitoring"]["rules"]] == ["VanishingGradient", "CheckAccuracy"]
    assert given["monitoring"]["sentinel_action"] == "stop"
    with tarfile.open(given["job"]["source"]) as archive:  # the rule's file travels in the job's source
        assert sorted(m.name for m in archive.getmembers() if m.isfile()) == ["stabilizer_custom_rules/check.py",
                                                                             "train.py"]
    with pytest.raises(SdkJobError, match=r"monitoring\.rules: given twice"):
        execution_input_for({"monitoring": {"rules": []}}, estimator)
