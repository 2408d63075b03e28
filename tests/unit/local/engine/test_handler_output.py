"""Handlers invoked by two executions at once must not leave stdout pointing at the Lambda log."""

import io
import sys
import threading
import time
from types import SimpleNamespace

from stabilizer.local.engine.engine import LocalEngine


def _sleeping_handler(event, context):
    print(f"start {event}")
    time.sleep(event)
    print(f"end {event}")
    return event


def _overlapping(first_invoke, second_invoke):
    # The second call starts while the first is inside the handler, and ends after it.
    first = threading.Thread(target=first_invoke, args=(0.1, None))
    second = threading.Thread(target=second_invoke, args=(0.3, None))
    first.start()
    time.sleep(0.02)
    second.start()
    first.join()
    second.join()


def test_concurrent_invocations_restore_stdout_and_log_everything():
    log = io.StringIO()
    invoke = LocalEngine._quiet(SimpleNamespace(_lambda_log=log), _sleeping_handler)
    terminal = sys.stdout
    _overlapping(invoke, invoke)
    assert sys.stdout is terminal
    assert sorted(log.getvalue().split("\n")[:-1]) == ["end 0.1", "end 0.3", "start 0.1", "start 0.3"]


def test_two_engines_invoking_at_once_each_log_only_their_own_handlers_output():
    # Two engines in one process (a notebook's, a test's) share sys.stdout: neither may print into
    # the other's log nor restore the terminal while the other's handler is still printing.
    first_log, second_log = io.StringIO(), io.StringIO()
    first = LocalEngine._quiet(SimpleNamespace(_lambda_log=first_log), _sleeping_handler)
    second = LocalEngine._quiet(SimpleNamespace(_lambda_log=second_log), _sleeping_handler)
    terminal = sys.stdout
    _overlapping(first, second)
    assert sys.stdout is terminal
    assert first_log.getvalue().split("\n")[:-1] == ["start 0.1", "end 0.1"]
    assert second_log.getvalue().split("\n")[:-1] == ["start 0.3", "end 0.3"]
