"""The numbers of the watcher's hook handles, apart from the script's.

torch numbers every hook handle from one counter (``torch.utils.hooks.RemovableHandle.next_id``) and keys
the table the hook lives in by that number. A module's tables are saved with it: ``torch.save(model)``
pickles the module whole, its hooks under their numbers (an older ``weight_norm``'s pre-hook, a script's
backward hook). Where the watcher had registered hooks of its own first, a hook the script registered
after them would be saved under another number than unwatched, and the file would differ (stop 79's harm
hunt: the model a script saved with a backward hook of its own, byte for byte another file watched).

Every hook the watcher registers takes its number from a range of the watcher's own (``apart``), far above
any number a script reaches, and the shared counter is left where it was: the script's hooks get the
numbers they get unwatched. A number is a key in one table, never compared with another, so the two ranges
share no table's key.

This module must not change gradients or weights.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from torch.utils.hooks import RemovableHandle

FIRST = 1 << 48  # the watcher's first number: no script registers this many hooks


class _Range:
    """The watcher's next number, and the ``apart`` blocks entered and not left (one inside another counts on
    from the outer one's numbers)."""

    def __init__(self) -> None:
        self.next = FIRST
        self.depth = 0
        self.lock = threading.RLock()


_RANGE = _Range()


@contextlib.contextmanager
def apart() -> Iterator[None]:
    """Hooks registered inside take their handles' numbers from the watcher's range; the script's counter is as
    it was after."""
    own = _RANGE
    with own.lock:
        own.depth += 1
        if own.depth == 1:
            script, RemovableHandle.next_id = RemovableHandle.next_id, own.next
        try:
            yield
        finally:
            own.depth -= 1
            if not own.depth:
                own.next, RemovableHandle.next_id = RemovableHandle.next_id, script
