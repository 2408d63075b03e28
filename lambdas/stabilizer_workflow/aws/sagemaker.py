"""The SageMaker adapter: training and processing jobs (create, describe, find, stop, list).

One call per method, its errors translated by stabilizer_workflow.aws; no decisions here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from stabilizer_workflow.aws import error_code, new_client, translate


@lru_cache(maxsize=1)
def get_sagemaker() -> Any:
    return new_client("sagemaker")


def _already_over(error: ClientError) -> bool:
    """SageMaker rejects a stop of a job that is no longer running; for us that is success."""
    message = error.response.get("Error", {}).get("Message", "").lower()
    return error_code(error) == "ValidationException" and any(
        word in message for word in ("status", "completed", "stopped", "failed", "stopping")
    )


def _no_such_job(error: ClientError) -> bool:
    """SageMaker answers a describe of an unknown job with ValidationException "Requested resource
    not found." (ResourceNotFound in some APIs)."""
    message = error.response.get("Error", {}).get("Message", "").lower()
    return error_code(error) == "ResourceNotFound" or (
        error_code(error) == "ValidationException" and "not found" in message
    )


class TrainingJobs:
    def __init__(self, client: Any) -> None:
        self.client = client

    def create(self, request: dict[str, Any]) -> dict[str, Any]:
        """Create the job; returns its description when the same attempt already created it."""
        try:
            self.client.create_training_job(**request)
            return {}
        except ClientError as error:
            if error_code(error) == "ResourceInUse":
                # A retried launch: the name is per attempt, so the job exists if it is ours.
                existing = self.describe(request["TrainingJobName"])
                ours = (
                    existing.get("CheckpointConfig", {}).get("S3Uri") == request["CheckpointConfig"]["S3Uri"]
                )
                if ours:
                    return existing
            raise translate(error, f"CreateTrainingJob {request['TrainingJobName']}") from error
        except BotoCoreError as error:
            raise translate(error, f"CreateTrainingJob {request['TrainingJobName']}") from error

    def describe(self, name: str) -> dict[str, Any]:
        try:
            return self.client.describe_training_job(TrainingJobName=name)
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"DescribeTrainingJob {name}") from error

    def find(self, name: str) -> dict[str, Any] | None:
        """The job's description, or None when SageMaker has no job of that name (yet)."""
        try:
            return self.client.describe_training_job(TrainingJobName=name)
        except ClientError as error:
            if _no_such_job(error):
                return None
            raise translate(error, f"DescribeTrainingJob {name}") from error
        except BotoCoreError as error:
            raise translate(error, f"DescribeTrainingJob {name}") from error

    def stop(self, name: str) -> bool:
        """Stop a training job; True if this call stopped it, False if it was already over."""
        try:
            self.client.stop_training_job(TrainingJobName=name)
            return True
        except ClientError as error:
            if _already_over(error):
                return False
            raise translate(error, f"StopTrainingJob {name}") from error
        except BotoCoreError as error:
            raise translate(error, f"StopTrainingJob {name}") from error

    def release_warm_pool(self, name: str) -> bool:
        """Release the job's warm pool (UpdateTrainingJob with KeepAlivePeriodInSeconds 0, "Terminate a
        warm pool" in the SageMaker developer guide); False when SageMaker holds no pool of it to
        release (none was kept, or it was reused or terminated meanwhile)."""
        try:
            self.client.update_training_job(TrainingJobName=name, ResourceConfig={"KeepAlivePeriodInSeconds": 0})
            return True
        except ClientError as error:
            if error_code(error) in ("ValidationException", "ResourceNotFound"):
                return False
            raise translate(error, f"UpdateTrainingJob {name}") from error
        except BotoCoreError as error:
            raise translate(error, f"UpdateTrainingJob {name}") from error

    def running(self, name_prefix: str) -> list[dict[str, Any]]:
        """Descriptions of the InProgress training jobs whose name starts with `name_prefix`."""
        names: list[str] = []
        try:
            paginator = self.client.get_paginator("list_training_jobs")
            for page in paginator.paginate(NameContains=name_prefix, StatusEquals="InProgress"):
                names.extend(
                    s["TrainingJobName"] for s in page.get("TrainingJobSummaries", [])
                    if s["TrainingJobName"].startswith(name_prefix)
                )
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"ListTrainingJobs {name_prefix}*") from error
        return [self.describe(name) for name in names]

    def stop_processing_job(self, name: str) -> bool:
        try:
            self.client.stop_processing_job(ProcessingJobName=name)
            return True
        except ClientError as error:
            if _already_over(error):
                return False
            raise translate(error, f"StopProcessingJob {name}") from error
        except BotoCoreError as error:
            raise translate(error, f"StopProcessingJob {name}") from error
