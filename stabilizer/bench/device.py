"""The watcher on an accelerator: step time, synchronisations, and an in-job rollback (a benchmark, not a test).

    python -m stabilizer.bench.device                         # CUDA where there is one, else the CPU
    python -m stabilizer.bench.device --quick                 # a small GPT, few steps: that it runs

The script is stabilizer/bench/gpt_loop.py (a GPT with AdamW, a hand-set rate, autocast, clipping),
run unchanged as its own process, plain and under the launcher (``python -m stabilizer_sentinel.launch``)
with the default recovery (relaunch) and with ``in_job``. Each measurement is side by side in one run:

1. **Step time.** The configurations take turns, ``--rounds`` times each, so drift in the machine falls
   on all alike; each run's milliseconds per step over its steps after the warm-up (the device drained
   before and after), the median per configuration and its ratio to plain. The losses each run logged
   are compared with plain's (on a GPU, plain against plain too: some kernels are not deterministic).
2. **Synchronisations per step** (CUDA only): ``torch.cuda.set_sync_debug_mode("warn")`` makes every
   synchronising call warn; each is counted for the watcher when its code is on the stack, else for
   the script (its loss logs), per step and per source line of the watcher.
3. **Host time inside the watcher** (stabilizer.bench.hook_time): the script run in-process under the
   launcher's hooks, each of the watcher's entry points timed, milliseconds per step by part, and the
   garbage collector's beside the script's unwatched.
4. **The rewind's copy** of the GPT's state (weights and AdamW's), in this process: waiting for each tensor
   against the rewind's own, to the host going on, the training stream free and the copy in host memory.
5. **An in-job rollback.** The same script at a rate that breaks it, watched with ``in_job``: the
   rollback's seconds from the finding to training again (its probes included), steps lost and probe
   steps, as findings.json records them; its last loss beside a healthy run's.

Logs and findings go to ``--out`` (``$OUT`` where set). This module measures and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import stabilizer_sentinel

SCRIPT = Path(__file__).with_name("gpt_loop.py")
MODEL = Path(stabilizer_sentinel.__file__).parent.parent
CONFIGS = {"plain": None, "launcher, relaunch": "relaunch", "launcher, in_job": "in_job"}
QUICK = ["--width", "64", "--depth", "2", "--heads", "2", "--context", "32", "--vocab", "256", "--batch", "8"]


def run(name: str, recovery: str | None, script_args: list[str], work: Path, extra_env: dict[str, str] | None = None,
        ) -> dict:
    """One run of the script: its result line, exit status, and findings (watched runs)."""
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(MODEL), os.environ.get("PYTHONPATH", "")]),
           **(extra_env or {})}
    command = [sys.executable, str(SCRIPT), *script_args]
    if recovery is not None:
        env.update({"STABILIZER_CONFIG": json.dumps({"recovery": recovery}),
                    "STABILIZER_CHECKPOINT_DIR": str(work / "checkpoints"),
                    "STABILIZER_FAILURE_FILE": str(work / "failure")})
        command = [sys.executable, "-m", "stabilizer_sentinel.launch", str(SCRIPT), *script_args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    (work / "stdout").write_text(done.stdout)
    (work / "stderr").write_text(done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    findings = work / "checkpoints" / "findings.json"
    result.update(name=name, status=done.returncode,
                  findings=json.loads(findings.read_text()) if findings.exists() else None)
    if done.returncode not in (0, 86):
        print(f"  {name}: exit {done.returncode}; stderr ends: {done.stderr[-600:]}", flush=True)
    return result


def step_time(args: argparse.Namespace, script_args: list[str], out: Path) -> None:
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for round_index in range(args.rounds):
        for name, recovery in CONFIGS.items():
            result = run(name, recovery, script_args, out / f"time-{round_index}-{name.replace(', ', '-')}")
            runs[name].append(result)
            print(f"  round {round_index + 1} {name:20s} {_ms(result.get('ms_per_step'))} ms/step, exit "
                  f"{result['status']}", flush=True)
    plain = statistics.median(r["ms_per_step"] for r in runs["plain"] if r.get("ms_per_step"))
    reference = runs["plain"][0].get("losses")
    print(f"\n{'configuration':22s} {'ms/step':>8s} {'ratio':>7s}  losses logged, against plain's first run")
    for name, results in runs.items():
        times = [r["ms_per_step"] for r in results if r.get("ms_per_step")]
        median = statistics.median(times) if times else float("nan")
        same = ["same" if r.get("losses") == reference else _largest_difference(r.get("losses"), reference)
                for r in results]
        print(f"{name:22s} {median:8.2f} {plain / median:6.3f}x  {', '.join(same)}")


def _ms(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _largest_difference(losses: dict | None, reference: dict | None) -> str:
    if not losses or not reference:
        return "no losses"
    gaps = [abs(losses[key] - reference[key]) / max(abs(reference[key]), 1e-12) for key in reference if key in losses]
    return f"differ (largest {max(gaps):.2e} relative)" if gaps else "none in common"


def hook_time(script_args: list[str], out: Path) -> None:
    """Host milliseconds per step inside each part of the watcher (stabilizer.bench.hook_time), and the
    garbage collector's, the script unwatched beside it."""
    reports = {}
    for name, recovery in CONFIGS.items():
        work = out / f"hooks-{name.replace(', ', '-')}"
        work.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(MODEL), os.environ.get("PYTHONPATH", "")])}
        if recovery is not None:
            env.update({"STABILIZER_CONFIG": json.dumps({"recovery": recovery, "integration": "launcher"}),
                        "STABILIZER_CHECKPOINT_DIR": str(work / "checkpoints"),
                        "STABILIZER_FAILURE_FILE": str(work / "failure")})
        command = [sys.executable, "-m", "stabilizer.bench.hook_time", "plain" if recovery is None else "watched",
                   *script_args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        (work / "stdout").write_text(done.stdout)
        (work / "stderr").write_text(done.stderr)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        found = [line for line in lines if "hook_ms_per_step" in line]
        if done.returncode or not found:
            print(f"  {name}: exit {done.returncode}; stderr ends: {done.stderr[-600:]}", flush=True)
            continue
        reports[name] = {**found[-1], "ms_per_step": next((line["ms_per_step"] for line in lines
                                                            if "ms_per_step" in line), None)}
    from stabilizer.bench.hook_time import ORDER

    parts = [part for part in ORDER if any(part in report["hook_ms_per_step"] for report in reports.values())]
    print("\nhost ms per step inside the watcher, by part (nested parts inside their parent), one run each")
    print(f"{'part':46s}" + "".join(f"{name:>20s}" for name in reports))
    for part in parts:
        print(f"{part:46s}" + "".join(f"{_ms(report['hook_ms_per_step'].get(part), 3):>20s}"
                                      for report in reports.values()))
    print(f"{'collections a step':46s}" + "".join(f"{report['collections_per_step']:20.2f}"
                                                 for report in reports.values()))
    print(f"{'ms a step (the script timing itself, timers in)':46s}"
          + "".join(f"{_ms(report['ms_per_step']):>20s}" for report in reports.values()))


def synchronisations(script_args: list[str], out: Path) -> None:
    for amp in ("bf16", "fp16"):
        counts = out / f"syncs-{amp}.json"
        result = run(f"syncs {amp}", "in_job", [*script_args, "--amp", amp], out / f"syncs-{amp}",
                     {"STABILIZER_BENCH_SYNCS": str(counts)})
        if not counts.exists():
            print(f"  {amp}: no count (exit {result['status']}; CUDA only)")
            continue
        report = json.loads(counts.read_text())
        print(f"\nsynchronisations, launcher with in_job, {amp}: {report['steps']} steps; the watcher's "
              f"{report['watcher']} ({report['watcher'] / report['steps']:.2f} a step, none on "
              f"{report['watcher_steps_with_none']} steps, at most {report['watcher_most_at_a_step']} at one); "
              f"the script's {report['script']} (its loss logs)")
        for line, count in report["watcher_lines"].items():
            print(f"  {count:5d}  {line}")


def rollback(args: argparse.Namespace, script_args: list[str], out: Path) -> None:
    healthy = run("healthy", "in_job", script_args, out / "rollback-healthy")
    broken = run("broken", "in_job", [*script_args, "--lr", str(args.broken_lr), "--clip", "0"],
                 out / "rollback-broken")
    print(f"\nin-job rollback at rate {args.broken_lr} (healthy {_rate(script_args)}), exit {broken['status']}")
    for decision in (broken.get("findings") or {}).get("rollbacks", []):
        print(f"  {decision.get('rule')} at step {decision.get('step')}: {decision.get('outcome')}, "
              f"{decision.get('seconds')} s to training again, {decision.get('steps_lost')} steps lost, "
              f"{decision.get('probe_steps')} probe steps, rate {decision.get('learning_rate_before')} -> "
              f"{decision.get('learning_rate_after')}")
    print(f"  last loss {_last(broken)} (healthy run: {_last(healthy)}); ms/step {_ms(broken.get('ms_per_step'))} "
          f"(healthy {_ms(healthy.get('ms_per_step'))})")


def _rate(script_args: list[str]) -> str:
    return script_args[script_args.index("--lr") + 1] if "--lr" in script_args else "3e-4"


def _last(result: dict) -> str:
    losses = result.get("losses") or {}
    return f"{losses[max(losses, key=int)]:.4f}" if losses else "-"


def copies(script_args: list[str]) -> None:
    """The rewind's copy of the state (weights and AdamW's) on the script's GPT: waiting for each tensor (as
    ``state_on_host`` does without ``devices``) against the rewind's own, timed to three points."""
    import time

    import torch

    from stabilizer.bench import gpt_loop
    from stabilizer_sentinel.recovery.rewind import Rewind, state_on_host

    args = gpt_loop.parser().parse_args(script_args)
    device = torch.device(args.device)
    model = gpt_loop.GPT(args.vocab, args.width, args.depth, args.heads, args.context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = gpt_loop.batches(args, device)[0]
    for _ in range(2):
        torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()
    rewind = Rewind(model, optimizer, checkpoint_dir=tempfile.mkdtemp(prefix="bench-device-copies-"))

    def drain() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    waiting, queued, stream_free, done = [], [], [], []
    for _ in range(6):
        drain()
        started = time.perf_counter()
        state_on_host(model.state_dict())
        state_on_host(optimizer.state_dict())
        waiting.append(time.perf_counter() - started)
        drain()
        started = time.perf_counter()
        snapshot = rewind.take_now(0)
        queued.append(time.perf_counter() - started)
        if device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        stream_free.append(time.perf_counter() - started)
        snapshot.settle()
        done.append(time.perf_counter() - started)
    size = snapshot.nbytes
    print(f"\nthe rewind's copy: {size / 2**20:.0f} MiB (weights and AdamW's state), ms, median of 5 after one")
    for name, times in (("waiting for each tensor", waiting), ("the rewind's: queued (the host goes on)", queued),
                        ("  the training stream free again", stream_free), ("  the copy in host memory", done)):
        print(f"  {name:42s} {statistics.median(times[1:]) * 1000:8.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stabilizer.bench.device", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None,
                        help="steps a run trains (300; with --quick 40, the rollback 150)")
    parser.add_argument("--broken-lr", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="a small GPT, few steps")
    parser.add_argument("--only", choices=["time", "hooks", "syncs", "rollback", "copies"], action="append")
    parser.add_argument("--out", default=os.environ.get("OUT") or "")
    args, script_args = parser.parse_known_args(argv)
    steps = args.steps or (40 if args.quick else 300)
    script_args = [*(QUICK if args.quick else []), "--steps", str(steps), *script_args]
    if args.quick:
        script_args += ["--warmup", "10", "--log-every", "10"]
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-device-"))
    chosen = args.only or ["copies", "time", "hooks", "syncs", "rollback"]
    print(f"gpt_loop {' '.join(script_args)}; logs in {out}", flush=True)
    if "copies" in chosen:
        copies(script_args)
    if "time" in chosen:
        step_time(args, script_args, out)
    if "hooks" in chosen:
        hook_time(script_args, out)
    if "syncs" in chosen:
        synchronisations(script_args if args.quick else [*script_args, "--steps", "60"], out)
    if "rollback" in chosen:
        rollback(args, [*script_args, "--steps", "150"] if args.quick and not args.steps else script_args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
