"""What a first deploy and a long execution would meet in a real account, read from the template:
partitions, redeploys, checkpoint deletions, Debugger rules, the Lambda time budget, the event
rules that move and clean up executions, the Powertools layer and warm pools."""

from __future__ import annotations

import json
import re

import pytest

from infra.config import ContextError, read_config
from tests.infra.synth import REPO_ROOT, as_list, dumps, policy_statements, synth


def _resources(raw: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in raw["Resources"].items() if r["Type"] == kind}


def _statements(raw: dict, policy: str) -> list[dict]:
    return [s for logical_id, s in policy_statements(raw) if policy in logical_id]


def _object_patterns(statement: dict) -> set[str]:
    found = set()
    for resource in as_list(statement["Resource"]):
        match = re.search(r'"Arn"\]\}, "([^"]+)"\]\]', dumps(resource))
        if match:
            found.add(match.group(1))
    return found


def _function(raw: dict, name: str) -> tuple[str, dict]:
    [(logical_id, function)] = [(k, r) for k, r in _resources(raw, "AWS::Lambda::Function").items()
                                if f"{name}Function" in k]
    return logical_id, function


def test_no_partition_is_written_anywhere_in_the_template(default_synth):
    _, raw = default_synth
    # China (aws-cn) and GovCloud (aws-us-gov) ARNs differ; every ARN must come from AWS::Partition.
    text = json.dumps(raw)
    assert "arn:aws:" not in text
    [machine] = _resources(raw, "AWS::StepFunctions::StateMachine").values()
    definition = machine["Properties"]["DefinitionString"]
    assert "arn:${Partition}:states:::lambda:invoke" in dumps(definition)


def test_a_redeploy_keeps_the_source_archive_and_library_running_jobs_use(default_synth):
    _, raw = default_synth
    deployments = _resources(raw, "Custom::CDKBucketDeployment").values()
    prefixes = set()
    for deployment in deployments:
        properties = deployment["Properties"]
        # CDK's handler removes the old prefix on update unless RetainOnDelete is true, and prunes
        # objects the new asset lacks unless Prune is false.
        assert properties.get("RetainOnDelete", True) is True
        assert properties["Prune"] is False
        prefixes.add(properties["DestinationBucketKeyPrefix"])
    # The source archive and the sentinel library (every job's `stabilizer` channel), each under
    # a key that carries the content hash.
    [source] = [p for p in prefixes if p.startswith("source/")]
    [library] = [p for p in prefixes if p.startswith("library/")]
    assert re.fullmatch(r"source/[0-9a-f]{20}/", source)
    assert re.fullmatch(r"library/[0-9a-f]{20}/", library)


def test_execution_role_deletes_only_checkpoints(default_synth):
    _, raw = default_synth
    statements = _statements(raw, "SageMakerExecutionPolicy")
    deletes = [s for s in statements if "s3:DeleteObject" in as_list(s["Action"])]
    assert [_object_patterns(s) for s in deletes] == [{"/executions/*/checkpoints/*"}]
    # Jobs read their channels anywhere in the stack's bucket, and nothing outside it; without
    # Debugger rules, no rule image.
    reads = {p for s in statements if "s3:GetObject" in as_list(s["Action"]) for p in _object_patterns(s)}
    assert reads == {"/*"}
    assert "sagemaker-debugger-rules" not in dumps(statements)


def test_debugger_rules_get_their_output_and_their_images():
    _, raw = synth(debugger_rules_enabled="true")
    statements = _statements(raw, "SageMakerExecutionPolicy")
    # The rule jobs read the hook's output under executions/*/debug/, within the bucket-wide read.
    reads = {p for s in statements if as_list(s["Action"]) == ["s3:GetObject"] for p in _object_patterns(s)}
    assert reads == {"/*"}
    [pull] = [s for s in statements if s.get("Sid") == "PullDebuggerRuleImages"]
    assert "ecr:BatchGetImage" in pull["Action"]
    # The rule image's own account in this region (the SDK's table, baked in as a mapping), not `*`.
    resource = dumps(pull["Resource"])
    assert resource.endswith(':repository/sagemaker-debugger-rules"]]}') and ":*:" not in resource
    assert "DebuggerRuleRegistry" in resource


def test_one_aws_call_fits_the_function_timeout_with_room(default_synth):
    from stabilizer_workflow.aws import (
        CONNECT_TIMEOUT_SECONDS,
        DEADLINE_SAFETY_SECONDS,
        MAX_ATTEMPTS,
        READ_TIMEOUT_SECONDS,
        client_config,
        worst_case_call_seconds,
    )

    # The client configuration the handlers use is the one the arithmetic is about.
    # botocore rewrites the dict in place once a client is built from it ("max_attempts" retries
    # become "total_max_attempts" tries), so read it in either form.
    config = client_config()
    retries = config.retries
    assert retries["mode"] == "standard"
    assert retries.get("total_max_attempts", retries.get("max_attempts", -1) + 1) == MAX_ATTEMPTS + 1
    assert (config.connect_timeout, config.read_timeout) == (CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS)
    _, raw = default_synth
    for name in ("Train", "Monitor", "Watch"):
        timeout = _function(raw, name)[1]["Properties"]["Timeout"]
        # A cold start (~0.5 s measured import) plus one call started at the deadline check's
        # limit must end before Lambda kills the invocation; twice that is the room asked for.
        assert 2 * (worst_case_call_seconds() + DEADLINE_SAFETY_SECONDS) <= timeout, name


def test_job_end_and_abnormal_execution_end_reach_the_watch_function(default_synth):
    _, raw = default_synth
    watch_id, _ = _function(raw, "Watch")
    rules = {k: r["Properties"] for k, r in _resources(raw, "AWS::Events::Rule").items()}
    [job_rule] = [r for r in rules.values() if r["EventPattern"]["source"] == ["aws.sagemaker"]]
    assert job_rule["EventPattern"]["detail-type"] == ["SageMaker Training Job State Change"]
    assert job_rule["EventPattern"]["detail"] == {
        "TrainingJobStatus": ["Completed", "Failed", "Stopped"],
        "TrainingJobName": [{"prefix": "stabilizer-"}],
    }
    [execution_rule] = [r for r in rules.values() if r["EventPattern"]["source"] == ["aws.states"]]
    assert execution_rule["EventPattern"]["detail-type"] == ["Step Functions Execution Status Change"]
    assert execution_rule["EventPattern"]["detail"]["status"] == ["FAILED", "TIMED_OUT", "ABORTED"]
    [machine_id] = _resources(raw, "AWS::StepFunctions::StateMachine")
    assert execution_rule["EventPattern"]["detail"]["stateMachineArn"] == [{"Ref": machine_id}]
    for rule in (job_rule, execution_rule):
        [target] = rule["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [watch_id, "Arn"]}
        assert target["RetryPolicy"]["MaximumRetryAttempts"] >= 8
    permissions = [r["Properties"] for r in _resources(raw, "AWS::Lambda::Permission").values()]
    assert sum(p["Principal"] == "events.amazonaws.com" for p in permissions) == 2


def test_watch_function_wakes_only_this_state_machine_and_keeps_tokens_beside_attempts(default_synth):
    _, raw = default_synth
    statements = _statements(raw, "WatchFunctionPolicy")
    [machine_id] = _resources(raw, "AWS::StepFunctions::StateMachine")
    [wake] = [s for s in statements if s["Action"] == "states:SendTaskSuccess"]
    assert wake["Resource"] == {"Ref": machine_id}
    [tokens] = [s for s in statements if s.get("Sid") == "KeepTaskTokens"]
    assert _object_patterns(tokens) == {"/executions/*/wake-token.json"}
    [describe] = [s for s in statements if s["Action"] == "states:DescribeExecution"]
    assert ":execution:" in dumps(describe["Resource"]) and machine_id in dumps(describe["Resource"])


def test_warm_pools_are_a_setting_with_sagemakers_bound():
    _, raw = synth(warm_pool_seconds="900")
    environment = _function(raw, "Train")[1]["Properties"]["Environment"]["Variables"]
    assert environment["WARM_POOL_SECONDS"] == "900"

    class Context(dict):
        def try_get_context(self, key):
            return self.get(key)

    assert read_config(Context()).warm_pool_seconds == 0
    with pytest.raises(ContextError, match="'warm_pool_seconds'"):
        read_config(Context({"warm_pool_seconds": "3601"}))


def test_powertools_layer_is_pinned_to_a_published_parameter():
    class Context(dict):
        def try_get_context(self, key):
            return self.get(key)

    assert read_config(Context()).powertools_version == "3.22.1"
    # 3.23.0's python3.13 x86_64 parameter was never published (powertools-lambda-python#7689).
    with pytest.raises(ContextError, match=r"'powertools_version' 3\.23\.0 has no published"):
        read_config(Context({"powertools_version": "3.23.0"}))


def test_the_tests_pin_the_powertools_the_layer_deploys():
    # The deployed functions import Powertools from the layer of POWERTOOLS_VERSION; the `lambda`
    # extra pins the same release, so local runs and tests exercise that code, not a newer one.
    import tomllib

    from infra.config import POWERTOOLS_VERSION

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [pin] = [r for r in extras["lambda"] if r.startswith("aws-lambda-powertools")]
    assert pin.split("==")[1] == POWERTOOLS_VERSION
