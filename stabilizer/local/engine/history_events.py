"""Keep the local interpreter's execution history in the shape GetExecutionHistory documents.

moto's Step Functions interpreter runs a task state in a thread and times it out from the state's
thread. When the task's own thread has not yet scheduled the task by the time its timeout fires (a
parked ``.waitForTaskToken`` task with a one-second ``TimeoutSecondsPath`` on a loaded machine),
the thread goes on in a frame that has ended: evaluating the timeout there is a no-op, the value
popped in its place is the task's parameters, and the late ``TaskScheduled`` event carries a dict
as its ``timeoutInSeconds``. The execution itself goes on as Step Functions' would (the timeout is
caught), but every later ``GetExecutionHistory`` fails to serialise (``TypeError: int() argument
must be ... not 'dict'``) and the local run ends on an error no AWS run can have.

Step Functions documents ``timeoutInSeconds`` and ``heartbeatInSeconds`` of the scheduled-task
events as optional integers (API reference, ``TaskScheduledEventDetails``,
``LambdaFunctionScheduledEventDetails``): a value that is not one is left out of the event here,
as the field is left out when the state has no timeout. Nothing else of the event is touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

INTEGER_FIELDS = ("timeoutInSeconds", "heartbeatInSeconds")


def well_formed(event_details: Any) -> Any:
    """``event_details`` (``{"<kind>EventDetails": {...}}``) without an integer field that holds something else."""
    if not isinstance(event_details, dict):
        return event_details
    return {kind: _without_bad_integers(details) for kind, details in event_details.items()}


def _without_bad_integers(details: Any) -> Any:
    if not isinstance(details, dict) or all(_is_integer(details[name]) for name in INTEGER_FIELDS if name in details):
        return details
    return {name: value for name, value in details.items() if name not in INTEGER_FIELDS or _is_integer(value)}


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Every history event the interpreter publishes is made well formed (``well_formed``) first."""
    from moto.stepfunctions.parser.asl.eval.event.event_manager import EventManager

    original = EventManager.add_event

    def add_event(self: Any, context: Any, event_type: Any, event_details: Any = None, *args: Any,
                  **kwargs: Any) -> int:
        return original(self, context, event_type, well_formed(event_details), *args, **kwargs)

    with mock.patch.object(EventManager, "add_event", add_event):
        yield
