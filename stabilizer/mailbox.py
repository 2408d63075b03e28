"""The SNS topic's messages, read back through an SQS queue subscribed to it.

SNS keeps no copy of what it sent, so both the local engine and ``AwsClient`` subscribe a queue to
the topic, as a person's mailbox would be. One queue may carry the messages of several
executions: ``drain`` moves everything waiting into the mailbox, and ``for_execution`` picks out
one execution's messages by the ``execution`` message attribute the workflow sets on every
notification (docs/contracts.md), else by the execution's ARN or quoted name in the text (for
messages published without attributes).

It sits at the package's root, under both its readers: the client and local mode import it, and it
imports neither.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stabilizer.reports.records import Notification


@dataclass(frozen=True)
class Letter:
    """One message as it arrived: the clock reading on arrival, and the SNS envelope's parts."""

    arrived: float
    subject: str
    message: str
    attributes: dict[str, str]

    def notification(self, since: float) -> Notification:
        """The message as a Notification received ``arrived - since`` seconds into an execution."""
        return Notification(self.subject, self.message, self.arrived - since, dict(self.attributes))


def addressed_to(letter: Letter, name: str, arn: str) -> bool:
    """Whether a message belongs to the execution ``name`` (ARN ``arn``)."""
    execution = letter.attributes.get("execution")
    if execution:
        return execution in (name, arn)
    return arn in letter.message or f'"{name}"' in letter.message


class Mailbox:
    """Messages drained from one SQS queue, kept until taken. Safe to share between threads."""

    def __init__(self, sqs: Any, queue_url: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.clock = clock
        self._letters: list[Letter] = []
        self._lock = threading.Lock()

    def drain(self) -> None:
        """Move every message waiting in the queue into the mailbox (and delete it from the queue)."""
        with self._lock:
            while True:
                received = self.sqs.receive_message(
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=0,
                    MessageAttributeNames=["All"],
                )
                messages = received.get("Messages", [])
                if not messages:
                    return
                for message in messages:
                    envelope = json.loads(message["Body"])
                    self._letters.append(
                        Letter(
                            arrived=self.clock(),
                            subject=envelope.get("Subject") or "",
                            message=envelope.get("Message", ""),
                            attributes={
                                key: str(value.get("Value", ""))
                                for key, value in (envelope.get("MessageAttributes") or {}).items()
                            },
                        )
                    )
                    self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])

    def for_execution(self, name: str, arn: str, *, take: bool = False) -> list[Letter]:
        """The execution's messages in arrival order; ``take`` removes them from the mailbox."""
        with self._lock:
            mine = [letter for letter in self._letters if addressed_to(letter, name, arn)]
            if take:
                self._letters = [letter for letter in self._letters if not addressed_to(letter, name, arn)]
            return mine
