"""Benchmark of local mode: the reference scenario end to end, per policy.

    python -m stabilizer.bench                          # both policies, the reference problem
    python -m stabilizer.bench --policy default num_epochs=1

For each policy it runs one execution through the local engine (no live view) and prints:
wall time; the sum of the training jobs' wall times; control-plane overhead (wall time minus
that sum, as a share of wall time); peak memory of the whole run (this process and every process
under it, sampled from /proc); the attempts and the outcome. The figures are measured, never
asserted: targets are for people to compare against, not for tests to enforce.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

# The targets of the local mode, printed next to what was measured.
TARGET_WALL_SECONDS = 180
TARGET_OVERHEAD = 0.15
TARGET_PEAK_BYTES = 4 * 1024**3


def _children(pid: int) -> list[int]:
    found = []
    task_dir = Path(f"/proc/{pid}/task")
    for task in task_dir.glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return found


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def tree_rss_bytes(root: int) -> int:
    """Resident memory of a process and all its descendants."""
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _rss_bytes(pid)
        stack += _children(pid)
    return total


class PeakMemory:
    """Samples the process tree's resident memory in the background and keeps the maximum."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes(os.getpid()))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_bytes(os.getpid()))


def run_one(policy: str, pairs: list[str], data_dir: Path, run_root: Path) -> dict[str, Any]:
    from stabilizer.cli import LOCAL_DEFAULTS
    from stabilizer.inputs import build_input, workflow_state_module
    from stabilizer.local.engine import LocalEngine, Project
    from stabilizer.parts import project_root
    from stabilizer.report import outcome, timing, write_report

    project = Project.discover(project_root())
    execution_input = build_input(
        state_module=workflow_state_module(project.lambdas),
        pairs=pairs,
        policy=policy,
        defaults=LOCAL_DEFAULTS,
    )
    name = f"bench-{policy}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = run_root / name
    started = time.monotonic()
    with PeakMemory() as memory, LocalEngine(run_dir, data_dir, project=project) as engine:
        setup = engine.setup_seconds
        record = engine.run(execution_input, name=name)
    total = time.monotonic() - started
    write_report(record, run_dir)
    t = timing(record)
    return {
        "policy": policy,
        "input": execution_input,
        "outcome": outcome(record),
        "attempts": len(record.attempts),
        "final_batch_norm": (record.state or {}).get("run_spec", {}).get("add_batch_norm"),
        "setup_seconds": round(setup, 2),
        "wall_seconds": t["wall_seconds"],
        "job_seconds": t["job_seconds"],
        "control_plane_seconds": t["control_plane_seconds"],
        "control_plane_fraction": t["control_plane_fraction"],
        "total_seconds_with_setup": round(total, 2),
        "peak_memory_bytes": memory.peak,
        "jobs": [{"job": a.job_name, "status": a.status, "seconds": round(a.seconds, 2)} for a in record.attempts],
        "run_dir": str(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stabilizer.bench", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--policy", choices=["default", "original", "both"], default="both")
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / "bench")
    parser.add_argument("--data-dir", type=Path, help="train/ and test/ channels (default: the offline digits)")
    parser.add_argument("pairs", nargs="*", metavar="key=value", help="execution input fields, as for stabilizer run")
    args = parser.parse_args(argv)

    from stabilizer.cli import prepare_data
    from stabilizer.parts import model_dir

    data_args = argparse.Namespace(data_dir=args.data_dir, run_dir=Path("runs"))
    data_dir = prepare_data(data_args, model_dir(), sys.stdout)
    policies = ["default", "original"] if args.policy == "both" else [args.policy]
    results = []
    print(f"cpus: {os.cpu_count()}  load average before: {os.getloadavg()[0]:.2f}")
    for policy in policies:
        result = run_one(policy, args.pairs, data_dir, args.run_dir)
        results.append(result)
        print(
            f"policy {policy}: {result['outcome']} after {result['attempts']} attempts "
            f"(final add_batch_norm={result['final_batch_norm']})\n"
            f"  wall {result['wall_seconds']:.1f} s (target <= {TARGET_WALL_SECONDS} s; engine setup "
            f"{result['setup_seconds']:.1f} s more)\n"
            f"  training jobs {result['job_seconds']:.1f} s; control plane {result['control_plane_seconds']:.1f} s "
            f"= {100 * result['control_plane_fraction']:.1f} % of wall (target <= {100 * TARGET_OVERHEAD:.0f} %)\n"
            f"  peak memory of the run {result['peak_memory_bytes'] / 1024**2:.0f} MiB "
            f"(target < {TARGET_PEAK_BYTES / 1024**3:.0f} GiB)\n"
            f"  jobs: " + ", ".join(f"{j['status']} {j['seconds']:.1f} s" for j in result["jobs"]) + "\n"
            f"  report: {result['run_dir']}/report.md"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    args.run_dir.mkdir(parents=True, exist_ok=True)
    (args.run_dir / "bench.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
