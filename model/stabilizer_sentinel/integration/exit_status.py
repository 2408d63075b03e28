"""How a script the launcher watches ended when ``SystemExit`` ended it: ``sys.exit(n)``,
``exit(n)``, or a bare ``raise SystemExit(n)`` anywhere in it; or ``os._exit(n)``.

Python calls no hook for an uncaught ``SystemExit`` (``sys.excepthook``, which
stabilizer_sentinel.summary chains, is for the other exceptions), and by the time ``atexit`` runs
the exception is gone. So two things are kept while the script runs:

- the status of the latest ``SystemExit`` made: ``builtins.SystemExit`` becomes a subclass that
  notes its status when it is made, and ``sys.exit``, ``_thread.exit`` and ``_thread.exit_thread``
  raise it (their C code raises the builtin class itself, which an ``except SystemExit`` naming the
  subclass would not catch). ``except SystemExit``, ``isinstance`` and Python's own exit (the status,
  the message) see it as before;
- the script's top-level frame (its ``<module>`` frame, in ``__main__``), found when the hooks attach.

At exit the frame says whether the script ran to its end (its last instruction a return) or was
left by an exception; left by one that ``sys.excepthook`` never saw, it was the latest
``SystemExit``, or an exception a hook of the script's own took in place of the chained one
(``sys.excepthook = ...``): Python keeps that one in ``sys.last_value`` before it calls the hook, and
its traceback passes through the script's frame. One the script caught (argparse's ``--help`` under
``try``) changes nothing.

Status 0 or None is a normal end ("completed"); any other status is recorded as the exception
that ended the script, ``SystemExit: <status>``. This module never changes the status or the flow.

``os._exit(n)`` ends the process at once: no ``atexit`` handler runs, so the watcher's own close
(the summary in findings.json) would never be written, and a run that ended so would read as never
watched. ``os._exit`` becomes a function of the same name, signature and documentation that, in the
process that installed it, first runs the watcher's closers (``on_hard_exit``; the script's own
``atexit`` handlers are left out, as ``os._exit`` leaves them out), waiting at most
``HARD_EXIT_SECONDS`` for them (a closer stuck behind a thread the script abandoned must not keep
the process alive), then calls the original with the same status. A forked child (a DataLoader
worker, multiprocessing's forked process, which ends with ``os._exit``) calls the original at once.
"""

from __future__ import annotations

import _thread
import builtins
import contextlib
import dis
import inspect
import os
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

from stabilizer_sentinel.summary import ended_by, ended_with

HARD_EXIT_SECONDS = 10.0

_RETURNS = frozenset(dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap)


class _Seen:
    made = False
    status: Any = None
    frame: FrameType | None = None


SEEN = _Seen()
_ORIGINAL = getattr(builtins.SystemExit, "original", builtins.SystemExit)


class SystemExit(_ORIGINAL):  # stands in for the builtin, under its name
    """The builtin ``SystemExit``, noting its status when made."""

    original = _ORIGINAL

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        SEEN.made, SEEN.status = True, self.code


SystemExit.__module__ = "builtins"  # shown, and pickled, as the builtin


_ORIGINAL_EXIT = getattr(os._exit, "original", os._exit)
_CLOSERS: list[Callable[[], None]] = []
_OWNER: list[int] = []  # the pid of the process whose watcher the closers close


def install() -> None:
    """Note every ``SystemExit`` made from now on, and close the watcher before ``os._exit``; idempotent."""
    if builtins.SystemExit is SystemExit:
        return
    builtins.SystemExit = SystemExit  # type: ignore[misc]

    def exit(status: object = None) -> NoReturn:  # sys.exit's C code raises the builtin class itself
        raise SystemExit(status)

    exit.__doc__ = sys.exit.__doc__
    sys.exit = exit
    for name in ("exit", "exit_thread"):  # _thread.exit(): a thread's own way out, SystemExit from C as well
        original = getattr(_thread, name, None)
        if original is not None:
            setattr(_thread, name, _thread_exit(original))
    threading.excepthook = _thread_excepthook
    _OWNER[:] = [os.getpid()]
    os._exit = _exit


def _thread_exit(original: Callable[[], NoReturn]) -> Callable[[], NoReturn]:
    def exit() -> NoReturn:
        raise SystemExit

    exit.__name__ = exit.__qualname__ = original.__name__
    exit.__doc__ = original.__doc__
    exit.original = original  # type: ignore[attr-defined]
    return exit


_ORIGINAL_THREAD_HOOK = getattr(threading.excepthook, "original", threading.excepthook)


def _thread_excepthook(args: Any) -> None:
    """A thread left by a ``SystemExit`` (``sys.exit`` in a thread) ends silently, as the builtin hook lets it;
    that hook knows the builtin class alone, not the one standing in for it."""
    if args.exc_type is not None and issubclass(args.exc_type, _ORIGINAL):
        return
    _ORIGINAL_THREAD_HOOK(args)


_thread_excepthook.__name__ = _thread_excepthook.__qualname__ = "excepthook"
_thread_excepthook.__doc__ = _ORIGINAL_THREAD_HOOK.__doc__
_thread_excepthook.original = _ORIGINAL_THREAD_HOOK  # type: ignore[attr-defined]


def on_hard_exit(close: Callable[[], None]) -> None:
    """Run ``close`` (idempotent: it runs at ``atexit`` too, on a normal end) before ``os._exit`` ends this process."""
    _CLOSERS.append(close)


def _exit(status: int) -> NoReturn:
    try:
        if _CLOSERS and os.getpid() in _OWNER:
            _close_before_exit(status)
    finally:  # whatever happened above, the process ends as the script asked
        _ORIGINAL_EXIT(status)


def _close_before_exit(status: int) -> None:
    closers = list(_CLOSERS)
    _CLOSERS.clear()
    if status != 0:
        ended_with("exception", f"os._exit({status})")

    def close_all() -> None:
        for close in closers:
            with contextlib.suppress(Exception):  # the process ends with the script's status, whatever happens here
                close()

    closing = threading.Thread(target=close_all, name="sentinel-close", daemon=True)
    try:
        closing.start()
    except RuntimeError:  # no new thread at interpreter shutdown: nothing is written
        return
    closing.join(HARD_EXIT_SECONDS)


_exit.__name__ = _exit.__qualname__ = "_exit"
with contextlib.suppress(ValueError, TypeError):  # a builtin without a readable signature: none shown either way
    _exit.__signature__ = inspect.signature(_ORIGINAL_EXIT)  # type: ignore[attr-defined]  # (status), as the builtin's
_exit.__doc__ = _ORIGINAL_EXIT.__doc__
_exit.__module__ = _ORIGINAL_EXIT.__module__
_exit.original = _ORIGINAL_EXIT  # type: ignore[attr-defined]


def watch_main_frame() -> None:
    """Keep the script's ``<module>`` frame (the outermost, for ``python -m`` under runpy's)."""
    if SEEN.frame is not None:
        return
    main = getattr(sys.modules.get("__main__"), "__dict__", None)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main:
            SEEN.frame = frame
        frame = frame.f_back


def _left_by_exception() -> bool:
    """Whether the script's frame was left by an exception (asked at exit): False when the script ran to its
    end (its last instruction a return) or its frame was never seen."""
    frame = SEEN.frame
    if frame is None:
        return False
    code, last = frame.f_code.co_code, frame.f_lasti
    return not (0 <= last < len(code) and code[last] in _RETURNS)


def _hooked_elsewhere() -> BaseException | None:
    """The uncaught exception Python handed to ``sys.excepthook`` (it keeps it in ``sys.last_value`` first),
    where its traceback passes through the script's frame: one that left the script, not one an earlier
    interactive session kept there."""
    error = getattr(sys, "last_value", None)
    trace = getattr(error, "__traceback__", None)
    while trace is not None:
        if trace.tb_frame is SEEN.frame:
            return error
        trace = trace.tb_next
    return None


def record_uncaught() -> None:
    """At exit, before the summary is written: how the script ended where no hook of ours saw it
    (summary.ended_by, kept only when no uncaught exception was recorded first): an exception the script's
    own ``sys.excepthook`` took in place of the chained one, else the latest ``SystemExit``'s failure status."""
    if not _left_by_exception():
        return
    error = _hooked_elsewhere()
    if error is not None:
        ended_by(error)
    elif SEEN.made and SEEN.status is not None and SEEN.status != 0:
        ended_by(_ORIGINAL(SEEN.status))
