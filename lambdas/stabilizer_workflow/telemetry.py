"""Logs, metrics and traces of both handlers: Powertools' Logger, Metrics and Tracer, set up once.

Configured from the environment the stack gives the functions: the service name from
``POWERTOOLS_SERVICE_NAME`` and the metrics namespace from ``POWERTOOLS_METRICS_NAMESPACE``
(``DEFAULT_SERVICE`` and ``DEFAULT_NAMESPACE`` where they are not set, as in unit tests).

Tracing: the X-Ray SDK is most of a handler's cold import (``python -X importtime -c "import
train_handler"`` in ``lambdas/`` shows ``aws_xray_sdk.core`` as its largest entry), and Powertools'
Tracer imports it even when tracing is off. So the Tracer is created, and the SDK imported, only
where Powertools would trace: inside Lambda (``LAMBDA_TASK_ROOT`` set), not under SAM local or
Chalice, and without ``POWERTOOLS_TRACE_DISABLED`` (the rule of
``aws_lambda_powertools.tracing.Tracer._is_tracer_disabled``, Powertools 3.x). The deployed
functions run with active tracing, so in the cloud every invocation is traced as before.

The Tracer patches botocore alone (``TRACED_LIBRARIES``): every AWS call the handlers make goes
through it and appears as a subsegment. Powertools' default patches every library the X-Ray SDK
knows that is importable (requests, httpx, sqlite3, database drivers...), importing each of them
at the cold start although the handlers use none.

Nothing here decides anything about a run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.logging import Logger
from aws_lambda_powertools.metrics import Metrics, MetricUnit
from aws_lambda_powertools.shared import constants
from aws_lambda_powertools.shared.functions import resolve_truthy_env_var_choice

DEFAULT_SERVICE = "stabilizer"
DEFAULT_NAMESPACE = "Stabilizer"

Handler = Callable[[Any, Any], Any]
# The libraries whose calls appear in traces: the handlers reach AWS through botocore only.
TRACED_LIBRARIES = ("botocore",)

service = os.environ.get(constants.SERVICE_NAME_ENV) or DEFAULT_SERVICE
logger = Logger(service=service)
metrics = Metrics(namespace=os.environ.get(constants.METRICS_NAMESPACE_ENV) or DEFAULT_NAMESPACE, service=service)

__all__ = ["MetricUnit", "instrumented", "logger", "metrics", "tracing_enabled"]


def tracing_enabled(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether Powertools' Tracer would trace here (see the module docstring)."""
    if resolve_truthy_env_var_choice(env=environ.get(constants.TRACER_DISABLED_ENV, "false")):
        return False
    if not environ.get(constants.LAMBDA_TASK_ROOT_ENV):
        return False
    return not (environ.get(constants.SAM_LOCAL_ENV) or environ.get(constants.CHALICE_LOCAL_ENV))


@lru_cache(maxsize=1)
def tracer() -> Any:
    """The Tracer, created on first use (it imports the X-Ray SDK)."""
    from aws_lambda_powertools.tracing import Tracer

    return Tracer(service=service, patch_modules=TRACED_LIBRARIES)


def instrumented(handler: Handler) -> Handler:
    """``handler`` with the Lambda context in every log line, its metrics flushed when it returns,
    and one trace segment around it where tracing is on."""
    wrapped = metrics.log_metrics(handler)
    if tracing_enabled():
        wrapped = tracer().capture_lambda_handler(wrapped)
    return logger.inject_lambda_context(log_event=False)(wrapped)
