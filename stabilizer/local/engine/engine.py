"""Local mode: the project's state machine and Lambda code, run on one machine with real training.

The engine starts moto (``mock_aws`` with its Step Functions interpreter executing definitions),
creates the bucket and topic the CDK app would create, uploads the packaged ``model/`` source and
the offline data set, fills the ASL file's ``${placeholders}`` from the map CDK reads too
(``statemachine/placeholders.json``; the deployment's local stand-ins are
``stabilizer.local.engine.deployment``'s), routes the three Lambda functions to the handler functions
in ``lambdas/`` (the same code CDK deploys), serves SageMaker training jobs as local subprocesses
(their metric definitions' matches sent to moto's CloudWatch, as SageMaker sends them), delivers
each job's end to the watch function as EventBridge's rule does in the cloud. Then it starts
executions, stops them, and hands each one to ``stabilizer.local.engine.execution_follower``, which follows
it: history, notifications (through an SQS queue subscribed to the topic, as a person's mailbox
would be), and each job's log for its loss and gradient norm.

In strict mode (``strict=True``, ``STABILIZER_STRICT=1``, ``stabilizer run --local --strict``)
every AWS call of the functions, the state machine and the training jobs is judged by the IAM
policies of the synthesized stack, and what AWS would deny is refused with the same error
(``stabilizer.local.iam.access_check``).

It must not decide anything about the workflow: every decision is made by the state machine and
the handlers, exactly as in the cloud.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from stabilizer.local.emulator.job_state_events import job_state_change
from stabilizer.local.emulator.rule_jobs import rule_evaluator_factory
from stabilizer.local.emulator.sagemaker import LocalSageMaker
from stabilizer.local.emulator.training_job import LOCAL_INTERRUPT_GRACE_SECONDS, LocalTrainingJob
from stabilizer.local.engine import history_events
from stabilizer.local.engine.deployment import (
    ACCOUNT,
    REGION,
    EngineError,
    LocalSettings,
    Project,
    fill_placeholders,
    placeholder_values,
    strict_from_environment,
)
from stabilizer.local.engine.execution_follower import ExecutionFollower, Observer, unobserved
from stabilizer.local.engine.lambda_seam import LocalLambdas, cold_start, handler_module
from stabilizer.local.engine.staging import StagingError, stage, upload_library
from stabilizer.local.iam.access_check import AccessChecker, acting_as, state_machine_clients, tag_client
from stabilizer.mailbox import Mailbox
from stabilizer.reports.records import RunRecord
from stabilizer.source.sourcedir import mark_run_directory, source_archive
from stabilizer_workflow.aws.cloudwatch import NAMESPACE as JOB_METRICS_NAMESPACE
from stabilizer_workflow.execution.service_limits import execution_name_problem

# Held while a handler runs with sys.stdout and sys.stderr pointed at its engine's lambdas.log.
_HANDLER_STDOUT = threading.RLock()


class LocalEngine:
    """Run executions of the project's state machine on this machine. Use as a context manager."""

    def __init__(
        self,
        run_dir: Path,
        data_dir: Path,
        *,
        project: Project | None = None,
        settings: LocalSettings | None = None,
        python: str = sys.executable,
        strict: bool | None = None,
        access: AccessChecker | None = None,
    ) -> None:
        """`access` records and judges every call of the stack's principals by the synthesized
        IAM; `strict` (default: STABILIZER_STRICT) builds one from a synth that refuses what AWS
        would deny (stabilizer.local.iam.access_check)."""
        self.run_dir = Path(run_dir).resolve()
        self.data_dir = Path(data_dir).resolve()
        self.project = project or Project.discover()
        self.settings = settings or LocalSettings()
        self.python = python
        self.lambdas = LocalLambdas(REGION, ACCOUNT)
        self.sagemaker: LocalSageMaker | None = None
        self.state_machine_arn: str | None = None
        self._stack = contextlib.ExitStack()
        self._queue_url: str | None = None
        self._clients: dict[str, Any] = {}
        self._lambda_log: io.TextIOBase | None = None
        self._mailbox: Mailbox | None = None
        self.setup_seconds = 0.0
        self.strict = strict_from_environment() if strict is None else strict
        self.access = access

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> LocalEngine:
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        self.setup_seconds = time.monotonic() - started
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        # An execution still running would go on invoking the handlers after the mocks are gone.
        with contextlib.suppress(Exception):
            self.stop_running_executions()
        if self.sagemaker is not None:
            self.sagemaker.interrupt_all()
            self.sagemaker.wait_all(timeout=LOCAL_INTERRUPT_GRACE_SECONDS + 10)
        self._stack.close()

    def stop_running_executions(self) -> list[str]:
        """Stop every execution of the state machine still running; returns their ARNs."""
        if self.state_machine_arn is None:
            return []
        sfn = self.client("stepfunctions")
        running = sfn.list_executions(stateMachineArn=self.state_machine_arn, statusFilter="RUNNING")
        arns = [e["executionArn"] for e in running["executions"]]
        for arn in arns:
            sfn.stop_execution(executionArn=arn, error="EngineClosed", cause="the local engine was closed")
        return arns

    def client(self, service: str) -> Any:
        import boto3

        if service not in self._clients:
            self._clients[service] = boto3.client(service, region_name=REGION)
        return self._clients[service]

    def _start(self) -> None:
        from moto import mock_aws

        # Marked, so that no job's source (a job of one's own in "." packs the whole directory) carries runs.
        mark_run_directory(self.run_dir)
        environment = {
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_SESSION_TOKEN": "local",
            **self.settings.lambda_environment(),
        }
        self._stack.enter_context(mock.patch.dict(os.environ, environment))
        for variable in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
            self._stack.enter_context(_unset(variable))
        self._stack.enter_context(mock_aws(config={"stepfunctions": {"execute_state_machine": True}}))
        self._stack.enter_context(history_events.installed())  # a late task thread's event stays readable
        self._stack.callback(self._clients.clear)
        if self.access is None and self.strict:
            self.access = self.settings.strict_access_checker(self.lambdas)
        job_s3 = self.client("s3")
        if self.access is not None:
            import boto3

            from stabilizer.local.iam.stack_policies import EXECUTION_ROLE, STATE_MACHINE

            self._stack.enter_context(self.access.installed())
            self._stack.enter_context(state_machine_clients(STATE_MACHINE))
            # What a training job does in S3, it does as the SageMaker execution role.
            job_s3 = tag_client(boto3.client("s3", region_name=REGION), EXECUTION_ROLE)
        self._create_resources()
        self._lambda_log = self._stack.enter_context((self.run_dir / "lambdas.log").open("a"))
        self._register_handlers()
        self._stack.enter_context(self.lambdas.installed())
        self.sagemaker = LocalSageMaker(
            self.run_dir / "jobs",
            job_s3,
            region=REGION, account=ACCOUNT,
            python=self.python,
            extra_env=self.settings.job_environment,
            stop_grace_seconds=self.settings.stop_grace_seconds,
            rule_evaluator=rule_evaluator_factory(python=self.python, region=REGION, account=ACCOUNT),
            on_job_end=self._job_ended,
            admission=self.access.job_refusal if self.access is not None else None,
            metrics=self._publish_job_metrics,
        )
        self._stack.enter_context(self.sagemaker.installed())
        self._create_state_machine()

    def _create_resources(self) -> None:
        s3 = self.client("s3")
        s3.create_bucket(Bucket=self.settings.bucket)
        s3.put_object(
            Bucket=self.settings.bucket,
            Key=self.settings.source_uri.split("/", 3)[3],
            Body=source_archive(self.project.model),
        )
        upload_library(s3, self.project.library_root, self.settings.bucket, self.settings.library_uri.split("/", 3)[3])
        for channel in ("train", "test"):
            directory = self.data_dir / channel
            files = sorted(directory.glob("*.npy")) if directory.is_dir() else []
            if not files:
                raise EngineError(f"no data for the {channel} channel: expected x.npy and y.npy in {directory}")
            for path in files:
                s3.upload_file(str(path), self.settings.bucket, f"data/{channel}/{path.name}")
        sns = self.client("sns")
        sns.create_topic(Name=self.settings.topic_name)
        sqs = self.client("sqs")
        self._queue_url = sqs.create_queue(QueueName=f"{self.settings.topic_name}-mailbox")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self._queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        sns.subscribe(TopicArn=self.settings.topic_arn, Protocol="sqs", Endpoint=queue_arn)
        self._mailbox = Mailbox(sqs, self._queue_url)

    def _register_handlers(self) -> None:
        for function, name in (
            (self.settings.train_function, "train"),
            (self.settings.monitor_function, "monitor"),
            (self.settings.watch_function, "watch"),
        ):
            module = handler_module(self.project.lambdas, name)
            cold_start(module)
            self.lambdas.register(function, self._quiet(module.lambda_handler, self.settings.principal_of(function)))
        self._route_handler_logs()

    def _quiet(self, handler: Callable[[Any, Any], Any], principal: str | None = None) -> Callable[[Any, Any], Any]:
        """Send what a handler prints to lambdas.log (CloudWatch's place), not the terminal; its
        AWS calls are `principal`'s (its function's role)."""
        log = self._lambda_log
        # redirect_stdout swaps the process-wide sys.stdout: two executions invoking handlers at
        # once, of one engine or of two, would restore each other's stream, print into each other's
        # log and leave stdout pointing at a closed one. The lock, one per process as sys.stdout is,
        # makes invocations take turns; each one lasts milliseconds.
        lock = _HANDLER_STDOUT

        def invoke(event: Any, context: Any) -> Any:
            assert log is not None
            acting = acting_as(principal) if principal else contextlib.nullcontext()
            with lock, acting, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                try:
                    return handler(event, context)
                finally:
                    log.flush()

        return invoke

    def _route_handler_logs(self) -> None:
        # Powertools' Logger holds the stdout of its import time; point it at lambdas.log.
        for logger in [logging.getLogger(), *_all_loggers()]:
            for handler in logger.handlers:
                # logging.lastResort's class follows sys.stderr by itself (its stream cannot be set).
                if isinstance(handler, logging._StderrHandler):
                    continue
                if isinstance(handler, logging.StreamHandler) and handler.stream in (
                    sys.stdout,
                    sys.stderr,
                    sys.__stdout__,
                    sys.__stderr__,
                ):
                    previous = handler.setStream(self._lambda_log)  # type: ignore[arg-type]
                    self._stack.callback(handler.setStream, previous)

    def _publish_job_metrics(self, data: list[dict[str, Any]]) -> None:
        """SageMaker's PutMetricData of a job's metric matches, to the second: hang bounds of seconds."""
        cloudwatch = self.client("cloudwatch")
        for start in range(0, len(data), 500):
            chunk = [{**item, "StorageResolution": 1} for item in data[start:start + 500]]
            cloudwatch.put_metric_data(Namespace=JOB_METRICS_NAMESPACE, MetricData=chunk)

    def _job_ended(self, job: LocalTrainingJob) -> None:
        """EventBridge's rule, locally: the job's "SageMaker Training Job State Change" to the watch
        function, in the shape SageMaker sends (no CheckpointConfig: `job_state_events`)."""
        assert self.sagemaker is not None
        event = job_state_change(
            self.sagemaker.describe_training_job(job.name), job.request.get("Tags", []),
            account=ACCOUNT, region=REGION,
        )
        self.lambdas.invoke(self.settings.watch_function, json.loads(json.dumps(event)))

    def _create_state_machine(self) -> None:
        text = self.project.definition.read_text()
        values = placeholder_values(self.project.placeholder_map, self.settings, self.lambdas)
        definition = fill_placeholders(text, values)
        (self.run_dir / "definition.asl.json").write_text(definition)
        created = self.client("stepfunctions").create_state_machine(
            name=self.settings.state_machine_name, definition=definition, roleArn=self.settings.states_role
        )
        self.state_machine_arn = created["stateMachineArn"]

    # ---------------------------------------------------------------- executions
    def start_execution(self, execution_input: dict[str, Any], name: str | None = None) -> str:
        name = name or f"local-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        refused = execution_name_problem(name)  # Step Functions' InvalidName (moto's double does not check it)
        if refused:
            raise EngineError(f"execution name {refused}")
        # A job of your own: its local directory and data go to the local S3 first, as on AWS.
        try:
            # Under source/, where the stack's train role reads source archives (ValidateInput), as
            # the AWS client uploads them (source/jobs/<hash>/).
            execution_input = stage(execution_input, self.client("s3"), self.settings.bucket, f"source/jobs/{name}")
        except StagingError as error:
            raise EngineError(str(error)) from None
        started = self.client("stepfunctions").start_execution(
            stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(execution_input)
        )
        return started["executionArn"]

    def run(
        self,
        execution_input: dict[str, Any],
        *,
        name: str | None = None,
        observer: Observer | None = None,
        poll_seconds: float = 0.25,
        interrupt: threading.Event | None = None,
    ) -> RunRecord:
        """Start an execution and follow it to its end (or until ``interrupt`` is set)."""
        arn = self.start_execution(execution_input, name)
        return self.follow(arn, execution_input, observer=observer, poll_seconds=poll_seconds, interrupt=interrupt)

    def follow(
        self,
        arn: str,
        execution_input: dict[str, Any],
        *,
        observer: Observer | None = None,
        poll_seconds: float = 0.25,
        interrupt: threading.Event | None = None,
        record: RunRecord | None = None,
    ) -> RunRecord:
        """Follow an execution to its end, filling ``record`` (a new one unless given) as it goes;
        Ctrl-C (``interrupt``) stops it and its running job."""
        assert self._mailbox is not None
        name = arn.rsplit(":", 1)[1]
        follower = ExecutionFollower(
            self.client("stepfunctions"),
            self.sagemaker,
            self._mailbox,
            record or RunRecord(execution_arn=arn, name=name, input=execution_input),
            observer or unobserved,
        )
        return follower.follow(poll_seconds=poll_seconds, interrupt=interrupt, on_interrupt=lambda: self.stop(arn))

    def stop(self, arn: str) -> list[LocalTrainingJob]:
        """Ctrl-C: stop the execution (so nothing new launches), then ask its running job to end
        cleanly (SIGTERM from this machine, not StopTrainingJob; killed if not ended within a minute)."""
        sfn = self.client("stepfunctions")
        with contextlib.suppress(Exception):
            sfn.stop_execution(executionArn=arn, error="Interrupted", cause="stopped from the command line (Ctrl-C)")
        assert self.sagemaker is not None
        stopped = self.sagemaker.interrupt_all()
        for job in stopped:
            job.done.wait(LOCAL_INTERRUPT_GRACE_SECONDS + 10)
        return stopped

    # ---------------------------------------------------------------- inspection (tests, client)
    def history(self, arn: str) -> list[dict[str, Any]]:
        return self.client("stepfunctions").get_execution_history(executionArn=arn)["events"]

    def running_jobs(self) -> list[LocalTrainingJob]:
        return [] if self.sagemaker is None else self.sagemaker.running_jobs()


def _all_loggers() -> Iterator[logging.Logger]:
    for logger in list(logging.root.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            yield logger


@contextlib.contextmanager
def _unset(variable: str) -> Iterator[None]:
    previous = os.environ.pop(variable, None)
    try:
        yield
    finally:
        if previous is not None:
            os.environ[variable] = previous
