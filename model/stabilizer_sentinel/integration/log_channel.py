"""The job's log as a second, independent channel: the loss its own lines report.

When the configuration gives a ``loss_regex`` (the job's metric definition for its loss), or when
the launcher needs the log for its loss, ``install`` wraps ``sys.stdout`` and ``sys.stderr`` once per
process: everything passes through unchanged, and every complete line the regex matches yields a
number (a line rewritten by carriage returns, a progress bar's, is read at its last update that
has one). The channel keeps the last one, the number of lines, and the step at which the log first
reported a non-finite loss (``summary.log_loss``); at that line it hands the value to the guard that
watches the run, which records an ``ExplodingTensor`` finding with source "log", and stops the job at
its next step when the action is stop (a line may be printed from any thread, where exiting would end
that thread alone). Not before the guard checked its first step: nothing was trained yet, so a number
printed then is no training loss that blew up (a script prints ``best loss: inf`` as its
best-so-far's first value), and a first loss that is not finite is the finite check's at that step.
Nor where the guard checked the step the line follows with a finite loss of the script's own tensors
(its backward pass's scalar, or ``step(loss)``; ``Guard.read_finite_loss``): a non-finite loss that
step applied would be in its gradients, which the finite check reads, so the line's number is one the
training never applied (a script's own guard printing ``loss: nan, skipping the batch`` before it
skips it) and neither counts nor becomes the channel's last. Nor a line of the watcher's own (``say``): a finding's
message quotes losses. The log decides where the hooks read no
loss of their own (a backward pass from several tensors, or none the launcher saw).

Where the job names an objective metric (the configuration's ``objective``: a reward, an accuracy, and which
way is better), the lines its regex matches are its readings (``summary.Objective``), kept beside the loss's:
whether the run learned, where the loss cannot say (a policy gradient's surrogate, or no loss seen), and
against a loss that fell while it never improved (``summary.RunRecord.summary``).

Cost: one regex search per complete line printed (two with an objective), nothing per training step.

This module must not read tensors or decide anything: it reads lines.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import sys
from collections.abc import Callable
from typing import Any, TextIO

from stabilizer_sentinel import failsafe
from stabilizer_sentinel.say import saying
from stabilizer_sentinel.summary import LogLoss, Objective


class _LossFromLog(io.TextIOBase):
    """A stream that passes everything through and reads the loss out of complete lines."""

    def __init__(self, stream: TextIO, readers: list[tuple[re.Pattern[str], Callable[[float], None]]]) -> None:
        self._stream = stream
        self._readers = readers  # (pattern, sink): each complete line's number its pattern matches goes to its sink
        self._partial = ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        if saying():  # the watcher's own line: passed through, never read for a loss; the script's line it ended
            self._partial = ""
            return written
        *lines, rest = (self._partial + text).split("\n")
        self._partial = rest[-4096:]  # a line that never ends (progress bars) is not kept whole
        for line in lines:
            for pattern, sink in self._readers:
                match = _last_match(pattern, line)
                if match:
                    with contextlib.suppress(ValueError):
                        failsafe.call_shielded(sink, float(match.group(1)))
        return written

    def midline(self) -> bool:
        """Whether the script's last line is not ended yet (a progress bar redrawn with carriage returns): the
        watcher's line (``say``) starts on a line of its own."""
        return bool(self._partial)

    def flush(self) -> None:
        self._stream.flush()

    def __del__(self) -> None:
        """Nothing: the stream underneath is not this one's to close when it is let go (a script that replaced
        ``sys.stdout`` before anything else held this one: io's finalizer would close the process's stdout,
        and the next print fail). ``close()`` called by the script still closes it, as unwatched."""

    def __getattr__(self, name: str) -> Any:  # buffer, name, mode, line_buffering, reconfigure, ...
        return getattr(self._stream, name)


def _last_match(pattern: re.Pattern[str], line: str) -> re.Match[str] | None:
    """The match in the last of a line's carriage-return updates that has one: a progress bar rewrites its line
    (``\r``) as it goes, and what it shows at its end is its last update, not its first (stop 69's hunt)."""
    for update in reversed(line.split("\r")):
        match = pattern.search(update)
        if match:
            return match
    return None


def _delegate(name: str) -> Any:
    def method(self: _LossFromLog, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._stream, name)(*args, **kwargs)

    method.__name__ = name
    return method


# What io.TextIOBase defines itself (so __getattr__ never sees it) answers as the stream underneath:
# fileno() is the script's file descriptor, isatty() its terminal, encoding its encoding.
for _name in ("fileno", "isatty", "readable", "writable", "seekable", "tell", "seek", "truncate", "close",
              "detach", "read", "readline", "readlines"):
    setattr(_LossFromLog, _name, _delegate(_name))
for _name in ("encoding", "errors", "newlines", "closed"):
    setattr(_LossFromLog, _name, property(lambda self, _name=_name: getattr(self._stream, _name)))


class LogChannel:
    def __init__(self, pattern: str) -> None:
        self.pattern = re.compile(pattern)
        self.record = LogLoss()
        self.listeners: list[Callable[[float], None]] = []  # the launcher's loss, when no loss module gives one
        # the stabilizer_sentinel.integration.guard.Guard that numbers steps and records findings
        self.guard: Any = None
        self._busy = False
        self._readers = [(self.pattern, self._value)]
        sys.stdout = _LossFromLog(sys.stdout, self._readers)  # type: ignore[assignment]
        sys.stderr = _LossFromLog(sys.stderr, self._readers)  # type: ignore[assignment]

    def read_objective(self, objective: dict[str, str] | None) -> None:
        """Read the job's objective metric (``StabilizerConfig.objective``) from the lines too, once."""
        if objective is None or self.record.objective is not None:
            return
        self.record.objective = Objective(objective["name"], objective["type"])
        self._readers.append((re.compile(objective["regex"]), self.record.objective.add))

    def attach(self, guard: Any) -> None:
        """``guard`` watches the run from now on (what the log reported before its first step is no
        training loss that blew up: nothing was trained)."""
        self.guard = guard
        guard.record.log = self.record

    def _value(self, value: float) -> None:
        if self._busy:  # a line printed while handling one (the finding's own message)
            return
        self._busy = True
        try:
            self.record.lines += 1
            guard = self.guard
            watching = guard is not None and guard.record.steps_observed
            step = max(guard.step_number - 1, 0) if watching else 0
            if watching and not math.isfinite(value) and guard.read_finite_loss(step):
                return  # not the loss the step applied, which the hooks read finite (module docstring)
            self.record.last = value
            for listener in self.listeners:
                listener(value)
            if not watching:
                return  # before the first checked step: nothing trained yet (module docstring)
            if not math.isfinite(value) and self.record.nonfinite_step is None and not guard.undone(step):
                # (a step a rollback undid is not the run's)
                self.record.nonfinite_step = step
                guard.log_nonfinite(value)
        finally:
            self._busy = False

    def uninstall(self) -> None:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, _LossFromLog):
                setattr(sys, name, stream._stream)
        if _INSTALLED.get("channel") is self:
            del _INSTALLED["channel"]


_INSTALLED: dict[str, LogChannel] = {}  # the process's channel, once installed


def current() -> LogChannel | None:
    return _INSTALLED.get("channel")


def install(pattern: str, objective: dict[str, str] | None = None) -> LogChannel:
    """The process's log channel, installed with ``pattern`` the first time; reading ``objective`` too."""
    if "channel" not in _INSTALLED:
        _INSTALLED["channel"] = LogChannel(pattern)
    _INSTALLED["channel"].read_objective(objective)
    return _INSTALLED["channel"]
