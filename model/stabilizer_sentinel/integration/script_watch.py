"""How a script asks to be watched: ``watch(model, optimizer)`` builds its ``Guard`` from the job's
configuration, unless the launcher already watches that optimizer.

Under the launcher (stabilizer_sentinel.integration.launcher_hooks) a standby waits for the script's own call,
offered with ``offer``: ``claim`` asks it to hand over the guard it attached, or to stand down, and a
checkpoint the launcher loaded before the call is named with ``preloaded`` for the summary. What the
guard then does in the loop is stabilizer_sentinel.integration.guard's; this module only wires one up.
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from stabilizer_contract.job import REWIND_EVERY
from stabilizer_sentinel import handle_ids
from stabilizer_sentinel.integration.guard import Guard
from stabilizer_sentinel.job_config import JobPaths, load_config

# Called by watch() before it builds a guard (offer), by handle id.
_OFFERED: OrderedDict[int, Callable[[nn.Module, torch.optim.Optimizer | None], Guard | None]] = OrderedDict()
_PRELOADED: dict[str, str] = {}  # "checkpoint": the one the launcher loaded before the script called watch()
_NEWEST: dict[str, weakref.ref[Guard]] = {}  # the newest guard watch() or the Lightning callback built, by directory


def offer(standby: Callable[[nn.Module, torch.optim.Optimizer | None], Guard | None]) -> RemovableHandle:
    """Ask ``standby`` first, at each ``watch(model, optimizer)``, until the handle's ``remove()``: it
    answers with the guard it already attached to that optimizer, or stands down and answers None."""
    with handle_ids.apart():
        handle = RemovableHandle(_OFFERED)
    _OFFERED[handle.id] = standby
    return handle


def preloaded(source: str) -> None:
    """The launcher loaded the checkpoint ``source`` before the script called watch(): the guard watch()
    builds restores checkpoints and says it started from there."""
    _PRELOADED["checkpoint"] = source


def supersede(guard: Guard) -> None:
    """``guard`` watches the script's next training (its own ``watch()`` called again, a second Trainer's
    callback), writing to the directory a guard built before it wrote to: the newer guard's findings.json is
    the job's, as the launcher's next phase's is. The earlier one's in-job decisions go into it, before the
    newer one's own, and the earlier one, if still open, writes nothing at its close (at the interpreter's exit
    the newer one closes first, and the earlier one's summary overwrote it: stop 86's harm hunt, a second
    network's rollback lost from findings.json)."""
    directory = str(guard.paths.checkpoint_dir)
    earlier = _NEWEST[directory]() if directory in _NEWEST else None
    if earlier is not None and earlier is not guard:
        guard.carry_decisions(earlier.in_job_decisions())
        earlier.superseded()
    _NEWEST[directory] = weakref.ref(guard)


def claim(model: nn.Module, optimizer: Any) -> Guard | None:
    """The script watches itself: the launcher's standby stands down, or hands over the guard it attached."""
    for standby in list(_OFFERED.values()):
        attached = standby(model, optimizer)
        if attached is not None:
            return attached
    return None


def watch(
    model: nn.Module | Sequence[torch.Tensor],
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    *,
    rules: list[Mapping[str, Any]] | str | None = None,
    capture: Mapping[str, Any] | str | None = None,
    action: str | None = None,
    recovery: str | None = None,
    start_step: int = 0,
    environ: Mapping[str, str] | None = None,
    install_hooks: bool = True,
    rewind_every: int = REWIND_EVERY,
    rewind_keep: int = 2,
    started_from: str | None = None,
) -> Guard:
    """Protect ``model`` trained by ``optimizer``, configured by the SageMaker job.

    The job's ``sagemaker_stabilizer`` hyperparameter (stabilizer_sentinel.job_config) decides; ``rules``,
    ``capture`` and ``action`` are the script's own defaults for what the job leaves unset. With
    neither, the sentinel runs the finite check (``ExplodingTensor``) and stops the job when it fires.
    The finite check and the learning check (stabilizer_sentinel.detection.health) run whatever the rule list says;
    action ``notify`` records findings without stopping. ``recovery="in_job"`` answers an explosion or a
    divergence inside the job: back to the last healthy state, on at a lower rate chosen by probing
    (stabilizer_sentinel.recovery.recovery); the default, ``relaunch``, stops the job for the workflow.

    ``optimizer`` may be a list (a GAN's optimizers: the first one's steps are the run's) or None
    (parameters updated by hand: each backward pass is a step); ``model`` a list of leaf tensors. A
    script that fine-tunes a state it loaded itself names it in ``started_from`` (the summary's;
    ``guard.restore()`` sets it itself).

    With an optimizer, the guard keeps the last healthy state (``guard.rewind``, stabilizer_sentinel.recovery.rewind):
    every ``rewind_every`` steps a host copy of the weights and optimizer state, the newest
    ``rewind_keep`` kept and written as checkpoints at the first finding. It costs ``rewind_keep`` x
    (weights + optimizer state) of host memory: a very large model may want it off (``rewind_every=0``).
    """
    if rewind_every < 0 or rewind_keep < 1:
        raise ValueError(f"watch: rewind_every must be >= 0 and rewind_keep >= 1, got rewind_every={rewind_every}, "
                         f"rewind_keep={rewind_keep}")
    attached = claim(model, optimizer)
    if attached is not None:
        return attached  # the launcher watches this optimizer already: one guard, the launcher's
    config = load_config(environ).with_defaults(
        rules=json.loads(rules) if isinstance(rules, str) else (list(rules) if rules is not None else None),
        capture=json.loads(capture) if isinstance(capture, str) else (dict(capture) if capture is not None else None),
        action=action,
        recovery=recovery,
    )
    guard = Guard(model, optimizer, config=config, paths=JobPaths.from_env(environ), start_step=start_step,
                  install_hooks=install_hooks, rewind_every=rewind_every, rewind_keep=rewind_keep)
    if "checkpoint" in _PRELOADED:
        guard.restores_checkpoints()
        guard.resumed(_PRELOADED["checkpoint"])
    guard.resumed(started_from)
    supersede(guard)
    return guard

