"""The training and Debugger rule images in the template, from the SDK's lookup (infra/training_image.py).

`BakedImages` adds the per-region registry accounts as CfnMappings and gives the stack two things:
the train Lambda's image variables (`environment`) and the ECR repositories the SageMaker
execution role pulls from (`repository_arns`). URIs are joined in the template from the mapped
account, AWS::Region and AWS::URLSuffix, so one region-agnostic template serves every region the
SDK knows, China and GovCloud included.
"""

from __future__ import annotations

import json

from aws_cdk import Aws, CfnMapping, Fn
from constructs import Construct

from infra.config import DeploymentConfig
from infra.training_image import (
    PYTORCH_VERSION,
    RegionalImage,
    debugger_rules,
    framework_versions,
    pytorch_training,
)
from stabilizer_workflow import environment as env


class BakedImages(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        if config.training_image_uri:
            # The user's image for every instance type (workflow/images.py), and nothing that looks
            # the region up in a mapping: a custom image is how a region the SDK does not know
            # deploys, and Fn::FindInMap fails the whole stack there. Framework images by version
            # are then not offered (the train Lambda says to give job.image as a URI).
            self.environment: dict[str, str] = {
                env.FRAMEWORK_IMAGES: "{}",
                env.TRAINING_IMAGE_URI: config.training_image_uri,
            }
            self.repository_arns = [_repository_arn_of(config.training_image_uri)]
        else:
            cpu = pytorch_training(PYTORCH_VERSION, "cpu")
            self._training_account = CfnMapping(
                self, "TrainingImageRegistry",
                mapping={region: {"account": account} for region, account in sorted(cpu.accounts.items())},
            ).find_in_map(Aws.REGION, "account")
            self.environment = {
                env.FRAMEWORK_IMAGES: self._framework_images(),
                env.TRAINING_IMAGE_URI: self._uri(cpu),
                env.TRAINING_IMAGE_URI_GPU: self._uri(pytorch_training(PYTORCH_VERSION, "gpu")),
            }
            self.repository_arns = [self._repository_arn(self._training_account, cpu.repository)]
        if config.debugger_rules_enabled:
            rules = debugger_rules()
            mapping = CfnMapping(
                self, "DebuggerRuleRegistry",
                mapping={region: {"account": account} for region, account in sorted(rules.accounts.items())},
            )
            account = mapping.find_in_map(Aws.REGION, "account")
            self.environment[env.DEBUGGER_RULE_IMAGE] = self._uri(rules, account)
            self.debugger_repository_arn = self._repository_arn(account, rules.repository)

    def _uri(self, image: RegionalImage, account: str | None = None) -> str:
        return Fn.join("", [account or self._training_account, ".dkr.ecr.", Aws.REGION, ".", Aws.URL_SUFFIX,
                            "/", image.repository, ":", image.tag])

    def _framework_images(self) -> str:
        # A JSON object whose URIs hold the mapped account and the region: CDK turns the tokens
        # inside this string into one Fn::Join.
        builds = {
            version: {p: self._uri(pytorch_training(version, p)) for p in ("cpu", "gpu")}
            for version in framework_versions()
        }
        return json.dumps({"pytorch": builds}, separators=(",", ":"))

    @staticmethod
    def _repository_arn(account: str, repository: str) -> str:
        return f"arn:{Aws.PARTITION}:ecr:{Aws.REGION}:{account}:repository/{repository}"


def _repository_arn_of(uri: str) -> str:
    # <account>.dkr.ecr.<region>.<suffix>/<repository>[:<tag>|@<digest>]
    host, _, path = uri.partition("/")
    account, region = host.split(".")[0], host.split(".")[3]
    repository = path.split("@")[0].split(":")[0]
    return f"arn:{Aws.PARTITION}:ecr:{region}:{account}:repository/{repository}"
