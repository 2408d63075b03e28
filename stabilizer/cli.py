"""The `stabilizer` command.

`stabilizer run --local` trains one job of the reference problem on the offline data as a local
process under the SageMaker container contract, and prints its outcome.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "model"


def run_local(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir) / time.strftime("%Y%m%d-%H%M%S")
    data_dir = Path(args.run_dir) / "data" / "digits"
    if not (data_dir / "train" / "x.npy").exists():
        subprocess.run([sys.executable, "data.py", "digits", "--out", str(data_dir)], cwd=MODEL_DIR, check=True)
    env = dict(os.environ, SM_CHANNEL_TRAIN=str(data_dir / "train"), SM_CHANNEL_TEST=str(data_dir / "test"),
               SM_MODEL_DIR=str(run_dir / "model"), STABILIZER_CHECKPOINT_DIR=str(run_dir / "checkpoints"),
               STABILIZER_FAILURE_FILE=str(run_dir / "output" / "failure"))
    hyperparameters = [f"--{key}={value}" for key, value in (kv.split("=", 1) for kv in args.overrides)]
    command = [sys.executable, "train.py", "--log_every", "1", *hyperparameters]
    print(f"training the reference problem in {run_dir}")
    first_non_finite = None
    with subprocess.Popen(command, cwd=MODEL_DIR, env=env, stdout=subprocess.PIPE, text=True) as process:
        for line in process.stdout:
            print(line, end="")
            if first_non_finite is None and line.startswith("step="):
                fields = dict(part.split("=", 1) for part in line.split())
                if not math.isfinite(float(fields["grad_norm"])):
                    first_non_finite = int(fields["step"])
    if process.returncode != 0:
        print(f"outcome: the job failed (exit {process.returncode}); see {run_dir / 'output' / 'failure'}")
        return 1
    if first_non_finite is not None:
        print(f"outcome: gradients became non-finite at step {first_non_finite}")
        return 2
    print("outcome: trained with finite gradients throughout")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stabilizer", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the reference problem")
    run.add_argument("--local", action="store_true", required=True, help="run on this machine")
    run.add_argument("--run-dir", default="runs", help="where runs, data and reports are written")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="hyperparameter overrides")
    args = parser.parse_args(argv)
    return run_local(args)


if __name__ == "__main__":
    sys.exit(main())
