"""What a training job runs with: the training image URI and the SageMaker execution role.

The execution role is what SageMaker assumes inside each job: it reads the data and the source
archive, syncs the checkpoint directory both ways (SageMaker mirrors the job's deletions there,
so the role deletes too, under checkpoints/ only), writes outputs and Debugger tensors, writes
the job's logs and metrics, and pulls the training image (and, with Debugger rules on, the rule
images, whose processing jobs run with this role and read the Debugger output).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Aws, CfnMapping, Fn, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra import nag
from infra.config import DeploymentConfig
from infra.storage import Storage
from infra.training_image import DLC_REGISTRY_ACCOUNTS, PYTORCH_TRAINING_REPOSITORY, image_tag_for

# The repository of SageMaker Debugger's built-in rule images; its account differs per region
# ("Docker images for Debugger rules" in the SageMaker Debugger guide).
DEBUGGER_RULES_REPOSITORY = "sagemaker-debugger-rules"


class TrainingRuntime(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig,
                 storage: Storage) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.storage = storage
        self.training_image_uri = self._training_image_uri()
        self.execution_role = self._execution_role()

    def _training_image_uri(self) -> str:
        if self.config.training_image_uri:
            return self.config.training_image_uri
        registries = CfnMapping(
            self,
            "DlcRegistry",
            mapping={region: {"account": account} for region, account in DLC_REGISTRY_ACCOUNTS.items()},
        )
        self._registries = registries
        account = registries.find_in_map(Aws.REGION, "account")
        return Fn.join(
            "",
            [account, ".dkr.ecr.", Aws.REGION, ".", Aws.URL_SUFFIX, "/",
             PYTORCH_TRAINING_REPOSITORY, ":", image_tag_for(self.config.instance_type)],
        )

    def _image_repository_arn(self) -> str:
        if self.config.training_image_uri:
            # <account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>
            host, _, path = self.config.training_image_uri.partition("/")
            account, region = host.split(".")[0], host.split(".")[3]
            repository = path.split("@")[0].split(":")[0]
            return f"arn:{Aws.PARTITION}:ecr:{region}:{account}:repository/{repository}"
        account = self._registries.find_in_map(Aws.REGION, "account")
        return f"arn:{Aws.PARTITION}:ecr:{Aws.REGION}:{account}:repository/{PYTORCH_TRAINING_REPOSITORY}"

    def _objects(self, *patterns: str) -> list[str]:
        return [self.storage.bucket.arn_for_objects(pattern) for pattern in patterns]

    def _execution_role(self) -> iam.Role:
        role = iam.Role(
            self,
            "SageMakerExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description="Runs stabilizer training jobs: reads data and source, writes executions/.",
        )
        read = ["data/*", "source/*", "executions/*/checkpoints/*"]
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
                conditions={"StringLike": {"s3:prefix": ["data/*", "source/*", "executions/*"]}},
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
                resources=[self._image_repository_arn()],
            ),
            iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
        ]
        if self.config.debugger_rules_enabled:
            statements.append(iam.PolicyStatement(
                sid="PullDebuggerRuleImages",
                actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                         "ecr:BatchCheckLayerAvailability"],
                resources=[f"arn:{Aws.PARTITION}:ecr:{Aws.REGION}:*:repository/{DEBUGGER_RULES_REPOSITORY}"],
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
        if self.config.debugger_rules_enabled:
            findings.append((
                f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ecr:<AWS::Region>:*:repository/"
                f"{DEBUGGER_RULES_REPOSITORY}]",
                "Debugger's rule images live in an AWS account that differs per region; the scope is "
                "that one repository name in this region.",
            ))
        nag.acknowledge(policy, *findings)
