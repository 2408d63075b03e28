"""Template properties that matter: IAM scopes, encryption, substitutions, context, outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from aws_cdk.assertions import Match

from infra.config import EXECUTION_TIMEOUT_DAYS, ContextError, read_config
from infra.stack import LAMBDA_MEMORY_MB
from stabilizer_workflow import environment
from tests.infra.synth import REPO_ROOT, as_list, dumps, policy_statements, synth

PREFIX = "stabilizer"


def _resources(raw: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in raw["Resources"].items() if r["Type"] == kind}


def _named(raw: dict, kind: str, name: str) -> dict[str, dict]:
    """Resources of `kind` whose logical id contains `name` (constructs prefix their ids)."""
    return {k: r for k, r in _resources(raw, kind).items() if name in k}


def _one(raw: dict, kind: str, containing: str = "") -> tuple[str, dict]:
    matches = [(k, r) for k, r in _resources(raw, kind).items() if containing in k]
    assert len(matches) == 1, f"expected one {kind} named like {containing!r}, got {[k for k, _ in matches]}"
    return matches[0]


def _statements_of(raw: dict, policy_prefix: str) -> list[dict]:
    return [s for logical_id, s in policy_statements(raw) if policy_prefix in logical_id]


def _train_environment(raw: dict) -> dict:
    functions = _resources(raw, "AWS::Lambda::Function")
    [train] = [r for k, r in functions.items() if "TrainFunction" in k]
    return train["Properties"]["Environment"]["Variables"]


def _role_id(raw: dict, prefix: str) -> str:
    return _one(raw, "AWS::IAM::Role", prefix)[0]


# --- storage and notifications ------------------------------------------------------------------


def test_bucket_blocks_public_access_is_encrypted_and_expires_artifacts(default_synth):
    template, _ = default_synth
    template.has_resource_properties("AWS::S3::Bucket", {
        "PublicAccessBlockConfiguration": {
            "BlockPublicAcls": True, "BlockPublicPolicy": True,
            "IgnorePublicAcls": True, "RestrictPublicBuckets": True,
        },
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [
            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]},
        "LifecycleConfiguration": {"Rules": Match.array_with([
            Match.object_like({"Prefix": "executions/", "ExpirationInDays": 35, "Status": "Enabled"}),
        ])},
    })


def test_an_executions_artifacts_outlive_the_longest_execution(default_synth):
    # A running execution reads its checkpoints (resuming from an early attempt's), findings and
    # wake tokens: none may expire before the execution's own timeout ends it.
    _, raw = default_synth
    _, bucket = _one(raw, "AWS::S3::Bucket")
    [rule] = [r for r in bucket["Properties"]["LifecycleConfiguration"]["Rules"] if r.get("Prefix") == "executions/"]
    timeout = json.loads((REPO_ROOT / "statemachine" / "stabilizer.asl.json").read_text())["TimeoutSeconds"]
    assert timeout == EXECUTION_TIMEOUT_DAYS * 86_400
    assert rule["ExpirationInDays"] * 86_400 > timeout


def _cloudwatch_retentions() -> set[str]:
    import re

    import botocore.session

    shape = botocore.session.get_session().get_service_model("logs").operation_model(
        "PutRetentionPolicy").input_shape.members["retentionInDays"]
    return set(re.findall(r"\b\d+\b", shape.documentation.split("Possible values are:")[1].split(".")[0]))


def test_a_retention_shorter_than_an_execution_is_refused():
    class Context(dict):
        def try_get_context(self, key):
            return self.get(key)

    minimum = EXECUTION_TIMEOUT_DAYS + 1
    with pytest.raises(ContextError, match=f"'artifact_retention_days' must be an integer >= {minimum}"):
        read_config(Context({"artifact_retention_days": 30}))
    with pytest.raises(ContextError, match=f"'log_retention_days' must be an integer >= {minimum}"):
        read_config(Context({"log_retention_days": 30}))


def test_bucket_and_topic_refuse_requests_without_tls(default_synth):
    template, _ = default_synth
    deny_insecure = Match.object_like({
        "Effect": "Deny",
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    })
    template.has_resource_properties("AWS::S3::BucketPolicy", {
        "PolicyDocument": {"Statement": Match.array_with([deny_insecure])},
    })
    template.has_resource_properties("AWS::SNS::TopicPolicy", {
        "PolicyDocument": {"Statement": Match.array_with([deny_insecure])},
    })


def test_topic_is_encrypted(default_synth):
    _, raw = default_synth
    _, topic = _one(raw, "AWS::SNS::Topic")
    # The alias ARN of the AWS managed key for SNS.
    assert dumps(topic["Properties"]["KmsMasterKeyId"]).endswith(':alias/aws/sns"]]}')


def test_bucket_is_retained_unless_context_says_destroy(default_synth):
    _, raw = default_synth
    _, bucket = _one(raw, "AWS::S3::Bucket")
    assert bucket["DeletionPolicy"] == "Retain"
    assert not _resources(raw, "Custom::S3AutoDeleteObjects")

    _, destroyed = synth(removal_policy="destroy")
    _, bucket = _one(destroyed, "AWS::S3::Bucket")
    assert bucket["DeletionPolicy"] == "Delete"
    assert len(_resources(destroyed, "Custom::S3AutoDeleteObjects")) == 1


def test_email_subscription_only_when_the_context_gives_one(default_synth):
    template, _ = default_synth
    template.resource_count_is("AWS::SNS::Subscription", 0)

    with_email, _ = synth(notification_email="ml-team@example.com")
    with_email.resource_count_is("AWS::SNS::Subscription", 1)
    with_email.has_resource_properties("AWS::SNS::Subscription", {
        "Protocol": "email", "Endpoint": "ml-team@example.com",
    })


# --- IAM ----------------------------------------------------------------------------------------


def test_no_wildcard_resource_on_sagemaker_s3_or_sns_actions(default_synth):
    _, raw = default_synth
    checked = 0
    for logical_id, statement in policy_statements(raw):
        actions = as_list(statement["Action"])
        if actions == ["sagemaker:ListTrainingJobs"]:
            continue  # supports no resource scoping; lists names only (the watch function's)
        if any(a.split(":")[0] in {"sagemaker", "s3", "sns"} for a in actions):
            checked += 1
            assert "*" not in as_list(statement["Resource"]), f"{logical_id}: {actions} on *"
    assert checked >= 8


def test_sagemaker_actions_only_on_this_deployments_jobs(default_synth):
    _, raw = default_synth
    granted = set()
    for logical_id, statement in policy_statements(raw):
        actions = [a for a in as_list(statement["Action"]) if a.startswith("sagemaker:")]
        if not actions:
            continue
        if actions == ["sagemaker:ListTrainingJobs"]:
            granted |= set(actions)
            continue
        granted |= set(actions)
        for resource in as_list(statement["Resource"]):
            arn = dumps(resource)
            kind = "processing-job" if actions == ["sagemaker:StopProcessingJob"] else "training-job"
            assert arn.endswith(f':{kind}/{PREFIX}-*"]]}}'), f"{logical_id}: {actions} on {arn}"
    assert granted == {
        "sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob",
        "sagemaker:AddTags", "sagemaker:StopProcessingJob", "sagemaker:ListTrainingJobs",
        "sagemaker:UpdateTrainingJob",  # the monitor releases a warm pool no attempt will reuse
    }


def test_train_launches_and_monitor_stops(default_synth):
    _, raw = default_synth
    train = {a for s in _statements_of(raw, "TrainFunctionPolicy") for a in as_list(s["Action"])}
    monitor = {a for s in _statements_of(raw, "MonitorFunctionPolicy") for a in as_list(s["Action"])}
    assert {"sagemaker:CreateTrainingJob", "sagemaker:AddTags", "iam:PassRole"} <= train
    # The train function stops only a job it created for an execution aborted meanwhile: it may ask
    # whether that execution still runs, and stop training jobs of this deployment's prefix.
    assert "sagemaker:StopProcessingJob" not in train
    assert {"sagemaker:StopTrainingJob", "states:DescribeExecution"} <= train
    [check] = [s for s in _statements_of(raw, "TrainFunctionPolicy") if s.get("Sid") == "CheckItsExecutionStillRuns"]
    assert check["Action"] == "states:DescribeExecution" and ":execution:" in json.dumps(check["Resource"])
    assert {"sagemaker:StopTrainingJob", "sagemaker:StopProcessingJob"} <= monitor
    assert not {"sagemaker:CreateTrainingJob", "iam:PassRole"} & monitor
    # The train function reads no data; it lists its bucket (channels may lie at any prefix of it,
    # the resume channel under executions/) to say what is missing before a launch.
    assert "sns:Publish" in train and {a for a in train if a.startswith("s3:")} == {"s3:ListBucket", "s3:GetObject"}
    [listing] = [s for s in _statements_of(raw, "TrainFunctionPolicy") if s["Action"] == "s3:ListBucket"]
    assert "Condition" not in listing and listing["Resource"] == {"Fn::GetAtt": [_bucket_id(raw), "Arn"]}
    # ValidateInput reads users' source archives (to find the entry point) under source/ only.
    [sources] = [s for s in _statements_of(raw, "TrainFunctionPolicy") if s.get("Sid") == "ReadSourceArchives"]
    assert _object_patterns(sources) == {"/source/*"}
    assert {"sns:Publish", "s3:GetObject", "s3:ListBucket"} <= monitor


def test_pass_role_is_the_execution_role_to_sagemaker_only(default_synth):
    _, raw = default_synth
    execution_role = _role_id(raw, "SageMakerExecutionRole")
    passes = [(k, s) for k, s in policy_statements(raw) if "iam:PassRole" in as_list(s["Action"])]
    assert len(passes) == 1
    logical_id, statement = passes[0]
    assert "TrainFunctionPolicy" in logical_id
    assert statement["Resource"] == {"Fn::GetAtt": [execution_role, "Arn"]}
    assert statement["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}


def _bucket_id(raw: dict) -> str:
    [bucket] = _resources(raw, "AWS::S3::Bucket")
    return bucket


def _object_patterns(statement: dict) -> set[str]:
    patterns = set()
    for resource in as_list(statement["Resource"]):
        match = re.search(r'"Arn"\]\}, "([^"]+)"\]\]', dumps(resource))
        assert match, f"not an object ARN of the bucket: {resource}"
        patterns.add(match.group(1))
    return patterns


def test_execution_role_reads_inputs_and_writes_only_under_executions(default_synth):
    _, raw = default_synth
    statements = _statements_of(raw, "SageMakerExecutionPolicy")
    reads = [s for s in statements if as_list(s["Action"]) == ["s3:GetObject"]]
    writes = [s for s in statements if "s3:PutObject" in as_list(s["Action"])]
    # Channels wherever they lie in the stack's bucket; writes only under executions/.
    assert _object_patterns(reads[0]) == {"/*"}
    assert _object_patterns(writes[0]) == {
        "/executions/*/output/*", "/executions/*/checkpoints/*", "/executions/*/debug/*", "/executions/*/profiler/*",
    }
    actions = {a for s in statements for a in as_list(s["Action"])}
    assert {"logs:PutLogEvents", "cloudwatch:PutMetricData", "ecr:BatchGetImage",
            "ecr:GetAuthorizationToken"} <= actions
    assert not {a for a in actions if a.startswith(("sagemaker:", "iam:", "sns:"))}


def test_monitor_reads_only_findings_progress_and_stragglers_and_lists_checkpoints(default_synth):
    _, raw = default_synth
    for policy in ("MonitorFunctionPolicy",):
        reads = [s for s in _statements_of(raw, policy) if "s3:GetObject" in as_list(s["Action"])]
        assert [_object_patterns(s) for s in reads] == [
            {"/executions/*/checkpoints/findings.json", "/executions/*/checkpoints/progress.json",
             "/executions/*/checkpoints/stragglers.json"}]
        lists = [s for s in _statements_of(raw, policy) if "s3:ListBucket" in as_list(s["Action"])]
        assert lists[0]["Condition"] == {"StringLike": {"s3:prefix": ["executions/*"]}}


def test_state_machine_role_invokes_the_two_functions_and_publishes(default_synth):
    _, raw = default_synth
    role = _role_id(raw, "StateMachineRole")
    statements = [s for k, s in policy_statements(raw) if "StateMachineRoleDefaultPolicy" in k]
    invoked = {dumps(r) for s in statements if s["Action"] == "lambda:InvokeFunction"
               for r in as_list(s["Resource"])}
    functions = {k for k in _resources(raw, "AWS::Lambda::Function")
                 if any(f"{n}Function" in k for n in ("Train", "Monitor", "Watch"))}
    assert len(functions) == 3
    for function in functions:
        assert dumps({"Fn::GetAtt": [function, "Arn"]}) in invoked
    assert len(invoked) == 6  # each function, unqualified and :version/alias
    publishes = [s for s in statements if s["Action"] == "sns:Publish"]
    assert [p["Resource"] for p in publishes] == [{"Ref": _one(raw, "AWS::SNS::Topic")[0]}]
    actions = {a for s in statements for a in as_list(s["Action"])}
    assert not {a for a in actions if a.startswith(("sagemaker:", "s3:", "iam:"))}
    _, machine = _one(raw, "AWS::StepFunctions::StateMachine")
    assert machine["Properties"]["RoleArn"] == {"Fn::GetAtt": [role, "Arn"]}


# --- functions ----------------------------------------------------------------------------------


def test_functions_runtime_layer_memory_tracing_and_logs(default_synth):
    _, raw = default_synth
    functions = {k: r["Properties"] for k, r in _resources(raw, "AWS::Lambda::Function").items()
                 if any(f"{n}Function" in k for n in ("Train", "Monitor", "Watch"))}
    handlers = sorted(p["Handler"] for p in functions.values())
    assert handlers == [f"stabilizer_workflow.handlers.{name}.lambda_handler" for name in ("monitor", "train", "watch")]
    [parameter] = [k for k in raw["Parameters"] if k.startswith("SsmParameterValueawsservicepowertools")]
    layer = raw["Parameters"][parameter]["Default"]
    # Pinned (not latest) to a release whose python3.13 x86_64 parameter was published (#7689).
    assert layer == "/aws/service/powertools/python/x86_64/python3.13/3.22.1"
    for properties in functions.values():
        assert properties["Runtime"] == "python3.13"
        assert properties["Architectures"] == ["x86_64"]
        assert properties["MemorySize"] == LAMBDA_MEMORY_MB
        assert 30 <= properties["Timeout"] <= 900
        assert properties["TracingConfig"] == {"Mode": "Active"}
        assert properties["Layers"] == [{"Ref": parameter}]
        kind = properties["Handler"].split(".")[2]
        # What the function's settings read (stabilizer_workflow.environment), and nothing more.
        variables = set(properties["Environment"]["Variables"])
        assert environment.deployed(kind) <= variables, kind
        assert variables <= set(environment.FUNCTIONS[kind].values()) | {environment.POWERTOOLS_SERVICE_NAME}, kind
        if kind == "train":  # the default deployment's images: both builds of PyTorch
            assert environment.TRAINING_IMAGE_URI_GPU in variables
        assert "LoggingConfig" in properties
    # Every log group keeps an execution's logs as long as it may run (31 days), in a retention
    # CloudWatch accepts (botocore's model, PutRetentionPolicy retentionInDays: 1, 3, 5, 7, 14, 30, 60, ...).
    groups = [r["Properties"] for r in raw["Resources"].values() if r["Type"] == "AWS::Logs::LogGroup"]
    assert len(groups) == 4
    for group in groups:
        assert group["RetentionInDays"] * 86_400 > EXECUTION_TIMEOUT_DAYS * 86_400
        assert str(group["RetentionInDays"]) in _cloudwatch_retentions()


def test_environment_bakes_in_deployment_values(default_synth):
    _, raw = default_synth
    env = _train_environment(raw)
    bucket = _one(raw, "AWS::S3::Bucket")[0]
    assert env["BUCKET"] == {"Ref": bucket}
    assert env["JOB_NAME_PREFIX"] == PREFIX
    # What CDK bakes in must be what the Lambdas accept, or every execution fails at its first step.
    from stabilizer_workflow.settings import MonitorSettings, TrainSettings

    stand_ins = {"BUCKET": "stabilizer-bucket", "TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:topic",
                 "SAGEMAKER_ROLE_ARN": "arn:aws:iam::123456789012:role/sagemaker-execution",
                 "TRAINING_IMAGE_URI": "123456789012.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.9.0",
                 "TRAINING_IMAGE_URI_GPU": "123456789012.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.9.0",
                 "FRAMEWORK_IMAGES": "{}",
                 "SOURCE_S3_URI": "s3://stabilizer-bucket/source/x/sourcedir.tar.gz"}
    resolved = {k: v if isinstance(v, str) else stand_ins.get(k, f"s3://stabilizer-bucket/{k.lower()}")
                for k, v in env.items()}
    assert TrainSettings.from_env(resolved).job_name_prefix == PREFIX
    MonitorSettings.from_env(resolved)
    assert env["DEFAULT_INSTANCE_TYPE"] == "ml.m5.xlarge"
    assert env["DEBUGGER_RULES_ENABLED"] == "false"
    assert env["SAGEMAKER_ROLE_ARN"] == {"Fn::GetAtt": [_role_id(raw, "SageMakerExecutionRole"), "Arn"]}
    assert dumps(env["SOURCE_S3_URI"]).endswith('/sourcedir.tar.gz"]]}')
    assert dumps(env["TRAIN_DATA_S3_URI"]).endswith('/data/train/"]]}')
    # The images themselves, region by region, are checked against the SDK in test_training_image.py.
    assert "pytorch-training:2.8.0-cpu-py312" in dumps(env["TRAINING_IMAGE_URI"])
    assert "pytorch-training:2.8.0-gpu-py312" in dumps(env["TRAINING_IMAGE_URI_GPU"])


def test_deployment_context_switches_image_debugger_and_instance():
    _, gpu = synth(instance_type="ml.g5.xlarge", debugger_rules_enabled="true")
    env = _train_environment(gpu)
    # Both builds are baked in whatever the default instance type: the image follows each request's.
    assert "2.8.0-gpu-py312" in dumps(env["TRAINING_IMAGE_URI_GPU"])
    assert "2.8.0-cpu-py312" in dumps(env["TRAINING_IMAGE_URI"])
    assert "sagemaker-debugger-rules:latest" in dumps(env["DEBUGGER_RULE_IMAGE"])
    assert env["DEBUGGER_RULES_ENABLED"] == "true"
    assert env["DEFAULT_INSTANCE_TYPE"] == "ml.g5.xlarge"


def test_bad_context_is_refused_naming_the_key():
    class Context(dict):
        def try_get_context(self, key):
            return self.get(key)

    assert read_config(Context()).instance_type == "ml.m5.xlarge"
    for key, value in [("instance_type", "m5.large"), ("job_name_prefix", "Stabilizer"),
                       ("job_name_prefix", "stabilizer-"),
                       ("notification_email", "not-an-address"), ("removal_policy", "keep"),
                       ("debugger_rules_enabled", "yes please"), ("artifact_retention_days", "0")]:
        with pytest.raises(ContextError, match=f"'{key}'"):
            read_config(Context({key: value}))


# --- state machine ------------------------------------------------------------------------------


def test_definition_placeholders_are_all_substituted(default_synth):
    _, raw = default_synth
    _, machine = _one(raw, "AWS::StepFunctions::StateMachine")
    definition = machine["Properties"]["DefinitionString"]
    substitutions = machine["Properties"]["DefinitionSubstitutions"]
    placeholders = set(re.findall(r"\$\{(\w+)\}", definition))
    mapped = json.loads((REPO_ROOT / "statemachine" / "placeholders.json").read_text())["placeholders"]
    assert placeholders == set(substitutions) == set(mapped)
    assert substitutions["Partition"] == {"Ref": "AWS::Partition"}
    # What CloudFormation deploys: every placeholder replaced, no `${` left.
    deployed = definition
    for name in substitutions:
        deployed = deployed.replace("${" + name + "}", f"resolved-{name}")
    assert "${" not in deployed
    functions = {k for k in _resources(raw, "AWS::Lambda::Function")
                 if any(f"{n}Function" in k for n in ("Train", "Monitor", "Watch"))}
    assert {substitutions[f"{n}FunctionArn"]["Fn::GetAtt"][0] for n in ("Train", "Monitor", "Watch")} == functions


def test_state_machine_logs_everything_and_traces(default_synth):
    template, _ = default_synth
    template.has_resource_properties("AWS::StepFunctions::StateMachine", {
        "LoggingConfiguration": Match.object_like({"Level": "ALL"}),
        "TracingConfiguration": {"Enabled": True},
    })


def test_the_console_link_never_stops_a_deploy_in_a_partition_it_has_no_host_for(default_synth):
    """Fn::FindInMap fails the deploy when the partition is not in the mapping. Every partition
    botocore knows (its partitions.json: aws, aws-cn, aws-us-gov, aws-iso*, aws-eusc) either has
    a console host in the mapping or gets no ConsoleLink output (its condition is false there)."""
    import os

    import botocore

    _, raw = default_synth
    partitions = json.loads((Path(os.path.dirname(botocore.__file__)) / "data" / "partitions.json").read_text())
    known = [p["id"] for p in partitions["partitions"]]
    assert {"aws", "aws-cn", "aws-us-gov", "aws-iso", "aws-iso-b"} <= set(known)
    output = raw["Outputs"]["ConsoleLink"]
    condition = raw["Conditions"][output["Condition"]]
    hosts = raw["Mappings"]["ConsoleHost"]

    def holds(expression: dict, partition: str) -> bool:
        [(function, arguments)] = expression.items()
        if function == "Fn::Or":
            return any(holds(argument, partition) for argument in arguments)
        assert function == "Fn::Equals"
        values = [partition if argument == {"Ref": "AWS::Partition"} else argument for argument in arguments]
        return values[0] == values[1]

    for partition in known:
        assert holds(condition, partition) == (partition in hosts), partition
    assert {p for p in known if p in hosts} == {"aws", "aws-cn", "aws-us-gov"}


def test_outputs(default_synth):
    _, raw = default_synth
    outputs = raw["Outputs"]
    expected = {"StateMachineArn", "BucketName", "TopicArn", "ConsoleLink", "ExampleExecutionInput"}
    assert expected <= set(outputs)
    link = dumps(outputs["ConsoleLink"]["Value"])
    assert "/states/home?region=" in link and '"ConsoleHost", {"Ref": "AWS::Partition"}' in link
    hosts = raw["Mappings"]["ConsoleHost"]
    assert hosts["aws"]["host"] == "console.aws.amazon.com" and hosts["aws-cn"]["host"] == "console.amazonaws.cn"
    example = json.loads(outputs["ExampleExecutionInput"]["Value"])
    schema = json.loads((REPO_ROOT / "schemas" / "execution-input.schema.json").read_text())
    jsonschema.validate(example, schema)
