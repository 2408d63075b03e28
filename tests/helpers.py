"""Helpers shared by every tier: run model/train.py as a SageMaker job would, read its log lines;
the original AWS sample's execution input."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "model"
TRAIN_SCRIPT = MODEL_DIR / "train.py"

# The original AWS sample's flat execution input, every field of it (values as its notebook passed them).
SAMPLE_INPUT = {
    "init_warmup_learning_rate": 0.1,
    "learning_rate": 0.1,
    "add_batch_norm": 0,
    "num_epochs": 3,
    "bucket": "my-sample-bucket",
    "base_job_name": "resnet-elu",
    "instance_type": "ml.p3.2xlarge",
    "region": "us-west-2",
    "debugger_save_interval": 100,
    "max_num_retraining": 10,
    "max_monitor_transitions": 300,
}
# Its fields that are deployment settings, not per-execution input.
SAMPLE_DEPLOYMENT_FIELDS = ("bucket", "base_job_name", "region")


@dataclass
class JobDirs:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def failure(self) -> Path:
        return self.root / "output" / "failure"

    def env(self, channels: dict[str, Path] | None = None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "STABILIZER_"))}
        env.update(SM_MODEL_DIR=str(self.model), STABILIZER_CHECKPOINT_DIR=str(self.checkpoints),
                   STABILIZER_FAILURE_FILE=str(self.failure), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"))
        for name, path in (channels or {}).items():
            env[f"SM_CHANNEL_{name.upper()}"] = str(path)
        env.update(extra)
        return env


def run_train(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run model/train.py as SageMaker would: a separate process, cwd in the source directory."""
    return subprocess.run([sys.executable, str(TRAIN_SCRIPT), *args], cwd=MODEL_DIR, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def step_lines(stdout: str) -> list[dict[str, str]]:
    """The `step=... loss=...` log lines as dicts, as a MetricDefinitions regex would read them."""
    rows = []
    for line in stdout.splitlines():
        if line.startswith("step="):
            rows.append(dict(part.split("=", 1) for part in line.split()))
    return rows


def model_module(name: str):
    """``model/<name>.py`` loaded from its file (``model/`` is a source directory, not a package).

    ``data`` and ``resnet`` import no sibling and load as stabilizer's benchmarks load them;
    ``recipe`` imports no sibling either; ``train`` imports all three as siblings (``from data
    import read_channel``), so they stand under those names only while it loads.
    """
    import importlib.util

    from stabilizer.local.reference_source import reference_module

    if name != "train":
        return reference_module(name, MODEL_DIR)
    key = "stabilizer_reference_source_train"
    if key not in sys.modules:
        siblings = {sibling: reference_module(sibling, MODEL_DIR) for sibling in ("data", "recipe", "resnet")}
        saved = {sibling: sys.modules.get(sibling) for sibling in siblings}
        sys.modules.update(siblings)
        try:
            spec = importlib.util.spec_from_file_location(key, TRAIN_SCRIPT)
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(key, None)
            raise
        finally:
            for sibling, before in saved.items():
                if before is None:
                    sys.modules.pop(sibling, None)
                else:
                    sys.modules[sibling] = before
    return sys.modules[key]


def in_make_test_all(*values: object) -> list:
    """Parameters of a test that `make test` leaves to `make test-all` (marked `long`): the other
    variants of a path whose first variants `make test` runs. A tuple is one set of arguments."""
    import pytest

    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.long) for v in values]
