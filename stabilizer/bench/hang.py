"""Measure the time from a hang to the stop: a rank falls asleep in its loop, the watchdog ends the job.

    python -m stabilizer.bench.hang --floor 2 --trials 3     # from the repository root

Each trial runs ``torchrun --standalone --nproc_per_node 2 tests/fixtures/ddp/hang.py --sleep-rank 1
--sleep-step 8`` (gloo, CPU; a step takes about 0.03 s) with ``STABILIZER_HANG_FLOOR_SECONDS`` at
``--floor`` and ``STABILIZER_HANG_FACTOR`` at ``--factor``, and prints, counted from the moment rank 1
falls asleep (its ``sleeping at=`` stamp): when findings.json held the ``Hang`` finding, and when the
last process of the job had ended. The first is bounded by the watchdog's bound plus one tick (a
tenth of the floor, at most 1 s); the second adds the time the ranks take to leave.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "fixtures" / "ddp" / "hang.py"


def trial(floor: float, factor: float, work: Path) -> dict[str, float | str]:
    config = work / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "STABILIZER_"))}
    env.update(PYTHONPATH=str(ROOT / "model"), OMP_NUM_THREADS="1", SM_INPUT_CONFIG_DIR=str(config),
               STABILIZER_CHECKPOINT_DIR=str(work / "checkpoints"), STABILIZER_FAILURE_FILE=str(work / "failure"),
               STABILIZER_HANG_FLOOR_SECONDS=f"{floor:g}", STABILIZER_HANG_FACTOR=f"{factor:g}")
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "--tee", "3", str(SCRIPT), "--sleep-rank", "1", "--sleep-step", "8"],
                            cwd=SCRIPT.parent, env=env, capture_output=True, text=True, timeout=60 + 10 * floor,
                            check=False)
    ended = time.time()
    output = result.stdout + result.stderr
    slept = float(re.search(r"sleeping at=(\d+\.\d+)", output).group(1))
    findings = work / "checkpoints" / "findings.json"
    (hang,) = [f for f in json.loads(findings.read_text())["findings"] if f["rule"] == "Hang"]
    return {"finding": findings.stat().st_mtime - slept, "ended": ended - slept, "named": hang["tensor"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor", type=float, default=2.0, help="STABILIZER_HANG_FLOOR_SECONDS")
    parser.add_argument("--factor", type=float, default=10.0, help="STABILIZER_HANG_FACTOR")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    for number in range(args.trials):
        with tempfile.TemporaryDirectory() as work:
            seen = trial(args.floor, args.factor, Path(work))
        print(f"floor {args.floor:g} s, factor {args.factor:g}, trial {number + 1}: Hang finding "
              f"{seen['finding']:.2f} s after the rank fell asleep ({seen['named']}), every process ended "
              f"{seen['ended']:.2f} s after", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
