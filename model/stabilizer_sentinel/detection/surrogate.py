"""Whether the loss is a surrogate whose value measures no fit: a sum of terms weighted by constants of
both signs (stabilizer_sentinel.loops.backward_loss, ``signed_weights``).

A policy gradient's loss is one: ``-(log_probs * advantages).sum()``. As the policy learns, the
log-probabilities of the actions it takes rise to 0, and the surrogate with them, while the return
climbs: a healthy REINFORCE run that reached the best return read as a loss that rose from -0.60 to
-0.01, and the learning check called it Diverging at its end. No fall or rise of such a loss says whether
the run learned, so the learning check judges neither (``LearningCheck``, ``unjudged``): the summary's
``learned`` is null and says why, and the workflow calls a completed run unverified, not succeeded.
The finite check and the configured rules still watch it.

One backward pass of that form makes the run's loss a surrogate (an actor-critic's policy term
backwarded on its own beside its value loss, or added to it: ``policy + 0.5 * value - 0.01 * entropy``),
another optimizer's pass too (SAC's entropy coefficient, beside a critic stepped first): a critic's error rises
with the returns in a healthy run, and is no measure of learning either (docs/rules.md).
The flag is kept on the tensors' device; it is read (one synchronisation) when the check asks, once a
window.

This module must not change gradients or weights: it reads the graph's saved tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from stabilizer_sentinel.loops import backward_loss, bare_tensors

REASON = ("its loss is a sum of terms weighted by constants of both signs (a policy gradient's surrogate, "
          "-(log_probs * advantages)), whose value measures no fit: whether the run learned is not judged")


class Surrogate:
    """Whether any backward pass so far started from a surrogate loss (``found``)."""

    def __init__(self) -> None:
        self._seen: torch.Tensor | None = None  # on the device: a pass of that form was seen
        self._found = False

    def observe(self, tensors: Sequence[torch.Tensor]) -> None:
        """One backward pass is about to run from ``tensors``."""
        if self._found:
            return
        signed = backward_loss.signed_weights(tensors)
        if signed is not None:
            self._seen = signed if self._seen is None else self._seen | signed.to(self._seen.device)

    def found(self) -> bool:
        """Whether a pass so far was a surrogate's (a host synchronisation on an accelerator, until one was)."""
        if not self._found and self._seen is not None:
            self._found = bool(self._seen)
        return self._found


def listen(owner: object) -> Surrogate:
    """A surrogate check fed by every backward pass of this process while ``owner`` lives."""
    surrogate = Surrogate()
    bare_tensors.listen_while(owner, surrogate.observe)
    return surrogate
