"""Handlers invoked by two executions at once must not leave stdout pointing at the Lambda log."""

import io
import sys
import threading
import time
from types import SimpleNamespace

from stabilizer.local.engine.engine import LocalEngine


def test_concurrent_invocations_restore_stdout_and_log_everything():
    log = io.StringIO()
    engine = SimpleNamespace(_lambda_log=log, _invoke_lock=threading.Lock())

    def handler(event, context):
        print(f"start {event}")
        time.sleep(event)
        print(f"end {event}")
        return event

    invoke = LocalEngine._quiet(engine, handler)
    terminal = sys.stdout
    # The second call starts while the first is inside the handler, and ends after it.
    first = threading.Thread(target=invoke, args=(0.1, None))
    second = threading.Thread(target=invoke, args=(0.3, None))
    first.start()
    time.sleep(0.02)
    second.start()
    first.join()
    second.join()
    assert sys.stdout is terminal
    assert sorted(log.getvalue().split("\n")[:-1]) == ["end 0.1", "end 0.3", "start 0.1", "start 0.3"]
