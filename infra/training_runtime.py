"""What a training job runs with: the training images and the SageMaker execution role.

The execution role is what SageMaker assumes inside each job: it reads the data and the source
archive, syncs the checkpoint directory both ways (SageMaker mirrors the job's deletions there,
so the role deletes too, under checkpoints/ only), writes outputs and Debugger tensors, writes
the job's logs and metrics, and pulls the training image (and, with Debugger rules on, the rule
images, whose processing jobs run with this role and read the Debugger output).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Aws, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra import nag
from infra.config import DeploymentConfig
from infra.image_mapping import BakedImages
from infra.storage import Storage


class TrainingRuntime(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig,
                 storage: Storage) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.storage = storage
        # Training and Debugger rule images, resolved at synth time with the SageMaker Python SDK.
        self.images = BakedImages(self, "Images", config=config)
        self.execution_role = self._execution_role()

    def _objects(self, *patterns: str) -> list[str]:
        return [self.storage.bucket.arn_for_objects(pattern) for pattern in patterns]

    def _execution_role(self) -> iam.Role:
        role = iam.Role(
            self,
            "SageMakerExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description="Runs stabilizer training jobs: reads data and source, writes executions/.",
        )
        # A job reads its channels wherever they lie in the stack's bucket (data/, a user's own
        # prefix, the `resume` channel under executions/, the library/ channel), the source
        # archive, and the checkpoints SageMaker restores; and the buckets `data_buckets` grants.
        # workflow/access.py refuses at ValidateInput a channel in any other bucket.
        buckets = [self.storage.bucket.bucket_arn, *(f"arn:{Aws.PARTITION}:s3:::{b}" for b in self.config.data_buckets)]
        statements = [
            iam.PolicyStatement(
                sid="ReadChannelsSourceAndCheckpoints",
                actions=["s3:GetObject"],
                resources=[f"{bucket}/*" for bucket in buckets],
            ),
            iam.PolicyStatement(
                sid="ListChannelsAndCheckpoints",
                actions=["s3:ListBucket"],
                resources=buckets,
            ),
            iam.PolicyStatement(
                sid="WriteOutputCheckpointsFindingsTensors",
                actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                # profiler/: ProfilerConfig.S3OutputPath, set with Debugger's profiler rules
                # (workflow/requests.py); SageMaker writes the profiler's output as this role.
                resources=self._objects(
                    "executions/*/output/*", "executions/*/checkpoints/*", "executions/*/debug/*",
                    "executions/*/profiler/*",
                ),
            ),
            iam.PolicyStatement(
                # SageMaker mirrors the checkpoint directory to S3, deletions included: the
                # training script keeps its newest checkpoints and renames temporary files.
                sid="MirrorCheckpointDeletions",
                actions=["s3:DeleteObject"],
                resources=self._objects("executions/*/checkpoints/*"),
            ),
            iam.PolicyStatement(
                sid="TrainingLogs",
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                         "logs:DescribeLogStreams"],
                resources=[Stack.of(self).format_arn(
                    service="logs", resource="log-group", resource_name="/aws/sagemaker/*",
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
        if self.config.debugger_rules_enabled:
            statements.append(iam.PolicyStatement(
                sid="PullDebuggerRuleImages",
                actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                         "ecr:BatchCheckLayerAvailability"],
                resources=[self.images.debugger_repository_arn],
            ))
        policy = iam.Policy(self, "SageMakerExecutionPolicy", statements=statements)
        policy.attach_to_role(role)
        self._acknowledge(policy)
        return role

    def _acknowledge(self, policy: iam.Policy) -> None:
        bucket = nag.logical_id(self.storage.bucket)
        findings = [
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/*]",
             "Training reads its channels wherever the user put them in this stack's bucket (data/, "
             "their own prefixes, the resume channel under executions/), the source archive under "
             "source/ and the sentinel library under library/; nothing outside this bucket."),
            *(
                (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{b}/*]",
                 f"The deployment grants jobs the data bucket {b} (data_buckets); read only.")
                for b in self.config.data_buckets
            ),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/checkpoints/*]",
             "Each attempt syncs its checkpoint directory (checkpoints, findings.json, tensors) "
             "both ways under executions/<execution>/attempt-<n>/, named at run time."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/output/*]",
             "SageMaker writes the model artifact under the attempt's output/ prefix, named at run time."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/profiler/*]",
             "Debugger's profiler (with profiler rules) writes under the attempt's profiler/ prefix, "
             "named at run time."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/debug/*]",
             "Debugger (when enabled) writes under the attempt's debug/ prefix, named at run time, and "
             "its rule jobs read it back."),
            ("AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:"
             "log-group:/aws/sagemaker/*]",
             "SageMaker writes training jobs (and Debugger rule processing jobs) into fixed log groups "
             "under /aws/sagemaker/."),
            ("AwsSolutions-IAM5[Resource::*]",
             "cloudwatch:PutMetricData and ecr:GetAuthorizationToken support no resource scoping; "
             "metrics are limited to the /aws/sagemaker/ namespaces by condition."),
        ]
        nag.acknowledge(policy, *findings)
