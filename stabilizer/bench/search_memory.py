"""The memory a search's trials peak at, unwatched and watched (a benchmark, not a test).

    python -m stabilizer.bench.search_memory                  # three trials of a 25M-parameter MLP, Adam
    python -m stabilizer.bench.search_memory --width 512      # quicker

A search whose trials each train inside a function that returns the score alone (an Optuna objective) frees
each trial's network, gradients and optimizer state as the function returns. The watcher holds the network
and optimizer it watches: it must let go of them when the script does, or the next trial trains beside them
(docs/harmless.md). The same script (``tests/fixtures/loops/search_trials.py``, sized by ``--width`` and
``--depth``) runs unwatched, then watched by the launcher with the relaunch policy and with in-job recovery
(whose copies of the state are part of what it holds), one after the other; each run's peak resident memory is
the kernel's (``wait4``), and its ratio to the unwatched run's is printed. The parameters' own size is printed
beside them: weights, gradients and Adam's two moments are four times it.

This module measures and prints; it must not be imported by the training code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "fixtures" / "loops" / "search_trials.py"
RUNS = (("unwatched", None), ("watched, relaunch", "relaunch"), ("watched, in_job", "in_job"))


def peak(args: list[str], recovery: str | None, scratch: Path) -> tuple[float, float, int, str]:
    """Run the script (watched by the launcher under ``recovery``, unwatched when None): its peak resident
    memory in MB, its seconds, its exit status and its stdout."""
    command = [sys.executable, *(["-m", "stabilizer_sentinel.launch"] if recovery else []), str(SCRIPT), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "STABILIZER_"))}
    env["STABILIZER_CHECKPOINT_DIR"] = str(scratch / (recovery or "unwatched"))
    if recovery:
        env["STABILIZER_CONFIG"] = json.dumps({"recovery": recovery})
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=scratch)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read().decode()
    return usage.ru_maxrss / 1024, time.perf_counter() - started, process.returncode, stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=6)
    args = parser.parse_args(argv)
    script_args = ["--trials", str(args.trials), "--steps", str(args.steps),
                   "--width", str(args.width), "--depth", str(args.depth)]
    parameters = 8 * args.width + args.width + (args.depth - 1) * (args.width + 1) * args.width + 2 * args.width + 2
    print(f"{args.trials} trials of {args.steps} steps, an MLP of {parameters / 1e6:.1f}M parameters "
          f"({parameters * 4 / 2**20:.0f} MB of float32 weights; Adam's state and the gradients, three times that)")
    print(f"{'run':<20} {'peak MB':>8} {'x unwatched':>12} {'seconds':>8}  same output")
    with tempfile.TemporaryDirectory() as scratch:
        base, base_out = None, None
        for name, recovery in RUNS:
            mb, seconds, status, stdout = peak(script_args, recovery, Path(scratch))
            if status != 0:
                print(f"{name}: exit {status}", file=sys.stderr)
                return 1
            base = base or mb
            base_out = base_out if base_out is not None else stdout
            print(f"{name:<20} {mb:>8.0f} {mb / base:>12.2f} {seconds:>8.1f}  {'yes' if stdout == base_out else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
