"""The watcher's lines on stderr, each written in one call.

``print(text, file=sys.stderr)`` writes the text, then its newline: two calls, and ``sys.stderr`` passes each
through to the file at once. Where processes share one stderr (the ranks ``torch.multiprocessing.spawn``
starts, a Hogwild! parent and its workers), another process's line can land between the two, and two lines
join (stop 69's hunt: two ranks' findings on one line). One call is one ``write`` of the descriptor, and a
pipe never interleaves writes of up to ``PIPE_BUF`` bytes (4,096 on Linux), far longer than these lines.
"""

from __future__ import annotations

import sys
import threading

_SAYING = threading.local()  # set while ``say`` writes: the log channel reads no loss from the watcher's own lines


def say(text: str) -> None:
    """Write ``text`` and its newline to stderr in one call, and flush it."""
    stream = sys.stderr
    if stream is None:  # an interpreter with no stderr (pythonw, a daemon that closed it): print writes nothing too
        return
    # After a line the script left unended (a progress bar's, redrawn with carriage returns), on a line of its own:
    # written on, it read "... loss=1.66e+3sentinel: Diverging at step 3: ..." (stop 80's hunt).
    midline = getattr(stream, "midline", None)
    start = "\n" if callable(midline) and midline() is True else ""
    _SAYING.on = True
    try:
        stream.write(f"{start}{text}\n")
        stream.flush()
    finally:
        _SAYING.on = False


def saying() -> bool:
    """Whether this thread is writing one of the watcher's lines (``say``): a number in it is no loss the script
    printed (stabilizer_sentinel.integration.log_channel; stop 80's hunt: a finding's message quoting the loss
    1.739e+08 was read as the log's last loss, where the script printed none)."""
    return getattr(_SAYING, "on", False)
