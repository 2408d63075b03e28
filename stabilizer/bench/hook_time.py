"""Host time inside the watcher, part by part, per step: the device benchmark's instrument (not a test).

    python -m stabilizer.bench.hook_time watched ARGS...   # gpt_loop.py ARGS under the launcher's hooks
    python -m stabilizer.bench.hook_time plain ARGS...     # the same script unwatched: its garbage collection

``watched`` installs the launcher's hooks in this process as the job's autostart does
(``launcher_hooks.activate``, with the configuration the environment gives: ``STABILIZER_CONFIG`` and
the rest, as ``python -m stabilizer_sentinel.launch`` sets them), each of the watcher's entry points
wrapped in a timer first; then it runs stabilizer/bench/gpt_loop.py as ``__main__``, unchanged. It
prints the script's own output, then one JSON line: the milliseconds per step spent in each part, over
every step the script took, and the garbage collector's (the whole process's: a part that allocates
many objects brings collections on sooner). Nested parts are inside their parent's time. On CUDA, a part
that reads the device (the finite check's read of the loss and the gradient norm) includes the wait for it.

The timers (``time.perf_counter`` twice a call) are in the figures: about a microsecond a call.
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
    ("stabilizer_sentinel.capture.module_hooks", None, "_dispatch", "module forward hooks"),
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
    spent: dict[str, float] = {}
    collections = [0]
    started_at: list[float] = []

    def collector(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started_at.append(time.perf_counter())
        elif started_at:
            spent["garbage collection"] = spent.get("garbage collection", 0.0) + time.perf_counter() - started_at.pop()
            collections[0] += 1

    if mode == "watched":
        for module, name, attribute, part in PARTS:
            owner = importlib.import_module(module)
            owner = getattr(owner, name) if name else owner
            setattr(owner, attribute, timed(spent, part, getattr(owner, attribute)))
        from stabilizer_sentinel.integration.launcher_hooks import activate

        activate(force=True)
    import torch  # noqa: F401 - imported before the collector counts: the script's import is not its steps

    sys.argv = [str(SCRIPT), *script_args]
    gc.callbacks.append(collector)
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        gc.callbacks.remove(collector)
    steps = int(script_args[script_args.index("--steps") + 1]) if "--steps" in script_args else 200
    report = {part: round(spent[part] * 1000 / steps, 4) for part in ORDER if part in spent}
    print(json.dumps({"hook_ms_per_step": report, "collections_per_step": round(collections[0] / steps, 3),
                      "steps": steps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
