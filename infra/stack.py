"""The stabilizer stack: storage, the training runtime, the workflow and its events, composed.

Everything deployment-level (bucket, topic, roles, image, instance type, job-name prefix) is baked
in by the three constructs, so an execution started from the console with `{}` runs the reference
problem. Each construct carries its own least-privilege grants and the cdk-nag acknowledgements
of the resources it creates. This module must not call AWS at synth time: `cdk synth` runs offline.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Aws, CfnCondition, CfnMapping, CfnOutput, Fn, Stack
from constructs import Construct

from infra.config import DeploymentConfig
from infra.job_events import JobEvents
from infra.lambda_asset import BuiltAsset
from infra.storage import Storage
from infra.training_runtime import TrainingRuntime
from infra.workflow import LAMBDA_MEMORY_MB, LAMBDA_TIMEOUT_SECONDS, Workflow

__all__ = ["LAMBDA_MEMORY_MB", "LAMBDA_TIMEOUT_SECONDS", "StabilizerStack"]

# Example input shown in the outputs and in README.md (schemas/execution-input.schema.json):
# the original sample's remedy ladder, checking every two minutes. Every field is optional.
EXAMPLE_INPUT = '{"policy": "original", "wait_seconds": 120}'

# The console's host per partition (the console link must work in China and GovCloud too). In a
# partition not listed here (aws-iso*, aws-eusc: no public console host) the stack has no ConsoleLink
# output, rather than a lookup that fails the deploy.
CONSOLE_HOSTS = {
    "aws": "console.aws.amazon.com",
    "aws-cn": "console.amazonaws.cn",
    "aws-us-gov": "console.amazonaws-us-gov.com",
}


class StabilizerStack(Stack):
    """One stack: the whole deployed part of stabilizer."""

    def __init__(self, scope: Construct, construct_id: str, *, config: DeploymentConfig,
                 lambda_asset: BuiltAsset, training_source_dir: Path, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.config = config
        self.storage = Storage(self, "Storage", config=config, training_source_dir=training_source_dir)
        self.runtime = TrainingRuntime(self, "TrainingRuntime", config=config, storage=self.storage)
        self.workflow = Workflow(self, "Workflow", config=config, storage=self.storage,
                                 runtime=self.runtime, lambda_asset=lambda_asset)
        self.job_events = JobEvents(self, "JobEvents", config=config, storage=self.storage, workflow=self.workflow)
        self.workflow.drop_redundant_role_dependencies()
        self._outputs()

    def _outputs(self) -> None:
        machine = self.workflow.state_machine
        CfnOutput(self, "StateMachineArn", value=machine.state_machine_arn,
                  description="Start executions of this state machine.")
        CfnOutput(self, "BucketName", value=self.storage.bucket.bucket_name,
                  description="Data under data/train/ and data/test/; attempts under executions/.")
        CfnOutput(self, "TopicArn", value=self.storage.topic.topic_arn,
                  description="Every decision and failure is published here.")
        hosts = CfnMapping(self, "ConsoleHost", mapping={p: {"host": h} for p, h in CONSOLE_HOSTS.items()})
        known = CfnCondition(self, "ConsoleHostKnown", expression=Fn.condition_or(
            *(Fn.condition_equals(Aws.PARTITION, partition) for partition in CONSOLE_HOSTS)))
        CfnOutput(
            self,
            "ConsoleLink",
            condition=known,
            value=Fn.join("", [
                "https://", Aws.REGION, ".", hosts.find_in_map(Aws.PARTITION, "host"),
                "/states/home?region=", Aws.REGION, "#/statemachines/view/", machine.state_machine_arn,
            ]),
            description="The state machine in the Step Functions console: Start execution, input {}.",
        )
        CfnOutput(self, "ExampleExecutionInput", value=EXAMPLE_INPUT,
                  description="{} runs the reference problem; every field is optional.")
