"""Host time inside the watcher, part by part, per step: the device benchmark's instrument (not a test).

    python -m stabilizer.bench.hook_time watched ARGS...   # gpt_loop.py ARGS under the launcher's hooks
    python -m stabilizer.bench.hook_time plain ARGS...     # the same script unwatched: its garbage collection

``watched`` installs the launcher's hooks in this process as the job's autostart does
(``launcher_hooks.activate``, with the configuration the environment gives: ``STABILIZER_CONFIG`` and
the rest, as ``python -m stabilizer_sentinel.launch`` sets them), each of the watcher's entry points
wrapped in a timer first; then it runs stabilizer/bench/gpt_loop.py as ``__main__``, unchanged. It
prints the script's own output, then one JSON line: the milliseconds per optimizer step spent in each
part, and the garbage collector's (the whole process's: a part that leaves many objects alive brings
collections on sooner), from the first optimizer step on (the network's and the optimizer's making
left out), over every step the optimizer took (an in-job rollback's probes and replays included).

How to read it:
- Nested parts are inside their parent's time, but not always: the learning check also reads the first
  loss before any check, and the rewind's first copy is taken inside the first check.
- A collection that comes inside a part counts in that part and in the collector's row.
- On CUDA the rewind's copies are queued without waiting: the device does them later, and the host
  waits for them inside the next part that reads the device (the finite check's read), which also waits
  for the step's own work.
- Not timed: the optimizer hooks' own code around the check and the update (a rollback's rate, its
  scale and unscale), the log channel, the wrapper of ``Tensor.backward`` around its hook.
- The timers (``time.perf_counter`` twice a call) are in the figures: about a microsecond a call, and
  the module hooks are called once per module per forward pass.
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import runpy
import sys
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("gpt_loop.py")


# The parts timed, in the order printed: (module, owner in it or None for a function, attribute, part).
PARTS = [
    ("stabilizer_sentinel.integration.guard", "Guard", "check", "check before the update"),
    ("stabilizer_sentinel.detection.sentinel", "Sentinel", "_sync_scalars", "  gradient norm, the finite check's read"),
    ("stabilizer_sentinel.detection.learning_check", "LearningCheck", "observe", "  learning check"),
    ("stabilizer_sentinel.capture.capture", "Capture", "end_step", "  capture"),
    ("stabilizer_sentinel.detection.sentinel", "Sentinel", "_invoke", "  rules"),
    ("stabilizer_sentinel.integration.guard", "Guard", "advance", "after the update"),
    ("stabilizer_sentinel.recovery.rewind", "Rewind", "after_step", "  rewind's copies"),
    ("stabilizer_sentinel.integration.launcher_hooks", "LauncherHooks", "_backward", "backward hook"),
    ("stabilizer_sentinel.integration.launcher_hooks", "LauncherHooks", "_module_called",
     "module hooks: the launcher's, before"),
    ("stabilizer_sentinel.integration.launcher_hooks", "LauncherHooks", "_module_returned",
     "module hooks: the launcher's, after"),
    ("stabilizer_sentinel.capture.module_hooks", None, "_dispatch", "module hooks: capture's"),
    ("stabilizer_sentinel.integration.launcher_hooks", "LauncherHooks", "_optimizer_stepping",
     "optimizer hook: the launcher's"),
]
ORDER = ["garbage collection"] + [part for *_, part in PARTS]


def timed(spent: dict[str, float], part: str, inner: Any) -> Any:
    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[part] = spent.get(part, 0.0) + time.perf_counter() - started

    return wrapper


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("watched", "plain"):
        print("usage: python -m stabilizer.bench.hook_time watched|plain [gpt_loop args]", file=sys.stderr)
        return 2
    mode, script_args = argv[0], argv[1:]
    spent: dict[str, float] = {"garbage collection": 0.0}
    steps, collections = [0], [0]
    started_at: list[float] = []

    def collector(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started_at.append(time.perf_counter())
        elif started_at:
            took = time.perf_counter() - started_at.pop()
            if steps[0]:
                spent["garbage collection"] = spent.get("garbage collection", 0.0) + took
                collections[0] += 1

    def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
        steps[0] += 1

    if mode == "watched":
        for module, name, attribute, part in PARTS:
            owner = importlib.import_module(module)
            owner = getattr(owner, name) if name else owner
            setattr(owner, attribute, timed(spent, part, getattr(owner, attribute)))
        from stabilizer_sentinel.integration.launcher_hooks import activate

        activate(force=True)
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    counting = register_optimizer_step_pre_hook(stepped)  # after the watcher's own: it counts every step
    sys.argv = [str(SCRIPT), *script_args]
    gc.callbacks.append(collector)
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        gc.callbacks.remove(collector)
        counting.remove()
    taken = max(steps[0], 1)
    report = {part: round(spent[part] * 1000 / taken, 4) for part in ORDER if part in spent}
    print(json.dumps({"hook_ms_per_step": report, "collections_per_step": round(collections[0] / taken, 3),
                      "steps": steps[0]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
