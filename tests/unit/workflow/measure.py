"""Figures for the Lambda asset, printed, never asserted (timings do not belong in unit tests).

    python -m tests.unit.workflow.measure            # from the repository root

1. Serialised size of a state payload holding 30 fully recorded attempts (each with a finding and
   a decision; then each with three in-job rollbacks too, of which the state keeps the newest 8),
   against the 64 KiB budget and the 256 KiB Step Functions limit.
2. Cold import time of each handler: the wall and CPU time of `import <handler>` in a fresh
   interpreter (median of several runs), and Python's own `-X importtime` cumulative figure.
   Outside Lambda tracing is off, so the X-Ray SDK is not imported (workflow/telemetry.py);
   with `LAMBDA_TASK_ROOT` set (as in Lambda, tracing on) it is.
   Then, in the same process, the CPU time of the first SageMaker client (`get_sagemaker()`):
   boto3 is imported by the client factories, not by the handlers, so a cold start in the cloud
   (whose first invocation always makes an AWS call) pays the import and this together.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from stabilizer_workflow.execution.state import dump_state
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import ENV, state_with_exploded_attempts

ROOT = Path(__file__).resolve().parents[3]

RUNS = 7


def payload_size() -> None:
    for rollbacks in (0, 3):
        state = state_with_exploded_attempts(TrainSettings.from_env(ENV), 30, rollbacks)
        size = len(json.dumps(dump_state(state)).encode())
        kept = sum(len(attempt.rollbacks) for attempt in state.attempts)
        print(
            f"state payload, {len(state.attempts)} attempts, {rollbacks} in-job rollbacks each ({kept} kept): "
            f"{size} bytes ({size / 1024:.1f} KiB); "
            f"{size / 65536:.2f} of 64 KiB, {size / 262144:.2f} of the 256 KiB Step Functions limit"
        )


def cold_imports(tracing: bool = False) -> None:
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    if tracing:
        env["LAMBDA_TASK_ROOT"] = "/var/task"  # as in Lambda: Powertools traces, the X-Ray SDK is imported
    for handler in ("stabilizer_workflow.handlers.train", "stabilizer_workflow.handlers.monitor"):
        code = (
            "import time; t = time.perf_counter(); c = time.process_time(); "
            f"import {handler}; w, i = time.perf_counter() - t, time.process_time() - c; "
            "from stabilizer_workflow.aws.sagemaker import get_sagemaker; get_sagemaker(); "
            "print(w, i, time.process_time() - c - i)"
        )
        walls, cpus, clients = [], [], []
        for _ in range(RUNS):
            out = subprocess.run(
                [sys.executable, "-c", code],
                cwd=ROOT / "lambdas",
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            wall, cpu, client = (float(x) * 1000 for x in out.stdout.split())
            walls.append(wall)
            cpus.append(cpu)
            clients.append(client)
        cumulative = []
        for _ in range(3):
            trace = subprocess.run(
                [sys.executable, "-X", "importtime", "-c", f"import {handler}"],
                cwd=ROOT / "lambdas",
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stderr
            cumulative.append(
                next(
                    int(line.split("|")[1]) / 1000
                    for line in trace.splitlines()
                    if line.endswith(f"| {handler}")
                )
            )
        print(
            f"{handler}{' (tracing on)' if tracing else ''}: cold import median {statistics.median(walls):.0f} ms "
            f"(min {min(walls):.0f}, max {max(walls):.0f}, {RUNS} fresh processes), "
            f"CPU time median {statistics.median(cpus):.0f} ms (what a busy machine inflates least); "
            f"-X importtime cumulative, median of 3: {statistics.median(cumulative):.0f} ms; "
            f"then the first SageMaker client: CPU time median {statistics.median(clients):.0f} ms"
        )


if __name__ == "__main__":
    print(f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    payload_size()
    cold_imports()
    cold_imports(tracing=True)
