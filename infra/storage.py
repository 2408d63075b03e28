"""Storage and notifications: the project bucket, the topic, and the training source archive.

The bucket holds the training data (`data/`), the packaged `model/` (`source/<hash>/`), and every
attempt's checkpoints, findings, tensors and outputs (`executions/`). The topic carries every
decision. This construct grants nothing: the roles that use these are built where they are used.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3deploy
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from infra import nag
from infra.config import DeploymentConfig

# The construct id CDK gives the singleton function behind every BucketDeployment of a stack.
BUCKET_DEPLOYMENT_HANDLER = "Custom::CDKBucketDeployment8693BB64968944B69AAFB0CC9EB8756C"


class Storage(Construct):
    """The bucket, the topic (with the optional email subscription) and `source/<hash>/sourcedir.tar.gz`."""

    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig,
                 training_source_dir: Path) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.bucket = self._bucket()
        self.topic = self._topic()
        self.source_s3_uri = self._training_source(training_source_dir)
        self.library_s3_uri = self._library(training_source_dir)

    def data_uri(self, channel: str) -> str:
        return f"s3://{self.bucket.bucket_name}/data/{channel}/"

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
                # Step Functions and in the notifications after these expire. source/ has no
                # expiry: an archive whose model/ did not change is not uploaded again, so its age
                # says nothing about whether jobs still use it.
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
        nag.acknowledge(
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

    def _training_source(self, model_dir: Path) -> str:
        from infra.lambda_asset import default_cache_root
        from infra.training_source import ARCHIVE_NAME, stage_source_archive

        stage = stage_source_archive(model_dir, default_cache_root())
        # The content hash in the key: a redeploy with another model/ writes a new key and leaves
        # the old one in place, so jobs that are starting or running (and executions that will
        # relaunch with the archive their first attempt used) keep finding theirs.
        prefix = f"source/{stage.name.removeprefix('sourcedir-')}/"
        s3deploy.BucketDeployment(
            self,
            "TrainingSource",
            sources=[s3deploy.Source.asset(str(stage))],
            destination_bucket=self.bucket,
            destination_key_prefix=prefix,
            # CDK's handler deletes the previous destination prefix on an update whose prefix
            # changed unless RetainOnDelete is true, and `prune` deletes objects the new asset does
            # not have (aws-cdk-lib 2.275.0, aws-s3-deployment/bucket-deployment-handler/index.py,
            # lines 129-143). Neither may touch an archive a job may still download.
            retain_on_delete=True,
            prune=False,
        )
        self._acknowledge_bucket_deployment()
        return f"s3://{self.bucket.bucket_name}/{prefix}{ARCHIVE_NAME}"

    def _library(self, model_dir: Path) -> str:
        """The in-job library (`stabilizer_sentinel`, `stabilizer_contract`) under `library/<hash>/`.

        That prefix is every job's `stabilizer` channel.

        Users' jobs import it from there (docs/contracts.md, sections 8 and 9) without vendoring it;
        the key carries the content hash and old copies stay, as for the source archive.
        """
        from infra.lambda_asset import default_cache_root
        from infra.training_source import stage_library, stage_source_archive

        digest = stage_source_archive(model_dir, default_cache_root()).name.removeprefix("sourcedir-")
        prefix = f"library/{digest}/"
        s3deploy.BucketDeployment(
            self,
            "SentinelLibrary",
            sources=[s3deploy.Source.asset(str(stage_library(model_dir, default_cache_root())))],
            destination_bucket=self.bucket,
            destination_key_prefix=prefix,
            retain_on_delete=True,
            prune=False,
        )
        return f"s3://{self.bucket.bucket_name}/{prefix}"

    def _acknowledge_bucket_deployment(self) -> None:
        # BucketDeployment runs one singleton function per stack; its role and runtime are CDK's.
        handler = Stack.of(self).node.try_find_child(BUCKET_DEPLOYMENT_HANDLER)
        if handler is None:
            return
        bucket = nag.logical_id(self.bucket)
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
        nag.acknowledge(handler, *findings)
