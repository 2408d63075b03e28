"""The events that move and clean up executions, and what the watch function may do for them.

- "SageMaker Training Job State Change" (Completed, Failed, Stopped; this deployment's job-name
  prefix): the job's end, not the next check, moves the execution: the watch function sends the
  parked execution its task token. SageMaker sends this event to the default event bus whenever
  TrainingJobStatus changes (EventBridge reference, "Amazon SageMaker AI events"); its detail is
  a part of DescribeTrainingJob's response without CheckpointConfig (tests/events/README.md), so
  the watch function finds the execution from OutputDataConfig.S3OutputPath or the job's tags.
- "Step Functions Execution Status Change" (FAILED, TIMED_OUT, ABORTED; this state machine):
  whatever ends an execution abnormally (a timeout, a StopExecution, the history quota, an error
  no Catch handled), the watch function stops the training job it left running and tells someone.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra import nag
from infra.config import DeploymentConfig
from infra.storage import Storage
from infra.workflow import Workflow

# SageMaker ends a job in one of these; the watch function wakes the execution on each.
TERMINAL_JOB_STATUSES = ["Completed", "Failed", "Stopped"]
# An execution that ends in one of these may have left a job running.
ABNORMAL_EXECUTION_STATUSES = ["FAILED", "TIMED_OUT", "ABORTED"]


class JobEvents(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig,
                 storage: Storage, workflow: Workflow) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.storage = storage
        self.workflow = workflow
        self._grant_watch()
        self._rules()

    def _grant_watch(self) -> None:
        executions = self.workflow.executions_arn()
        policy = iam.Policy(
            self,
            "WatchFunctionPolicy",
            statements=[
                iam.PolicyStatement(
                    sid="KeepTaskTokens",
                    actions=["s3:PutObject", "s3:GetObject", "s3:DeleteObject"],
                    resources=self.workflow.objects("executions/*/wake-token.json"),
                ),
                self.workflow.list_bucket("executions/*"),
                iam.PolicyStatement(
                    sid="WakeExecutions",
                    actions=["states:SendTaskSuccess"],
                    resources=[self.workflow.state_machine.state_machine_arn],
                ),
                iam.PolicyStatement(
                    sid="ReadEndedExecutions",
                    actions=["states:DescribeExecution"],
                    resources=[executions],
                ),
                iam.PolicyStatement(
                    sid="FindAndStopLeftJobs",
                    actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
                    resources=[self.workflow.training_job_arn()],
                ),
                iam.PolicyStatement(
                    sid="ListTrainingJobs",
                    actions=["sagemaker:ListTrainingJobs"],
                    resources=["*"],
                ),
                self.workflow.notify(),
            ],
        )
        policy.attach_to_role(self.workflow.watch_function.role)
        bucket = nag.logical_id(self.storage.bucket)
        nag.acknowledge(
            policy,
            *self.workflow.job_arn_reasons(),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/wake-token.json]",
             "One task-token file per attempt, under executions/<execution>/attempt-<n>/ named at run time."),
            self.workflow.execution_arn_reason(
                "DescribeExecution of this state machine's executions only, named at run time, to read why "
                "one ended."),
            ("AwsSolutions-IAM5[Resource::*]",
             "sagemaker:ListTrainingJobs supports no resource scoping; it finds the running jobs of an "
             "ended execution, which are then stopped under the job-name prefix scope above."),
        )

    def _rules(self) -> None:
        # The job's end moves the execution, not the next poll: SageMaker sends "SageMaker Training
        # Job State Change" to the default event bus whenever TrainingJobStatus changes (EventBridge
        # reference, "Amazon SageMaker AI events"); the detail is a part of DescribeTrainingJob's
        # response, without CheckpointConfig (tests/events/README.md).
        events.Rule(
            self,
            "TrainingJobEnded",
            description="A training job of this deployment ended: wake its execution.",
            event_pattern=events.EventPattern(
                source=["aws.sagemaker"],
                detail_type=["SageMaker Training Job State Change"],
                detail={
                    "TrainingJobStatus": TERMINAL_JOB_STATUSES,
                    "TrainingJobName": events.Match.prefix(f"{self.config.job_name_prefix}-"),
                },
            ),
            targets=[targets.LambdaFunction(self.workflow.watch_function, retry_attempts=8,
                                            max_event_age=Duration.hours(2))],
        )
        # Whatever ends an execution abnormally (a timeout, a StopExecution, the history quota, an
        # error no Catch handled) it must not leave a job running unwatched.
        events.Rule(
            self,
            "ExecutionEndedAbnormally",
            description="An execution of this state machine failed, timed out or was aborted: stop its jobs, notify.",
            event_pattern=events.EventPattern(
                source=["aws.states"],
                detail_type=["Step Functions Execution Status Change"],
                detail={
                    "status": ABNORMAL_EXECUTION_STATUSES,
                    "stateMachineArn": [self.workflow.state_machine.state_machine_arn],
                },
            ),
            targets=[targets.LambdaFunction(self.workflow.watch_function, retry_attempts=185,
                                            max_event_age=Duration.hours(24))],
        )
