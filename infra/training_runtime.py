"""What a training job runs with: the training images and the SageMaker execution role.

The execution role is what SageMaker assumes inside each job: it reads the data and the source
archive, syncs the checkpoint directory both ways (SageMaker mirrors the job's deletions there,
so the role deletes too, under checkpoints/ only), writes outputs and Debugger tensors, writes
the job's logs and metrics, and pulls the training image (and, with Debugger rules on, the rule
images, whose processing jobs run with this role and read the Debugger output).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
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
        # library/: the in-job sentinel library, the jobs' `stabilizer` channel.
        read = ["data/*", "source/*", "library/*", "executions/*/checkpoints/*"]
        if self.config.debugger_rules_enabled:
            read.append("executions/*/debug/*")  # the rule jobs read what the hook wrote
        statements = [
            iam.PolicyStatement(
                sid="ReadDataSourceAndCheckpoints",
                actions=["s3:GetObject"],
                resources=self._objects(*read),
            ),
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self.storage.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": ["data/*", "source/*", "library/*", "executions/*"]}},
            ),
            iam.PolicyStatement(
                sid="WriteOutputCheckpointsFindingsTensors",
                actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                resources=self._objects(
                    "executions/*/output/*", "executions/*/checkpoints/*", "executions/*/debug/*"
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
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/data/*]",
             "Training reads every object of the data prefix (x.npy, y.npy per channel)."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/source/*]",
             "Training reads sourcedir.tar.gz, whose key carries its content hash."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/library/*]",
             "Every job downloads the sentinel library (the `stabilizer` channel) under library/<hash>/."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/checkpoints/*]",
             "Each attempt syncs its checkpoint directory (checkpoints, findings.json, tensors) "
             "both ways under executions/<execution>/attempt-<n>/, named at run time."),
            (f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/executions/*/output/*]",
             "SageMaker writes the model artifact under the attempt's output/ prefix, named at run time."),
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
