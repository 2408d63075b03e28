"""The client in front of the local engine, for notebooks, scripts and tests.

``LocalClient`` drives a running ``LocalEngine`` (``LocalClient.open()`` starts one). The
questions it answers are those of stabilizer.client.execution_client, shared with the AWS client.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabilizer.client.execution_client import ExecutionClient, ExecutionView
from stabilizer.client.inputs import check_execution_name
from stabilizer.reports.records import Notification, RunRecord


@dataclass
class _Followed:
    record: RunRecord
    thread: threading.Thread
    done: threading.Event = field(default_factory=threading.Event)


class LocalClient(ExecutionClient):
    """A running local engine: ``LocalClient.open()`` starts one (close it, or use ``with``), or
    ``LocalClient(engine)`` wraps one already running."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._owns_engine = False
        self.sfn = engine.client("stepfunctions")
        self.s3 = engine.client("s3")
        self.bucket = engine.settings.bucket
        self.state_machine_arn = engine.state_machine_arn
        self._followed: dict[str, _Followed] = {}

    def start(
        self, execution_input: dict[str, Any] | None = None, name: str | None = None, *, job: Any = None,
        inputs: Any = None, knobs: dict[str, Any] | None = None, **job_options: Any,
    ) -> str:
        execution_input = self.with_job(execution_input, job, inputs, knobs, job_options)
        arn = self.engine.start_execution(execution_input, check_execution_name(name) if name is not None else None)
        record = RunRecord(execution_arn=arn, name=arn.rsplit(":", 1)[1], input=execution_input)

        def follow() -> None:
            try:
                self.engine.follow(arn, execution_input, record=record)
            finally:
                self._followed[arn].done.set()

        thread = threading.Thread(target=follow, name=f"follow-{record.name}", daemon=True)
        self._followed[arn] = _Followed(record=record, thread=thread)
        thread.start()
        return arn

    @classmethod
    def open(
        cls, run_dir: str | Path = "runs/notebook", data_dir: str | Path | None = None, settings: Any = None
    ) -> LocalClient:
        """Start a local engine for a notebook: the offline digits unless ``data_dir`` is given."""
        from stabilizer.local.engine.deployment import Project
        from stabilizer.local.engine.engine import LocalEngine
        from stabilizer.local.offline_digits import ensure_offline_digits

        project = Project.discover()
        data = Path(data_dir) if data_dir else ensure_offline_digits(Path(run_dir) / "data" / "digits", project.model)
        engine = LocalEngine(Path(run_dir), data, project=project, settings=settings)
        engine.__enter__()
        client = cls(engine)
        client._owns_engine = True
        # A notebook kernel that exits without close() must not leave training processes behind.
        atexit.register(client.close)
        return client

    def close(self) -> None:
        """Stop the engine this client started (its running jobs get SIGTERM)."""
        if self._owns_engine:
            self.engine.close()
            self._owns_engine = False
            atexit.unregister(self.close)

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def with_job(
        self, execution_input: dict[str, Any] | None, job: Any, inputs: Any, knobs: Any, options: dict[str, Any]
    ) -> dict[str, Any]:
        """As on every client, plus: an image named by framework and version becomes the SDK's URI for
        the local engine's region (local jobs run on this machine; the URI only has to be the right one)."""
        from stabilizer.local.engine.deployment import REGION

        if job is not None and not isinstance(job, dict):
            options = {"region": REGION, **options}
        result = super().with_job(execution_input, job, inputs, knobs, options)
        described = result.get("job")
        if isinstance(described, dict) and isinstance(described.get("image"), dict):
            from stabilizer.client.sdk_aws import image_uri_for

            instance_type = described.get("instance_type") or self.engine.settings.instance_type
            result = {**result, "job": {**described, "image": image_uri_for(described["image"], instance_type, REGION)}}
        return result

    def record(self, execution_arn: str) -> RunRecord:
        """What the engine observed of an execution started here (attempts, metrics, notifications)."""
        return self._followed[execution_arn].record

    def notifications(self, execution_arn: str) -> list[Notification]:
        followed = self._followed.get(execution_arn)
        return list(followed.record.notifications) if followed else []

    def tensor_store(self, execution_arn: str, attempt: int) -> str:
        view = self.describe(execution_arn)
        numbered = {a.get("number"): a for a in view.attempts}
        job_name = (numbered.get(attempt) or {}).get("job_name")
        job = self.engine.sagemaker.jobs.get(job_name) if job_name else None
        if job is None:
            raise LookupError(f"{view.name} has no attempt {attempt}")
        return str(Path(job.checkpoint_dir) / "tensors")

    def wait(self, execution_arn: str, timeout: float = 3600, poll_seconds: float = 1) -> ExecutionView:
        followed = self._followed.get(execution_arn)
        if followed is not None:
            followed.done.wait(timeout)
        return super().wait(execution_arn, timeout=0 if followed else timeout, poll_seconds=poll_seconds)
