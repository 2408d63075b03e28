"""The watcher's lines on stderr, each written in one call.

``print(text, file=sys.stderr)`` writes the text, then its newline: two calls, and ``sys.stderr`` passes each
through to the file at once. Where processes share one stderr (the ranks ``torch.multiprocessing.spawn``
starts, a Hogwild! parent and its workers), another process's line can land between the two, and two lines
join (stop 69's hunt: two ranks' findings on one line). One call is one ``write`` of the descriptor, and a
pipe never interleaves writes of up to ``PIPE_BUF`` bytes (4,096 on Linux), far longer than these lines.
"""

from __future__ import annotations

import sys


def say(text: str) -> None:
    """Write ``text`` and its newline to stderr in one call, and flush it."""
    stream = sys.stderr
    if stream is None:  # an interpreter with no stderr (pythonw, a daemon that closed it): print writes nothing too
        return
    stream.write(f"{text}\n")
    stream.flush()
