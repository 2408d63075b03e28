"""The watcher never breaks the run it watches: where its own code raises, it stands aside.

Every place the watcher's code runs inside the script (an optimizer's step hooks, a module's forward
hooks, a backward pass's listeners, the log's lines, a Lightning callback's hooks, the guard's
``step()``, the close at exit) goes through ``shielded``. An exception raised there (a bug of ours met
on a loop we never saw) is caught: the watcher says so once on stderr, stops its watchdog, and stands
aside for the rest of the process. Each shielded call then returns at once, and the script runs on as
it would unwatched: its output, its exit status and its files are its own. What the watching saw up to
then is still written at exit, with ``summary.watching_failed`` saying what failed and where
(docs/contracts.md), so the workflow never calls such a run a success: the rest of it ran unwatched.

Not caught: ``SystemExit`` and ``KeyboardInterrupt`` (a rule stop is a ``SystemExit``, and an interrupt
is the user's); and any exception in a run of several ranks, where one rank standing aside would leave
the others waiting in the watcher's collectives: there it is raised, as before. A rate factor an in-job
rollback put in force (stabilizer_sentinel.recovery.recovery) applies at the watcher's step hooks, and
stands aside with them: the script's own rate is back from then on.

This module must not change gradients or weights.
"""

from __future__ import annotations

import contextlib
import functools
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from stabilizer_sentinel.say import say

F = TypeVar("F", bound=Callable[..., Any])

_failure: list[str] = []  # what failed, once: the watcher stands aside from then on
_on_failure: list[Callable[[str], None]] = []  # told when it does (the guard: its watchdog and hooks)
PACKAGE = Path(__file__).resolve().parent


def failure() -> str | None:
    """What failed in the watcher's code (``Type: message at file:line``), or None while it watches."""
    return _failure[0] if _failure else None


def shielded(function: F, *, after_failure: bool = False) -> F:
    """``function`` (called from inside the script) with its exceptions caught: the watcher stands aside
    (``stand_aside``) and the call returns None; once it has, the call returns None at once, unless
    ``after_failure`` (the close at exit, which still writes what was seen)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        return _call(function, after_failure, args, kwargs)

    return call  # type: ignore[return-value]


def closing(method: F) -> F:
    """``shielded`` as a decorator, for what closes the watching: it still runs once the watcher stood aside."""
    return shielded(method, after_failure=True)


def call_shielded(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` shielded (a listener of a backward pass, a log line's sink), with no wrapper
    made per call."""
    return _call(function, False, args, kwargs)


def _call(function: Callable[..., Any], after_failure: bool, args: tuple, kwargs: dict) -> Any:
    if _failure and not after_failure:
        return None
    if torch.compiler.is_compiling():  # traced into a compiled region: the graph gets the call as it is
        return function(*args, **kwargs)
    try:
        return function(*args, **kwargs)
    except Exception as error:
        if _several_ranks():
            raise
        stand_aside(error)
        return None


def stand_aside(error: BaseException) -> None:
    """Stop watching this process for good, say why once, and tell those listening (``on_failure``)."""
    if _failure:
        return
    _failure.append(f"{type(error).__name__}: {error} at {_where(error)}")
    say(f"sentinel: the watcher's own code failed ({_failure[0]}); it stands aside and the run goes on "
        f"unwatched")
    for listener in list(_on_failure):
        with contextlib.suppress(Exception):  # standing aside must not raise in turn
            listener(_failure[0])


def on_failure(owner: object, listener: Callable[[Any, str], None]) -> None:
    """Call ``listener(owner, failure)`` when the watcher stands aside, while ``owner`` lives."""
    ref = weakref.ref(owner)

    def told(what: str) -> None:
        held = ref()
        if held is not None:
            listener(held, what)

    _on_failure.append(told)


def _where(error: BaseException) -> str:
    """The innermost frame of the watcher's own code the error passed through (``file:line``), else the
    innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [frame for frame in frames if Path(frame.filename).resolve().is_relative_to(PACKAGE)]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return "an unknown place"
    path = Path(frame.filename).resolve()
    name = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path.name
    return f"{name}:{frame.lineno}"


def _several_ranks() -> bool:
    distributed = torch.distributed
    return bool(distributed.is_available() and distributed.is_initialized() and distributed.get_world_size() > 1)
