"""The run's summary in findings.json, and how the script ended (docs/contracts.md, section 2).

Whoever watches a job (the library's ``watch()``, the launcher, the Lightning callback) keeps one
``RunRecord``: steps taken, checked and skipped, the last loss, the evaluations, where the run
started from, what the job's log said of the loss, the loss scale. The sentinel writes it, as the
``summary`` object of findings.json, whenever it writes that file and once more at the end, so every
watched job leaves one; a job nobody watched leaves none, which is how the workflow tells it apart.

How the script ended is read from the interpreter: ``watch_exit()`` chains ``sys.excepthook`` (called
for an uncaught exception, before the ``atexit`` handlers that close the guard), which records the
exception's one line and hands it on to the previous hook unchanged: the traceback is printed and
the exit status is Python's own. ``KeyboardInterrupt`` ends as "interrupted". A failing exit status
is told with ``ended_by`` (stabilizer_sentinel.integration.exit_status); the guard asks ``how_it_ended()``.

This module must not touch the model, the optimizer or the training loop's control flow.
"""

from __future__ import annotations

import itertools
import math
import sys
import types
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from stabilizer_sentinel import failsafe

EVALUATIONS_KEPT = 100
# A script's own words for how it ended, in the summary's: model/train.py closes with "stopped" on SIGTERM.
ENDINGS = {"stopped": "interrupted"}


def jsonable(value: float | str | None) -> float | str | None:
    """A float for findings.json (written with allow_nan=False): non-finite values as "nan", "inf", "-inf"."""
    if value is None or isinstance(value, str):
        return value
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def describe(error: BaseException) -> tuple[str, str]:
    """How an exception ends a run: ("exception" or "interrupted", its one line ``TypeName: message``)."""
    text = " ".join(str(error).split())
    line = f"{type(error).__name__}: {text}"[:500] if text else type(error).__name__
    return ("interrupted" if isinstance(error, KeyboardInterrupt) else "exception"), line


class ExitWatch:
    """How the script ended: set by the chained ``sys.excepthook`` (an uncaught exception) or by a caller."""

    def __init__(self) -> None:
        self.ended: str | None = None
        self.exception: str | None = None
        self._installed = False
        self._previous: Any = None

    def install(self) -> None:
        """Chain ``sys.excepthook`` once per process; idempotent."""
        if self._installed:
            return
        self._installed = True
        self._previous = sys.excepthook
        sys.excepthook = self._hook

    def record(self, error: BaseException) -> None:
        if self.ended is None:
            self.ended, self.exception = describe(error)

    def _hook(self, kind: type[BaseException], error: BaseException, trace: types.TracebackType | None) -> None:
        self.record(error)
        (self._previous or sys.__excepthook__)(kind, error, trace)


class Ending(NamedTuple):
    """How the script ended, as far as the interpreter told: ``status`` "exception" or "interrupted" (None
    while no uncaught exception or failing exit status was recorded) and the exception's one line."""

    status: str | None
    exception: str | None


_EXIT = ExitWatch()  # the process's


def watch_exit() -> None:
    """Chain ``sys.excepthook`` once per process: an uncaught exception is how the script ended."""
    _EXIT.install()


def ended_by(error: BaseException) -> None:
    """``error`` ended the script, unless an uncaught exception was recorded first."""
    _EXIT.record(error)


def ended_with(ended: str, line: str) -> None:
    """The script ended so (``ended``: "exception", ...; ``line``: what ended it), unless an uncaught
    exception was recorded first: an end no exception stands for (``os._exit(n)``)."""
    if _EXIT.ended is None:
        _EXIT.ended, _EXIT.exception = ended, line


def how_it_ended() -> Ending:
    """How the script ended, as recorded so far (asked when the guard closes)."""
    return Ending(_EXIT.ended, _EXIT.exception)


# The job's objective metric (its ``objective``: a metric its log prints that rises, ``Maximize``, or falls,
# ``Minimize``, as the run learns: a reward, an accuracy). Readings kept: the first and the newest this many.
OBJECTIVE_KEPT = 1024
OBJECTIVE_FEWEST = 4  # fewer readings than this judge nothing
OBJECTIVE_MARGIN = 0.05  # the least move, of the baseline's magnitude, that is learning (the loss's least fall)
OBJECTIVE_ERRORS = 2.0  # ... and more than this many standard errors of the difference from the baseline


@dataclass
class Objective:
    """The job's objective metric as its log lines print it (``judged``): it decides ``learned`` where the loss
    did not, and says no where the loss learned and it never moved the better way (``RunRecord.summary``).

    A policy gradient's loss is a surrogate whose value measures no fit (stabilizer_sentinel.detection.surrogate),
    and a script may print no loss at all; what it prints as it learns (an episode's reward, an accuracy) can
    say whether it learned, where the job names that metric and which way is better (SageMaker's
    ``HyperParameterTuningJobObjective``: ``MetricName``, ``Type``)."""

    name: str
    type: str = "Maximize"
    readings: int = 0
    first: list[float] = field(default_factory=list)  # the first OBJECTIVE_KEPT readings
    newest: deque[float] = field(default_factory=lambda: deque(maxlen=OBJECTIVE_KEPT))

    def add(self, value: float) -> None:
        self.readings += 1
        if len(self.first) < OBJECTIVE_KEPT:
            self.first.append(value)
        self.newest.append(value)

    def judged(self) -> tuple[bool | None, str]:
        """Whether the metric moved the better way from its first readings to its last, with the words that say
        so: True where its last quarter's mean passed where its first quarter settled (the mean of that
        quarter's later half, where better than the whole quarter's: a running average's climb from its
        initial value to the untrained level is no learning) beyond the margin and two standard errors;
        False where that mean is not beyond its first quarter's mean so; None between, or where too few
        readings were finite."""
        if self.readings and not math.isfinite(self.newest[-1]):
            return False, f"its objective {self.name}'s last reading is {self.newest[-1]}"
        first = [v for v in self.first if math.isfinite(v)]
        newest = [v for v in self.newest if math.isfinite(v)]
        held = len(first) if self.readings <= OBJECTIVE_KEPT else len(first) + len(newest)
        if held < OBJECTIVE_FEWEST:
            return None, f"{held} finite readings of its objective {self.name}, too few to judge"
        k = max(1, min(held // 4, OBJECTIVE_KEPT))
        half = max(1, k // 2)
        sign = 1.0 if self.type == "Maximize" else -1.0
        start, end = sum(first[:k]) / k, sum(newest[-k:]) / k
        settled = sign * max(sign * start, sign * sum(first[k - half:k]) / half)
        # The readings' noise from successive differences (a trend adds to it: the judgement errs toward no).
        steps = [b - a for run in (first, newest) for a, b in itertools.pairwise(run)]
        noise = math.sqrt(sum(d * d for d in steps) / (2 * len(steps))) if steps else 0.0
        way = "rose" if sign > 0 else "fell"
        of = f"the means of its first and last {k} of {self.readings} readings" if k > 1 else (
            f"its first and last readings, of {self.readings}")
        moved = f"{start:.4g} -> {end:.4g} ({of})"
        # Past where it settled by the larger of that noise and the first quarter's own spread: a running average
        # wanders slowly (its successive readings close, the level they drift about not), and its climb from its
        # initial value is within that spread.
        spread = math.sqrt(sum((v - start) ** 2 for v in first[:k]) / (k - 1)) if k > 1 else 0.0
        bar = max(OBJECTIVE_MARGIN * abs(settled), OBJECTIVE_ERRORS * max(noise, spread) * math.sqrt(1 / k + 1 / half))
        if sign * (end - settled) > bar:
            return True, f"its objective {self.name} {way} {moved}"
        if sign * (end - start) <= max(OBJECTIVE_MARGIN * abs(start), OBJECTIVE_ERRORS * noise * math.sqrt(2 / k)):
            return False, f"its objective {self.name} never {way} beyond its noise: {moved}"
        return None, (f"its objective {self.name} {way} {moved} but not beyond where its first readings settled, "
                      f"{settled:.4g}, by more than {bar:.3g} (5 % of that, or two standard errors of their noise and "
                      f"spread): too little to judge")

    def as_json(self, improved: bool | None, says: str, decided: bool) -> dict[str, Any]:
        """The summary's ``objective``: ``improved`` and ``says`` as ``judged`` gave them."""
        return {"name": self.name, "type": self.type, "readings": self.readings, "improved": improved,
                "says": says, "decided": decided}


@dataclass
class LogLoss:
    """The second, independent channel: the loss as the job's own log lines report it (and the objective)."""

    last: float | None = None
    nonfinite_step: int | None = None
    lines: int = 0
    objective: Objective | None = None

    def as_json(self) -> dict[str, Any]:
        return {"last": jsonable(self.last), "nonfinite_step": self.nonfinite_step, "lines": self.lines}


@dataclass
class RunRecord:
    """What one watcher saw of the run; ``summary()`` turns it into findings.json's ``summary``."""

    integration: str = "library"
    steps_taken: int = 0
    steps_observed: int = 0
    steps_skipped: int = 0
    steps_idle: int = 0  # steps before any whose loss and gradients were exactly zero: not begun (Sentinel)
    first_step: int | None = None
    last_step: int | None = None
    last_loss: float | None = None
    first_seen: float | None = None  # the first finite loss: the start of a run too short for a window
    started_from: str | None = None
    restores: bool = False
    trained_before: int = 0  # this network's earlier trainings from its start in this process: told, not acted on
    exception: str | None = None  # set by a framework that catches the exception itself (Lightning)
    evaluations: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=EVALUATIONS_KEPT))
    log: LogLoss | None = None
    scale_last: float | None = None
    scale_min: float | None = None

    def observed(self, step: int, loss: float | None) -> None:
        self.steps_observed += 1
        if self.first_step is None:
            self.first_step = step
        self.last_step = step
        if loss is not None:
            self.last_loss = loss
            if self.first_seen is None and math.isfinite(loss):
                self.first_seen = loss

    def loss_scale(self, scale: float) -> None:
        self.scale_last = scale
        self.scale_min = scale if self.scale_min is None else min(self.scale_min, scale)

    def summary(self, learning: Any, *, ended: str | None, exception: str | None) -> dict[str, Any]:
        """The ``summary`` object; ``learning`` is the sentinel's learning check
        (stabilizer_sentinel.detection.health)."""
        start = getattr(learning, "learning_start", None)  # the untrained level, not an early spike
        start = self.first_seen if start is None else start  # a run ended before its first window closed
        window = int(getattr(learning, "window", 5) or 5)
        unjudged = getattr(learning, "unjudged", None)  # a loss whose value measures no fit
        if getattr(learning, "learned", False):
            learned: bool | None = True
        else:  # judged only once a second window closed after the first
            few = self.steps_observed < 2 * window or getattr(learning, "judgeable", True) is False
            learned = None if start is None or few or unjudged else False
        learned_by = getattr(learning, "learned_by_cycles", None)
        objective = self.log.objective if self.log is not None else None
        decided, said = False, None
        if objective is not None:
            # Where the loss left it open, the job's objective decides; where the loss learned and the objective
            # never moved the better way, the job's own measure of learning says no (a TD error fitted while the
            # reward stayed flat): not for a run started from a trained state, whose objective may begin where it
            # stays.
            improved, says = said = objective.judged()
            if (learned is None and improved is not None) or (
                    learned is True and improved is False and self.started_from is None):
                learned, learned_by, decided = improved, says, True
        best = getattr(learning, "best_loss", None)
        document: dict[str, Any] = {
            "integration": self.integration,
            "ended": ENDINGS.get(ended or "", ended),
            "exception": exception,
            "steps_taken": self.steps_taken,
            "steps_observed": self.steps_observed,
            "steps_skipped": self.steps_skipped,
            "steps_idle": self.steps_idle,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "first_loss": jsonable(start),
            "last_loss": jsonable(self.last_loss),
            "best_loss": jsonable(best),
            "last_window_loss": jsonable(getattr(learning, "last_window_loss", None)),
            "learned": learned,
            "unjudged": unjudged,
            "learned_by": learned_by,
            "judged_afresh": [[step, why] for step, why in getattr(learning, "segments", [])],
            "watching_failed": failsafe.failure(),
            "started_from": self.started_from,
            "restores": self.restores,
            "trained_before": self.trained_before,
            "evaluations": [[step, jsonable(value)] for step, value in self.evaluations],
            "log_loss": self.log.as_json() if self.log is not None else None,
            "objective": objective.as_json(*said, decided) if said is not None else None,
        }
        if self.scale_last is not None:
            document["loss_scale"] = {"last": jsonable(self.scale_last), "min": jsonable(self.scale_min)}
        return document
