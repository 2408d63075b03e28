"""The CloudWatch adapter: when the job's metric stream last moved (GetMetricData).

SageMaker reads a training job's log with the regexes of its ``MetricDefinitions`` and sends each
match to CloudWatch "in real time" (SageMaker Developer Guide, "Monitor and Analyze Training Jobs
Using Metrics"), under the namespace ``/aws/sagemaker/TrainingJobs`` with the dimension
``TrainingJobName`` (the same guide: "Choose Metrics, then choose /aws/sagemaker/TrainingJobs.
Choose TrainingJobName."), at a one-minute frequency ("Monitor Amazon SageMaker with Amazon
CloudWatch": "Metrics are available at a 1-minute frequency"). The ``Host`` dimension
(``<job>/algo-<n>``) belongs to the instance metrics (CPU, memory, GPU), not to these; so the job's
own metrics tell when *the job* last logged its loss, not which host.

``newest`` asks for the loss metric's SampleCount per period, newest period first, and answers
the *end* of the newest period that holds a sample: the latest moment the last loss line can
have been logged, so a silence measured from it is never longer than the real one.

One call per method, its errors translated by stabilizer_workflow.aws; no decisions here.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from stabilizer_workflow.aws import new_client, translate

NAMESPACE = "/aws/sagemaker/TrainingJobs"
JOB_DIMENSION = "TrainingJobName"
# CloudWatch keeps one-minute data for 15 days (GetMetricStatistics API reference); a query that
# starts earlier must use a coarser period, so the look-back stops there.
LOOK_BACK = timedelta(days=14)


@lru_cache(maxsize=1)
def get_cloudwatch() -> Any:
    return new_client("cloudwatch")


class MetricStreams:
    """The jobs' metric streams; ``period_seconds`` is the stream's resolution (60 s on AWS)."""

    def __init__(self, client: Any, period_seconds: int = 60) -> None:
        self.client = client
        self.period_seconds = period_seconds

    def newest(self, job_name: str, metric_name: str, since: datetime, now: datetime) -> datetime | None:
        """The end of the newest period in which the job logged ``metric_name``, or None when it never did."""
        period = timedelta(seconds=self.period_seconds)
        start = max(since, now - LOOK_BACK) - period
        query = {
            "Id": "progress",
            "MetricStat": {
                "Metric": {"Namespace": NAMESPACE, "MetricName": metric_name,
                           "Dimensions": [{"Name": JOB_DIMENSION, "Value": job_name}]},
                "Period": self.period_seconds,
                "Stat": "SampleCount",
            },
            "ReturnData": True,
        }
        try:
            response = self.client.get_metric_data(
                MetricDataQueries=[query], StartTime=start, EndTime=now + period, ScanBy="TimestampDescending",
            )
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"GetMetricData {NAMESPACE} {metric_name} of {job_name}") from error
        stamps = [
            stamp
            for result in response.get("MetricDataResults", [])
            for stamp, count in zip(result.get("Timestamps", []), result.get("Values", []), strict=False)
            if count > 0
        ]
        return max(stamps) + period if stamps else None
