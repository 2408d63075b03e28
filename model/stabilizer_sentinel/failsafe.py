"""The watcher never breaks the run it watches: where its own code raises, it stands aside.

Every place the watcher's code runs inside the script (an optimizer's step hooks, a module's forward
hooks, a backward pass's listeners, the log's lines, a Lightning callback's hooks, the guard's
``step()``, the close at exit) goes through ``shielded``. An exception raised there (a bug of ours met
on a loop we never saw) is caught: the watcher says so once on stderr, stops its watchdog, and stands
aside for the rest of the process. Each shielded call then returns at once, and the script runs on as
it would unwatched: its output, its exit status and its files are its own. What the watching saw up to
then is still written at exit, with ``summary.watching_failed`` saying what failed and where
(docs/contracts.md), so the workflow never calls such a run a success: the rest of it ran unwatched.

In a run of several ranks one rank may not stand aside alone: the others would wait for it in the
watcher's collectives. The ranks meet in one at each step (the guard's agreement,
stabilizer_sentinel.loops.distributed), so a rank whose watcher failed still meets them there once, says
it is leaving, and every rank stands aside at that step (the others raise ``StoodAside`` inside their check,
which the shield swallows). The hooks that reach the agreement are shielded with a ``meeting``: called in
place of the hook once the watcher stood aside, and at once where the failure came in that very hook before
its agreement. Where the failure came while the ranks may wait in another collective (inside the
agreement, a rollback's exchange at the step's end, a stop's), or no guard meets the ranks, it is raised,
as before.

Not caught: ``SystemExit`` and ``KeyboardInterrupt`` (a rule stop is a ``SystemExit``, and an interrupt
is the user's). A rate factor an in-job rollback put in force (stabilizer_sentinel.recovery.recovery)
applies at the watcher's step hooks, and stands aside with them: the script's own rate is back from then
on (the guard sets back a rate scaled for the step under way).

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
_ranks: list[weakref.ref[Any]] = []  # the guard whose agreement the ranks meet at each step (``meets_ranks``)

PACKAGE = Path(__file__).resolve().parent


class StoodAside(Exception):  # noqa: N818 (no error: every rank stands aside together)
    """Raised inside a rank's check when the step's agreement told it another rank's watcher failed: the
    shielded call returns at once, and the run goes on unwatched on every rank from that step."""


def failure() -> str | None:
    """What failed in the watcher's code (``Type: message at file:line``), or None while it watches."""
    return _failure[0] if _failure else None


def shielded(function: F, *, after_failure: bool = False, meeting: Callable[..., Any] | None = None) -> F:
    """``function`` (called from inside the script) with its exceptions caught: the watcher stands aside
    (``stand_aside``) and the call returns None; once it has, the call returns None at once, unless
    ``after_failure`` (the close at exit, which still writes what was seen). ``meeting`` (with the call's
    arguments): what a hook that reaches the ranks' agreement does once the watcher stood aside, and at once
    where this very call failed before its agreement (the module's docstring)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        return _call(function, after_failure, args, kwargs, meeting)

    return call  # type: ignore[return-value]


def closing(method: F) -> F:
    """``shielded`` as a decorator, for what closes the watching: it still runs once the watcher stood aside."""
    return shielded(method, after_failure=True)


def call_shielded(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` shielded (a listener of a backward pass, a log line's sink), with no wrapper
    made per call."""
    return _call(function, False, args, kwargs, None)


def _call(function: Callable[..., Any], after_failure: bool, args: tuple, kwargs: dict,
          meeting: Callable[..., Any] | None) -> Any:
    if _failure and not after_failure:
        if meeting is not None:
            meeting(*args, **kwargs)
        return None
    if torch.compiler.is_compiling():  # traced into a compiled region: the graph gets the call as it is
        return function(*args, **kwargs)
    met = _meetings() if meeting is not None else 0  # a step hook's alone: not every module's forward pass
    try:
        return function(*args, **kwargs)
    except StoodAside:
        return None
    except Exception as error:
        ranks = _ranks[0]() if _ranks else None
        if _several_ranks() and (ranks is None or not ranks.may_leave()):
            raise
        stand_aside(error)
        if meeting is not None and (ranks is None or ranks.meetings == met):  # its agreement is still to come
            meeting(*args, **kwargs)
        return None


def _meetings() -> int:
    """The agreements this rank took part in so far (``meets_ranks``), 0 with none."""
    ranks = _ranks[0]() if _ranks else None
    return ranks.meetings if ranks is not None else 0


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


def told(what: str) -> None:
    """Another rank's watcher failed (``what``, named with its rank), as the step's agreement said: stand aside
    on this rank too."""
    if _failure:
        return
    _failure.append(what)
    say(f"sentinel: the watcher's own code failed ({what}); every rank stands aside and the run goes on unwatched")
    for listener in list(_on_failure):
        with contextlib.suppress(Exception):
            listener(what)


def meets_ranks(owner: Any) -> None:
    """``owner`` (a guard) is where the ranks meet at each step: its ``meetings`` counts the agreements this rank
    took part in, and its ``may_leave()`` says whether a rank may stand aside now and meet the others at the next
    (``_call``)."""
    _ranks[:] = [weakref.ref(owner)]


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
