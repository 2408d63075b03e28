"""The Step Functions adapter: wake a parked execution with its task token, read an execution's status.

One call per method, its errors translated by stabilizer_workflow.aws; no decisions here.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from stabilizer_workflow.aws import error_code, new_client, translate


@lru_cache(maxsize=1)
def get_stepfunctions() -> Any:
    return new_client("stepfunctions")


# SendTaskSuccess answers these when the execution no longer waits for that token (it timed out
# into the regular check, ended, or the token was already used): nothing left to wake.
_TOKEN_GONE = {"TaskTimedOut", "TaskDoesNotExist", "InvalidToken", "ExecutionDoesNotExist"}


class Executions:
    def __init__(self, client: Any) -> None:
        self.client = client

    def wake(self, token: str, output: dict[str, Any]) -> bool:
        """Send a parked execution its task token; False when it no longer waits for it."""
        try:
            self.client.send_task_success(taskToken=token, output=json.dumps(output))
            return True
        except ClientError as error:
            if error_code(error) in _TOKEN_GONE:
                return False
            raise translate(error, "SendTaskSuccess") from error
        except BotoCoreError as error:
            raise translate(error, "SendTaskSuccess") from error

    def describe(self, arn: str) -> dict[str, Any]:
        try:
            return self.client.describe_execution(executionArn=arn)
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"DescribeExecution {arn}") from error

    def status(self, arn: str) -> str:
        """RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED or PENDING_REDRIVE."""
        return str(self.describe(arn).get("status", ""))
