"""The sentinel for any PyTorch loop: ``watch(model, optimizer)`` installs hooks, the loop reports its loss.

A plain loop gains three lines (docs/contracts.md, section 8; docs/library.md)::

    import stabilizer_sentinel as sentinel
    guard = sentinel.watch(model, optimizer)        # configuration from the SageMaker job
    ...
        loss.backward()
        guard.step(loss)                             # before optimizer.step()
        optimizer.step()

Everything else happens in hooks: the optimizer's (stabilizer_sentinel.loops.optimizer_hooks) run the finite check
of the loss and the gradient norm and the configured rules on the gradients about to be applied,
write findings.json and, when a rule stops the job, exit with status 86 and the failure file before
the bad step reaches the weights; then count the step and arm the capture of the next forward pass.
The guard closes itself at interpreter exit and writes the run's summary into findings.json
(stabilizer_sentinel.summary: steps taken, checked and skipped, losses, how the script ended).

The loops people write (each with its test in tests/unit/sentinel/loops/test_loops.py):

- mixed precision with ``torch.amp.GradScaler``: watched; steps the scaler skips are counted and
  judged (stabilizer_sentinel.loops.step_clock); bfloat16 autocast: watched like any loop;
- gradient accumulation (several ``backward()`` per step): watched, the last reported loss is the step's;
- several optimizers (a GAN): ``watch(model, [optimizer_d, optimizer_g])``, the first one's steps
  are the run's, the others' get the finite check (stabilizer_sentinel.loops.optimizer_hooks), and
  the copies hold their state and their parameters (a rollback puts all of them back);
- closures (``optimizer.step(closure)``, LBFGS): watched, checked after the step;
- parameters updated by hand (no optimizer): ``watch(model)``, or ``watch([w, b, ...])`` for bare tensors
  (stabilizer_sentinel.loops.bare_tensors); each backward pass is a step
  (stabilizer_sentinel.loops.step_clock.BackwardClock) and ``guard.step(loss)`` may come before or after it;
- ``torch.compile``d models: watched (the compiled wrapper is unwrapped to name the parameters).

With an optimizer, the guard keeps the last healthy state (``guard.rewind``, stabilizer_sentinel.recovery.rewind) and
writes it as checkpoints at the first finding; ``start = guard.restore()`` after ``watch()`` resumes a
relaunch from the newest checkpoint and returns the step to go on from. Step numbers count the
optimizer steps the loop attempted from ``start_step``; the loss reported since the last step belongs
to the next one.

Under DDP (``torch.distributed`` initialised, world size > 1) every rank checks its own loss and the
(all-reduced) gradients; one 4-integer all-reduce per step tells every rank whether any rank found
something or must stop, so all ranks leave at the same step. Rank 0 alone captures tensors, evaluates
the rules other than the finite check and writes findings.json, with the other ranks' findings.

``watch()`` itself, and how it finds a guard the launcher already attached, are
stabilizer_sentinel.integration.script_watch's. This module must not checkpoint, log training metrics or change
gradients or weights.
"""

from __future__ import annotations

import atexit
import gc
import math
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from stabilizer_contract.catalogue import SENTINEL_CHECKS
from stabilizer_contract.job import EXIT_RULE_STOP, REWIND_EVERY
from stabilizer_sentinel import failsafe
from stabilizer_sentinel.capture import module_hooks
from stabilizer_sentinel.detection import input_blind, watchdog, weight_motion
from stabilizer_sentinel.detection.sentinel import TRIAL, Verdict, build_monitoring
from stabilizer_sentinel.failsafe import closing, shielded
from stabilizer_sentinel.integration import exit_status, log_channel
from stabilizer_sentinel.job_config import JobPaths, StabilizerConfig
from stabilizer_sentinel.loops import distributed, schedules, worker_processes
from stabilizer_sentinel.loops.backward_loss import BackwardLoss
from stabilizer_sentinel.loops.networks import BareTensors, network_of
from stabilizer_sentinel.loops.optimizer_hooks import OptimizerHooks
from stabilizer_sentinel.loops.step_clock import BackwardClock, ScalerWatch, follow_scaler, unfollow
from stabilizer_sentinel.recovery import resume
from stabilizer_sentinel.recovery.batches import Batches
from stabilizer_sentinel.recovery.ranks import Follower, Ranks
from stabilizer_sentinel.recovery.recovery import Recovery
from stabilizer_sentinel.recovery.rewind import Rewind
from stabilizer_sentinel.rules import RuleFinding
from stabilizer_sentinel.say import say
from stabilizer_sentinel.summary import RunRecord, describe, how_it_ended, jsonable, watch_exit

FINITE_CHECK_RULE = "ExplodingTensor"


class Guard(OptimizerHooks):
    """The sentinel attached to one model and one optimizer; see the module docstring."""

    # The step under way's backward passes (``backward_pass``): how its first was read, its passes of other
    # terms as written (``_term``), the mean of its micro-batches' passes.
    _first_pass: BackwardLoss | None = None
    _terms: torch.Tensor | None = None
    _latest_mean: torch.Tensor | float | None = None
    apart = False  # the ranks step apart (Join, a network each, a rank alone): each decides alone, no agreement
    # The ranks' agreements this rank took part in; whether the others may now wait for it in another of the
    # watcher's collectives (inside an agreement, a rollback's exchange or a stop at the step's end); whether it
    # owes them the next agreement, its watcher having stood aside, or was told there another rank's had
    # (``may_leave``, ``meet_ranks``: stabilizer_sentinel.failsafe).
    meetings = 0
    _in_collective = _owes_meeting = _told = False
    _met = False  # the ranks decided at this guard's first check whether they step together (``_meet_first``)
    joinables: tuple[weakref.ref[Any], ...] = ()  # what the script may hand to torch's Join (its DDP wrapper)
    # The watched network's forward passes so far, and their count at the end of the last step (``network_idle``);
    # whether the script let go of the network and the optimizer, and this guard of them (``release``).
    calls = _calls_then = 0
    _schedules: schedules.Schedules | None = None  # the optimizer's schedulers, found when first asked (_held_low)
    released = False
    # The forward passes with gradients through the network's DDP wrapper so far, and their count at the end of
    # the last step (``_stepped_alone``).
    ddp_calls = _ddp_calls_then = 0
    _rows: int | None = None  # the rows of the step's batch: its network's first call's first input (``_called``)
    _superseded = False  # a newer guard writes findings.json (``superseded``)

    def __init__(
        self,
        model: nn.Module | Sequence[torch.Tensor],
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None,
        *,
        config: StabilizerConfig,
        paths: JobPaths,
        start_step: int = 0,
        install_hooks: bool = True,
        rewind_every: int = 0,
        rewind_keep: int = 2,
        integration: str = "library",
        batches: Batches | None = None,
    ) -> None:
        self.model = network_of(model)
        self._handles: list[Any] = []
        self.called_through([model] if isinstance(model, nn.Module) and model is not self.model else [])
        optimizers = [] if optimizer is None else [optimizer] if isinstance(optimizer, torch.optim.Optimizer) \
            else list(optimizer)
        self.optimizer = optimizer = optimizers[0] if optimizers else None
        self.others: list[torch.optim.Optimizer] = []  # checked at their steps; the first one's steps are counted
        self.config = config
        self.paths = paths
        self.rank, self.world_size = distributed.rank_and_size()
        self.primary = self.rank == 0
        # A worker process of the script (stabilizer_sentinel.loops.worker_processes) judges and reports as rank 0
        # does, into its own part of findings.json; like another rank, it stores no tensors and no rewind.
        stores = self.primary and not worker_processes.is_worker()
        self.capture, self.sentinel = build_monitoring(
            self.model,
            sentinel_rules=config.effective_rules,
            sentinel_action=config.effective_action,
            capture=config.effective_capture if stores else {},
            checkpoint_dir=paths.checkpoint_dir,
            tensor_dir=paths.tensor_dir if stores else None,
            failure_file=paths.failure_file,
            write_findings=self.primary,
            only_rules=None if self.primary else (FINITE_CHECK_RULE, *SENTINEL_CHECKS),  # their thresholds too
        )
        self.step_number = start_step
        self.rewind: Rewind | None = None
        self.recovery: Recovery | None = None
        # In-job recovery needs the edges of the optimizer's step (the rate at the step, the step's end):
        # the optimizer's hooks, or for Lightning's callback, which checks and counts its steps itself,
        # the edges alone (hook_step_edges). A script that drives the guard by hand has neither. Every
        # DDP rank decides this alike: rank 0 leads and the others follow, or none recovers in the job.
        in_job_possible = install_hooks or integration == "lightning"
        if optimizer is not None and stores:
            self._keep_states(optimizer, start_step, rewind_every, rewind_keep, in_job_possible=in_job_possible)
        elif optimizer is not None and in_job_possible and self._ranks_recover():
            self.recovery = self.sentinel.recovery = Follower(self)  # rank 0 decides, this rank does the same
        self.batches = self._keep_batches(stores=stores, early=batches)
        self.epoch: int | None = None
        self.phase: str | None = None
        # The step's loss; whether it came from the job's log (the launcher's, where no backward pass gave
        # one); the last step whose loss the script's own tensors gave, finite (``read_finite_loss``).
        self._loss, self._loss_logged, self._finite_loss_at = None, False, -1
        self._passes, self._pass_sum = 0, None  # the step under way's backward passes (backward_pass)
        self._labels: torch.Tensor | None = None
        self._inputs: torch.Tensor | None = None
        self._outputs: torch.Tensor | None = None
        self._deferred_stop = self._reported_once = self._warned_late = False
        # The launcher may read losses from log lines, late by design: no warning there.
        self.warn_when_loss_is_late = integration != "launcher"
        self._closed = False
        # What the summary of findings.json says (stabilizer_sentinel.summary); written at the end, findings or not.
        self.record = RunRecord(integration=integration)
        if integration == "launcher" and self.sentinel.learning.chance is not None:
            self.sentinel.learning.chance.accept_scaled = True  # its losses are the loss nodes' own (backward_pass)
        self.sentinel.summary = self._summary
        watch_exit()
        self.scaler_watch = ScalerWatch(self)
        if self.rewind is not None:
            self.rewind.scaling = self.scaler_watch  # the loss scaler's state goes with each copy
        self.clock: BackwardClock | None = None
        self._hook_steps(optimizers, install_hooks, integration)
        if config.loss_regex is not None or config.objective is not None or log_channel.current() is not None:
            log_channel.install(config.effective_loss_regex, config.objective).attach(self)
        self._hook_forward()
        self.capture.begin_step(self.step_number)
        self.watchdog = watchdog.start(self)  # a thread that notices a loop which stopped taking steps
        self_ref = weakref.ref(self)
        atexit.register(_close_at_exit, self_ref, self.world_size > 1)
        self._shielded()
        exit_status.on_hard_exit(lambda: (guard := self_ref()) is not None and guard.close())  # os._exit: no atexit

    def _shielded(self) -> None:
        """Where the watcher's own code fails, it stands aside (stabilizer_sentinel.failsafe): told here, and with
        several ranks, they meet in this guard's agreement of each step."""
        failsafe.on_failure(self, Guard._stood_aside)
        if self.world_size > 1:
            failsafe.meets_ranks(self)

    def _stood_aside(self, what: str) -> None:
        """The watcher's own code failed (stabilizer_sentinel.failsafe): no more checks, copies or hang watch;
        the loaders as torch has them. What was seen is written at the close, with what failed."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.recovery is not None and self.optimizer is not None:
            self.recovery.set_back(self.optimizer)  # a rate scaled for the step under way: the script's again
        self._owes_meeting = not self._told and self._meets_ranks()
        if self._owes_meeting:
            return  # the hooks stay until this rank met the others at the step's agreement (``meet_ranks``)
        if threading.current_thread() is threading.main_thread():  # not from the watchdog's thread, mid-step
            self._remove_hooks()  # else left in place, each returning at once

    def _meets_ranks(self) -> bool:
        """Whether the ranks meet in this guard's agreement at each step (several ranks that step evenly)."""
        return (self.world_size > 1 and not self.apart and torch.distributed.is_available()
                and torch.distributed.is_initialized())

    def may_leave(self) -> bool:
        """Whether this rank's watcher may stand aside now, its failure told to the others at the next step's
        agreement (stabilizer_sentinel.failsafe): not while they may wait for it in another of the watcher's
        collectives, nor for a loop updated by hand (its steps end in the backward pass: ``BackwardClock``)."""
        return not self._meets_ranks() or (not self._in_collective and self.clock is None)

    def told(self, what: str) -> None:
        """The step's agreement said another rank's watcher failed (``what``): this one stands aside too, owing
        nothing."""
        self._told = True
        failsafe.told(what)

    def meet_ranks(self) -> None:
        """The watcher stood aside on this rank, at a point where its step would be checked: meet the others in
        the step's agreement once, telling them (every rank stands aside there), then let go of the hooks."""
        if not self._owes_meeting:
            return
        self._owes_meeting = False
        distributed.leave(failsafe.failure() or "")
        if threading.current_thread() is threading.main_thread():
            self._remove_hooks()

    def _hook_forward(self) -> None:
        """Read the network's forward passes: whether its output ignores its input (the learning check's
        ``input_blind``), and the captured inputs and predictions where they are configured."""
        self.sentinel.learning.motion = weight_motion.WeightMotion(self.model)
        if not isinstance(self.model, BareTensors):  # a network whose forward passes the script calls
            self.sentinel.learning.input_blind, handle = input_blind.listen(self.model)
            self._handles += [handle, module_hooks.forward_hook(self.model, self._called)]
        if set(self.capture.collections) & {"inputs", "predictions"}:
            self._handles.append(module_hooks.forward_hook(self.model, self._keep_inputs_and_outputs))

    def _hook_steps(self, optimizers: list[torch.optim.Optimizer], install_hooks: bool, integration: str) -> None:
        optimizer = optimizers[0] if optimizers else None
        # The hooks of the optimizer whose steps are the run's, and whether its step is under way
        # (OptimizerHooks._hook_first): none where the loop checks and counts its steps itself.
        self._first_handles: list[Any] = []
        self._in_step = False
        self.inner: list[torch.optim.Optimizer] = []  # stepped inside the first one's step (add_inner)
        self.sentinel.learning.rivals = lambda: bool(self.others)  # another optimizer steps: a GAN's, a critic's
        self.sentinel.learning.held_low = self._held_low  # a constant warm-up's scheduler, read where a finding waits
        if install_hooks and optimizer is not None:
            self.hook_optimizers(optimizers, in_checkpoints=integration != "launcher")
            follow_scaler(optimizer, self)
        elif optimizer is not None and self.recovery is not None:  # Lightning's callback checks and counts
            self.hook_step_edges(optimizer)
        elif install_hooks:  # updated by hand: each backward pass is a step (stabilizer_sentinel.loops.step_clock)
            params = [p for p in self.model.parameters() if p.requires_grad]
            if params:
                self.clock = BackwardClock(self, params, wait_for_loss=integration == "library")

    def _keep_states(self, optimizer: torch.optim.Optimizer, start_step: int, every: int, keep: int, *,
                     in_job_possible: bool) -> None:
        """The last healthy states, copied every few steps and written as checkpoints at the first finding.

        Rank 0 alone keeps them: under DDP every rank holds the same weights. In-job recovery
        (stabilizer_sentinel.recovery.recovery) rolls back to them, copies always taken; under DDP rank 0
        sends the state it rolled back to to the other ranks (stabilizer_sentinel.recovery.ranks).
        """
        in_job = in_job_possible and self.config.effective_recovery == "in_job" and (
            self.world_size == 1 or self._ranks_recover())
        writes = every > 0  # copies kept for the rollback alone are not written as checkpoints at a finding
        every = REWIND_EVERY if in_job and every <= 0 else every
        if every <= 0:
            return
        self.rewind = Rewind(self.model, optimizer, checkpoint_dir=self.paths.checkpoint_dir, every=every, keep=keep)
        self.rewind.writes = writes
        self.sentinel.rewind = self.rewind
        if in_job:
            self.rewind.companion = self.sentinel  # the first copy is taken at the first check (check())
            self.recovery = self.sentinel.recovery = Recovery(self)
            if self.world_size > 1:
                self.recovery.ranks = Ranks(self)  # the other ranks do as this one did

    def _keep_batches(self, *, stores: bool, early: Batches | None) -> Batches | None:
        """The training batches each step took, for a rollback to replay the failing step's
        (stabilizer_sentinel.recovery.batches), and those an earlier attempt found bad, passed over. One
        process only: each DDP rank's batches are its own. ``early``: the launcher's, watching the loaders
        since the script began (the guard attaches at the first optimizer step, after that step's batches
        were fetched); Lightning's callback makes the guard as training starts, before any."""
        replays = isinstance(self.recovery, Recovery) and self.world_size == 1
        skip = self.config.skip_batches if stores and self.world_size == 1 else ()
        nonfinite = self.config.skip_nonfinite_batches and stores and self.world_size == 1
        if not (replays or skip or nonfinite):
            if early is not None:
                early.deactivate()
            return None
        batches = early if early is not None else Batches(skip, skip_nonfinite=nonfinite)
        batches.activate()
        if replays:
            self.recovery.batches = batches
        return batches

    def add_optimizer(self, optimizer: torch.optim.Optimizer, network: nn.Module | None = None) -> bool:
        """Check another optimizer's steps too (stabilizer_sentinel.loops.optimizer_hooks), and keep its state
        with the copies, with its parameters: as ``network`` (the launcher's guess of the module they
        belong to, whose buffers come too) where it holds them all and none of the first optimizer's, else as
        bare tensors; those the
        model holds too are put back with them, at that optimizer's step (Rewind.apart). On another DDP
        rank, the same network receives what rank 0 sends of it."""
        added = super().add_optimizer(optimizer)
        keeper = self.rewind if self.rewind is not None else self.recovery if isinstance(self.recovery, Follower) \
            else None  # rank 0 copies its state; another DDP rank loads what rank 0 sends
        if not added or keeper is None:
            return added
        params = [p for group in optimizer.param_groups for p in group["params"]]
        held = {id(p) for p in network.parameters()} if network is not None else set()
        first = {id(p) for group in self.optimizer.param_groups for p in group["params"]} if self.optimizer else set()
        # Not a network that holds the first optimizer's parameters too (one network, its body under Adam and
        # its head under SGD): its copy, taken at this optimizer's first step, after the first one's, would put
        # the body back as that step left it at every rollback to the first copy (stop 63's recovery hunt).
        if network is not None and {id(p) for p in params} <= held and not held & first:
            keeper.add_other(network, optimizer)
        else:
            keeper.add_other(BareTensors(params), optimizer)
        return True

    def add_inner(self, optimizer: torch.optim.Optimizer) -> bool:
        """An optimizer the first one steps inside its own step (stabilizer_sentinel.loops.optimizer_hooks):
        its state is copied and put back with the first one's; on another DDP rank, loaded from what rank 0
        sends with it."""
        added = super().add_inner(optimizer)
        keeper = self.rewind if self.rewind is not None else self.recovery if isinstance(self.recovery, Follower) \
            else None
        if added and keeper is not None:
            keeper.add_inner(optimizer)
        return added

    def replaced_by(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer``, at its first step, replaces the one whose steps are the run's: it updates
        some of the same parameters (a second phase's optimizer, one the script builds again each epoch),
        and it does not step inside that one's step (an optimizer wrapping another, as Lookahead does,
        steps its inner one there). A GAN's second optimizer updates other parameters: it is added
        (``add_optimizer``). Not while a rollback probes rates. Under DDP every rank decides alike at the
        same step (each builds its optimizer alike; the rollback under way is rank 0's, and the others' exchange
        with it at each step's end, ``ranks.due``): before stop 73 the new one was another optimizer there, the
        first stepped no more, and a rollback its explosion began never went on (the run trained on, not finite).
        """
        if self.optimizer is None or self._in_step or not self._first_handles:
            return False
        if getattr(self.recovery, "probing", False) or getattr(getattr(self.recovery, "ranks", None), "due", False):
            return False
        mine = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        return any(id(p) in mine for group in optimizer.param_groups for p in group["params"])

    def hand_over(self, optimizer: torch.optim.Optimizer) -> None:
        """Watch ``optimizer``'s steps as the run's from this one on (``replaced_by``): the step count and
        the learning check go on, the one replaced is let go, and the copies of the state held, whose
        optimizer state is the replaced one's, give way to copies of the new (the next is taken at this
        step's check)."""
        unfollow(self.optimizer, self)
        self._unhook_first()  # the inner optimizers' hooks too
        self.optimizer = optimizer
        if self.rewind is not None:
            self.rewind.replace_optimizer(optimizer)
        self._hook_first(optimizer, in_checkpoints=False)  # the launcher's level: no keys in its state_dict()
        follow_scaler(optimizer, self)
        if self.watchdog is not None:  # its steps are the loop's beat now
            self.watchdog.follow(optimizer, self._handles)
        self._meet_again()

    def _ranks_recover(self) -> bool:
        """Every DDP rank recovers in the job together (stabilizer_sentinel.recovery.ranks): the process group
        is up, so each step's agreement can carry rank 0's decisions."""
        return (self.world_size > 1 and self.config.effective_recovery == "in_job"
                and torch.distributed.is_available() and torch.distributed.is_initialized()
                and not worker_processes.is_worker())

    # -- what the loop calls
    @shielded
    def step(self, loss: torch.Tensor | float | None, *, labels: torch.Tensor | None = None,
             epoch: int | None = None, phase: str | None = None, logged: bool = False) -> None:
        """Report this step's loss (no host synchronisation); call it before ``optimizer.step()``.

        ``labels`` feeds the ``labels`` collection; ``epoch`` and ``phase`` ("warmup" or "main")
        go into findings so the workflow can tell an explosion during warm-up from a later one.
        ``logged``: the loss is a number the job's log printed (the launcher's, where no backward pass
        gave one), not one of the script's tensors.
        """
        self._loss = loss.detach() if isinstance(loss, torch.Tensor) else loss
        self._loss_logged = logged
        self._labels = labels
        self._reported_once = True
        if epoch is not None:
            self.epoch = epoch
        if phase is not None:
            self.phase = phase
        if self.clock is not None:
            self.clock.loss_reported()

    def backward_pass(self, loss: torch.Tensor, read: BackwardLoss | None = None) -> None:
        """A backward pass of the step under way started from ``loss`` (``read``: how
        stabilizer_sentinel.loops.backward_loss read it).

        The step's loss is the mean over its passes (gradient accumulation: one per micro-batch), on the
        device (no host synchronisation). The launcher reports its losses here. Where that mean is not
        finite, the latest pass's loss stands: an earlier pass whose loss was not finite and whose
        gradients the script threw away (its own guard, skipping the step and zeroing them) is no part of
        this step; had it kept them, the step's gradients are not finite and the finite check finds them.

        A pass from no loss node of ``LOSS_NODES``, after a first pass from one (``_term``), is no
        micro-batch: it is another term of the same objective backwarded on its own (a regularizer, an
        auxiliary loss: ``loss.backward(); (1e-5 * l2).backward()``). It is added as written, in the first
        pass's units, not averaged in, nor scaled back by its own weight (read alone, a 1e-5-weighted L2
        term rose with the weights as the loss it stood for fell).

        A pass at a point a closure optimizer tries inside its step (``at_trial_point``: L-BFGS's line search)
        is no part of the step's loss.
        """
        if self.at_trial_point():
            return
        if self._loss is None or self._passes == 0:
            self._passes, self._pass_sum, self._first_pass, self._terms = 0, loss, read, None
        elif self._term(read):
            assert read is not None and read.written is not None and self._first_pass is not None
            term = read.written.to(loss.device, torch.float32) / self._first_pass.divisor
            self._terms = term if self._terms is None else self._terms + term
            self._loss = self._latest_mean + self._terms
            if self.clock is not None:
                self.clock.loss_reported()
            return
        else:
            self._pass_sum = self._pass_sum + loss
        self._passes += 1
        self._loss, self._loss_logged = loss, False
        if self._passes > 1:
            mean = self._pass_sum / self._passes
            self._loss = torch.where(torch.isfinite(mean), mean, loss) if isinstance(mean, torch.Tensor) else mean
        self._latest_mean = self._loss
        if self._terms is not None:
            self._loss = self._loss + self._terms
        if self.clock is not None:
            self.clock.loss_reported()

    def _term(self, read: BackwardLoss | None) -> bool:
        """Whether a pass read so is another term of the step's objective, not a micro-batch (``backward_pass``):
        read from no loss node of ``LOSS_NODES``, where the step's first pass was read from one."""
        first = self._first_pass
        if read is None or read.written is None or first is None:
            return False
        return first.loss_node is not None and read.loss_node is None and read.kind != first.kind

    has_loss = property(lambda self: self._loss is not None)

    def take_loss(self) -> torch.Tensor | float | None:
        """The loss reported for the step about to be counted without a check (a skipped step), as the
        checks read it (``_objective``), cleared, with its batch's rows."""
        loss, self._loss, self._passes, self._rows = self._objective(), None, 0, None
        return loss

    def pass_loss(self) -> torch.Tensor | float | None:
        """The loss the backward passes of the step under way reported (their mean), as backwarded, cleared:
        for the guard of a new phase whose first step's passes this one read (the launcher's ``_new_phase``)."""
        loss, self._loss, self._passes = self._loss, None, 0
        return loss

    def eval_loss(self, loss: float | torch.Tensor, *, labels: torch.Tensor | None = None,
                  outputs: torch.Tensor | None = None) -> Verdict:
        """Record an evaluation after the last optimizer step (the ``Overfit`` rule reads these)."""
        return self._eval_loss(loss, labels=labels, outputs=outputs) or Verdict()  # once stood aside: nothing

    @shielded
    def _eval_loss(self, loss: float | torch.Tensor, *, labels: torch.Tensor | None,
                   outputs: torch.Tensor | None) -> Verdict:
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        self.record.evaluations.append((max(self.step_number - 1, 0), value))
        verdict = self.sentinel.after_eval(
            max(self.step_number - 1, 0), epoch=self.epoch, phase=self.phase, learning_rate=self.learning_rate,
            loss=value, labels=labels, outputs=outputs,
        )
        if verdict.stop:
            if self.world_size > 1:
                self._deferred_stop = True  # evaluations may run on rank 0 alone: agree at the next step
            else:
                self._stop(f"after the evaluation at step {max(self.step_number - 1, 0)}")
        return verdict

    def check(self) -> Verdict:
        """Check the gradients of the step about to be applied (the hooks call this; so may a framework)."""
        step = self.step_number
        if (not self.apart and self.world_size > 1
                and distributed.uneven([ref() for ref in self.joinables] + [self.optimizer])):
            self._step_apart()
            if failsafe.failure() is not None:
                return Verdict()
        if self.batches is not None:
            self.batches.checked(step)
        self.take_first_copy()
        verdict = self.sentinel.after_backward(
            step, epoch=self.epoch, phase=self.phase, learning_rate=self.learning_rate, loss=self._objective(),
            inputs=self._inputs, labels=self._labels, outputs=self._outputs, rows=self._rows,
        )
        self._loss = self._labels = self._inputs = self._outputs = self._rows = None
        self._passes = 0
        history = self.sentinel.loss_history
        loss = history[-1][1] if history and history[-1][0] == step else None
        if loss is not None and math.isfinite(loss) and not self._loss_logged:
            self._finite_loss_at = step
        self._loss_logged = False
        self.record.observed(step, loss)
        self.record.steps_idle = self.sentinel.steps_idle
        if self.recovery is not None:
            if self.rewind is not None:
                self.rewind.measured(step, loss)
            self.recovery.observed(loss)
        stop = verdict.stop or self._deferred_stop
        together = self.world_size > 1 and torch.distributed.is_initialized() and not self.apart
        if together and not self._met:
            together = self._meet_first()
        elif together and self._stepped_alone():
            say(f"sentinel: rank {self.rank} stepped its network through the module inside its DDP wrapper, not "
                "the wrapper: its gradients are its own; each rank is watched alone (no agreement at each step, "
                "nothing rolled back in the job)")
            self._step_apart("this rank stepped its network without DDP")
            together = False
        if together:
            self._in_collective = True  # until the step's end, where a rollback's exchange or a stop follows it
            stop = distributed.agree(self, verdict, stop)
            self.meetings += 1
            ranks = getattr(self.recovery, "ranks", None)
            self._in_collective = stop or (ranks is not None and ranks.due)
        if stop:
            self._stop(f"at step {step}", together=together)
        return verdict

    def _meet_first(self) -> bool:
        """At this guard's first check with several ranks: whether they step together (``distributed.step_together``);
        where they do not, each rank decides alone from here, as under torch's ``Join`` (``_step_apart``)."""
        self._met = True
        return self._meet(distributed.MEETING, "their first step")

    def _meet_again(self) -> None:
        """An optimizer took over the run's steps (``hand_over``) on ranks that stepped together: whether every rank
        took it over (each builds its next phase's optimizer alike, at the same step), decided as at the first
        check, or rank 0 alone did (a head it fine-tunes alone once the ranks' training is done, the others at a
        barrier). Stop 74: rank 0's steps then waited in the agreement for ranks that never stepped, and the job
        hung (12 s unwatched)."""
        if self._met and not self.apart and self.world_size > 1 and torch.distributed.is_initialized():
            self._meet(distributed.next_meeting(), "the first step of a new optimizer")

    def _meet(self, meeting: str, where: str) -> bool:
        decision = distributed.step_together(self.world_size, self.rank, self._replica(), meeting)
        if decision == distributed.TOGETHER:
            return True
        why = (f"did not all reach {where} within {distributed.MEET_SECONDS:.0f} s of each other"
               if decision == distributed.APART else
               f"reached {where} with different networks (weights, gradients or optimizer settings)")
        say(f"sentinel: the ranks {why}: each rank is watched alone (no agreement at each step, nothing rolled back "
            "in the job)")
        self._step_apart()
        return False

    def _replica(self) -> str:
        """This rank's network as the ranks compare it at their first check (``distributed.replica``); without its
        gradients for a loop updated by hand, checked as its backward pass ends, before DDP averaged them."""
        gradients = self.clock is None
        if self.optimizer is not None:
            groups = self.optimizer.param_groups
            return distributed.replica((p for group in groups for p in group["params"]), groups, gradients=gradients)
        return distributed.replica(self.model.parameters() if self.model is not None else (), gradients=gradients)

    def called_through(self, wrappers: Sequence[nn.Module]) -> None:
        """The script calls the network through ``wrappers`` (DDP's): one may be handed to torch's ``Join``, and
        a DDP wrapper's forward passes are counted (``_stepped_alone``)."""
        self.joinables = (*self.joinables, *(weakref.ref(wrapper) for wrapper in wrappers))
        for wrapper in wrappers:
            if isinstance(wrapper, nn.parallel.DistributedDataParallel):
                self._handles.append(module_hooks.forward_hook(wrapper, self._called_through_ddp))

    def _called_through_ddp(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if torch.is_grad_enabled():
            self.ddp_calls += 1

    def _stepped_alone(self) -> bool:
        """Whether this rank's step was its own, on ranks that stepped together through DDP until now: the network
        called with gradients since the last step, its DDP wrapper not (``model.module(x)``: no gradient was
        averaged). Rank 0 going on alone after the ranks' training, the others at a barrier, with the same
        optimizer (stop 74's hunt: its steps waited in the agreement of each step and the job hung, 17 s
        unwatched). Never where no call is seen (a compiled network's calls run no hook)."""
        return (self.ddp_calls > 0 and self.ddp_calls == self._ddp_calls_then
                and self.calls != self._calls_then)

    def _step_apart(self, why: str = "the script's Join (uneven inputs) began") -> None:
        """The script handed its network or optimizer to torch's ``Join`` (uneven inputs): a rank out of batches
        steps no more and would wait forever in this guard's agreement of each step (stop 68's harm hunt: a
        watched DDP run under ``Join`` hung where it ran in 26 to 47 s unwatched). From this step on each rank decides
        alone: a stop is its own (torchrun then ends the others), and nothing is rolled back in the job. Every
        rank comes here at the same step, the first after the script built its ``Join`` (the ranks stepped
        together until then). Where a rollback's rate is in force or a rollback is under way, which the ranks
        could no longer carry together, the watcher stands aside on every rank instead, the script's own rates
        back. Also where one rank stepped alone (``_stepped_alone``, ``why`` says so): that rank comes here, at
        its first step alone."""
        self.apart = True
        recovery = self.recovery
        if recovery is None:
            return
        if recovery.probing or recovery.factor != 1.0 or recovery.ceiling is not None:
            failsafe.stand_aside(RuntimeError(f"{why} while an in-job rollback's rate was in force; the ranks can "
                                              "no longer agree at each step"))
            return
        self.recovery = self.sentinel.recovery = None

    def take_first_copy(self) -> None:
        """The state the script starts training from (after any checkpoint it loaded), once: an explosion in the
        first steps rolls back to it. Taken at the first step's check, before its update; a ``step(closure)`` is
        checked after its update, and its first copy is taken as it begins (stop 70's hunt: a rollback "to step
        0" of a closure loop, Lightning's automatic optimisation under the launcher, loaded the weights and the
        Adam state after step 0's update, which a rate 1,000 times too high had wrecked, three times over)."""
        rewind = self.rewind
        if self.recovery is not None and rewind is not None and rewind.first is None and not rewind.frozen:
            first = rewind.try_take(self.step_number)
            if first is not None:
                rewind.keep(first)

    def step_begins(self) -> None:
        """Before the step's check: where the script gave its optimizer a group since the last step, the copies
        go and one is taken of the state this step starts from (``Rewind.before_step``)."""
        if self.rewind is not None:
            self.rewind.before_step(self.step_number)

    def advance(self) -> None:
        """Count the optimizer step just taken, copy the state when due and arm capture for the next forward pass."""
        self.record.steps_taken += 1
        self.step_ended()

    def step_ended(self) -> None:
        """The optimizer step just taken ended (``advance`` counted it, or the loop did: ``check_counted``):
        the next one's number, a copy of the state when due, a rollback under way goes on, capture armed."""
        self.step_number += 1
        self._calls_then, self._ddp_calls_then = self.calls, self.ddp_calls
        if self.rewind is not None:
            self.rewind.after_step(self.step_number)
        if self.recovery is not None:
            self.recovery.after_step()
        self._in_collective = False
        if not self._closed:
            self.capture.begin_step(self.step_number)

    def read_finite_loss(self, step: int) -> bool:
        """Whether step ``step`` was checked with a finite loss the script's own tensors gave (its backward
        pass's scalar, or ``step(loss)``), not a number read from the log."""
        return self._finite_loss_at == step

    def undone(self, step: int) -> bool:
        """Whether a rollback undid step ``step`` (in-job recovery), or a rate range test that blew up, told, goes
        on (its non-finite losses are the test's, which the script meant: stabilizer_sentinel.detection.sentinel)."""
        return (self.recovery is not None and step < self.recovery.live_from) or self.sentinel.sweeping

    def undone_before(self, step: int) -> None:
        """A rollback undid the steps before ``step`` (the lineage goes on from a copy): a non-finite loss
        the job's log printed for one of them is no longer the run's (the summary's ``log_loss``)."""
        log = self.record.log
        if log is not None and log.nonfinite_step is not None and log.nonfinite_step < step:
            log.nonfinite_step = None

    def phase_ended(self) -> None:
        """The script's next phase begins (the launcher lets this guard go, stabilizer_sentinel.integration.
        launcher_hooks): a rollback still probing is recorded as it stands, as at the run's end
        (``Recovery.close``). Stop 70's hunt: a trial the script abandoned mid-probe left no record of its
        rollback, its printed result the probe's."""
        if self.recovery is not None:
            self.recovery.close("the script's next training began")

    def _held_low(self) -> bool:
        """Whether a scheduler of the optimizer holds its rate at a constant warm-up's fraction now and raises it
        later (stabilizer_sentinel.loops.schedules); found again for an optimizer that replaced the first."""
        if self.optimizer is None:
            return False
        if self._schedules is None or not self._schedules.of(self.optimizer):
            self._schedules = schedules.Schedules(self.optimizer)
        return self._schedules.held_low()

    def network_idle(self) -> bool:
        """Whether the watched network was called with gradients on (at least once) but not since its optimizer's
        last step: a backward pass now is another network's (the launcher's ``_phase_over``); a pass under
        ``no_grad`` (an evaluation, a trial's score) is no part of any. Never where no call is seen (a loop over
        bare tensors; a compiled network, whose calls run no hook)."""
        return self.calls > 0 and self.calls == self._calls_then and self.record.steps_taken > 0

    def _called(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if torch.is_grad_enabled():
            self.calls += 1
            first = inputs[0] if isinstance(inputs, tuple) and inputs else None
            if self._rows is None and isinstance(first, torch.Tensor) and first.dim() >= 1:
                self._rows = int(first.shape[0])

    def release(self) -> None:
        """The script let go of the network and the optimizer this guard watched (a search's trial function
        returned, and the next trial trains): let go of them too, and of every copy, batch and tensor of theirs
        the watcher held, before the next network's first backward pass. Held until the next optimizer's first
        step, the two networks and their optimizers' state were on the device together, where unwatched the
        first was freed (stop 75, ``python -m stabilizer.bench.search_memory``: 1.56-1.59 times the unwatched
        peak, 1.08-1.23 since). What was seen stays: the phase's decisions and checks, its summary written at
        exit where no next phase follows. A released guard is handed nothing more (the launcher keeps the next network's
        passes until its guard attaches); its ``model`` is an empty module, its ``optimizer`` None."""
        self.phase_ended()
        self._remove_hooks()
        if self.watchdog is not None:
            self.watchdog.stop()
        self.released = True
        self.model, self.optimizer, self.others, self.inner = nn.Module(), None, [], []
        self.recovery = self.rewind = self.clock = self.batches = None
        self._loss = self._pass_sum = self._first_pass = self._terms = self._latest_mean = None
        self._labels = self._inputs = self._outputs = None
        self._passes = 0
        self.sentinel.release()

    def in_job_decisions(self) -> list[dict[str, Any]]:
        """This guard's in-job decisions so far (findings.json's ``rollbacks``), earlier phases' first."""
        return list(self.sentinel.rollbacks)

    def carry_decisions(self, decisions: list[dict[str, Any]]) -> None:
        """The in-job decisions of the phase before this guard's (a sweep's first model, let go by the launcher):
        findings.json keeps them, before this guard's own."""
        self.sentinel.rollbacks[:0] = decisions

    def give_up_rollback(self, finding: dict[str, Any], *, together: bool = False) -> None:
        """In-job recovery found no lower rate that trains: the finding stands, the job stops (a relaunch
        follows); ``together``: every DDP rank stops here at once (rank 0 told them)."""
        if self.rewind is not None:
            self.rewind.persist(before_step=finding["step"])
        self.sentinel.adopt([finding])
        self._stop(f"at step {finding['step']} (no lower rate trained in the job)", together=together)

    def restore(self) -> int:
        """Load the newest checkpoint into the model and optimizer; returns the next step to run (0: none).

        The job's own checkpoint directory first, then the ``resume`` channel (stabilizer_sentinel.recovery.resume); one
        that does not fit is reported in one line and left alone. Calling it tells the workflow that a
        relaunch of this script resumes (summary ``restores``).
        """
        self.record.restores = True
        restored = resume.restore(self.paths, self.model, self.optimizer)  # the load hook sets the step count
        if restored is None:
            return 0
        source, next_step = restored
        self.resumed(resume.started_from(source, self.paths), next_step)
        return next_step

    # -- what a caller tells the guard (model/train.py, the Lightning callback, the launcher, watch())
    def restores_checkpoints(self, extra: dict[str, Any] | None = None) -> None:
        """The script loads the newest checkpoint itself at its start, so a relaunch of it resumes (the
        summary's ``restores``); ``extra`` goes into every checkpoint the rewind writes."""
        self.record.restores = True
        if extra is not None and self.rewind is not None:
            self.rewind.extra = extra

    def lineage(self) -> dict[str, Any]:
        """Where the learning check stands: what a later guard of the same network goes on from (``continues``)."""
        return self.sentinel.learning.state_dict()

    def continues(self, lineage: dict[str, Any]) -> None:
        """This network trained before in this process, under another guard whose learning check stood at
        ``lineage`` (``lineage()``): it is judged against the start of that training, as a resumed run is."""
        self.sentinel.learning.load_state_dict(lineage)

    def trained_unwatched(self, losses: list[float],
                          began: tuple[dict[str, Any], dict[str, Any]] | None = None) -> None:
        """This network trained ``len(losses)`` steps before this guard attached, at those losses (another
        optimizer's, under the launcher's guard of the phase before): judged against the start they measured.
        ``began``: the state it began those steps from (``held_other`` of that guard), where known: with in-job
        recovery, the first copy, to which a divergence found in those steps rolls back."""
        if began is not None and self.recovery is not None and self.rewind is not None:
            self.rewind.begin_from(began, self.step_number - len(losses), losses[0] if losses else None)
        self.sentinel.trained_unwatched(losses)

    def held_other(self, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The state of another optimizer (and its network) this guard's copies hold (``Rewind.held_other``)."""
        return self.rewind.held_other(optimizer) if self.rewind is not None else None

    def trained_again(self, before: int) -> None:
        """This network is one trained ``before`` times already in this process, each from its start (a search's
        trials, a cross-validation's folds: stabilizer_sentinel.integration.launcher_hooks); the summary's
        ``trained_before``; each finding of it says so (findings.json's ``told``)."""
        self.record.trained_before = before
        self.sentinel.told = TRIAL

    def driven_by(self, driver: str) -> None:
        """This network's training is called by ``driver``, a package that trains several runs to compare them (a
        search, a cross-validation: stabilizer_sentinel.integration.launcher_hooks, ``search_driver``): each
        finding of it says so (findings.json's ``told``), as a search's later trials' do."""
        self.sentinel.told = f"a trial of a search: {driver} calls its training and compares its trials"

    def resumed(self, started_from: str | None, next_step: int | None = None) -> None:
        """The run started from ``started_from`` (a checkpoint, named in the summary); with
        ``next_step``, its steps count on from there."""
        if started_from is not None:
            self.record.started_from = started_from
        if next_step is not None:
            self.begin_step(next_step)

    @shielded
    def begin_step(self, step: int) -> None:
        """The loop's own count says step ``step`` begins (Lightning's ``trainer.global_step``)."""
        self.step_number = step
        self.capture.begin_step(step)

    def check_counted(self, step: int) -> Verdict:
        """Check step ``step`` of a loop that counts its steps itself, and count it as taken."""
        self.step_number = step
        verdict = self.check()
        self.record.steps_taken += 1
        return verdict

    @closing
    def failed(self, exception: BaseException) -> None:
        """The loop raised ``exception``: close with how it ended (stabilizer_sentinel.summary.describe)."""
        ended, self.record.exception = describe(exception)
        self.close(status=ended)

    def external_finding(self, step: int, tensor: str, value: float, message: str, *, source: str,
                         rule: str = FINITE_CHECK_RULE) -> None:
        """A finding from outside the per-step check (the log, the loss scaler): ExplodingTensor unless ``rule``."""
        context = {"epoch": self.epoch, "phase": self.phase, "learning_rate": self.learning_rate}
        verdict = self.sentinel.report(RuleFinding(rule, step, tensor, jsonable(value), message), context,
                                       source=source)
        if verdict.stop and source == "log":
            self._deferred_stop = True  # printed from anywhere (another thread): stopped at the next step
        elif verdict.stop:
            self._stop(f"at step {step}")

    def stop_if_deferred(self, step: int) -> None:  # where no check runs (a skipped step)
        if self._deferred_stop:
            self._stop(f"at step {step}")

    def log_nonfinite(self, value: float) -> None:
        """The job's log reported a non-finite loss (stabilizer_sentinel.integration.log_channel)."""
        step = max(self.step_number - 1, 0)
        self.external_finding(step, "losses/loss", value, f"the job's log reported a non-finite loss ({value}) "
                              f"at step {step}", source="log")

    def _summary(self, ended: str | None) -> dict[str, Any]:
        line = self.record.exception or how_it_ended().exception
        return self.record.summary(self.sentinel.learning, ended=ended,
                                   exception=line if ended in ("exception", "interrupted") else None)

    @closing
    def close(self, status: str | None = None) -> None:
        """Remove the hooks, write the summary and finish the tensor store (``training_end.json``); idempotent.

        ``status`` defaults to how the script ended: "exception" or "interrupted" after an uncaught
        exception (stabilizer_sentinel.summary.how_it_ended), else "completed".
        """
        if self._closed:
            return
        if self._superseded:  # the newer guard's findings.json is the job's
            self.discard()
            return
        status = status or how_it_ended().status or "completed"
        self._closed = True
        self._remove_hooks()
        if self.recovery is not None:
            self.recovery.close()
            self.sentinel.recovery = None  # a finding at the end (a run that never learned) is the run's verdict
        if self.scaler_watch.scaler is not None:
            self.scaler_watch.read_scale(judge=False)
        self.sentinel.close(status=status)

    def superseded(self) -> None:
        """A newer guard watches the script's next training into the same findings.json
        (stabilizer_sentinel.integration.script_watch, ``supersede``): this one goes on checking its own steps, and
        writes nothing at its close."""
        self._superseded = True

    def discard(self) -> None:
        """Remove the hooks and write nothing, now or at exit: another guard watches this run."""
        self._closed = True
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        if self.batches is not None:
            self.batches.deactivate()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.clock is not None:
            self.clock.remove()
        if self.optimizer is not None:
            unfollow(self.optimizer, self)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def learning_rate(self) -> float | None:
        if self.optimizer is None or not self.optimizer.param_groups:
            return None
        if self.recovery is not None:  # the rate the step runs at: the script's, times a rollback's factor
            return self.recovery.rate(self.optimizer)
        lr = self.optimizer.param_groups[0].get("lr")
        return float(lr) if lr is not None else None

    def _objective(self) -> torch.Tensor | float | None:
        """The step's loss as the checks read it: negated where every group of the optimizer maximizes
        (``maximize=True``: the scalar backwarded is an objective that rises as the run learns)."""
        groups = self.optimizer.param_groups if self.optimizer is not None else []
        if self._loss is None or not groups or not all(group.get("maximize", False) for group in groups):
            return self._loss
        return -self._loss

    @property
    def findings(self) -> list[dict[str, Any]]:
        return self.sentinel.findings

    # -- hooks
    def _keep_inputs_and_outputs(self, module: nn.Module, inputs: tuple, output: Any) -> None:
        if module.training:
            first = inputs[0] if inputs else None
            self._inputs = first.detach() if isinstance(first, torch.Tensor) else None
            self._outputs = output.detach() if isinstance(output, torch.Tensor) else None

    # -- stopping
    def _stop(self, when: str, *, together: bool = False) -> None:
        """Stop the job; ``together``: every DDP rank stops at this step (they agreed), and each waits for
        the others before it exits (Sentinel.exit_for_rule_stop)."""
        finding = self.sentinel.stop_finding
        # The finding's own line (``sentinel: <rule> at step N: <why>``) was printed as it was found: this one
        # says what became of it, without the reason a third time (the failure file holds it).
        what = finding["rule"] if finding else "another rank stopped"
        say(f"sentinel stopped the job {when}: {what} (exit status {EXIT_RULE_STOP})")
        self._closed = True
        self._remove_hooks()
        # exit status 86, failure file "RuleStop: ..."
        self.sentinel.exit_for_rule_stop(leave=torch.distributed.barrier if together else None, echo=False)


@closing
def _close_at_exit(guard_ref: weakref.ref, distributed: bool) -> None:
    """Close the guard at the interpreter's exit; in a distributed run, then collect what is garbage while the
    interpreter is whole. gloo on torch 2.13.0 aborts a rank now and then when the run's collectives are freed by
    the interpreter's own teardown instead ("terminate called without an active exception", after the script's
    last line; torchrun then fails the job): 7 of 80 runs of a DDP loop under load, with or without the
    sentinel; 0 of 50 with this collection, the script collecting nothing itself (docs/library.md, "DDP")."""
    guard = guard_ref()
    if guard is not None:
        guard.close()
    del guard
    if distributed:
        gc.collect()
