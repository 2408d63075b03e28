"""Every AWS call of a launch, judged by the synthesized IAM with a real policy evaluator.

moto enforces no IAM, so a call AWS would deny passes every moto test. Here the handlers run
under moto with `stabilizer.local.iam.access_check` recording each call as its principal's IAM
requests (action, resource ARN, context keys such as `s3:prefix` and `iam:PassedToService`),
and each request is evaluated against that principal's policies in the template the CDK app
synthesizes. Why principalmapper's evaluator and not moto's IAM enforcement: see the docstring
of stabilizer/local/iam/access_check.py (moto 5.2.5 knows only StringEquals, turns a failed
condition into a Deny, ignores NotResource); the semantics it must honour are checked in
tests/unit/local/iam/test_access_check.py.

What the stack grants, decided here: a job reads its channels anywhere in the stack's bucket (the
`resume` channel lies under executions/, a user's data under their own prefix) and its source
archive under source/ (where ValidateInput reads it as the train role), and
in the buckets the deployment names with `data_buckets`; anything else is refused at
ValidateInput naming the field. The execution role pulls only the images the deployment baked
in (and `training_image_uri`'s repository); any other `job.image` is refused naming job.image.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import boto3
import pytest
from moto import mock_aws

from stabilizer.local.engine.deployment import ACCOUNT, REGION, LocalSettings
from stabilizer.local.engine.lambda_seam import LocalLambdas
from stabilizer.local.iam.access_check import AccessChecker, acting_as, evaluate
from stabilizer.local.iam.iam_requests import IamRequest, Where, job_requests, requests_for
from stabilizer.local.iam.stack_policies import EXECUTION_ROLE, MONITOR, TRAIN, principal_policies
from tests.infra.synth import synth

SETTINGS = LocalSettings()
BUCKET = SETTINGS.bucket
NAMES = SETTINGS.deployment_names(LocalLambdas(REGION, ACCOUNT))
WHERE = Where(region=REGION, account=ACCOUNT, state_machine_arn=SETTINGS.state_machine_arn)
EXECUTION = {"id": f"arn:aws:states:{REGION}:{ACCOUNT}:execution:stabilizer-local:exec-1", "name": "exec-1"}
RESUME_FROM = f"s3://{BUCKET}/executions/exec-1/attempt-1/checkpoints/checkpoint-00000005.pt"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def policies(default_synth):
    return principal_policies(default_synth[1], NAMES)


@pytest.fixture
def cloud() -> Iterator[dict[str, Any]]:
    """The local deployment's bucket and topic under moto, with data, library, source and a checkpoint."""
    env = {
        **SETTINGS.lambda_environment(),
        "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    }
    with mock.patch.dict(os.environ, env), mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        for key in ("data/train/x.npy", "data/test/x.npy", "library/stabilizer_sentinel/__init__.py",
                    "mydata/train/x.npy", RESUME_FROM.split("/", 3)[3]):
            s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
        s3.put_object(Bucket=BUCKET, Key="source/jobs/mine/sourcedir.tar.gz", Body=_archive("fit.py"))
        boto3.client("sns", region_name=REGION).create_topic(Name=SETTINGS.topic_name)
        yield {"s3": s3, "sagemaker": boto3.client("sagemaker", region_name=REGION),
               "sns": boto3.client("sns", region_name=REGION)}


def _archive(*names: str) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"#"))
    return buffer.getvalue()


def _train_settings(**env: str):
    from stabilizer_workflow.settings import TrainSettings

    return TrainSettings.from_env({**SETTINGS.lambda_environment(), "AWS_REGION": REGION, **env})


def _launch_twice(cloud: dict[str, Any], policies, raw_input: dict[str, Any]) -> AccessChecker:
    """Prepare, launch attempt 1, then relaunch resuming from attempt 1's checkpoint, as the train role."""
    from stabilizer_workflow.aws.s3 import Artifacts
    from stabilizer_workflow.aws.sagemaker import TrainingJobs
    from stabilizer_workflow.aws.sns import Notifier
    from stabilizer_workflow.handlers import train as train_handler
    from stabilizer_workflow.launch.sources import SourceArchives

    settings = _train_settings()
    tools = {
        "settings": settings,
        "sources": SourceArchives(cloud["s3"]),
        "jobs": TrainingJobs(cloud["sagemaker"]),
        "notifier": Notifier(cloud["sns"], settings.topic_arn),
        "artifacts": Artifacts(cloud["s3"]),
        "now": NOW,
    }
    checker = AccessChecker(policies, WHERE)
    with checker.installed(), acting_as(TRAIN):
        state = train_handler.handle({"action": "prepare", "input": raw_input, "execution": EXECUTION}, **tools)
        state = train_handler.handle({"action": "launch", "state": state}, **tools)
        relaunch = {**state, "next_action": "launch_new", "resume_from": RESUME_FROM}
        train_handler.handle({"action": "launch", "state": relaunch}, **tools)
    return checker


def _allowed(checker: AccessChecker, principal: str, action: str) -> list[tuple[str, str, str, str]]:
    return [c.row() for c in checker.calls if c.principal == principal and c.request.action == action]


def test_a_resuming_relaunch_is_allowed_to_check_its_resume_channel(cloud, policies):
    checker = _launch_twice(cloud, policies, {})
    assert checker.denied() == [], checker.table()
    assert checker.unmapped() == []
    # The relaunch listed the resume channel under executions/, as the train role, and was allowed.
    prefix = RESUME_FROM.split("/", 3)[3]
    listing = (TRAIN, "s3:ListBucket", f"arn:aws:s3:::{BUCKET} [s3:max-keys=1, s3:prefix={prefix}]", "allowed")
    assert listing in _allowed(checker, TRAIN, "s3:ListBucket")
    # ... and created both jobs, tagged, passing the execution role to SageMaker only.
    assert len(_allowed(checker, TRAIN, "sagemaker:CreateTrainingJob")) == 2
    assert {row[3] for row in _allowed(checker, TRAIN, "sagemaker:AddTags")} == {"allowed"}
    [passed] = set(_allowed(checker, TRAIN, "iam:PassRole"))
    assert passed == (TRAIN, "iam:PassRole", f"{SETTINGS.sagemaker_role} [iam:PassedToService=sagemaker.amazonaws.com]",
                      "allowed")
    # The execution role then reads that channel and pulls the deployment's image.
    role = policies[EXECUTION_ROLE].documents
    bucket, key = RESUME_FROM.removeprefix("s3://").split("/", 1)
    for request in (requests_for("s3", "ListObjectsV2", {"Bucket": bucket, "Prefix": key}, WHERE)
                    + requests_for("s3", "GetObject", {"Bucket": bucket, "Key": key}, WHERE)):
        assert evaluate(role, request).allowed, request
    assert {c.verdict.allowed for c in checker.calls if c.principal == EXECUTION_ROLE} == {True}


def test_the_monitor_may_read_a_training_jobs_metric_stream_progress_and_stragglers(cloud, policies):
    from datetime import timedelta

    from stabilizer_workflow.aws.cloudwatch import NAMESPACE, MetricStreams
    from stabilizer_workflow.aws.s3 import Artifacts
    from stabilizer_workflow.aws.sagemaker import TrainingJobs
    from stabilizer_workflow.aws.sns import Notifier
    from stabilizer_workflow.execution.state import load_state
    from stabilizer_workflow.handlers import monitor as monitor_handler
    from stabilizer_workflow.handlers import train as train_handler
    from stabilizer_workflow.launch.sources import SourceArchives
    from stabilizer_workflow.settings import MonitorSettings

    settings = _train_settings()
    tools = {"settings": settings, "sources": SourceArchives(cloud["s3"]), "jobs": TrainingJobs(cloud["sagemaker"]),
             "notifier": Notifier(cloud["sns"], settings.topic_arn), "artifacts": Artifacts(cloud["s3"]), "now": NOW}
    state = train_handler.handle({"action": "prepare", "input": {}, "execution": EXECUTION}, **tools)
    state = load_state(train_handler.handle({"action": "launch", "state": state}, **tools))
    name, checkpoints = state.current.job_name, state.current.checkpoint_s3_uri
    # What SageMaker sends from the job's log (as the service, not as any role of the stack).
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    cloudwatch.put_metric_data(Namespace=NAMESPACE, MetricData=[{
        "MetricName": "train:loss", "Value": 2.3, "Timestamp": datetime.now(UTC) - timedelta(minutes=2),
        "Dimensions": [{"Name": "TrainingJobName", "Value": name}]}])
    bucket, prefix = checkpoints.removeprefix("s3://").split("/", 1)
    cloud["s3"].put_object(Bucket=bucket, Key=f"{prefix}/stragglers.json", Body=json.dumps(
        {"version": 1, "stragglers": [{"rule": "Straggler", "rank": 3, "host": "algo-2", "step": 40, "factor": 3.1}]}))
    in_training = {"TrainingJobName": name, "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training",
                   "TrainingStartTime": datetime.now(UTC) - timedelta(minutes=30)}
    monitor_settings = MonitorSettings(topic_arn=SETTINGS.topic_arn)
    deps = monitor_handler.Collaborators(
        settings=monitor_settings, jobs=mock.Mock(describe=lambda job: in_training),
        artifacts=Artifacts(cloud["s3"]), notifier=Notifier(cloud["sns"], SETTINGS.topic_arn),
        streams=MetricStreams(cloudwatch))
    checker = AccessChecker(policies, WHERE)
    with checker.installed(), acting_as(MONITOR):
        observation = monitor_handler.gather(state, deps, datetime.now(UTC))
    assert observation.metric_at is not None  # the datapoint was read back
    assert checker.denied() == [], checker.table()
    assert checker.unmapped() == []
    read = _allowed(checker, MONITOR, "cloudwatch:GetMetricData")
    assert read and set(read) == {(MONITOR, "cloudwatch:GetMetricData", "*", "allowed")}
    reads = _allowed(checker, MONITOR, "s3:GetObject")
    for name in ("progress.json", "stragglers.json"):
        assert (MONITOR, "s3:GetObject", f"arn:aws:s3:::{checkpoints.removeprefix('s3://')}/{name}", "allowed") in reads
    assert [(s.rank, s.host) for s in observation.stragglers] == [(3, "algo-2")]


def test_a_channel_at_another_prefix_of_the_stack_bucket_is_listed_and_read(cloud, policies):
    job = {
        "source": f"s3://{BUCKET}/source/jobs/mine/sourcedir.tar.gz",
        "entry_point": "fit.py",
        "hyperparameters": {"lr": 0.1},
        "channels": {"train": f"s3://{BUCKET}/mydata/train/"},
        "knobs": {"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-4, "max": 1.0}},
    }
    checker = _launch_twice(cloud, policies, {"job": job})
    assert checker.denied() == [], checker.table()
    listing = (TRAIN, "s3:ListBucket", f"arn:aws:s3:::{BUCKET} [s3:max-keys=1, s3:prefix=mydata/train/]", "allowed")
    assert listing in _allowed(checker, TRAIN, "s3:ListBucket")
    # ValidateInput read the job's archive (HeadObject, GetObject) to find its entry point.
    archive = (TRAIN, "s3:GetObject", f"arn:aws:s3:::{BUCKET}/source/jobs/mine/sourcedir.tar.gz", "allowed")
    assert archive in _allowed(checker, TRAIN, "s3:GetObject")
    role = policies[EXECUTION_ROLE].documents
    for request in (requests_for("s3", "ListObjectsV2", {"Bucket": BUCKET, "Prefix": "mydata/train/"}, WHERE)
                    + requests_for("s3", "GetObject", {"Bucket": BUCKET, "Key": "mydata/train/x.npy"}, WHERE)):
        assert evaluate(role, request).allowed, request


def _refusal(raw_input: dict[str, Any], **env: str) -> str:
    from stabilizer_workflow.errors import InvalidInput
    from stabilizer_workflow.handlers import train as train_handler

    with pytest.raises(InvalidInput) as caught:
        train_handler.handle({"action": "prepare", "input": raw_input, "execution": EXECUTION},
                             settings=_train_settings(**env), sources=mock.Mock(members=lambda uri: ["fit.py"]))
    return str(caught.value)


def _own_job(**changes: Any) -> dict[str, Any]:
    return {"job": {
        "source": f"s3://{BUCKET}/source/jobs/mine/sourcedir.tar.gz",
        "entry_point": "fit.py",
        "hyperparameters": {"lr": 0.1},
        "channels": {"train": f"s3://{BUCKET}/mydata/train/"},
        "knobs": {"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-4, "max": 1.0}},
        **changes,
    }}


def test_a_channel_in_another_bucket_is_refused_at_validate_input_naming_it(policies):
    message = _refusal(_own_job(channels={"train": "s3://someone-elses-bucket/train/"}))
    assert message.startswith("job.channels.train: s3://someone-elses-bucket/train/ is in bucket "
                              "'someone-elses-bucket', which the deployment's SageMaker execution role cannot read")
    assert "-c data_buckets=someone-elses-bucket" in message
    # The evaluator agrees: the role could neither list nor read it.
    role = policies[EXECUTION_ROLE].documents
    assert not evaluate(role, IamRequest("s3:GetObject", "arn:aws:s3:::someone-elses-bucket/train/x.npy")).allowed
    assert not evaluate(role, IamRequest("s3:ListBucket", "arn:aws:s3:::someone-elses-bucket",
                                         {"s3:prefix": "train/"})).allowed


def test_a_source_archive_outside_source_in_the_stack_bucket_is_refused_naming_job_source(policies):
    """ValidateInput reads the archive as the train role (its entry point must be in it), which reads
    source/ of the stack's bucket only; an archive elsewhere in that bucket is refused before any
    call, saying where to put it, exactly where the evaluator denies the read."""
    train = policies[TRAIN].documents
    elsewhere, inside = f"s3://{BUCKET}/mycode/sourcedir.tar.gz", f"s3://{BUCKET}/source/jobs/mine/sourcedir.tar.gz"
    for uri in (elsewhere, inside):
        [read] = requests_for("s3", "GetObject", {"Bucket": BUCKET, "Key": uri.split("/", 3)[3]}, WHERE)
        assert evaluate(train, read).allowed == (uri == inside), uri
    message = _refusal(_own_job(source=elsewhere))
    assert message.startswith(f"job.source: {elsewhere} is outside s3://{BUCKET}/source/")
    _own_job_accepted = _train_settings()
    from stabilizer_workflow.launch.access import source_problem

    assert source_problem(inside, _own_job_accepted) is None


def test_a_bucket_granted_by_data_buckets_is_readable_and_accepted():
    _, raw = synth(data_buckets="shared-datasets")
    role = principal_policies(raw, NAMES)[EXECUTION_ROLE].documents
    assert evaluate(role, IamRequest("s3:GetObject", "arn:aws:s3:::shared-datasets/train/x.npy")).allowed
    assert evaluate(role, IamRequest("s3:ListBucket", "arn:aws:s3:::shared-datasets", {"s3:prefix": "train/"})).allowed
    assert not evaluate(role, IamRequest("s3:PutObject", "arn:aws:s3:::shared-datasets/train/x.npy")).allowed
    environment = next(r["Properties"]["Environment"]["Variables"] for r in raw["Resources"].values()
                       if r["Type"] == "AWS::Lambda::Function"
                       and r["Properties"].get("Handler") == "stabilizer_workflow.handlers.train.lambda_handler")
    assert environment["DATA_BUCKETS"] == "shared-datasets"
    from stabilizer_workflow.launch.access import channel_problems

    granted = _train_settings(DATA_BUCKETS="shared-datasets")
    assert channel_problems({"train": "s3://shared-datasets/train/"}, granted) == []


def test_an_image_the_execution_role_cannot_pull_is_refused_naming_job_image(policies):
    from stabilizer_workflow.launch.access import image_problem, repository_of

    settings = _train_settings()
    role = policies[EXECUTION_ROLE].documents
    foreign = "111122223333.dkr.ecr.us-east-1.amazonaws.com/my-training:1.0"
    message = _refusal(_own_job(image=foreign))
    assert message.startswith(f"job.image: {foreign} is in repository 111122223333.dkr.ecr.us-east-1/my-training, "
                              "which the deployment's SageMaker execution role cannot pull")
    # What ValidateInput accepts is exactly what the evaluator lets the role pull.
    images = [settings.training_image_uri, foreign,
              "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-cpu-py312",
              "763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-training:2.8.0-cpu-py312",
              "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:2.1.0-gpu"]
    for image in images:
        repository = repository_of(image)
        arn = f"arn:aws:ecr:{repository.region}:{repository.account}:repository/{repository.name}"
        pullable = evaluate(role, IamRequest("ecr:BatchGetImage", arn)).allowed
        assert pullable == (image_problem(image, settings) is None), image


def test_the_profiler_output_path_is_writable_by_the_execution_role():
    from stabilizer_workflow.execution.state import WorkflowState
    from stabilizer_workflow.launch.requests import build_create_training_job

    _, raw = synth(debugger_rules_enabled="true")
    role = principal_policies(raw, NAMES)[EXECUTION_ROLE]
    settings = _train_settings(DEBUGGER_RULES_ENABLED="true",
                               DEBUGGER_RULE_IMAGE="503895931360.dkr.ecr.us-east-1.amazonaws.com/"
                                                   "sagemaker-debugger-rules:latest")
    from stabilizer_workflow.handlers import train as train_handler

    prepared = train_handler.handle(
        {"action": "prepare", "execution": EXECUTION,
         "input": {"run_spec": {"rules": [{"name": "NLPSequenceRatio", "parameters": {"token_values": "0"}},
                                          {"name": "StepOutlier"}]}}},
        settings=settings)
    request = build_create_training_job(WorkflowState.model_validate(prepared), settings, 1)
    assert request["ProfilerConfig"]["S3OutputPath"].endswith("/profiler")
    writes = [r for r in job_requests(request, WHERE) if r.action == "s3:PutObject"]
    assert [r.resource.split(f"{BUCKET}/", 1)[1].split("/")[3] for r in writes] == ["debug", "profiler"]
    for write in writes:
        assert evaluate(role.documents, write).allowed, write


def test_debugger_rule_jobs_get_no_actions_their_role_could_not_carry_out():
    """Debugger's built-in actions run in its rule job as the execution role ("Use Debugger built-in
    actions for rules"): StopTraining lists and stops training jobs (smdebug's StopTrainingAction calls
    ListTrainingJobs and StopTrainingJob), Email and SMS publish to an SMDebugRules topic. The
    synthesized execution role may do none of these, so the request carries no action_json and the
    monitor, whose role may stop the job and publish to the stack's topic, carries the actions out."""
    from stabilizer_workflow.execution.state import WorkflowState
    from stabilizer_workflow.handlers import train as train_handler
    from stabilizer_workflow.launch.requests import build_create_training_job

    _, raw = synth(debugger_rules_enabled="true")
    policies = principal_policies(raw, NAMES)
    job = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/stabilizer-0a1b2c3d-1"
    smdebug_topic = f"arn:aws:sns:{REGION}:{ACCOUNT}:SMDebugRules"
    role = policies[EXECUTION_ROLE].documents
    for request in (IamRequest("sagemaker:ListTrainingJobs", "*"), IamRequest("sagemaker:StopTrainingJob", job),
                    IamRequest("sns:Publish", smdebug_topic), IamRequest("sns:CreateTopic", smdebug_topic)):
        assert not evaluate(role, request).allowed, request
    assert evaluate(policies[MONITOR].documents, IamRequest("sagemaker:StopTrainingJob", job)).allowed
    settings = _train_settings(DEBUGGER_RULES_ENABLED="true",
                               DEBUGGER_RULE_IMAGE="503895931360.dkr.ecr.us-east-1.amazonaws.com/"
                                                   "sagemaker-debugger-rules:latest")
    actions = '[{"name": "stoptraining"}, {"name": "email", "endpoint": "mlteam@example.com"}]'
    prepared = train_handler.handle(
        {"action": "prepare", "execution": EXECUTION, "input": {"run_spec": {"rules": [
            {"name": "NLPSequenceRatio", "parameters": {"token_values": "0", "action_json": actions}}]}}},
        settings=settings)
    request = build_create_training_job(WorkflowState.model_validate(prepared), settings, 1)
    (rule,) = request["DebugRuleConfigurations"]
    assert "action_json" not in rule["RuleParameters"]


def test_the_monitor_may_release_a_warm_pool_of_its_own_jobs_only(policies):
    """A warm pool is released with UpdateTrainingJob (ResourceConfig.KeepAlivePeriodInSeconds 0,
    "Terminate a warm pool", SageMaker developer guide); the monitor asks it on its own jobs."""
    monitor = policies[MONITOR].documents
    params = {"ResourceConfig": {"KeepAlivePeriodInSeconds": 0}}
    [own] = requests_for("sagemaker", "UpdateTrainingJob", {"TrainingJobName": "stabilizer-0a1b2c3d-1", **params},
                         WHERE)
    assert own.action == "sagemaker:UpdateTrainingJob" and evaluate(monitor, own).allowed
    [other] = requests_for("sagemaker", "UpdateTrainingJob", {"TrainingJobName": "someone-elses-1", **params}, WHERE)
    assert not evaluate(monitor, other).allowed


def test_data_buckets_is_read_from_the_command_line_or_cdk_json_and_checked():
    from infra.config import ContextError, read_config

    class Context(dict):
        def try_get_context(self, key):
            return self.get(key)

    assert read_config(Context({"data_buckets": []})).data_buckets == ()  # cdk.json's default
    assert read_config(Context({"data_buckets": "shared-datasets, team.data"})).data_buckets == (
        "shared-datasets", "team.data")
    assert read_config(Context({"data_buckets": ["shared-datasets"]})).data_buckets == ("shared-datasets",)
    with pytest.raises(ContextError, match="'data_buckets' must hold S3 bucket names, got 'Shared_Data'"):
        read_config(Context({"data_buckets": "Shared_Data"}))
