"""The SNS adapter: publish a notification to the deployment's topic.

One call, its errors translated by stabilizer_workflow.aws; no decisions here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from stabilizer_workflow.aws import new_client, translate
from stabilizer_workflow.notifications import Notification


@lru_cache(maxsize=1)
def get_sns() -> Any:
    return new_client("sns")


class Notifier:
    def __init__(self, client: Any, topic_arn: str) -> None:
        self.client = client
        self.topic_arn = topic_arn

    def publish(self, notification: Notification) -> str:
        try:
            response = self.client.publish(**notification.publish_kwargs(self.topic_arn))
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"Publish {notification.event_type}") from error
        return str(response.get("MessageId", ""))
