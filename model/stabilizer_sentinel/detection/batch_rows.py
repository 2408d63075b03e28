"""Whether a step's batch is a short one: fewer rows than the run's usual batch, as a loader's last batch of an
epoch is where it keeps the remainder (``DataLoader(..., drop_last=False)``, its default).

A loss summed over its rows (an ELBO as Pyro's ``Trace_ELBO`` returns it, a VAE's ``reduction="sum"``
reconstruction plus its KL term) is smaller on that batch by the rows it lacks. Beside full batches in a window,
it read as a fall: stop 82's hunt, Pyro's VAE tutorial at rate 0 (1,500 images in batches of 64: 23 of them and
one of 28), its loss 3,034 on a full batch and 1,323 on the last, was called learned, its windows holding the
last batch 12 % below its first window; the same script dropping its last batch was ``NotLearning``. A loss
averaged over its rows is only noisier on it. The learning check leaves such a step out of its windows
(``LearningCheck.observe``); every other check reads it as any step.

The rows are the leading dimension of the first tensor the watched network's first forward call with one, in the
step, was given (the guard's forward hook; none for calls with keyword arguments alone, nor a loop over bare
tensors). A step is short where its rows are fewer than the widest batch's among the last ``RECENT`` steps, this one
included, and that widest batch's rows are at least half of them: a last batch, once an epoch of two batches or
more, is short from the first epoch on, at every epoch alike. The rule must not change as the run goes on: a first
version, short only where the step's rows came at most half as often as the usual's, stopped leaving out the last
of three batches once the steps it counted reached ``RECENT`` (the review of stop 82), and a summed loss at rate 0
then read as a fall from windows without that batch to windows with it. A batch size that shrinks for good is no
longer short once the wider batches are under half of the last ``RECENT`` steps; batches whose rows vary from step
to step have no widest batch that common, and no step of theirs is short.

This module must not read tensors: it counts shapes the guard hands it.
"""

from __future__ import annotations

from collections import deque

RECENT = 64  # the steps whose rows say which batch is the widest, and how common it is


class BatchRows:
    """The rows of the latest steps' batches (``short``)."""

    def __init__(self) -> None:
        self._recent: deque[int] = deque(maxlen=RECENT)

    def short(self, rows: int | None) -> bool:
        """Record a step's rows (None: not known); whether its batch is a short one."""
        if rows is None:
            return False
        self._recent.append(rows)
        widest = max(self._recent)
        return rows < widest and 2 * self._recent.count(widest) >= len(self._recent)
