"""Run the fixture scripts of tests/fixtures as a job would: a separate process, the job's environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import MODEL_DIR, ROOT

FIXTURES = ROOT / "tests" / "fixtures"


def job_env(root: Path, config: dict | None = None, **extra: str) -> dict[str, str]:
    """The environment of a job whose directory is ``root``; ``config`` is its sagemaker_stabilizer value."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "STABILIZER_"))}
    hyperparameters = root / "input" / "config" / "hyperparameters.json"
    hyperparameters.parent.mkdir(parents=True, exist_ok=True)
    values = {"lr": "3"}
    if config is not None:
        values["sagemaker_stabilizer"] = json.dumps(config)
    hyperparameters.write_text(json.dumps(values))
    env.update(PYTHONPATH=str(MODEL_DIR), SM_INPUT_CONFIG_DIR=str(hyperparameters.parent),
               STABILIZER_CHECKPOINT_DIR=str(root / "checkpoints"), STABILIZER_FAILURE_FILE=str(root / "failure"),
               OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def findings(root: Path) -> list[dict]:
    return json.loads((root / "checkpoints" / "findings.json").read_text())["findings"]


def summary(root: Path) -> dict:
    """The ``summary`` of the job's findings.json (docs/contracts.md section 2); KeyError when it has none."""
    return json.loads((root / "checkpoints" / "findings.json").read_text())["summary"]


def logged(stdout: str, key: str = "grad_norm") -> list[tuple[int, float]]:
    rows = []
    for line in stdout.splitlines():
        if line.startswith("step="):
            fields = dict(part.split("=", 1) for part in line.split())
            rows.append((int(fields["step"]), float(fields[key])))
    return rows


def torchrun(logs: Path, ranks: int = 2) -> list[str]:
    """torchrun's arguments for ``ranks`` local workers: each rank's stdout and stderr copied to the console and
    kept whole in its own files under ``logs`` (read them with ``rank_output``)."""
    return ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), "--tee", "3",
            "--log-dir", str(logs)]


def rank_output(logs: Path, stream: str = "stdout") -> str:
    """What every rank wrote to ``stream``, from its own file under ``logs``, each line prefixed as torchrun's
    console copy prefixes it (``[default<rank>]:``). The console copy tails those files while they are written and
    now and then splits a line in two, another line between the halves: tests read the files."""
    lines = []
    for log in sorted(logs.glob(f"*/attempt_*/*/{stream}.log"), key=lambda path: int(path.parent.name)):
        lines += [f"[default{log.parent.name}]:{line}" for line in log.read_text(errors="replace").splitlines()]
    return "".join(line + "\n" for line in lines)


# gloo on torch 2.13.0 aborts a rank at its interpreter's exit now and then, after the script's last line
# and its barrier, with or without the sentinel (docs/library.md, "DDP"): torchrun then fails the run.
GLOO_EXIT_ABORT = "terminate called without an active exception"


def run_ranks(command: list[str], cwd: Path, env: dict[str, str], ranks: int = 2,
              timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``command`` under torchrun; again, once, where every rank printed ``done`` and one was aborted at exit
    by gloo alone (GLOO_EXIT_ABORT): what the run did is all there, torch's exit lost it."""
    result = run(command, cwd, env, timeout=timeout)
    output = result.stdout + result.stderr
    finished = sorted(re.findall(r"rank=(\d) done", output)) == [str(rank) for rank in range(ranks)]
    if result.returncode != 0 and GLOO_EXIT_ABORT in output and finished:
        shutil.rmtree(env["STABILIZER_CHECKPOINT_DIR"], ignore_errors=True)  # the second run starts as the first
        if "--log-dir" in command:
            shutil.rmtree(command[command.index("--log-dir") + 1], ignore_errors=True)
        Path(env["STABILIZER_FAILURE_FILE"]).unlink(missing_ok=True)
        result = run(command, cwd, env, timeout=timeout)
    return result
