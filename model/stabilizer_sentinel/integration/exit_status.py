"""How a script the launcher watches ended when ``SystemExit`` ended it: ``sys.exit(n)``,
``exit(n)``, or a bare ``raise SystemExit(n)`` anywhere in it.

Python calls no hook for an uncaught ``SystemExit`` (``sys.excepthook``, which
stabilizer_sentinel.summary chains, is for the other exceptions), and by the time ``atexit`` runs
the exception is gone. So two things are kept while the script runs:

- the status of the latest ``SystemExit`` made: ``builtins.SystemExit`` becomes a subclass that
  notes its status when it is made, and ``sys.exit`` raises it. ``except SystemExit``,
  ``isinstance`` and Python's own exit (the status, the message) see it as before;
- the script's top-level frame (its ``<module>`` frame, in ``__main__``), found when the hooks attach.

At exit the frame says whether the script ran to its end (its last instruction a return) or was
left by an exception; left by one that ``sys.excepthook`` never saw, it was the latest
``SystemExit``. One the script caught (argparse's ``--help`` under ``try``) changes nothing.

Status 0 or None is a normal end ("completed"); any other status is recorded as the exception
that ended the script, ``SystemExit: <status>``. This module never changes the status or the flow.
"""

from __future__ import annotations

import builtins
import dis
import sys
from types import FrameType
from typing import Any, NoReturn

from stabilizer_sentinel.summary import ended_by

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


def install() -> None:
    """Note every ``SystemExit`` made from now on; idempotent."""
    if builtins.SystemExit is SystemExit:
        return
    builtins.SystemExit = SystemExit  # type: ignore[misc]

    def exit(status: object = None) -> NoReturn:  # sys.exit's C code raises the builtin class itself
        raise SystemExit(status)

    exit.__doc__ = sys.exit.__doc__
    sys.exit = exit


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


def uncaught_status() -> tuple[bool, Any]:
    """(whether a ``SystemExit`` ended the script, its status), asked at exit. False when the script
    ran to its end or its frame was never seen."""
    frame = SEEN.frame
    if frame is None or not SEEN.made:
        return False, None
    code, last = frame.f_code.co_code, frame.f_lasti
    if 0 <= last < len(code) and code[last] in _RETURNS:
        return False, None
    return True, SEEN.status


def record_uncaught() -> None:
    """At exit, before the summary is written: a failure status is how the script ended (summary.ended_by)."""
    ended_by_exit, status = uncaught_status()
    if ended_by_exit and status is not None and status != 0:
        ended_by(_ORIGINAL(status))  # kept only when no uncaught exception was recorded first
