"""One queue subscribed to the topic carries every execution's notifications: each execution gets
its own, by the execution attribute, else by its ARN or quoted name in the text."""

from __future__ import annotations

import json

import boto3
from moto import mock_aws

from stabilizer.mailbox import Mailbox

ARN = "arn:aws:states:us-east-1:123456789012:execution:sm:{}"


def test_each_execution_gets_its_own_messages_once_taken_or_every_time_peeked(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        sns, sqs = boto3.client("sns"), boto3.client("sqs")
        topic = sns.create_topic(Name="t")["TopicArn"]
        url = sqs.create_queue(QueueName="mailbox")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)

        def publish(subject: str, message: str, execution: str | None = None) -> None:
            attributes = {"execution": {"DataType": "String", "StringValue": execution}} if execution else {}
            sns.publish(TopicArn=topic, Subject=subject, Message=message, MessageAttributes=attributes)

        publish("a launched", "body", execution="run-a")
        publish("b launched", "body", execution="run-b")
        publish("a failed", json.dumps({"execution": ARN.format("run-a")}))  # no attributes: the text names it
        publish("b failed", json.dumps({"name": "run-b"}))

        clock = iter(range(100))
        mailbox = Mailbox(sqs, url, clock=lambda: float(next(clock)))
        mailbox.drain()
        assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []  # drained from the queue
        peeked = mailbox.for_execution("run-a", ARN.format("run-a"))
        assert [letter.subject for letter in peeked] == ["a launched", "a failed"]
        assert peeked[0].attributes == {"execution": "run-a"}
        assert mailbox.for_execution("run-a", ARN.format("run-a")) == peeked  # peeking keeps them
        taken = mailbox.for_execution("run-b", ARN.format("run-b"), take=True)
        assert [letter.subject for letter in taken] == ["b launched", "b failed"]
        assert mailbox.for_execution("run-b", ARN.format("run-b")) == []
        note = taken[1].notification(since=0.0)
        assert (note.subject, note.received, note.body) == ("b failed", 3.0, {"name": "run-b"})
