"""Print the latency model: explosion to training again, on AWS, part by part, relaunched or in the job.

    python -m stabilizer.bench.latency                 # measures the wake path and both recoveries first
    python -m stabilizer.bench.latency --model-only    # the model alone, the wake taken to work

The figures and their sources are in stabilizer/bench/latency_model.py (documented, measured, derived or
assumed; none measured on AWS). Before printing, the benchmark runs the true wake path once in
local mode: a short healthy run of the reference job with `wait_seconds` 300, whose job-end
event (in the shape SageMaker documents) goes to the project's watch function. If that event
wakes the parked execution, the model's event parts stand; if the execution only moves at its
next check, the model uses the check instead. What is measured is the path from the job's own end
to the execution's next check, not the verdict: a run of a few steps may end `unverified` (too
short to judge learning) and still measures it, as long as its one job ran to its end. The last
lines give each way's total and its ratio to the original sample's.

It then runs the quickstart (examples/quickstart, lr 1.6: it diverges) twice in local mode, with
`job.recovery` in_job and relaunch, and prints the seconds from the finding to training again for
each on this machine: the rollback's own figure (findings.json) in the job; when relaunched, the
stopped job's end to the next job's launch (CreateTrainingJob), a lower bound: the new job's start,
its script's imports and its first step come on top.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabilizer.bench.latency_model import WakeMeasurement, Way, ways

# The cloud's default check interval: a wake that fails shows as a wait of this length.
MEASURE_WAIT_SECONDS = 300
# A healthy attempt of the reference job (batch norm), a few steps on the offline digits.
MEASURE_INPUT: dict[str, Any] = {
    "wait_seconds": MEASURE_WAIT_SECONDS,
    "run_spec": {"add_batch_norm": 1, "warmup_epochs": 0, "num_epochs": 1, "batch_size": 64,
                 "max_steps": 4, "checkpoint_every": 2},
}


def table(all_ways: list[Way]) -> str:
    lines = []
    for way in all_ways:
        lines.append(way.name)
        for part in way.parts:
            figure = part.figure
            lines.append(f"  {part.name:<40} {figure.seconds:>7.1f} s  {figure.kind:<10} {figure.source}")
        lines.append(f"  {'total':<40} {way.seconds:>7.1f} s")
        lines.append("")
    base = all_ways[0].seconds
    lines.append(f"{'way':<62} {'total':>9} {'vs sample':>10}")
    for way in all_ways:
        lines.append(f"{way.name:<62} {way.seconds:>7.1f} s {base / way.seconds:>9.1f}x")
    return "\n".join(lines)


def _time(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return dt.datetime.fromisoformat(str(value))


def wake_from_history(history: list[dict[str, Any]], job_end: dt.datetime, wait_seconds: int) -> WakeMeasurement:
    """From an execution's history: did the wait in progress when the job ended end by its task
    token (TaskSucceeded) or by its timeout, and how long after the job's end came the next check."""
    awaits = [e for e in history if e["type"] in ("TaskSucceeded", "TaskTimedOut")
              and _time(e["timestamp"]) >= job_end]
    checks = [e for e in history if e["type"] == "TaskStateEntered"
              and e.get("stateEnteredEventDetails", {}).get("name") == "CheckJobAndRules"
              and _time(e["timestamp"]) >= job_end]
    if not checks:
        raise RuntimeError("the execution never checked the job after it ended")
    woken = bool(awaits) and awaits[0]["type"] == "TaskSucceeded"
    return WakeMeasurement(woken, (_time(checks[0]["timestamp"]) - job_end).total_seconds(), wait_seconds)


def measuring_problem(record: Any, job_statuses: list[str]) -> str | None:
    """Why a measuring run measured no wake, in one line; None when it did: the workflow reached
    a verdict of its own (whichever: the wake does not depend on it) after exactly one job that
    ended by itself (a job the monitor stopped ends at the workflow's request, not on its own)."""
    from stabilizer.local.engine.execution_follower import failure_message

    verdict = record.status == "SUCCEEDED" or (record.status == "FAILED" and record.error == "TrainingNotRecovered")
    if verdict and job_statuses == ["Completed"]:
        return None
    why = failure_message(record.cause) or "no cause given"
    return (f"the measuring run ended {record.status} ({record.error or 'no error'}: {why}) with job(s) "
            f"{', '.join(job_statuses) or 'none'}; it needs one job that completes by itself")


def measure_wake(work: Path) -> WakeMeasurement:
    """Run the true path once in local mode and measure it (see the module docstring).

    The libraries' log (the ASL interpreter's dump of each failed state) goes to `work`/engine.log."""
    from stabilizer.local.checkout import reference_source
    from stabilizer.local.engine.engine import LocalEngine
    from stabilizer.local.offline_digits import ensure_offline_digits

    logging.basicConfig(filename=work / "engine.log", level=logging.WARNING, force=True)
    data = ensure_offline_digits(work / "data", reference_source())
    with LocalEngine(work / "run", data) as engine:
        record = engine.run(MEASURE_INPUT, name="latency-wake")
        history = engine.history(record.execution_arn)
        assert engine.sagemaker is not None
        jobs = list(engine.sagemaker.jobs.values())
    problem = measuring_problem(record, [job.status for job in jobs])
    if problem:
        raise RuntimeError(f"{problem} (details: {work / 'engine.log'}, {work / 'run'})")
    end = jobs[0].training_end_time
    assert end is not None
    return wake_from_history(history, end, MEASURE_WAIT_SECONDS)


QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "input.json"


@dataclass(frozen=True)
class LocalRecovery:
    """The quickstart's explosion answered both ways in local mode (wall clock, this machine)."""

    in_job_seconds: float  # the finding to training on at the chosen rate, probing included (the job's own figure)
    in_job_jobs: int
    relaunch_seconds: float  # the stopped job's end to the next job's launch (a lower bound)
    relaunch_jobs: int

    def lines(self) -> list[str]:
        ratio = self.relaunch_seconds / self.in_job_seconds if self.in_job_seconds > 0 else float("inf")
        return [
            "locally, the quickstart (lr 1.6) answered both ways on this machine:",
            f"  in the job:  {self.in_job_seconds:7.2f} s from the finding to training on at the chosen rate "
            f"({self.in_job_jobs} job)",
            f"  relaunched:  {self.relaunch_seconds:7.2f} s from the stopped job's end to the next job's launch "
            f"({self.relaunch_jobs} jobs; its start and first step come on top: a lower bound)",
            f"  relaunch / in the job: at least {ratio:.0f}x",
        ]


def _quickstart(work: Path, recovery: str) -> dict[str, Any]:
    """run.json of the quickstart in local mode with ``job.recovery`` set."""
    run_dir = work / recovery
    command = [sys.executable, "-m", "stabilizer.cli", "run", "--local", "--input", str(QUICKSTART),
               f"job.recovery={recovery}", "--plain", "--run-dir", str(run_dir), "--name", recovery]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)
    runs = list(run_dir.glob("*/run.json"))
    if not runs:
        raise RuntimeError(f"the quickstart ({recovery}) left no run.json: {done.stderr[-500:]}")
    return json.loads(runs[0].read_text())


def measure_recovery(work: Path) -> LocalRecovery:
    """The quickstart once in the job and once relaunched (see LocalRecovery)."""
    in_job = _quickstart(work, "in_job")
    rollbacks = in_job["state"]["attempts"][0].get("rollbacks") or []
    if not rollbacks or rollbacks[0].get("seconds") is None:
        raise RuntimeError("the quickstart recovered in the job made no rollback")
    relaunch = _quickstart(work, "relaunch")
    attempts = relaunch["state"]["attempts"]
    if len(attempts) < 2:
        raise RuntimeError("the quickstart relaunched made no second attempt")
    waited = (_time(attempts[1]["started_at"]) - _time(attempts[0]["ended_at"])).total_seconds()
    return LocalRecovery(float(rollbacks[0]["seconds"]), len(in_job["state"]["attempts"]), waited, len(attempts))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stabilizer.bench.latency", description=__doc__.split("\n")[0])
    parser.add_argument("--model-only", action="store_true", help="print the model without measuring the wake path")
    args = parser.parse_args(argv)
    wake, local = None, None
    if not args.model_only:
        work = Path(tempfile.mkdtemp(prefix="stabilizer-latency-"))
        try:
            wake = measure_wake(work)
            local = measure_recovery(work)
        except RuntimeError as error:  # the run's files stay for a look
            parser.exit(1, f"{parser.prog}: {error}\n")
        shutil.rmtree(work, ignore_errors=True)
        print(f"wake path: {wake.source}\n")
        print("\n".join(local.lines()) + "\n")
    print(table(ways(wake, local.in_job_seconds if local else None)))


if __name__ == "__main__":
    main()
