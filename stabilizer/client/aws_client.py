"""The client in front of a deployed stack on AWS, for notebooks and scripts.

``AwsClient`` finds the deployed stack's resources from its CloudFormation outputs
(``StateMachineArn``, ``BucketName``, ``TopicArn``) and uses boto3. SNS keeps no copy of what it
sent, so notifications come from an SQS queue subscribed to the topic (``subscribe_mailbox``
creates one) plus the messages the state machine publishes itself, read from the history.
The questions it answers are those of stabilizer.client.execution_client, shared with the local client.
"""

from __future__ import annotations

import json
import time
from typing import Any

from stabilizer.client.execution_client import ExecutionClient, canonical_message, published_by_state_machine
from stabilizer.mailbox import Mailbox
from stabilizer.reports.records import Notification


class AwsClient(ExecutionClient):
    """The deployed stack, through boto3."""

    def __init__(
        self,
        stack_name: str = "Stabilizer",
        *,
        session: Any = None,
        region_name: str | None = None,
        mailbox_queue_url: str | None = None,
        cloudformation: Any = None,
    ) -> None:
        import boto3

        self.session = session or boto3.session.Session(region_name=region_name)
        self.cloudformation = cloudformation or self.session.client("cloudformation")
        self.sfn = self.session.client("stepfunctions")
        self.s3 = self.session.client("s3")
        self.sqs = self.session.client("sqs")
        self.stack_name = stack_name
        outputs = self.stack_outputs(stack_name)
        missing = [k for k in ("StateMachineArn", "BucketName", "TopicArn") if k not in outputs]
        if missing:
            raise LookupError(f"stack {stack_name} has no output(s) {', '.join(missing)}; is it the stabilizer stack?")
        self.state_machine_arn = outputs["StateMachineArn"]
        self.bucket = outputs["BucketName"]
        self.topic_arn = outputs["TopicArn"]
        self.mailbox_queue_url = mailbox_queue_url
        self._mailbox = Mailbox(self.sqs, mailbox_queue_url) if mailbox_queue_url else None
        self._mailbox_started = time.monotonic()

    def with_job(
        self, execution_input: dict[str, Any] | None, job: Any, inputs: Any, knobs: Any, options: dict[str, Any]
    ) -> dict[str, Any]:
        """As on every client, plus: the image for this region, local source and channels uploaded."""
        if job is not None and not isinstance(job, dict):
            options = {"region": self.session.region_name, **options}
        result = super().with_job(execution_input, job, inputs, knobs, options)
        if isinstance(result.get("job"), dict):
            from stabilizer.client.sdk_aws import upload_local_files

            result = {**result, "job": upload_local_files(result["job"], self.s3, self.bucket)}
        return result

    def stack_outputs(self, stack_name: str) -> dict[str, str]:
        stacks = self.cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
        return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}

    def subscribe_mailbox(self, queue_name: str | None = None) -> str:
        """Create an SQS queue subscribed to the topic, so notifications can be read back later."""
        name = queue_name or f"{self.stack_name}-mailbox"
        sqs = self.sqs
        url = sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "sns.amazonaws.com"},
                    "Action": "sqs:SendMessage",
                    "Resource": arn,
                    "Condition": {"ArnEquals": {"aws:SourceArn": self.topic_arn}},
                }
            ],
        }
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(policy)})
        self.session.client("sns").subscribe(TopicArn=self.topic_arn, Protocol="sqs", Endpoint=arn)
        self.mailbox_queue_url = url
        self._mailbox = Mailbox(self.sqs, url)
        return url

    def notifications(self, execution_arn: str) -> list[Notification]:
        name = execution_arn.rsplit(":", 1)[1]
        mine = []
        if self._mailbox is not None:
            self._mailbox.drain()
            letters = self._mailbox.for_execution(name, execution_arn)
            mine = [letter.notification(since=self._mailbox_started) for letter in letters]
        # What the state machine publishes itself is in the history; it is in the mailbox too
        # when one is subscribed, and is then listed once.
        seen = {(n.subject, canonical_message(n.message)) for n in mine}
        own = [
            n
            for n in published_by_state_machine(self.history(execution_arn))
            if (n.subject, canonical_message(n.message)) not in seen
        ]
        return mine + own

    def tensor_store(self, execution_arn: str, attempt: int) -> str:
        return f"{self.attempt_prefix(execution_arn, attempt)}/checkpoints/tensors/"
