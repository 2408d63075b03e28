"""The workflow: the three Lambdas, their least-privilege policies, the state machine and the
EventBridge rules that move it.

- train: prepares the execution's state and launches each training job;
- monitor: checks a job and its findings, decides, stops jobs;
- watch: parks the execution until its job changes (the task token of `AwaitJobChange`); its
  EventBridge rules and permissions are in infra/job_events.py.

The state machine is the ASL file with its placeholders filled from statemachine/placeholders.json
(infra/definition.py); nothing about the workflow's logic is written here.

Why a task token woken by the job's EventBridge event, and not the optimised
`sagemaker:createTrainingJob.sync` integration: `.sync` waits for the job's end only, so the
monitor could not look at a running job (Debugger rule verdicts, the gave-up limits) without a
parallel branch; the request would have to be spelt out field by field in the ASL (optional
members such as the Debugger configuration cannot be left out conditionally); and moto's
interpreter, which runs this same definition in local mode, lists sagemaker among its unsupported
integrations (moto 5.2.5, state_task_service_factory.py, _UNSUPPORTED_SERVICE_NAMES). The token
keeps the Lambdas as they are, keeps `wait_seconds` as the longest silence, and runs in moto.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, AssetHashType, Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra import nag
from infra.config import DeploymentConfig
from infra.definition import DEFINITION_FILE, substitutions
from infra.function_environment import function_environments
from infra.lambda_asset import BuiltAsset
from infra.storage import Storage
from infra.training_runtime import TrainingRuntime

# Measured, not on Lambda: loading both handlers in the Lambda layout (asset, layer, boto3 only;
# tests/infra/test_lambda_asset.py, CPython 3.11 on x86_64, nothing byte-compiled, as on a cold
# start) peaks at 68 MiB (VmHWM). 256 MB is almost four times that, room for the work (a state
# payload, one findings file), and gives twice the CPU share of 128 MB, which shortens cold starts.
LAMBDA_MEMORY_MB = 256
# One AWS call may take stabilizer_workflow.aws.worst_case_call_seconds() (52 s) with botocore's retries and
# timeouts; the handlers start no call that could not finish before this timeout
# (stabilizer_workflow.aws.invocation_deadline), so a slow call ends as TransientAwsError, which the state
# machine retries, and never as a Lambda timeout (Lambda.Unknown or Sandbox.Timedout). tests/infra checks
# the sum.
LAMBDA_TIMEOUT_SECONDS = 120

def _retention(days: int) -> logs.RetentionDays:
    """The CloudWatch retention at or above `days` (CloudWatch accepts only some values)."""
    table = {
        1: logs.RetentionDays.ONE_DAY, 3: logs.RetentionDays.THREE_DAYS, 5: logs.RetentionDays.FIVE_DAYS,
        7: logs.RetentionDays.ONE_WEEK, 14: logs.RetentionDays.TWO_WEEKS, 30: logs.RetentionDays.ONE_MONTH,
        60: logs.RetentionDays.TWO_MONTHS, 90: logs.RetentionDays.THREE_MONTHS,
        180: logs.RetentionDays.SIX_MONTHS, 365: logs.RetentionDays.ONE_YEAR,
    }
    return next((table[d] for d in sorted(table) if d >= days), logs.RetentionDays.ONE_YEAR)


class Workflow(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig,
                 storage: Storage, runtime: TrainingRuntime, lambda_asset: BuiltAsset) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.storage = storage
        self.runtime = runtime
        powertools = self._powertools_layer()
        environments = function_environments(config, storage, runtime)
        self.train_function = self._function(
            "TrainFunction", "stabilizer_workflow.handlers.train.lambda_handler", lambda_asset, powertools,
            "Prepares the execution's state and launches each training job.", environments["train"],
        )
        self.monitor_function = self._function(
            "MonitorFunction", "stabilizer_workflow.handlers.monitor.lambda_handler", lambda_asset, powertools,
            "Checks a training job and its rule findings, decides the next step, stops jobs.",
            environments["monitor"],
        )
        self.watch_function = self._function(
            "WatchFunction", "stabilizer_workflow.handlers.watch.lambda_handler", lambda_asset, powertools,
            "Wakes the execution when its training job ends; cleans up after executions that end abnormally.",
            environments["watch"],
        )
        self._grant_train()
        self._grant_monitor()
        self.state_machine = self._state_machine()
        self._grant_train_its_execution()

    # --- helpers ------------------------------------------------------------------------------

    def objects(self, *patterns: str) -> list[str]:
        return [self.storage.bucket.arn_for_objects(pattern) for pattern in patterns]

    def training_job_arn(self, kind: str = "training-job") -> str:
        return Stack.of(self).format_arn(
            service="sagemaker", resource=kind, resource_name=f"{self.config.job_name_prefix}-*"
        )

    def list_bucket(self, *prefixes: str) -> iam.PolicyStatement:
        # ListBucket makes a missing key a 404 (NoSuchKey) instead of a 403, and lets the monitor
        # list an attempt's checkpoints; limited to prefixes.
        return iam.PolicyStatement(
            actions=["s3:ListBucket"],
            resources=[self.storage.bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": list(prefixes)}},
        )

    def notify(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(sid="Notify", actions=["sns:Publish"], resources=[self.storage.topic.topic_arn])

    def job_arn_reasons(self, *, processing: bool = False) -> list[tuple[str, str]]:
        prefix = self.config.job_name_prefix
        arn = "arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>"
        reasons = [(f"AwsSolutions-IAM5[Resource::{arn}:training-job/{prefix}-*]",
                    "Training jobs are named at run time (execution and attempt); the scope is this "
                    "deployment's job-name prefix.")]
        if processing:
            reasons.append((f"AwsSolutions-IAM5[Resource::{arn}:processing-job/{prefix}-*]",
                            "Debugger rule jobs are named after their training job at run time; the scope "
                            "is this deployment's job-name prefix."))
        return reasons

    # --- functions ----------------------------------------------------------------------------

    def _powertools_layer(self) -> lambda_.ILayerVersion:
        # The official public layer, resolved at deploy time from its public SSM parameter (no
        # lookup at synth, so synth works offline). It must match the runtime and architecture,
        # and the version must be one whose parameter was published (infra/config.py).
        arn = ssm.StringParameter.value_for_string_parameter(
            self, f"/aws/service/powertools/python/x86_64/python3.13/{self.config.powertools_version}"
        )
        return lambda_.LayerVersion.from_layer_version_arn(self, "PowertoolsLayer", arn)

    def _function(self, construct_id: str, handler: str, asset: BuiltAsset, powertools: lambda_.ILayerVersion,
                  description: str, environment: dict[str, str]) -> lambda_.Function:
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
            timeout=Duration.seconds(LAMBDA_TIMEOUT_SECONDS),
            log_group=log_group,
            tracing=lambda_.Tracing.ACTIVE,
            role=role,
            environment=environment,
        )
        log_group.grant_write(role)
        nag.acknowledge(
            function,
            ("AwsSolutions-L1",
             "python3.13 is the runtime the project targets: the Powertools layer version and the "
             "bundled wheels (pydantic-core) are chosen for it, and the tests run the same code."),
        )
        nag.acknowledge(
            role.node.find_child("DefaultPolicy"),
            ("AwsSolutions-IAM5[Resource::*]",
             "X-Ray PutTraceSegments and PutTelemetryRecords support no resource scoping (CDK's "
             "grant for active tracing)."),
        )
        return function

    # --- policies -----------------------------------------------------------------------------

    def _grant_train(self) -> None:
        policy = iam.Policy(
            self,
            "TrainFunctionPolicy",
            statements=[
                iam.PolicyStatement(
                    sid="LaunchTrainingJobs",
                    # StopTrainingJob: a job created after its execution was aborted is stopped at once.
                    actions=["sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob",
                             "sagemaker:AddTags", "sagemaker:StopTrainingJob"],
                    resources=[self.training_job_arn()],
                ),
                iam.PolicyStatement(
                    sid="PassExecutionRoleToSageMakerOnly",
                    actions=["iam:PassRole"],
                    resources=[self.runtime.execution_role.role_arn],
                    conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
                ),
                # Before launching: is there an object under each channel of this bucket? Channels
                # may lie at any prefix of it: data/, a user's own, the library, and the `resume`
                # channel under executions/ (every resuming relaunch lists it).
                iam.PolicyStatement(sid="ListChannelsOfThisBucket", actions=["s3:ListBucket"],
                                    resources=[self.storage.bucket.bucket_arn]),
                # ValidateInput lists a user's source archive to find the entry point in it: under
                # source/ of this bucket, or in a bucket the deployment grants (data_buckets).
                iam.PolicyStatement(sid="ReadSourceArchives", actions=["s3:GetObject"], resources=[
                    *self.objects("source/*"),
                    *(f"arn:{Aws.PARTITION}:s3:::{bucket}/*" for bucket in self.config.data_buckets),
                ]),
                self.notify(),
            ],
        )
        policy.attach_to_role(self.train_function.role)
        self.train_policy = policy
        bucket = nag.logical_id(self.storage.bucket)
        nag.acknowledge(
            policy,
            *self.job_arn_reasons(),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/source/*]",
             "Source archives of users' jobs are uploaded under source/jobs/<hash>/, named at run time."),
            *(
                (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{b}/*]",
                 f"ValidateInput reads users' source archives in {b}, which the deployment grants (data_buckets).")
                for b in self.config.data_buckets
            ),
        )

    def executions_arn(self) -> str:
        """This state machine's executions, named at run time."""
        return Stack.of(self).format_arn(
            service="states", resource="execution",
            resource_name=f"{self.state_machine.state_machine_name}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

    def execution_arn_reason(self, why: str) -> tuple[str, str]:
        machine = nag.logical_id(self.state_machine)
        return (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:"
                f"execution:<{machine}.Name>:*]", why)

    def _grant_train_its_execution(self) -> None:
        """After CreateTrainingJob the train function asks whether its execution still runs (one aborted
        meanwhile would leave the job unwatched, so it stops it): DescribeExecution of this state
        machine's executions, granted once the state machine exists."""
        self.train_policy.add_statements(iam.PolicyStatement(
            sid="CheckItsExecutionStillRuns", actions=["states:DescribeExecution"],
            resources=[self.executions_arn()],
        ))
        nag.acknowledge(self.train_policy, self.execution_arn_reason(
            "DescribeExecution of this state machine's executions only, named at run time, to stop a job "
            "launched for an execution that was aborted meanwhile."))

    def _grant_monitor(self) -> None:
        policy = iam.Policy(
            self,
            "MonitorFunctionPolicy",
            statements=[
                iam.PolicyStatement(
                    sid="WatchAndStopTrainingJobs",
                    # UpdateTrainingJob: releases a warm pool no attempt will reuse (KeepAlivePeriodInSeconds 0).
                    actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob",
                             "sagemaker:UpdateTrainingJob"],
                    resources=[self.training_job_arn()],
                ),
                iam.PolicyStatement(
                    sid="StopDebuggerRuleJobs",
                    actions=["sagemaker:StopProcessingJob"],
                    resources=[self.training_job_arn("processing-job")],
                ),
                iam.PolicyStatement(
                    sid="ReadFindings",
                    actions=["s3:GetObject"],
                    # findings.json, progress.json's time (HeadObject) for the monitor's own hang check, and
                    # stragglers.json (the ranks the job's watchdog found slower than the others).
                    resources=self.objects("executions/*/checkpoints/findings.json",
                                           "executions/*/checkpoints/progress.json",
                                           "executions/*/checkpoints/stragglers.json"),
                ),
                self.list_bucket("executions/*"),
                # The job's metric stream (the loss lines SageMaker sends to CloudWatch): when it last
                # moved, for the monitor's own hang check (stabilizer_workflow.aws.cloudwatch).
                iam.PolicyStatement(sid="ReadJobMetricStreams", actions=["cloudwatch:GetMetricData"],
                                    resources=["*"]),
                self.notify(),
            ],
        )
        policy.attach_to_role(self.monitor_function.role)
        bucket = nag.logical_id(self.storage.bucket)
        nag.acknowledge(
            policy,
            *self.job_arn_reasons(processing=True),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/checkpoints/findings.json]",
             "One findings.json per attempt, under executions/<execution>/attempt-<n>/ named at run time."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/checkpoints/progress.json]",
             "One progress.json per attempt, under executions/<execution>/attempt-<n>/ named at run time."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/checkpoints/stragglers.json]",
             "One stragglers.json per attempt, under executions/<execution>/attempt-<n>/ named at run time."),
            ("AwsSolutions-IAM5[Resource::*]",
             "cloudwatch:GetMetricData supports no resource scoping (CloudWatch's permissions reference: the "
             "resource is *); it is read-only, and the monitor asks only for its training jobs' loss metric "
             "in /aws/sagemaker/TrainingJobs."),
        )

    # --- state machine --------------------------------------------------------------

    def _state_machine(self) -> sfn.StateMachine:
        stack = Stack.of(self)
        log_group = logs.LogGroup(
            self,
            "StateMachineLogs",
            # Vended-log groups for Step Functions are conventionally under /aws/vendedlogs/.
            log_group_name=f"/aws/vendedlogs/states/{stack.stack_name}-stabilizer",
            retention=_retention(self.config.log_retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )
        role = iam.Role(
            self,
            "StateMachineRole",
            assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
            description="Invokes the train, monitor and watch functions and publishes failures to the topic.",
        )
        definition = DEFINITION_FILE.read_text()
        state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            # Inline (not an S3 asset), so the template shows the definition it deploys.
            definition_body=sfn.DefinitionBody.from_string(definition),
            definition_substitutions=substitutions({
                "partition": Aws.PARTITION,
                "train_function_arn": self.train_function.function_arn,
                "monitor_function_arn": self.monitor_function.function_arn,
                "watch_function_arn": self.watch_function.function_arn,
                "topic_arn": self.storage.topic.topic_arn,
            }, definition),
            role=role,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
            tracing_enabled=True,
        )
        # cfn-lint's schema for state machine definitions (E3601) accepts only `arn:aws:` resources;
        # `arn:${Partition}:` is what lets the same definition run in aws-cn and aws-us-gov.
        # statelint checks the definition file itself (tests/asl/test_definition.py).
        state_machine.node.default_child.add_metadata("cfn-lint", {"config": {"ignore_checks": ["E3601"]}})
        functions = (self.train_function, self.monitor_function, self.watch_function)
        for function in functions:
            function.grant_invoke(role)
        self.storage.topic.grant_publish(role)
        nag.acknowledge(
            role.node.find_child("DefaultPolicy"),
            *(
                (f"AwsSolutions-IAM5[Resource::<{nag.logical_id(function)}.Arn>:*]",
                 "Invoking the function by version or alias: CDK's grantInvoke adds the qualified ARN "
                 "of this one function next to the unqualified one.")
                for function in functions
            ),
            ("AwsSolutions-IAM5[Resource::*]",
             "CloudWatch Logs delivery (logs:*LogDelivery, DescribeResourcePolicies, DescribeLogGroups) "
             "and X-Ray actions support no resource scoping; CDK's grant for logging and tracing."),
        )
        return state_machine

    def drop_redundant_role_dependencies(self) -> None:
        """Keep only the DependsOn on each role's default policy; the role itself is a GetAtt.

        CDK also lists the role, which cfn-lint reports as W3005 (dependency already enforced).
        """
        from infra.storage import BUCKET_DEPLOYMENT_HANDLER

        owners = [self.train_function, self.monitor_function, self.watch_function, self.state_machine]
        singleton = Stack.of(self).node.try_find_child(BUCKET_DEPLOYMENT_HANDLER)
        if singleton is not None:
            owners.append(singleton)
        for owner in owners:
            default_policy = owner.role.node.try_find_child("DefaultPolicy")
            depends_on = [nag.logical_id(default_policy)] if default_policy is not None else []
            owner.node.default_child.add_override("DependsOn", depends_on)
