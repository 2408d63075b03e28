"""The stabilizer stack: bucket, topic, roles, the two Lambdas and the state machine.

Everything deployment-level (bucket, topic, roles, image, instance type, job-name prefix) is baked
in here, so an execution started from the console with `{}` runs the reference problem. The state
machine is the ASL file in `statemachine/`, with its `${...}` placeholders filled by
`definition_substitutions`; nothing about the workflow is written in CDK code.

Least privilege, in short: the SageMaker execution role reads `data/`, `source/` and checkpoints
and writes under `executions/`; the Lambda roles act on `training-job/<prefix>-*` only and pass
the execution role to SageMaker only; the state machine role invokes the two functions and
publishes to the topic. The cdk-nag acknowledgements sit next to the resources they concern,
each with its reason.

This module must not call AWS at synth time (no lookups): `cdk synth` runs offline.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import (
    Acknowledgment,
    ArnFormat,
    AssetHashType,
    Aws,
    CfnOutput,
    Duration,
    Fn,
    RemovalPolicy,
    Stack,
    Validations,
)
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3deploy
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_ssm as ssm
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import DeploymentConfig
from infra.image_mapping import BakedImages
from infra.lambda_asset import BuiltAsset

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFINITION_FILE = REPO_ROOT / "statemachine" / "stabilizer.asl.json"

# Measured, not on Lambda: loading both handlers in the Lambda layout (asset, layer, boto3 only;
# tests/infra/test_lambda_asset.py, CPython 3.11 on x86_64, nothing byte-compiled, as on a cold
# start) peaks at 68 MiB (VmHWM). 256 MB is almost four times that, room for the work (a state
# payload, one findings file), and gives twice the CPU share of 128 MB, which shortens cold starts.
LAMBDA_MEMORY_MB = 256
# One or two SageMaker calls plus an S3 read and an SNS publish, each retried by botocore.
LAMBDA_TIMEOUT = Duration.seconds(60)

# The construct id CDK gives the singleton function behind every BucketDeployment of a stack.
_BUCKET_DEPLOYMENT_HANDLER = "Custom::CDKBucketDeployment8693BB64968944B69AAFB0CC9EB8756C"

# Example input shown in the outputs and in README.md (schemas/execution-input.schema.json):
# the original sample's remedy ladder, checking every two minutes. Every field is optional.
EXAMPLE_INPUT = '{"policy": "original", "wait_seconds": 120}'


def _acknowledge(construct: Construct, *findings: tuple[str, str]) -> None:
    acknowledgments = (Acknowledgment(id=rule, reason=reason) for rule, reason in findings)
    Validations.of(construct).acknowledge(*acknowledgments)


class StabilizerStack(Stack):
    """One stack: the whole deployed part of stabilizer."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeploymentConfig,
        lambda_asset: BuiltAsset,
        training_source_dir: Path,
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.config = config

        self.bucket = self._bucket()
        self.topic = self._topic()
        self.images = BakedImages(self, "Images", config=config)
        self.source_s3_uri = self._training_source(training_source_dir)
        self.sagemaker_role = self._sagemaker_execution_role()
        powertools = self._powertools_layer()
        self.train_function = self._function(
            "TrainFunction", "train_handler.lambda_handler", lambda_asset, powertools,
            "Prepares the execution's state and launches each training job.",
        )
        self.monitor_function = self._function(
            "MonitorFunction", "monitor_handler.lambda_handler", lambda_asset, powertools,
            "Checks a training job and its rule findings, decides the next step, stops jobs.",
        )
        self._grant_train(self.train_function.role)
        self._grant_monitor(self.monitor_function.role)
        self.state_machine = self._state_machine()
        self._outputs()
        self._drop_redundant_role_dependencies()

    # --- storage and notifications -------------------------------------------------------------

    def _bucket(self) -> s3.Bucket:
        destroy = self.config.removal_policy == "destroy"
        bucket = s3.Bucket(
            self,
            "Bucket",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                # Checkpoints, tensors, findings and outputs of every attempt live under
                # executions/; tensors dominate the volume. The execution's history stays in
                # Step Functions and in the notifications after these expire.
                s3.LifecycleRule(
                    id="expire-execution-artifacts",
                    prefix="executions/",
                    expiration=Duration.days(self.config.artifact_retention_days),
                ),
                s3.LifecycleRule(
                    id="abort-incomplete-uploads",
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
            ],
            removal_policy=RemovalPolicy.DESTROY if destroy else RemovalPolicy.RETAIN,
            auto_delete_objects=destroy,
        )
        _acknowledge(
            bucket,
            ("AwsSolutions-S1",
             "Server access logs would need a second bucket; every writer of this bucket is a role "
             "of this stack, and object-level auditing can be enabled with CloudTrail data events."),
        )
        return bucket

    def _topic(self) -> sns.Topic:
        topic = sns.Topic(
            self,
            "Topic",
            display_name="stabilizer",
            enforce_ssl=True,
            # The AWS managed key: SNS encrypts at rest with no key to pay for or administer;
            # every publisher of this topic is a principal of this account, which that key allows.
            master_key=kms.Alias.from_alias_name(self, "SnsManagedKey", "alias/aws/sns"),
        )
        if self.config.notification_email:
            topic.add_subscription(subscriptions.EmailSubscription(self.config.notification_email))
        return topic

    # --- training job inputs -------------------------------------------------------------------

    def _training_source(self, model_dir: Path) -> str:
        from infra.lambda_asset import default_cache_root
        from infra.training_source import ARCHIVE_NAME, stage_source_archive

        stage = stage_source_archive(model_dir, default_cache_root())
        # The content hash in the key lets a running execution keep the archive its jobs started with.
        prefix = f"source/{stage.name.removeprefix('sourcedir-')}/"
        deployment = s3deploy.BucketDeployment(
            self,
            "TrainingSource",
            sources=[s3deploy.Source.asset(str(stage))],
            destination_bucket=self.bucket,
            destination_key_prefix=prefix,
            retain_on_delete=False,
        )
        self._acknowledge_bucket_deployment(deployment)
        return f"s3://{self.bucket.bucket_name}/{prefix}{ARCHIVE_NAME}"

    def _acknowledge_bucket_deployment(self, deployment: s3deploy.BucketDeployment) -> None:
        # BucketDeployment runs one singleton function per stack; its role and runtime are CDK's.
        handler = self.node.try_find_child(_BUCKET_DEPLOYMENT_HANDLER)
        if handler is None:
            return
        bucket = self._logical_id(self.bucket)
        findings = [
            ("AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
             "AWSLambdaBasicExecutionRole]",
             "CDK's BucketDeployment function only writes its own logs with the basic execution role."),
            ("AwsSolutions-L1",
             "CDK's BucketDeployment function pins its runtime with the CDK version; it runs at deploy "
             "time only, to copy sourcedir.tar.gz."),
        ]
        for action in ("s3:GetBucket*", "s3:GetObject*", "s3:List*", "s3:Abort*", "s3:DeleteObject*"):
            findings.append((
                f"AwsSolutions-IAM5[Action::{action}]",
                "CDK's BucketDeployment grant: read of the CDK asset object and write of source/ "
                "in this bucket, the only two buckets it names.",
            ))
        for resource in ("Resource::arn:<AWS::Partition>:s3:::cdk-hnb659fds-assets-<AWS::AccountId>-"
                         "<AWS::Region>/*", f"Resource::<{bucket}.Arn>/*"):
            findings.append((
                f"AwsSolutions-IAM5[{resource}]",
                "CDK's BucketDeployment copies objects whose keys it learns at deploy time, within "
                "the CDK asset bucket and this stack's bucket only.",
            ))
        _acknowledge(handler, *findings)

    # --- roles ---------------------------------------------------------------------------------

    def _logical_id(self, construct: Construct) -> str:
        return self.get_logical_id(construct.node.default_child)

    def _objects(self, *patterns: str) -> list[str]:
        return [self.bucket.arn_for_objects(pattern) for pattern in patterns]

    def _list_bucket(self, *prefixes: str) -> iam.PolicyStatement:
        # ListBucket makes a missing key a 404 (NoSuchKey) instead of a 403, and lets the monitor
        # list an attempt's checkpoints; limited to prefixes.
        return iam.PolicyStatement(
            actions=["s3:ListBucket"],
            resources=[self.bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": list(prefixes)}},
        )

    def _training_job_arn(self, kind: str = "training-job") -> str:
        return self.format_arn(
            service="sagemaker", resource=kind, resource_name=f"{self.config.job_name_prefix}-*"
        )

    def _sagemaker_execution_role(self) -> iam.Role:
        role = iam.Role(
            self,
            "SageMakerExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description="Runs stabilizer training jobs: reads data and source, writes executions/.",
        )
        statements = [
            iam.PolicyStatement(
                sid="ReadDataSourceAndCheckpoints",
                actions=["s3:GetObject"],
                resources=self._objects("data/*", "source/*", "executions/*/checkpoints/*"),
            ),
            self._list_bucket("data/*", "source/*", "executions/*"),
            iam.PolicyStatement(
                sid="WriteOutputCheckpointsFindingsTensors",
                actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                resources=self._objects(
                    "executions/*/output/*", "executions/*/checkpoints/*", "executions/*/debug/*"
                ),
            ),
            iam.PolicyStatement(
                sid="TrainingLogs",
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                         "logs:DescribeLogStreams"],
                resources=[self.format_arn(
                    service="logs", resource="log-group", resource_name="/aws/sagemaker/TrainingJobs*",
                    arn_format=ArnFormat.COLON_RESOURCE_NAME,
                )],
            ),
            iam.PolicyStatement(
                sid="TrainingMetrics",
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}},
            ),
            iam.PolicyStatement(
                sid="PullTrainingImage",
                actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                         "ecr:BatchCheckLayerAvailability"],
                resources=self.images.repository_arns,
            ),
            iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
        ]
        policy = iam.Policy(self, "SageMakerExecutionPolicy", statements=statements)
        policy.attach_to_role(role)
        bucket = self._logical_id(self.bucket)
        _acknowledge(
            policy,
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/data/*]",
             "Training reads every object of the data prefix (x.npy, y.npy per channel)."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/source/*]",
             "Training reads sourcedir.tar.gz, whose key carries its content hash."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/checkpoints/*]",
             "Each attempt syncs its checkpoint directory (checkpoints, findings.json, tensors) "
             "under executions/<execution>/attempt-<n>/, named at run time."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/output/*]",
             "SageMaker writes the model artifact under the attempt's output/ prefix, named at run time."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/debug/*]",
             "Debugger (when enabled) writes under the attempt's debug/ prefix, named at run time."),
            ("AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:"
             "log-group:/aws/sagemaker/TrainingJobs*]",
             "SageMaker writes one log stream per training job into this fixed log group."),
            ("AwsSolutions-IAM5[Resource::*]",
             "cloudwatch:PutMetricData and ecr:GetAuthorizationToken support no resource scoping; "
             "metrics are limited to the /aws/sagemaker/ namespaces by condition."),
        )
        return role

    def _grant_train(self, role: iam.IRole) -> None:
        policy = iam.Policy(
            self,
            "TrainFunctionPolicy",
            statements=[
                iam.PolicyStatement(
                    sid="LaunchTrainingJobs",
                    actions=["sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob",
                             "sagemaker:AddTags"],
                    resources=[self._training_job_arn()],
                ),
                iam.PolicyStatement(
                    sid="PassExecutionRoleToSageMakerOnly",
                    actions=["iam:PassRole"],
                    resources=[self.sagemaker_role.role_arn],
                    conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
                ),
                iam.PolicyStatement(sid="Notify", actions=["sns:Publish"], resources=[self.topic.topic_arn]),
            ],
        )
        policy.attach_to_role(role)
        self._acknowledge_function_policy(policy)

    def _grant_monitor(self, role: iam.IRole) -> None:
        policy = iam.Policy(
            self,
            "MonitorFunctionPolicy",
            statements=[
                iam.PolicyStatement(
                    sid="WatchAndStopTrainingJobs",
                    actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
                    resources=[self._training_job_arn()],
                ),
                iam.PolicyStatement(
                    sid="StopDebuggerRuleJobs",
                    actions=["sagemaker:StopProcessingJob"],
                    resources=[self._training_job_arn("processing-job")],
                ),
                *self._read_findings_statements(),
                iam.PolicyStatement(sid="Notify", actions=["sns:Publish"], resources=[self.topic.topic_arn]),
            ],
        )
        policy.attach_to_role(role)
        self._acknowledge_function_policy(policy, monitors=True)

    def _read_findings_statements(self) -> list[iam.PolicyStatement]:
        return [
            iam.PolicyStatement(
                sid="ReadFindings",
                actions=["s3:GetObject"],
                resources=self._objects("executions/*/checkpoints/findings.json"),
            ),
            self._list_bucket("executions/*"),
        ]

    def _acknowledge_function_policy(self, policy: iam.Policy, *, monitors: bool = False) -> None:
        prefix = self.config.job_name_prefix
        bucket = self._logical_id(self.bucket)
        arn = "arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>"
        findings = [
            (f"AwsSolutions-IAM5[Resource::{arn}:training-job/{prefix}-*]",
             "Training jobs are named at run time (execution and attempt); the scope is this "
             "deployment's job-name prefix."),
        ]
        if monitors:
            findings.append((
                f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/checkpoints/findings.json]",
                "One findings.json per attempt, under executions/<execution>/attempt-<n>/ named at run time.",
            ))
            findings.append((
                f"AwsSolutions-IAM5[Resource::{arn}:processing-job/{prefix}-*]",
                "Debugger rule jobs are named after their training job at run time; the scope is this "
                "deployment's job-name prefix.",
            ))
        _acknowledge(policy, *findings)

    # --- functions ----------------------------------------------------------------------------

    def _powertools_layer(self) -> lambda_.ILayerVersion:
        # The official public layer, resolved at deploy time from its public SSM parameter (no
        # lookup at synth, so synth works offline). It must match the runtime and architecture.
        arn = ssm.StringParameter.value_for_string_parameter(
            self, f"/aws/service/powertools/python/x86_64/python3.13/{self.config.powertools_version}"
        )
        return lambda_.LayerVersion.from_layer_version_arn(self, "PowertoolsLayer", arn)

    def _function(
        self, construct_id: str, handler: str, asset: BuiltAsset, powertools: lambda_.ILayerVersion,
        description: str,
    ) -> lambda_.Function:
        log_group = logs.LogGroup(
            self,
            f"{construct_id}Logs",
            retention=_retention(self.config.log_retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )
        role = iam.Role(
            self,
            f"{construct_id}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"{construct_id}: its own logs and traces plus the policy attached below.",
        )
        function = lambda_.Function(
            self,
            construct_id,
            description=description,
            runtime=lambda_.Runtime.PYTHON_3_13,
            architecture=lambda_.Architecture.X86_64,
            handler=handler,
            code=lambda_.Code.from_asset(
                str(asset.path), asset_hash=asset.key, asset_hash_type=AssetHashType.CUSTOM
            ),
            layers=[powertools],
            memory_size=LAMBDA_MEMORY_MB,
            timeout=LAMBDA_TIMEOUT,
            log_group=log_group,
            tracing=lambda_.Tracing.ACTIVE,
            role=role,
            environment=self._function_environment(),
        )
        log_group.grant_write(role)
        _acknowledge(
            function,
            ("AwsSolutions-L1",
             "python3.13 is the runtime the project targets: the Powertools layer version and the "
             "bundled wheels (pydantic-core) are chosen for it, and the tests run the same code."),
        )
        _acknowledge(
            role.node.find_child("DefaultPolicy"),
            ("AwsSolutions-IAM5[Resource::*]",
             "X-Ray PutTraceSegments and PutTelemetryRecords support no resource scoping (CDK's "
             "grant for active tracing)."),
        )
        return function

    def _function_environment(self) -> dict[str, str]:
        data = f"s3://{self.bucket.bucket_name}/data"
        return {
            "BUCKET": self.bucket.bucket_name,
            "TOPIC_ARN": self.topic.topic_arn,
            "SAGEMAKER_ROLE_ARN": self.sagemaker_role.role_arn,
            **self.images.environment,
            "SOURCE_S3_URI": self.source_s3_uri,
            "TRAIN_DATA_S3_URI": f"{data}/train/",
            "TEST_DATA_S3_URI": f"{data}/test/",
            "JOB_NAME_PREFIX": self.config.job_name_prefix,
            "DEFAULT_INSTANCE_TYPE": self.config.instance_type,
            "DEBUGGER_RULES_ENABLED": "true" if self.config.debugger_rules_enabled else "false",
            "POWERTOOLS_SERVICE_NAME": "stabilizer",
        }

    # --- state machine -------------------------------------------------------------------------

    def _state_machine(self) -> sfn.StateMachine:
        log_group = logs.LogGroup(
            self,
            "StateMachineLogs",
            # Vended-log groups for Step Functions are conventionally under /aws/vendedlogs/.
            log_group_name=f"/aws/vendedlogs/states/{self.stack_name}-stabilizer",
            retention=_retention(self.config.log_retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )
        role = iam.Role(
            self,
            "StateMachineRole",
            assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
            description="Invokes the train and monitor functions and publishes failures to the topic.",
        )
        state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            # Inline (not an S3 asset), so the template shows the definition it deploys.
            definition_body=sfn.DefinitionBody.from_string(DEFINITION_FILE.read_text()),
            definition_substitutions={
                "TrainFunctionArn": self.train_function.function_arn,
                "MonitorFunctionArn": self.monitor_function.function_arn,
                "TopicArn": self.topic.topic_arn,
            },
            role=role,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
            tracing_enabled=True,
        )
        self.train_function.grant_invoke(role)
        self.monitor_function.grant_invoke(role)
        self.topic.grant_publish(role)
        _acknowledge(
            role.node.find_child("DefaultPolicy"),
            *(
                (f"AwsSolutions-IAM5[Resource::<{self._logical_id(function)}.Arn>:*]",
                 "Invoking the function by version or alias: CDK's grantInvoke adds the qualified ARN "
                 "of this one function next to the unqualified one.")
                for function in (self.train_function, self.monitor_function)
            ),
            ("AwsSolutions-IAM5[Resource::*]",
             "CloudWatch Logs delivery (logs:*LogDelivery, DescribeResourcePolicies, DescribeLogGroups) "
             "and X-Ray actions support no resource scoping; CDK's grant for logging and tracing."),
        )
        return state_machine

    def _drop_redundant_role_dependencies(self) -> None:
        """Keep only the DependsOn on each role's default policy; the role itself is a GetAtt.

        CDK also lists the role, which cfn-lint reports as W3005 (dependency already enforced).
        """
        owners = [self.train_function, self.monitor_function, self.state_machine]
        singleton = self.node.try_find_child(_BUCKET_DEPLOYMENT_HANDLER)
        if singleton is not None:
            owners.append(singleton)
        for owner in owners:
            role = owner.role
            default_policy = role.node.try_find_child("DefaultPolicy")
            depends_on = [self._logical_id(default_policy)] if default_policy is not None else []
            owner.node.default_child.add_override("DependsOn", depends_on)

    # --- outputs -------------------------------------------------------------------------------

    def _outputs(self) -> None:
        CfnOutput(self, "StateMachineArn", value=self.state_machine.state_machine_arn,
                  description="Start executions of this state machine.")
        CfnOutput(self, "BucketName", value=self.bucket.bucket_name,
                  description="Data under data/train/ and data/test/; attempts under executions/.")
        CfnOutput(self, "TopicArn", value=self.topic.topic_arn,
                  description="Every decision and failure is published here.")
        CfnOutput(
            self,
            "ConsoleLink",
            value=Fn.join("", [
                "https://", Aws.REGION, ".console.aws.amazon.com/states/home?region=", Aws.REGION,
                "#/statemachines/view/", self.state_machine.state_machine_arn,
            ]),
            description="The state machine in the Step Functions console: Start execution, input {}.",
        )
        CfnOutput(self, "ExampleExecutionInput", value=EXAMPLE_INPUT,
                  description="{} runs the reference problem; every field is optional.")


_RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
}


def _retention(days: int) -> logs.RetentionDays:
    """The CloudWatch retention at or above `days` (CloudWatch accepts only some values)."""
    return next((_RETENTION[d] for d in sorted(_RETENTION) if d >= days), logs.RetentionDays.ONE_YEAR)
