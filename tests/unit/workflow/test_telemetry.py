"""Logger, Metrics and Tracer are set up once for both handlers, from the environment; the X-Ray
SDK is imported only where tracing is on (in Lambda), so cold imports elsewhere skip its cost, and
boto3 only with the first client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stabilizer_workflow import telemetry
from stabilizer_workflow.handlers import monitor as monitor_handler
from stabilizer_workflow.handlers import train as train_handler

LAMBDAS = Path(__file__).resolve().parents[3] / "lambdas"

PROBE = """
import json, sys
from stabilizer_workflow.handlers import monitor as monitor_handler
from stabilizer_workflow.handlers import train as train_handler
from stabilizer_workflow import telemetry
print(json.dumps({
    "xray_imported": "aws_xray_sdk.core" in sys.modules,
    "boto3_imported": "boto3" in sys.modules,
    "tracer_created": telemetry.tracer.cache_info().currsize == 1,
    "tracer_disabled": telemetry.tracer().disabled if telemetry.tracer.cache_info().currsize else None,
    "patched": sorted(sys.modules["aws_xray_sdk.core.patcher"]._PATCHED_MODULES)
    if "aws_xray_sdk.core.patcher" in sys.modules else None,
    "namespace": telemetry.metrics.namespace,
    "service": telemetry.logger.service,
}))
"""


def probe(**environment: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POWERTOOLS_", "LAMBDA_TASK_ROOT", "AWS_SAM"))}
    env.update(AWS_DEFAULT_REGION="us-east-1", **environment)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=LAMBDAS, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_both_handlers_share_one_logger_and_one_metrics():
    assert train_handler.logger is monitor_handler.logger is telemetry.logger
    assert train_handler.metrics is monitor_handler.metrics is telemetry.metrics


@pytest.mark.slow
def test_outside_lambda_the_tracing_sdk_is_not_imported():
    seen = probe()
    assert seen["xray_imported"] is False
    # boto3 comes with the first client (stabilizer_workflow.aws), not with the handlers.
    assert seen["boto3_imported"] is False
    assert seen["tracer_created"] is False
    assert (seen["namespace"], seen["service"]) == ("Stabilizer", "stabilizer")


@pytest.mark.slow
def test_in_lambda_with_tracing_on_every_handler_is_traced():
    seen = probe(LAMBDA_TASK_ROOT="/var/task")
    assert seen["xray_imported"] is True
    assert seen["tracer_created"] is True
    assert seen["tracer_disabled"] is False
    # Every AWS call is traced (botocore patched), and only the libraries the handlers use.
    assert seen["patched"] == ["botocore"]


@pytest.mark.slow
def test_tracing_disabled_by_powertools_variable_even_in_lambda():
    seen = probe(LAMBDA_TASK_ROOT="/var/task", POWERTOOLS_TRACE_DISABLED="true")
    assert (seen["xray_imported"], seen["tracer_created"]) == (False, False)


@pytest.mark.slow
def test_namespace_and_service_come_from_the_environment():
    seen = probe(POWERTOOLS_METRICS_NAMESPACE="TeamMetrics", POWERTOOLS_SERVICE_NAME="stabilizer-eu")
    assert (seen["namespace"], seen["service"]) == ("TeamMetrics", "stabilizer-eu")


def test_tracing_follows_powertools_rule():
    assert telemetry.tracing_enabled({"LAMBDA_TASK_ROOT": "/var/task"}) is True
    assert telemetry.tracing_enabled({}) is False
    assert telemetry.tracing_enabled({"LAMBDA_TASK_ROOT": "/var/task", "AWS_SAM_LOCAL": "true"}) is False
    assert telemetry.tracing_enabled({"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "1"}) is False
