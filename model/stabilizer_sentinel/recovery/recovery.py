"""In-job recovery: roll back to the last healthy state and go on at a rate chosen by probing from it.

A relaunch costs a new job (provisioning, image, data, checkpoint: minutes on AWS). When the
sentinel finds an explosion or a divergence (``ExplodingTensor``, ``Diverging``: a rate too high for
the network at this point) and the job was asked to recover in place (the ``recovery`` key of its
configuration, ``in_job``), the guard does not stop. Instead:

1. **Roll back.** The step that failed is let through and undone: after it, the model and optimizer
   are loaded from the newest copy the rewind took before the run-up began (the finding's
   ``onset_step``; stabilizer_sentinel.recovery.rewind keeps the copies, with the learning check's state
   beside them, so the run is judged from that state's lineage again). When training goes on, the
   script's moving averages of the rolled-back networks (``AveragedModel``) restart from the weights it
   goes on from (stabilizer_sentinel.recovery.averages): they averaged in the steps the rollback undid.
2. **Probe.** From that state, each candidate rate (a third, a tenth, a thirtieth, a hundredth of the
   failing one: two orders of magnitude in one round) trains ``probe_steps`` steps of the script's own
   batches. A candidate fails at a finding of the sentinel's, a non-finite loss, a loss that climbs
   within its steps, or steps its loss scaler skips after one it applied (``SKIPS``: the scale, put
   back with the state, had fitted its gradients); among those that did not, the highest rate whose
   loss fell as low as the lowest (within the batches' noise) is the edge of what the network takes,
   and training goes on from the state the next lower candidate that trained reached (``choose``); from
   the edge's own where that lower one learned slower beyond the noise, with one optimizer and the script's
   rate no higher than at the copy (``Recovery._edge_may_be_kept``). When
   every candidate of a round failed, or the edge is the lowest rate probed (the lower the rate, the
   faster the loss fell: no rate a notch below the edge was tried), the next round probes a hundred
   times lower again, one candidate at a time until one is below the edge; after ``rounds`` rounds with
   nothing trained the finding stands and the job stops as it would have (the workflow relaunches).

   A sudden explosion (``ExplodingTensor`` with no run-up: no rate change, no growing gradient, no
   risen loss before it) at a rate the run was stable at is first replayed at that same rate: a
   corrupt batch or a one-off does that, and a lower rate would slow a healthy run for one record.
   When the replay trains its ``probe_steps`` steps, training goes on from there unchanged (the
   script's loop has moved past the batch; decision ``transient``); when it fails, the lower rates
   are probed as above. Where the step's own batches are known (stabilizer_sentinel.recovery.batches: a
   ``DataLoader``'s, one process), the replay's first step takes them again (its second where the loop
   fetches ahead and trains on the batch it holds first): when that step fails and
   the next ``probe_steps`` steps at the same rate, on the loader's next batches, train, the batch was
   bad (decision ``bad_batch``, naming it, and the relaunch skips it too); when it trains, a one-off
   (``transient``); when the steps after it fail, the rate.
   A rate the probes measured over five steps can be too high for the rest of the run: after a rollback
   went on, windows that rose above the best copy taken since, beyond the noise, several times
   (``RISE_WINDOWS``) take the job back to that copy and on at a notch lower (``NOTCH``), without
   probing: a rollback as the others (``probed`` empty), within ``max_rollbacks``. A run rolled back to
   its first copy (a rate too high from the start) whose windows, in the learning check's patience since,
   never fell below that copy's level (or the chance level, where lower) by ``LEARNED`` of it goes back
   to that copy the same way: the rate it went on at learns nothing (``Recovery._stalled``).
3. **Record.** Each rollback is a decision in findings.json's ``rollbacks`` (docs/contracts.md,
   section 2): the finding, the step restored, the rate before and after, what was probed, steps
   lost and the seconds from the finding to training again. The workflow records it in the attempt's
   history and tells the topic.

The rate is applied at the optimizer step (``scale``/``unscale`` around it): each group's ``lr`` is
multiplied by the factor in force just before the step and set back just after, so a script that
sets its own rate each step, a scheduler, or neither keep the schedule's shape, lowered. Never
above the highest rate the kept probe trained at (``ceiling``, of the first group): where the script's
rate rises past it (a warm-up, a one-cycle's climb), the factor in force is lowered to hold it there
(``in_force``), as no probe measured the network at the rates the climb would reach.

Several optimizers (a GAN's two) roll back together: the copies hold every optimizer's state and
the parameters of each, the factor applies to the rate of every optimizer the rollback held
(``covered``), and the first optimizer's steps are the ones counted, probed and judged; another
optimizer's part of the state is put back at
its own next step (its backward pass done), a step that changes nothing (its gradients predate it).
Under Lightning's callback too: Lightning counts each optimizer's step and the callback checks the
first one's. Not for a worker process: it stops as before and the relaunch handles it. At most
``max_rollbacks`` times per job. Under DDP every rank rolls back together: rank 0 decides, the
others do as it did, other optimizers too (stabilizer_sentinel.recovery.ranks).

This module decides the in-job remedy; it must not write files other than through the sentinel.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from stabilizer_contract.catalogue import DIVERGING
from stabilizer_contract.job import IN_JOB_ROLLBACKS, IN_JOB_TRANSIENTS
from stabilizer_contract.job import PAST_OUTCOMES as PAST  # an explosion the same rate trained past
from stabilizer_sentinel.recovery import averages
from stabilizer_sentinel.recovery.batches import corrupt_records, describe
from stabilizer_sentinel.say import say

EXPLODING = "ExplodingTensor"
RECOVERABLE = (EXPLODING, DIVERGING)  # a rate too high: the job can lower it itself
FACTORS = (1 / 3, 1 / 10, 1 / 30, 1 / 100)  # one round of candidates, relative to the failing rate
ROUND_STEP = 1 / 100  # each further round is this much lower again
ROUNDS = 2
PROBE_STEPS = 5
MAX_ROLLBACKS = IN_JOB_ROLLBACKS  # per job: the workflow's state has room for these and the transients
MAX_TRANSIENTS = IN_JOB_TRANSIENTS  # explosions the same rate trained past (corrupt batches, one-offs), per job
# An explosion this many steps or fewer after one the same rate trained past is the rate's: no replay.
TRANSIENT_REACH = 20
NOISE_ERRORS = 2.0  # scores closer than this many standard errors are the same to the probe
SEPARATE = 3  # later losses each of two probes needs before one wholly above the other is worse (Probe.above)
# A probe whose last loss is this fraction of its first's magnitude above it is climbing; a copy whose
# loss climbed back this fraction of the way to where the run started has lost what it learned.
CLIMB = 0.5
# ... and more than this many standard deviations of the difference of two steps' losses (the run's
# per-step noise times sqrt 2): a probe's first and last losses are single steps.
CLIMB_ERRORS = 3.0
# A probe whose steps the loss scaler skipped this many times after one it applied failed: its gradients
# grew past a scale that had fitted them, and again once it halved. A skipped step applies nothing, so such
# a probe's losses stay where it began and would pass for a rate that trains without harm. Skips before
# its first applied step are the scale calibrating to the restored state (a copy taken while the scaler
# still calibrated from its first scale): they do not count toward its ``probe_steps``, unless that many
# came before any applied step (then it failed).
SKIPS = 2
# After a rollback the job goes on a notch below the edge its probes measured over five steps (or at it:
# ``choose``): a rate that can still be too high for the rest of the run (the loss swings, or creeps up, below any
# finding's bound). A run whose windows of ``Rewind.every`` steps since the rollback rose above the best copy taken
# since (the rewind's lowest level) by more than ``RISE_ERRORS`` standard errors of a window's difference,
# ``RISE_WINDOWS`` times since that copy, goes back to it and on at ``NOTCH`` of the rate (``Recovery._risen``): the
# next lower candidate of the probes' spacing.
RISE_WINDOWS = 3
RISE_ERRORS = 2.0
NOTCH = 1 / 3
# A run whose copies before a finding are of its first this many windows, none better than its first step,
# rolls back to the state before that step (``restore_point``).
EARLY = 4
# ... or whose every window is above its first step's loss less this fraction of its magnitude (not below it
# by the learning check's least fall, its ``min_decrease``) while the copy to go back to began its own step
# above the first's.
LEARNED = 0.05


@dataclass
class Probe:
    """One candidate factor tried from the restored state."""

    factor: float
    losses: list[float] = field(default_factory=list)
    failed: str | None = None
    steps: int = 0  # optimizer steps taken at this rate (a step may have no loss: the launcher reads some from logs)
    top: float | None = None  # the highest rate (the first group's) a step of it ran at
    applied: int = 0  # of its steps, those the loss scaler (if any) applied: the probe's measure
    skipped: int = 0  # ... and those it skipped after the first it applied

    @property
    def score(self) -> float:
        """The mean loss after the first step (the first is the restored state's, the same for all)."""
        later = self.losses[1:] or self.losses
        return sum(later) / len(later) if later else math.inf

    @property
    def error(self) -> float:
        """The standard error of ``score``: the batches differ from probe to probe, and so do their losses.

        The spread is taken about the losses' straight-line trend, not their mean: a probe's loss falls
        as it trains, and a steep fall from a high restored loss is the rate's doing, not noise (taken
        about the mean it would make a probe far worse than another look as good)."""
        later = self.losses[1:] or self.losses
        n = len(later)
        if n < 2:
            return 0.0
        mean = sum(later) / n
        if n < 3:  # no degree of freedom left beside a line
            return math.sqrt(sum((x - mean) ** 2 for x in later) / (n - 1) / n)
        middle = (n - 1) / 2
        slope = sum((i - middle) * (x - mean) for i, x in enumerate(later)) / sum((i - middle) ** 2 for i in range(n))
        residuals = [x - mean - slope * (i - middle) for i, x in enumerate(later)]
        return math.sqrt(sum(r * r for r in residuals) / (n - 2) / n)

    @property
    def spread(self) -> float:
        """The per-step deviation of its later losses about their trend (``error`` times the root of their count):
        the noise of a probe from a state with none measured yet, its first loss left out."""
        return self.error * math.sqrt(max(len(self.losses) - 1, 1))

    def above(self, other: Probe) -> bool:
        """Whether every later loss of this probe is above every one of ``other``'s, with ``SEPARATE``
        losses each at least: however their spread reads, no noise makes the two the same (were they,
        three of each would fall apart so once in twenty draws; four of each, the default probe's, once
        in seventy)."""
        mine, theirs = self.losses[1:], other.losses[1:]
        return len(mine) >= SEPARATE and len(theirs) >= SEPARATE and min(mine) > max(theirs)

    def held(self, noise: float | None) -> bool:
        """Whether its later losses' mean is above its first by no more than ``climbing`` allows its last
        (``CLIMB`` of the first's magnitude, and the noise of two single steps): a rate that trained, not
        one that threw the loss up and back (at a third of a rate a hundred times too high, a
        super-resolution network's mean was 8e10 from 0.69)."""
        if not self.losses:
            return False
        first = self.losses[0]
        return self.score - first <= max(CLIMB * max(abs(first), 1e-12), CLIMB_ERRORS * math.sqrt(2) * (noise or 0.0))

    def climbing(self, noise: float | None) -> bool:
        """Whether the loss rose over the probe's steps by more than ``CLIMB`` of its first and than the
        noise of two single steps (``noise``: the run's per-step deviation in the state restored, or where none
        was measured there the probe's own later losses' ``spread``; never the run's as read after the probe's
        steps, which a probe thrown from its first loss to a saturated one widens past its own jump: stop 83's
        graph auto-encoder, four probes at exactly -log(1e-15), none failed)."""
        if len(self.losses) < 2:
            return False
        first, last = self.losses[0], self.losses[-1]
        bound = max(CLIMB * max(abs(first), 1e-12), CLIMB_ERRORS * math.sqrt(2) * (noise or 0.0))
        return last - first > bound


class RateFactor:
    """A factor on every group's rate, applied at the optimizer step alone (``scale``/``unscale``), for
    the first optimizer and the others alike (``scale_other``/``unscale_other``: a GAN's second)."""

    factor: float
    ceiling: float | None = None  # the highest rate (the first group's) the kept probe trained at; None: no cap
    _saved: list[Any]
    _in_force: float = 1.0  # the factor the last step of the first optimizer ran at (``in_force``)
    _saved_other: tuple[Any, ...] = ()  # the other optimizer's rates, as the script set them, while it steps
    _held: tuple[tuple[torch.Tensor, torch.Tensor | None], ...] = ()  # its gradients, held aside while it skips
    _saved_inner: tuple[tuple[dict[str, Any], Any], ...] = ()  # (group, rate): an inner optimizer's own while it steps
    # The other optimizers (by id) the last rollback held and probed with the first: the factor applies to those
    # alone. One that first stepped after it (a sweep's next model, trained while the first is still held) was
    # not rolled back and no probe measured it: its rates stay the script's.
    covered: frozenset[int] = frozenset()

    def in_force(self, optimizer: torch.optim.Optimizer) -> float:
        """The factor for this step: ``factor``, lowered where the script's rate has risen so far that its
        first group would run above ``ceiling`` (every group by the same factor, so their ratios hold)."""
        if self.ceiling is None:
            return self.factor
        lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        return min(self.factor, self.ceiling / lr) if isinstance(lr, int | float) and lr > 0 else self.factor

    def scale(self, optimizer: torch.optim.Optimizer) -> None:
        """Just before the step: each group's rate times the factor in force."""
        self._in_force = self.in_force(optimizer)
        self._saved = _scaled(optimizer, self._in_force)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Just after it: the script's own rates back, as it set them."""
        _unscaled(optimizer, self._saved)
        self._saved = []

    def set_back(self, optimizer: torch.optim.Optimizer) -> None:
        """The watcher stands aside (stabilizer_sentinel.failsafe) between ``scale`` and ``unscale``: the script's
        own rates back now, as its post-hook no longer will."""
        if self._saved:
            self.unscale(optimizer)
        self.unscale_inner()

    def scale_inner(self, optimizer: torch.optim.Optimizer, first: torch.optim.Optimizer) -> None:
        """Just before the step of an optimizer the first one steps inside its own (SAM's base, Lookahead's):
        its groups that are not the first one's (those were scaled with it) times the factor in force."""
        groups = [group for group in optimizer.param_groups if not any(group is own for own in first.param_groups)]
        self._saved_inner = tuple(zip(groups, _scaled_groups(groups, self._in_force), strict=False))

    def unscale_inner(self) -> None:
        """Just after that step: the rates of the groups ``scale_inner`` scaled back, as the script set them."""
        for group, rate in self._saved_inner:
            group["lr"] = rate
        self._saved_inner = ()

    def scale_other(self, optimizer: torch.optim.Optimizer) -> bool:
        """Just before another optimizer's step: its rates times the factor, and True; False when a
        rollback's state was put back into it now (``put_back_other``): its gradients predate that state,
        so they are held aside (``None`` for the step: an optimizer leaves a parameter without a gradient
        as it is), the step changes nothing, and they are back after it."""
        if self.put_back_other(optimizer):
            params = [param for group in optimizer.param_groups for param in group["params"]]
            self._held = tuple((param, param.grad) for param in params)
            for param in params:
                param.grad = None
            return False
        # The first optimizer's factor as its last step ran it (the ceiling is of its rate, not this one's).
        factor = (self._in_force if self.ceiling is not None else self.factor) if id(optimizer) in self.covered else 1.0
        self._saved_other = tuple(_scaled(optimizer, factor))
        return True

    def unscale_other(self, optimizer: torch.optim.Optimizer) -> bool:
        """Just after another optimizer's step: its rates, and any gradients held aside, back; True when
        the step was skipped."""
        skipped = bool(self._held)
        _unscaled(optimizer, list(self._saved_other))
        for param, grad in self._held:
            if param.grad is None:  # a closure's backward inside the step wrote a newer one: kept
                param.grad = grad
        self._saved_other, self._held = (), ()
        return skipped

    def put_back_other(self, optimizer: torch.optim.Optimizer) -> bool:
        """Put a rollback's state back into another optimizer and its parameters, when due: nothing here."""
        return False

    def rate(self, optimizer: torch.optim.Optimizer) -> float | None:
        """The first group's rate as the step runs it (the script's rate times the factor in force)."""
        lr = optimizer.param_groups[0].get("lr")
        if lr is None:
            return None
        return float(lr) if self._saved else float(lr) * self.in_force(optimizer)  # inside the step: scaled already


class Recovery(RateFactor):
    """The guard's in-job recovery (see the module docstring); ``guard`` is a
    stabilizer_sentinel.integration.guard.Guard. Under DDP it runs on rank 0, and ``ranks``
    (stabilizer_sentinel.recovery.ranks.Ranks) tells the other ranks what it did."""

    def __init__(self, guard: Any, *, max_rollbacks: int = MAX_ROLLBACKS, probe_steps: int = PROBE_STEPS,
                 factors: tuple[float, ...] = FACTORS, rounds: int = ROUNDS) -> None:
        self.guard = guard
        self.max_rollbacks = max_rollbacks
        self.probe_steps = probe_steps
        self.factors = factors
        self.rounds = rounds
        self.factor = 1.0  # the multiplier in force on every group's rate
        self.decisions: list[dict[str, Any]] = []
        self._saved: list[Any] = []  # the script's own rates while a step runs scaled
        self._trigger: dict[str, Any] | None = None  # the rollback under way
        self._snapshot: Any = None
        self._round = 0
        self._queue: list[float] = []
        self._probes: list[Probe] = []
        self._probe: Probe | None = None
        self._replay: Probe | None = None  # the same rate, replayed first after a sudden explosion
        self._replays = 0  # the next candidates started are replays: with the failing step's batches, without
        self.batches: Any = None  # the training batches each step took (stabilizer_sentinel.recovery.batches)
        self._batches_held: list[Any] | None = None  # the failing step's, for the first replay
        self._with_batch: Probe | None = None  # the replay that took them
        self._reproduced = False  # the failing step's batches failed again from the restored state
        self._bad: dict[str, Any] | None = None  # what the decision says of them
        self._bad_fetches: list[Any] = []  # ... and the batches themselves, until the decision
        self._ends: dict[int, Any] = {}  # the state each probe that did not fail reached, by id
        self._restore_due = False
        self.live_from = -1  # findings of steps before this one are about steps a rollback undid
        self.ranks: Any = None  # under DDP: what rank 0 did, told to the other ranks after each step of a rollback
        self._loaded = False  # a state was put back during this step's end
        self._skips_seen = 0  # the run's skipped steps as the last step of a probe ended
        self._restored_noise: float | None = None  # the run's per-step noise in the state rolled back to
        self._since: dict[str, Any] | None = None  # after a rollback went on: its windows, for a rise (_risen)
        self._back: Any = None  # the copy a rise goes back to at this step's end

    @property
    def probing(self) -> bool:
        """A rollback is under way (or due at this step's end): under DDP every rank exchanges with rank 0."""
        return self._trigger is not None or self._back is not None

    def scale(self, optimizer: torch.optim.Optimizer) -> None:
        super().scale(optimizer)
        probe, lr = self._probe, optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        if probe is not None and isinstance(lr, int | float):  # the rate this step of the probe runs at
            probe.top = float(lr) if probe.top is None else max(probe.top, float(lr))

    # -- what the sentinel hands over
    def intercept(self, entries: list[dict[str, Any]]) -> bool:
        """Findings of a step: True when they are this recovery's to handle (not recorded, no stop)."""
        stops = [entry for entry in entries if entry.get("action") == "stop"]
        if not stops:
            return False
        if all(entry["step"] < self.live_from for entry in stops):
            return True  # about a step already undone (a log line printed after the rollback): nothing to do
        if self._probe is not None:  # the candidate under trial failed
            self._probe.failed = f"{stops[0]['rule']} at step {stops[0]['step']}"
            self._restore_due = True
            return True
        if self.probing:
            return True  # a rollback under way answers it (another rank's finding of the same step)
        return self._can_roll_back(stops) and self._begin(stops[0])

    def _begin(self, entry: dict[str, Any]) -> bool:
        """Roll back for ``entry``: False when no copy is old enough."""
        snapshot = restore_point(self.guard.rewind, entry)
        if snapshot is None:
            return False
        if not self.guard.rewind.fits(snapshot):
            say(f"sentinel: {entry['rule']} at step {entry['step']}: no rollback in the job: the network or its "
                f"optimizer changed since the copy at step {snapshot.next_step} (pruned, a group added), which no "
                f"longer fits them")
            return False
        # The factor the failing step runs at, the ceiling folded in: the probes are relative to it, uncapped.
        # Inside the step (a closure's check) its rates are scaled already; before it, they are the script's.
        factor = self.factor if self.ceiling is None else self._in_force if self._saved else self.in_force(
            self.guard.optimizer)
        self._trigger = {"finding": entry, "started": time.perf_counter(), "rate_before": self.guard.learning_rate,
                         "factor_before": factor, "in_force_before": (self.factor, self.ceiling),
                         "covered_before": self.covered}
        self.covered = frozenset(id(optimizer) for _, optimizer in self.guard.rewind.others)
        self.factor, self.ceiling = factor, None
        self._snapshot = snapshot
        self._since = self._back = None
        self._round = 0
        replay = self._sudden(entry)
        self._batches_held = self.batches.held(entry["step"]) if replay and self.batches is not None else None
        self._replays = replay + (self._batches_held is not None)  # with the batches, then without when they fail
        self._queue = [self.factor] * self._replays + [self.factor * f for f in self.factors]
        self._probes = []
        self._ends = {}
        self._restore_due = True
        self._replay = self._with_batch = None
        self._bad = describe(self._batches_held) if self._batches_held else None
        self._bad_fetches = self._batches_held or []
        self._reproduced = False
        self.guard.rewind.frozen = True  # no copies of probing states
        then = ("replaying the same rate" + (" with the step's own batches" if self._batches_held else "")
                + ", then lower ones if it fails") if replay else "probing lower rates"
        say(f"sentinel: {entry['rule']} at step {entry['step']}: rolling back to step {snapshot.next_step} and "
            f"{then} in the job")
        return True

    def _sudden(self, entry: dict[str, Any]) -> bool:
        """An explosion with no run-up (the finite check's onset is the step before it: no rate change,
        no growing gradient, no risen loss) at a rate the run was stable at: a corrupt batch or a one-off
        can do that, so the same rate is replayed from the restored state first. Not again within
        ``TRANSIENT_REACH`` steps of an explosion the same rate trained past."""
        if entry["rule"] != EXPLODING or entry.get("onset_step") != entry["step"] - 1:
            return False
        stable, rate = entry.get("stable_learning_rate"), self.guard.learning_rate
        if stable is None or rate is None or rate > stable * (1 + 1e-9):
            return False
        return not any(d["outcome"] in PAST and entry["step"] - d["step"] <= TRANSIENT_REACH
                       for d in self.decisions)

    def _can_roll_back(self, stops: list[dict[str, Any]]) -> bool:
        guard = self.guard
        transients = sum(d["outcome"] in PAST for d in self.decisions)
        return (len(self.decisions) - transients < self.max_rollbacks and transients < MAX_TRANSIENTS
                and guard.rewind is not None and (guard.world_size == 1 or self.ranks is not None)
                and all(entry["rule"] in RECOVERABLE for entry in stops))

    def observed(self, loss: float | None) -> None:
        """The loss of the step just checked (None when the step had none)."""
        if self._since is not None and self._trigger is None and loss is not None and math.isfinite(loss):
            self._risen(loss)
        if self._probe is not None and loss is not None:
            if math.isfinite(loss):
                self._probe.losses.append(loss)
            elif self._probe.failed is None:
                self._probe.failed = f"non-finite loss ({loss})"
                self._restore_due = True

    def _risen(self, loss: float) -> None:
        """A loss of the run since a rollback went on: at the end of each window of ``Rewind.every`` losses,
        whether its mean rose above the level of the best copy taken since (the rewind's ``anchor``) by more
        than ``RISE_ERRORS`` standard errors of the difference of two windows' means (the run's per-step
        noise) and than ``LEARNED`` of that level (the quickstart's regression, its loss the same each step at
        its floor, 0.01027, went back 44 steps for a rise of rounding and was then stopped as a network that
        did not learn); at the ``RISE_WINDOWS``-th such window since that copy, back to it at this step's end
        (``_back_to_best``). A best copy from before the rollback (of the lineage it undid, or at the rate it
        failed at) is no such state, nor is one with no level."""
        since, rewind = self._since, self.guard.rewind
        since["window"].append(loss)
        if len(since["window"]) < rewind.every:
            return
        mean = sum(since["window"]) / len(since["window"])
        since["window"] = []
        since["windows"] += 1
        since["lowest"] = mean if since["lowest"] is None else min(since["lowest"], mean)
        noise = self.guard.sentinel.learning.noise or 0.0
        if self._stalled(since):
            since["mean"], self._back = mean, since["restored"]
            return
        best = rewind.anchor
        if best is None or best.level is None or best.next_step < since["from"]:
            return
        if best is not since["best"]:
            since["best"], since["risen"] = best, 0
        # Beyond the noise, and by the learning check's least fall (``LEARNED`` of the level): a loss with no
        # noise (a full batch, the same each step) sits at its floor with windows apart by rounding alone.
        if mean - best.level <= max(RISE_ERRORS * noise * math.sqrt(2 / rewind.every), LEARNED * abs(best.level)):
            return
        since["risen"] += 1
        if since["risen"] >= RISE_WINDOWS and self._can_roll_back([{"rule": DIVERGING}]):
            since["mean"] = mean
            self._back = best

    def _watch_since(self, restored: Any) -> dict[str, Any]:
        """What ``_risen`` and ``_stalled`` follow of the run that went on from ``restored`` at this step."""
        return {"from": self.guard.step_number, "window": [], "best": None, "risen": 0, "restored": restored,
                "windows": 0, "lowest": None, "stalled": None}

    def _stalled(self, since: dict[str, Any]) -> bool:
        """Whether the run that went on from the first copy (the rollback went back to where the run began:
        its rate was too high from the start) has had the learning check's patience since and no window
        of it below that copy's level, or the chance level where lower, by ``LEARNED`` of it: the rate it
        went on at learns nothing. The lowest window of a noisy loss lies below its level by the noise
        alone: no margin for the noise is added (the run's per-step noise, which the probes' and the
        run-up's losses can swell, would only widen what counts as learning nothing).

        A GPT at ten thousand times its rate, rolled back to its first step and on at a hundredth of the
        failing rate, the edge its five-step probes could see, sat at the labels' prior for the rest of the
        run: 8.51 at its first step, 8.55 fifty steps on, 7.78 at its end (prior 8.08), where a third of that
        rate learns to 0.04 (stabilizer/bench/gpt_loop.py --lr 3 --clip 0, width 256, vocabulary 4,096).
        Not for a rollback to a later copy, nor in a run a relaunch resumed (its first copy is the state it
        resumed): a state that learned may have little left to learn quickly."""
        rewind, learning = self.guard.rewind, self.guard.sentinel.learning
        restored, first = since["restored"], rewind.first
        if (restored is None or first is None or restored.next_step != first.next_step or first.level is None
                or not learning.began_here or learning.learned
                or since["windows"] * rewind.every < learning.patience_steps()):
            return False
        chance = learning.chance.level() if learning.chance is not None else None  # read once a window
        reference = first.level if chance is None else min(first.level, chance)
        if since["lowest"] < reference - LEARNED * abs(reference) or not self._can_roll_back([{"rule": DIVERGING}]):
            return False
        since["stalled"] = reference
        return True

    def _back_to_best(self) -> None:
        """What ``_risen`` or ``_stalled`` found: back to the best copy since the last rollback, or to the
        first, on at a notch lower."""
        guard, best, since = self.guard, self._back, self._since
        assert best is not None and since is not None
        started, step = time.perf_counter(), guard.step_number - 1  # the step just taken
        rate_before, factor_before = guard.learning_rate, self.factor
        if since["stalled"] is not None:
            message = (f"the loss had no window below {since['stalled']:.4g} (where the run began, or its chance "
                       f"level where lower) by {LEARNED:.0%} of it in the "
                       f"{since['windows'] * guard.rewind.every} steps since the rollback, the lowest "
                       f"{since['lowest']:.4g}: the rate it went on at learns nothing")
        else:
            message = (f"the loss rose above the best state since the rollback ({best.level:.4g}, the mean of the "
                       f"window before step {best.next_step}) by more than its noise in {since['risen']} windows "
                       f"of {guard.rewind.every} steps since, the last {since['mean']:.4g}: the rate it went on at "
                       f"is too high for the run")
        self._back, self._since = None, None
        self._load(best)
        guard.rewind.forget_after(best.next_step)
        self.live_from = guard.step_number
        guard.undone_before(guard.step_number)
        self.factor = factor_before * NOTCH
        if self.ceiling is not None:
            self.ceiling *= NOTCH
        finding = {"rule": DIVERGING, "step": step, "message": message, "action": "stop"}
        self._snapshot = best
        decision = self._decision({"finding": finding, "started": started, "rate_before": rate_before,
                                   "factor_before": factor_before}, [], self.factor)
        self.decisions.append(decision)
        self._since = self._watch_since(best)
        say(f"sentinel: {message}; rolled back {decision['steps_lost']} steps to step {best.next_step}, going on "
            f"at {decision['learning_rate_after']:.3g} ({self.factor:.3g} x the script's rate)"
            f"{self._restart_averages(decision)}")
        guard.sentinel.rolled_back(decision)

    def after_step(self) -> None:
        """After the optimizer step (the guard counted it): restore, move to the next candidate, or settle;
        under DDP, then tell the other ranks (``ranks``)."""
        self._loaded = False
        if self._back is not None:
            self._back_to_best()
        self._end_step()
        if self.ranks is not None:
            self.ranks.lead(loaded=self._loaded)

    def _end_step(self) -> None:
        probe = self._probe
        if probe is not None:
            self._count(probe)
            if probe is self._with_batch and probe.steps == 1 + self.batches.lead:
                self._first_replayed(probe)
        if probe is not None and not self._restore_due and probe.applied >= self.probe_steps:
            if probe.climbing(self._restored_noise if self._restored_noise is not None else probe.spread):
                probe.failed = "its loss climbed"
            elif probe is self._replay:
                self._go_on_unchanged()
                return
            else:
                self._ends[id(probe)] = self.guard.rewind.take_now(self.guard.step_number, waiting=True)
            self._restore_due = True
        if not self._restore_due:
            return
        self._restore_due = False
        if probe is not None:
            self._probes.append(probe)
            self._probe = None
            if probe is self._with_batch and not self._reproduced and self._replays:
                self._queue.pop(0)  # its other steps failed on other batches: the rate's, not the batch's
                self._replays = 0
            if probe is self._with_batch:
                # A replay not handed out yet goes to no later candidate. One the loop fetched ahead while the
                # step before it failed is in the loop's hands: the next candidate's first step trains on it.
                self.batches.replayed()
        if self._queue and not (self._round and self._ends and self._bracketed()):
            self._start(self._queue.pop(0))
            return
        if not self._bracketed() and self._round + 1 < self.rounds and self._trigger is not None:
            self._round += 1  # nothing trained, or the lowest rate probed was the edge: probe lower
            lower = self._trigger["factor_before"] * ROUND_STEP ** self._round
            self._queue = [lower * f for f in self.factors]
            self._start(self._queue.pop(0))
            return
        self._settle()

    def _count(self, probe: Probe) -> None:
        """The step just ended was one of ``probe``'s: applied or skipped by the loss scaler (``SKIPS``)."""
        probe.steps += 1
        skipped = self.guard.record.steps_skipped > self._skips_seen
        self._skips_seen = self.guard.record.steps_skipped
        if not skipped:
            probe.applied += 1
            return
        if probe.applied:
            probe.skipped += 1
        if self._restore_due:
            return
        if probe.skipped >= SKIPS:
            probe.failed = f"the loss scaler skipped {probe.skipped} of its steps after it applied one"
            self._restore_due = True
        elif not probe.applied and probe.steps >= self.probe_steps:
            probe.failed = f"the loss scaler skipped its first {probe.steps} steps"
            self._restore_due = True

    def _bracketed(self) -> bool:
        """Whether a rate below the edge was probed (``edge``): the job can go on a notch below it. Not
        when nothing trained, nor when the edge is the lowest rate probed: a loss still falling faster
        the lower the rate has not shown where the network's edge is, so the next round probes lower,
        one candidate at a time until one is below the edge."""
        top = edge([p for p in self._probes if id(p) in self._ends])
        return top is not None and any(p.factor < top.factor for p in self._probes)

    def close(self, cause: str = "the run ended") -> None:
        """The run ended (the script's loop is done), or ``cause``: a rollback still probing is recorded as it
        stands.

        The weights are the probe's under way (the job cannot go back once the script stopped
        stepping), not a recipe the job chose: the finding stands, as if the job had stopped on it, so
        the workflow remedies it by a relaunch, which resumes from the state the job rolled back to
        (written as a checkpoint here). Its ``stable_learning_rate`` is the highest rate a probe
        trained all its steps at without failing or throwing its loss up (``Probe.held``), when that is
        higher than the run-up's own. Where the run ended during
        the replay on the next batches after the failing step's own failed again, the decision names that
        batch (``batch``): the relaunch resumes before it, and skips it.
        """
        trigger, probe = self._trigger, self._probe
        if trigger is None:
            return
        if probe is not None and probe.steps:
            self._probes.append(probe)
        probed = self._probed(trigger)
        decision = self._decision(trigger, probed, probe.factor if probe is not None else None)
        decision["outcome"] = "ended"
        decision["probe_steps"] = sum(p["steps"] for p in probed)
        if probe is not None and probe is self._replay and probe is not self._with_batch and self._reproduced \
                and self._bad is not None and probe.steps and probe.failed is None:
            # Failed again from the restored state; the next batches were training.
            decision["batch"] = {**self._bad, "nonfinite": True} if self._corrupt_records(trigger) else self._bad
        self.decisions.append(decision)
        self._trigger = self._probe = None
        self._bad_fetches = []
        self.guard.sentinel.rollbacks.append(decision)  # written with the summary, as the job closes
        self.guard.rewind.persist_point(self._snapshot)  # where the relaunch resumes
        finding = dict(trigger["finding"])
        # A probe that trained all its steps and held its loss is a rate the network took; one cut short by
        # the run's end, or one that threw the loss up and back, is no evidence for the relaunch.
        before, factor_before = trigger["rate_before"], trigger["factor_before"]
        trained = [rate for p in self._probes if id(p) in self._ends and p.held(self._restored_noise)
                   if (rate := _times(before, p.factor / factor_before)) is not None]
        if trained and max(trained) > (finding.get("stable_learning_rate") or 0):
            finding["stable_learning_rate"] = max(trained)
        say(f"sentinel: {cause} while probing rates after {decision['rule']} at step {decision['step']} "
            f"({len(probed)} probed): the finding stands")
        self.guard.sentinel.adopt([finding])

    # -- steps of a rollback
    def _load(self, snapshot: Any) -> None:
        self.guard.rewind.load(snapshot)
        self._loaded = True

    def put_back_other(self, optimizer: torch.optim.Optimizer) -> bool:
        """The other optimizers' part of the state loaded last goes back at each one's next step
        (stabilizer_sentinel.recovery.rewind.Rewind.load_other)."""
        return self.guard.rewind.load_other(optimizer)

    def _start(self, factor: float) -> None:
        self._load(self._snapshot)
        self._restored_noise = self.guard.sentinel.learning.noise  # the restored state's, no probe's in it
        self.factor = factor
        self.live_from = self.guard.step_number
        self._probe = Probe(factor)
        self._skips_seen = self.guard.record.steps_skipped
        if self._replays:  # the first candidates after a sudden explosion: the same rate
            self._replays -= 1
            self._replay = self._probe
            if self._batches_held is not None:  # the first takes the failing step's batches again
                self.batches.replay(self._batches_held)
                self._with_batch, self._batches_held = self._probe, None

    def _first_replayed(self, probe: Probe) -> None:
        """The replay with the failing step's batches took the step they were handed out for (its first;
        its second where the loop fetches ahead, ``Batches.lead``): it failed on them (the batch
        is reproduced: the next replay trains on other batches), or it did not take them (a loop that
        fetched from other data first: a plain replay)."""
        if not self.batches.replayed():
            say("sentinel: the loop did not take the failing step's batches again: replaying on its next ones")
            self._with_batch = None
            if self._replays:
                self._queue.pop(0)
                self._replays = 0
        elif probe.failed is not None:
            self._reproduced = True
        if not self._reproduced:
            self._bad_fetches = []  # not the batch's doing: nothing to read in it

    def _go_on_unchanged(self) -> None:
        """The same rate trained from the restored state: the explosion was the batch's (the script's
        loop has moved past it) or a one-off. Training goes on from where the replay got to, the rate
        as it was."""
        trigger, probe, guard = self._trigger, self._probe, self.guard
        assert trigger is not None and probe is not None
        self._probes.append(probe)
        probed = self._probed(trigger)
        self._trigger = self._probe = self._replay = None
        self._queue, self._ends = [], {}
        guard.rewind.frozen = False
        guard.rewind.forget_after(self._snapshot.next_step)
        guard.undone_before(self.live_from)
        self.factor, self.ceiling = trigger["in_force_before"]  # the rate was not at fault: as it was
        self.covered = trigger["covered_before"]
        decision = self._decision(trigger, probed, probe.factor)
        decision["outcome"] = "bad_batch" if self._reproduced else "transient"
        records = False
        if self._reproduced and self._bad is not None:
            self.batches.skip.update(self._bad["fingerprints"])  # met again at a later pass: passed over
            # Its non-finite values, in a few records where the batches trained since hold none, are corrupt
            # records: wherever a shuffle puts them at a later pass, the batch that holds them is passed over too.
            records = self._corrupt_records(trigger)
            decision["batch"] = {**self._bad, "nonfinite": True} if records else self._bad
            if records:
                self.batches.corrupt_records_in(f.dataset for f in self._bad_fetches)
        self._bad_fetches = []
        self.decisions.append(decision)
        averaged = self._restart_averages(decision)
        head = (f"sentinel: rolled back {decision['steps_lost']} steps to step {decision['restored_step']}; "
                f"{decision['rule']} at step {decision['step']}")
        if self._reproduced:
            where = (f" (batch {self._bad['index']} of pass {self._bad['epoch']} over the training data)"
                     if self._bad else "")
            also = ("; it holds non-finite values the batches trained after it do not: any later batch that holds "
                    "them is passed over too" if records else "")
            say(f"{head} came again with that step's batches{where} and not with the next {probe.steps}: a bad "
                f"batch, skipped{also}; going on unchanged{averaged}")
        else:
            tried = "with that step's batches, then " if self._with_batch is not None else ""
            say(f"{head}: the same rate trained from there {tried}for {probe.steps} steps: "
                f"{'a one-off' if self._with_batch is not None else 'the batch or a one-off'}, going on unchanged"
                f"{averaged}")
        guard.sentinel.rolled_back(decision)

    def _corrupt_records(self, trigger: dict[str, Any]) -> bool:
        """Whether the bad batch's non-finite values are corrupt records (``batches.corrupt_records``), read
        against the batches held of the steps after the failing one (the replay's, on the next batches)."""
        after = [f for f in self.batches.trained_after(trigger["finding"]["step"])
                 if all(f.batch is not bad.batch for bad in self._bad_fetches)]
        return corrupt_records(self._bad_fetches, after)

    def _probed(self, trigger: dict[str, Any]) -> list[dict[str, Any]]:
        before, factor_before = trigger["rate_before"], trigger["factor_before"]
        return [{"factor": p.factor, "learning_rate": _times(before, p.factor / factor_before),
                 "steps": p.steps, "score": _number(p.score), "failed": p.failed} for p in self._probes]

    def _settle(self) -> None:
        trigger, guard = self._trigger, self.guard
        assert trigger is not None
        finding = trigger["finding"]
        probed = self._probed(trigger)
        self._trigger = None
        self._bad_fetches = []
        guard.rewind.frozen = False
        stable = [p for p in self._probes if id(p) in self._ends]
        chosen = choose(stable, at_minimum=self._edge_may_be_kept(stable))
        if chosen is None:  # nothing lower trained: the finding stands, the job stops as it would have
            self._load(self._snapshot)
            self.live_from = guard.step_number
            self.factor, self.ceiling = trigger["in_force_before"]
            self.covered = trigger["covered_before"]
            decision = self._decision(trigger, probed, None)
            self.decisions.append(decision)
            guard.sentinel.rollbacks.append(decision)  # written with the finding, as the job stops
            guard.rewind.persist_point(self._snapshot)  # where the relaunch resumes, with the copies before it
            together = self.ranks is not None and self.ranks.due  # every rank stops with rank 0, told here
            if self.ranks is not None:
                self.ranks.lead(loaded=True, stop=finding)
            guard.give_up_rollback(finding, together=together)
            return
        self._load(self._ends[id(chosen)])
        self._ends = {}
        guard.rewind.forget_after(self._snapshot.next_step)
        self.live_from = guard.step_number
        guard.undone_before(guard.step_number)
        self.factor = factor = chosen.factor
        self._since = self._watch_since(self._snapshot)
        self.ceiling = chosen.top  # no rate higher than the kept probe trained at: a rising schedule is not
        decision = self._decision(trigger, probed, factor)  # multiplied past what was measured
        self.decisions.append(decision)
        say(f"sentinel: rolled back {decision['steps_lost']} steps to step {decision['restored_step']}; going on "
            f"at {decision['learning_rate_after']:.3g} ({decision['factor']:.3g} x the script's rate), chosen from "
            f"{len(probed)} probes in {decision['seconds']:.2f} s{self._restart_averages(decision)}")
        guard.sentinel.rolled_back(decision)

    def _restart_averages(self, decision: dict[str, Any]) -> str:
        """The job goes on: the script's averaged copies of the rolled-back networks (``AveragedModel``: an
        EMA, SWA) restart from the weights it goes on from (``averages``); their count in ``decision``
        (``averages_restarted``), and words for the line that tells it."""
        rewind = self.guard.rewind
        restarted = averages.restart(rewind.model, rewind.optimizer, rewind.others, rewind.inner)
        if not restarted:
            return ""
        decision["averages_restarted"] = restarted
        return (f"; {restarted} averaged cop{'ies' if restarted > 1 else 'y'} of the network (AveragedModel) "
                f"restart{'' if restarted > 1 else 's'} from its weights at the script's next update")

    def _edge_may_be_kept(self, stable: list[Probe]) -> bool:
        """Whether a probe's five steps may stand for the rest of the run (``choose``'s ``at_minimum``). Not
        with several optimizers (a GAN's: the first one's loss falling faster is not the game going better),
        nor where the script's rate rose since the copy rolled back to (a warm-up's or a one-cycle's climb,
        which the rollback does not replay: that copy's weights took the rates the probes ran at for five
        steps only, without the climb that readies a network for them)."""
        if self.guard.rewind.others:
            return False
        groups = self._snapshot.optimizer.get("param_groups") or [{}]
        then = groups[0].get("lr")
        then = float(then) if isinstance(then, int | float | torch.Tensor) else None
        during = [p.top / p.factor for p in stable if p.top is not None and p.factor > 0]
        return then is not None and bool(during) and max(during) <= then * (1 + 1e-9)

    def _decision(self, trigger: dict[str, Any], probed: list[dict[str, Any]], factor: float | None) -> dict[str, Any]:
        finding = trigger["finding"]
        restored = self._snapshot.next_step
        kept = next((p for p in reversed(probed) if factor is not None and p["factor"] == factor), None)
        return {
            "rule": finding["rule"],
            "step": finding["step"],
            "message": finding["message"],
            "restored_step": restored,
            "steps_lost": finding["step"] + 1 - restored,
            "probe_steps": sum(p["steps"] for p in probed) - (kept["steps"] if kept else 0),
            "learning_rate_before": _number(trigger["rate_before"]),
            "learning_rate_after": _times(trigger["rate_before"], factor / trigger["factor_before"])
            if factor is not None else None,
            "factor": factor,
            "rate_ceiling": _number(self.ceiling) if factor is not None else None,
            "probed": probed,
            "outcome": "recovered" if factor is not None else "stopped",
            "seconds": round(time.perf_counter() - trigger["started"], 3),
            "resumed_at_step": self.guard.step_number,
            "finding": finding,
        }


def choose(stable: list[Probe], *, at_minimum: bool = False) -> Probe | None:
    """The probe to go on with: a notch below the highest rate whose loss fell as low as the lowest
    within the noise; with ``at_minimum``, the edge itself where the rate a notch below learned slower
    beyond the noise (the edge is then the loss's minimum over the rates, not the cliff's brink:
    ``Recovery._edge_may_be_kept`` says where that reading holds).

    Each probe trains on the script's next batches, not the same ones, so two scores differ by the
    batches as much as by the rates; where they cannot be told apart, the higher rate learns faster.
    That rate is the edge of what the network took for a few steps from this state, not what it takes
    for the rest of the run (a rate at the edge oscillates or climbs again tens of steps later), so the
    job goes on at the next lower candidate that trained, as a learning-rate range test does (a step
    below where the loss fell fastest); at the edge itself when no lower one trained, or, with ``at_minimum``,
    when the lower one learned slower.
    """
    top = edge(stable)
    if top is None:
        return None
    lower = [p for p in stable if p.factor < top.factor]
    if not lower:
        return top
    below = max(lower, key=lambda p: p.factor)
    if at_minimum and (below.score > top.score + NOISE_ERRORS * math.hypot(below.error, top.error)
                       or below.above(top)):
        return top
    return below


def edge(stable: list[Probe]) -> Probe | None:
    """The highest rate whose score is within the noise of the lowest score (``NOISE_ERRORS``
    standard errors of the difference) and whose losses are not all above the lowest's (``Probe.above``);
    None when no probe trained."""
    if not stable:
        return None
    best = min(stable, key=lambda p: p.score)
    tied = [p for p in stable if p.score <= best.score + NOISE_ERRORS * math.hypot(p.error, best.error)
            and not p.above(best)]
    return max(tied, key=lambda p: p.factor)


def restore_point(rewind: Any, finding: dict[str, Any]) -> Any:
    """The copy to roll back to for ``finding``: of those taken before its run-up began (its
    ``onset_step``, else the step before it), the newest that kept what the run had learned; None
    when no copy is that old.

    A copy taken before the onset may still be a poor state (a run that drifted up slowly for tens of
    steps). The lowest loss level among the copies (the rewind keeps the copy with the lowest level so
    far, and the first) is the best state known; a copy whose level climbed back less than ``CLIMB`` of
    the way from there to the earliest level held (where the run started, as far as the copies held
    tell) kept what was learned. The first copy's level is the loss of the single step taken from it: it
    counts among the states known (a fine-tune's pretrained state, which its first window may already
    have lost to its rate), not as where the run started, which a window's mean measures. When no
    window's level is below it (or none by the learning check's least fall, ``LEARNED`` of its magnitude,
    and the copy the bound picks began its own step above it: its ``own`` loss) and the copies held before
    the onset are of the run's first ``EARLY`` windows, the run never measured better than where it
    began: the first copy, whatever the bound says
    (one step's loss against windows' means, and no noise to weigh them by: a run-up inflates the
    estimate, so the rule is kept to where going back to the first copy costs a few windows at most). A
    copy taken after it holds nothing learned that the first lacks, and may hold the run-up's harm (the
    calibration corpus's ``rnn-lr3.5-noclip``: 3.20 at its first step, 3.28, 4.34, 5.62, 4.20, then 7.77
    from the copy at step 5, whose window's mean, 4.13, passed the bound; ``transformer-lr1``: 2.82 at its
    first step, 2.26, 2.41, 2.85, 3.53, a window 1.8 % below the first step that hid the rise, and the
    copy at step 5 began at 3.28; where that copy began below the first step, as ``onecycle-lr20``'s at
    1.44 against 2.30 after a window 4.8 % below it, the copy had learned). A copy without a level
    always counts.
    """
    onset = finding.get("onset_step")
    limit = min(finding["step"] - 1, onset if onset is not None else finding["step"] - 1)
    held = [s for s in rewind.kept() if s.next_step <= max(limit, 0)]
    levels = [s.level for s in held if s.level is not None]
    if not levels:
        return held[-1] if held else None
    windows = [s.level for s in held if s.level is not None and s is not rewind.first]
    first = rewind.first
    lowest, start = min(levels), (windows or levels)[0]
    bound = lowest + CLIMB * max(start - lowest, abs(lowest))
    chosen = [s for s in held if s.level is None or s.level <= bound][-1]
    if first is None or chosen is first or not any(s is first for s in held) or first.level is None \
            or not windows or held[-1].next_step - first.next_step > EARLY * rewind.every:
        return chosen
    worse = chosen.own is not None and chosen.own > first.level  # its own step began above the first's
    if min(windows) > first.level or (worse and min(windows) > first.level - LEARNED * abs(first.level)):
        return first  # never better than where it began: the copies after it hold no more, maybe the run-up's harm
    return chosen


def _scaled(optimizer: torch.optim.Optimizer, factor: float) -> list[Any]:
    """Each group's rate times ``factor``; returns the rates the script had set."""
    return _scaled_groups(optimizer.param_groups, factor)


def _unscaled(optimizer: torch.optim.Optimizer, saved: list[Any]) -> None:
    _unscaled_groups(optimizer.param_groups, saved)


def _scaled_groups(groups: list[dict[str, Any]], factor: float) -> list[Any]:
    if factor == 1.0:
        return []
    saved = [group["lr"] for group in groups]
    for group in groups:
        group["lr"] = group["lr"] * factor
    return saved


def _unscaled_groups(groups: list[dict[str, Any]], saved: list[Any]) -> None:
    for group, rate in zip(groups, saved, strict=False):
        group["lr"] = rate


def _number(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _times(rate: float | None, factor: float) -> float | None:
    """``rate`` times ``factor`` as the decision reports it: to 12 significant digits, so that 1.6 x 0.1 reads
    0.16, not 0.16000000000000003 (the rate the optimizer runs at is the product itself)."""
    product = None if rate is None else _number(rate * factor)
    return None if product is None else float(f"{product:.12g}")
