"""Settings a script makes in its environment before it imports torch, which torch reads as it is imported.

A script may set ``os.environ["OMP_NUM_THREADS"] = "1"`` (or ``MKL_NUM_THREADS``) and then ``import torch``
(a reinforcement-learning script beside its worker processes, a data pipeline that keeps the cores for its
loaders): torch reads the variable as it is loaded and runs its operators on that many threads. Under the
launcher torch is already loaded when the script starts (the hooks are installed from ``sitecustomize``,
before the script's first line), so the script's setting came too late and its operators ran on every core:
a difference in speed and, for a reduction split over threads, in the last bits of its results (found at
stop 64, not built then).

``follow_thread_setting`` is called before the watcher imports torch. It notes the variables, and watches the
script's import statements (``builtins.__import__``) until the first that imports torch from code not the
watcher's or torch's own: that is where torch would have been loaded. If the variables changed since, the
threads are set there to what torch takes from them at load (``MKL_NUM_THREADS`` where it is a positive
number, else ``OMP_NUM_THREADS``; ``torch.set_num_threads``), and the import statements are left alone from
then on. A variable set after that import changes nothing, as unwatched. Other variables torch's libraries
read at load (``OMP_PROC_BIND``, ``KMP_AFFINITY``) are not followed.

This module imports no torch at its top: ``sitecustomize`` calls it before torch is loaded.
"""

from __future__ import annotations

import builtins
import os
from typing import Any

# The variables torch reads its threads from as it is loaded, the later overriding the earlier.
THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Modules whose imports of torch are not the script's: the watcher's, torch's own lazy imports, and the import
# machinery's (a ``from package import submodule`` imports the submodule from importlib's own frame).
NOT_THE_SCRIPTS = ("stabilizer_sentinel", "stabilizer_contract", "torch", "importlib", "_frozen_importlib")


def follow_thread_setting() -> None:
    """Set torch's threads to ``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) where the script first imports torch,
    if the script changed those variables before (call before the watcher imports torch)."""
    before = _settings()
    original = builtins.__import__
    done = False

    def importing(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        nonlocal done
        module = original(name, globals, locals, fromlist, level)
        if not done and level == 0 and (name == "torch" or name.startswith("torch.")) and _the_scripts(globals):
            done = True
            if builtins.__import__ is importing:  # else another wrapper came after: this one passes through
                builtins.__import__ = original
            _apply(before)
        return module

    builtins.__import__ = importing


def _the_scripts(globals: Any) -> bool:
    """Whether an import statement with these globals is the script's (or a library's it imported)."""
    name = globals.get("__name__", "") if isinstance(globals, dict) else ""
    return not any(name == own or name.startswith(own + ".") for own in NOT_THE_SCRIPTS)


def _settings() -> tuple[str | None, ...]:
    return tuple(os.environ.get(name) for name in THREADS)


def _threads() -> int | None:
    """The threads torch takes from the environment as it is loaded: ``MKL_NUM_THREADS`` where it is a positive
    number, else ``OMP_NUM_THREADS`` where that is; None for neither (torch then takes the cores)."""
    for name in reversed(THREADS):
        try:
            threads = int(os.environ.get(name, "").strip())
        except ValueError:  # torch ignores a value it cannot read
            continue
        if threads >= 1:
            return threads
    return None


def _apply(before: tuple[str | None, ...]) -> None:
    threads = _threads()
    if _settings() == before or threads is None:
        return
    try:
        import torch

        torch.set_num_threads(threads)
    except Exception:  # never the script's failure: its threads stay as they were
        return
