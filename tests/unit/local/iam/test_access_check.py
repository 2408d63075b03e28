"""The evaluator judges as IAM does, and strict mode refuses a denied call as AWS answers it.

Each case is a rule of IAM's evaluation logic (IAM User Guide, "Policy evaluation logic" and
"IAM JSON policy elements: Condition operators") that the stack's policies rely on: resource
wildcards, StringLike on s3:prefix (and a missing key not matching), NotAction/NotResource, an
explicit Deny winning over any Allow.
"""

from __future__ import annotations

import os
from unittest import mock

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from stabilizer.local.engine.deployment import LocalSettings
from stabilizer.local.iam.access_check import AccessChecker, acting_as, evaluate, tag_client
from stabilizer.local.iam.iam_requests import IamRequest, Where, job_requests, requests_for
from stabilizer.local.iam.stack_policies import PrincipalPolicies, principal_policies

BUCKET = "arn:aws:s3:::bkt"
LIST_DATA = {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": BUCKET,
             "Condition": {"StringLike": {"s3:prefix": ["data/*", "library/*"]}}}

HANDLERS = "stabilizer_workflow.handlers"


def policy(*statements: dict) -> list[dict]:
    return [{"Version": "2012-10-17", "Statement": list(statements)}]


@pytest.mark.parametrize(("prefix", "allowed"), [
    ("data/train/", True),
    ("library/stabilizer_sentinel/", True),
    ("executions/e/attempt-1/checkpoints/checkpoint-00000005.pt", False),
    ("data", False),  # StringLike "data/*" needs the slash
    (None, False),  # no s3:prefix in the request: the condition does not match
])
def test_string_like_on_s3_prefix(prefix, allowed):
    context = {} if prefix is None else {"s3:prefix": prefix}
    assert evaluate(policy(LIST_DATA), IamRequest("s3:ListBucket", BUCKET, context)).allowed is allowed


def test_resource_wildcards_match_across_slashes_and_single_characters():
    documents = policy({"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{BUCKET}/executions/*/ckpt/?"})
    assert evaluate(documents, IamRequest("s3:GetObject", f"{BUCKET}/executions/e/attempt-1/ckpt/x")).allowed
    assert not evaluate(documents, IamRequest("s3:GetObject", f"{BUCKET}/executions/e/attempt-1/ckpt/xy")).allowed
    assert not evaluate(documents, IamRequest("s3:GetObject", "arn:aws:s3:::other/executions/e/ckpt/x")).allowed


def test_an_explicit_deny_wins_over_any_allow():
    documents = policy(
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": f"{BUCKET}/data/*"},
    )
    verdict = evaluate(documents, IamRequest("s3:DeleteObject", f"{BUCKET}/data/x"))
    assert not verdict.allowed and verdict.why.startswith("explicit deny")
    assert evaluate(documents, IamRequest("s3:DeleteObject", f"{BUCKET}/executions/x")).allowed


def test_not_action_and_not_resource():
    documents = policy({"Effect": "Allow", "NotAction": "s3:DeleteObject", "NotResource": f"{BUCKET}/secret/*"})
    assert evaluate(documents, IamRequest("s3:GetObject", f"{BUCKET}/data/x")).allowed
    assert not evaluate(documents, IamRequest("s3:DeleteObject", f"{BUCKET}/data/x")).allowed
    assert not evaluate(documents, IamRequest("s3:GetObject", f"{BUCKET}/secret/x")).allowed


def test_pass_role_only_to_the_named_service():
    documents = policy({"Effect": "Allow", "Action": "iam:PassRole", "Resource": "arn:aws:iam::1:role/r",
                        "Condition": {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}})
    to = {"iam:PassedToService": "sagemaker.amazonaws.com"}
    assert evaluate(documents, IamRequest("iam:PassRole", "arn:aws:iam::1:role/r", to)).allowed
    assert not evaluate(documents, IamRequest("iam:PassRole", "arn:aws:iam::1:role/r",
                                              {"iam:PassedToService": "ec2.amazonaws.com"})).allowed


def test_create_training_job_asks_for_the_job_tags_and_the_passed_role():
    where = Where(account="111122223333")
    requests = requests_for("sagemaker", "CreateTrainingJob", {
        "TrainingJobName": "Stabilizer-ABC-1", "RoleArn": "arn:aws:iam::111122223333:role/r", "Tags": [{"Key": "k"}],
    }, where)
    job = "arn:aws:sagemaker:us-east-1:111122223333:training-job/stabilizer-abc-1"
    assert requests == [
        IamRequest("sagemaker:CreateTrainingJob", job),
        IamRequest("sagemaker:AddTags", job),
        IamRequest("iam:PassRole", "arn:aws:iam::111122223333:role/r",
                   {"iam:PassedToService": "sagemaker.amazonaws.com"}),
    ]
    assert requests_for("s3", "ListObjectsV2", {"Bucket": "b", "Prefix": "data/", "MaxKeys": 1}, where) == [
        IamRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "data/", "s3:max-keys": "1"})
    ]
    assert not requests_for("s3", "PutBucketPolicy", {"Bucket": "b"}, where)[0].mapped


def test_a_job_pulls_its_image_and_writes_profiler_output_as_its_role():
    request = {
        "TrainingJobName": "j", "AlgorithmSpecification": {
            "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-cpu-py312"},
        "ProfilerConfig": {"S3OutputPath": "s3://b/executions/e/attempt-1/profiler"},
    }
    actions = [(r.action, r.resource) for r in job_requests(request, Where())]
    assert ("ecr:BatchGetImage", "arn:aws:ecr:us-east-1:763104351884:repository/pytorch-training") in actions
    assert ("s3:PutObject", "arn:aws:s3:::b/executions/e/attempt-1/profiler/j/profiler-output/system/incremental/"
            "metrics.json") in actions


def test_template_intrinsics_resolve_to_the_deployment_names():
    from stabilizer.local.iam.stack_policies import DeploymentNames

    template = {
        "Mappings": {"Registry": {"us-east-1": {"account": "763104351884"}}},
        "Resources": {
            "Bucket": {"Type": "AWS::S3::Bucket"},
            "Fn": {"Type": "AWS::Lambda::Function", "Properties": {
                "Handler": f"{HANDLERS}.train.lambda_handler", "Role": {"Fn::GetAtt": ["FnRole", "Arn"]}}},
            "FnRole": {"Type": "AWS::IAM::Role"},
            "Monitor": {"Type": "AWS::Lambda::Function", "Properties": {
                "Handler": f"{HANDLERS}.monitor.lambda_handler", "Role": {"Fn::GetAtt": ["FnRole", "Arn"]}}},
            "Watch": {"Type": "AWS::Lambda::Function", "Properties": {
                "Handler": f"{HANDLERS}.watch.lambda_handler", "Role": {"Fn::GetAtt": ["FnRole", "Arn"]}}},
            "Machine": {"Type": "AWS::StepFunctions::StateMachine",
                        "Properties": {"RoleArn": {"Fn::GetAtt": ["FnRole", "Arn"]}}},
            "JobRole": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {
                "Statement": [{"Principal": {"Service": "sagemaker.amazonaws.com"}}]}}},
            "Policy": {"Type": "AWS::IAM::Policy", "Properties": {"Roles": [{"Ref": "JobRole"}], "PolicyDocument": {
                "Statement": [{"Effect": "Allow", "Action": "ecr:BatchGetImage", "Resource": {"Fn::Join": ["", [
                    "arn:", {"Ref": "AWS::Partition"}, ":ecr:", {"Ref": "AWS::Region"}, ":",
                    {"Fn::FindInMap": ["Registry", {"Ref": "AWS::Region"}, "account"]}, ":repository/x"]]}},
                    {"Effect": "Allow", "Action": "s3:GetObject", "Resource": [
                        {"Fn::Sub": "${Bucket.Arn}/data/*"}, {"Fn::GetAtt": ["Unknown", "Arn"]}]}]}}},
        },
    }
    roles = {p: f"arn:aws:iam::1:role/{p}" for p in
             ("TrainFunction", "MonitorFunction", "WatchFunction", "StateMachine", "SageMakerExecutionRole")}
    names = DeploymentNames(bucket="local", topic_arn="t", state_machine_arn="s", function_arns={
        "TrainFunction": "f1", "MonitorFunction": "f2", "WatchFunction": "f3"}, role_arns=roles)
    [document] = principal_policies(template, names)["SageMakerExecutionRole"].documents
    assert document["Statement"][0]["Resource"] == "arn:aws:ecr:us-east-1:763104351884:repository/x"
    # What cannot be resolved matches nothing, so it can only deny.
    assert document["Statement"][1]["Resource"] == ["arn:aws:s3:::local/data/*", "unresolved:Unknown.Arn"]


@pytest.fixture
def s3():
    env = {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}
    with mock.patch.dict(os.environ, env), mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="bkt")
        yield client


def test_strict_mode_refuses_a_denied_call_as_aws_does_and_lets_allowed_ones_through(s3):
    role = PrincipalPolicies("Reader", "arn:aws:iam::123456789012:role/reader", policy(LIST_DATA))
    checker = AccessChecker({"Reader": role}, Where(), strict=True)
    with checker.installed():
        s3.list_objects_v2(Bucket="bkt", Prefix="anything/")  # no principal: the operator's own call
        with acting_as("Reader"):
            s3.list_objects_v2(Bucket="bkt", Prefix="data/train/")
            with pytest.raises(ClientError) as caught:
                s3.list_objects_v2(Bucket="bkt", Prefix="executions/e/")
    error = caught.value.response
    assert error["Error"]["Code"] == "AccessDenied"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert error["Error"]["Message"] == (
        "User: arn:aws:sts::123456789012:assumed-role/reader/Reader is not authorized to perform: s3:ListBucket on "
        "resource: arn:aws:s3:::bkt because no identity-based policy allows the s3:ListBucket action"
    )
    assert [row[3] for row in checker.table()] == ["allowed", "DENIED"]


def test_a_tagged_client_is_its_principals_whoever_calls_it(s3):
    role = PrincipalPolicies("Job", "arn:aws:iam::123456789012:role/job", policy(LIST_DATA))
    checker = AccessChecker({"Job": role, "Other": role}, Where())
    tag_client(s3, "Job")
    with checker.installed(), acting_as("Other"):
        s3.list_objects_v2(Bucket="bkt", Prefix="data/")
    assert [c.principal for c in checker.calls] == ["Job"]


def test_strict_mode_without_the_evaluator_says_what_to_install(monkeypatch):
    from stabilizer.local.engine.deployment import EngineError
    from stabilizer.local.engine.lambda_seam import LocalLambdas
    from stabilizer.local.iam import access_check

    def missing():
        raise RuntimeError("judging calls by the stack's IAM policies needs principalmapper (No module named "
                           "'principalmapper'); install the `dev` extra")

    monkeypatch.setattr(access_check, "_evaluator", missing)
    with pytest.raises(EngineError, match=r"^strict mode: .*needs principalmapper.*install the `dev` extra"):
        LocalSettings().strict_access_checker(LocalLambdas("us-east-1", "123456789012"))


def test_the_state_machines_own_notification_and_invocations_are_its_calls(tmp_path):
    """A deployment fault at prepare (not an input error) ends in NotifyFailureBeforeLaunch: the state
    machine publishes."""
    from pathlib import Path

    import numpy as np

    from stabilizer.local.engine.deployment import Project
    from stabilizer.local.engine.engine import LocalEngine
    from stabilizer.local.iam.stack_policies import STATE_MACHINE, TRAIN

    for channel in ("train", "test"):
        (tmp_path / "data" / channel).mkdir(parents=True)
        np.save(tmp_path / "data" / channel / "x.npy", np.zeros((2, 1), dtype=np.float32))
    settings = LocalSettings(job_name_prefix="not_a_prefix")  # MisconfiguredEnvironment in the train function
    machine = PrincipalPolicies(STATE_MACHINE, settings.states_role, policy(
        {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": "*"},
        {"Effect": "Allow", "Action": "sns:Publish", "Resource": settings.topic_arn},
    ))
    train = PrincipalPolicies(TRAIN, "arn:aws:iam::123456789012:role/train", policy())
    checker = AccessChecker({STATE_MACHINE: machine, TRAIN: train}, Where())
    root = Path(__file__).resolve().parents[4]
    with LocalEngine(tmp_path / "run", tmp_path / "data", project=Project.discover(root), settings=settings,
                     access=checker) as engine:
        record = engine.run({}, name="exec-misconfigured")
    assert record.status == "FAILED" and record.error == "MisconfiguredEnvironment"
    rows = checker.table()
    assert (STATE_MACHINE, "lambda:InvokeFunction", f"arn:aws:lambda:us-east-1:123456789012:function:"
            f"{settings.train_function}", "allowed") in rows
    assert (STATE_MACHINE, "sns:Publish", settings.topic_arn, "allowed") in rows


def test_strict_mode_fails_a_job_whose_image_its_role_cannot_pull():
    from stabilizer.local.iam.stack_policies import EXECUTION_ROLE

    role = PrincipalPolicies(EXECUTION_ROLE, "arn:aws:iam::123456789012:role/job", policy(
        {"Effect": "Allow", "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                                       "ecr:BatchCheckLayerAvailability"],
         "Resource": "arn:aws:ecr:us-east-1:763104351884:repository/pytorch-training"},
        {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
    ))
    request = {"TrainingJobName": "j", "AlgorithmSpecification": {"TrainingImage": ""}}
    ours = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-cpu-py312"
    theirs = "111122223333.dkr.ecr.us-east-1.amazonaws.com/mine:1"
    strict = AccessChecker({EXECUTION_ROLE: role}, Where(), strict=True)
    assert strict.job_refusal({**request, "AlgorithmSpecification": {"TrainingImage": ours}}) is None
    assert strict.job_refusal({**request, "AlgorithmSpecification": {"TrainingImage": theirs}}) == (
        "ClientError: AccessDenied: the execution role cannot ecr:BatchGetImage on "
        "arn:aws:ecr:us-east-1:111122223333:repository/mine (the training image; no identity-based policy allows)"
    )
    # Not strict: judged and recorded by the caller, never refused here.
    assert AccessChecker({EXECUTION_ROLE: role}, Where()).job_refusal(
        {**request, "AlgorithmSpecification": {"TrainingImage": theirs}}) is None


def test_each_engine_is_a_fresh_deployment_whose_functions_read_its_own_settings(tmp_path):
    """Lambda reads its environment at a cold start; a second engine in the same process is a new
    deployment, so its functions must not keep the settings the first engine's functions read."""
    from pathlib import Path

    import numpy as np

    from stabilizer.local.engine.deployment import Project
    from stabilizer.local.engine.engine import LocalEngine

    for channel in ("train", "test"):
        (tmp_path / "data" / channel).mkdir(parents=True)
        np.save(tmp_path / "data" / channel / "x.npy", np.zeros((2, 1), dtype=np.float32))
    project = Project.discover(Path(__file__).resolve().parents[4])
    with LocalEngine(tmp_path / "first", tmp_path / "data", project=project) as engine:
        assert engine.run({"nonsense": 1}, name="exec-first").error == "InvalidInput"
    settings = LocalSettings(job_name_prefix="not_a_prefix")
    with LocalEngine(tmp_path / "second", tmp_path / "data", project=project, settings=settings) as engine:
        record = engine.run({"nonsense": 1}, name="exec-second")
    assert (record.status, record.error) == ("FAILED", "MisconfiguredEnvironment")
    assert "JOB_NAME_PREFIX" in record.cause
