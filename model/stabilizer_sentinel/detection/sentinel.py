"""The in-job sentinel: a cheap finite check every step, the configured rules at save steps, findings.

Every training step, whatever the rule list, the sentinel checks that the loss and the total
gradient norm are finite and that the loss is learning (``stabilizer_sentinel.detection.health``): one fused norm
over all gradients and one host synchronisation for the two scalars, no per-parameter
synchronisation. At steps where capture saved something it evaluates the configured rules
against a ``MemoryTrial``. When a rule fires it writes ``<checkpoint dir>/findings.json``
(docs/contracts.md section 2) and, with action ``stop``, tells the training loop to stop before the
optimizer applies the bad step; ``exit_for_rule_stop`` then ends the process with status 86 and a
failure file starting ``RuleStop:`` (section 1).

Training loops normally reach it through ``stabilizer_sentinel.integration.script_watch.watch`` (hooks do the calls
below); this is the hand-wired form (``capture`` and ``sentinel`` come from ``build_monitoring``)::

    capture.begin_step(step)
    logits = model(x); loss = criterion(logits, y); loss.backward()
    verdict = sentinel.after_backward(step, epoch=epoch, phase=phase, learning_rate=lr, loss=loss,
                                      grad_norm=grad_norm, inputs=x, labels=y, outputs=logits)
    if verdict.stop:
        sentinel.exit_for_rule_stop()   # never returns
    optimizer.step()

This module must not checkpoint, log training metrics or change the model.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from stabilizer_contract.catalogue import DIVERGING, NOT_LEARNING
from stabilizer_contract.job import ENDED_RULE_STOP, EXIT_RULE_STOP, RULE_STOP_PREFIX
from stabilizer_sentinel import failsafe
from stabilizer_sentinel.capture import profiler as system_profiler
from stabilizer_sentinel.capture.capture import Capture, parse_capture
from stabilizer_sentinel.capture.trial import MemoryTrial
from stabilizer_sentinel.detection.health import LearningCheck, default_finite_rule, rate_sweep, run_up, sweep_goes_on
from stabilizer_sentinel.loops import distributed, gradients, worker_processes
from stabilizer_sentinel.rules import ExplodingTensor, Rule, RuleConfigError, RuleFinding, parse_rule_list
from stabilizer_sentinel.rules.base import unmatched_findings
from stabilizer_sentinel.say import say
from stabilizer_sentinel.summary import jsonable as _jsonable

FAILURE_PREFIX = RULE_STOP_PREFIX
FINDINGS_FILE = "findings.json"
SWEPT = (DIVERGING, "ExplodingTensor")  # what a rate range test ends in by design (``_entry``)
# Why a finding was told and nothing done (findings.json's ``told``): the script meant it, and the workflow judges
# the run on its evidence, not on the finding (docs/contracts.md).
RANGE_TEST = "a rate range test: the script raises its rate at every step until the loss blows up, by design"
TRIAL = "a trial of a search: the network built again from its start, the script compares its trials"
ACTIONS = ("stop", "notify")
HISTORY = 50
# Profiler rules read samples, not saved tensors: evaluated every this many steps.
SYSTEM_RULES_EVERY = 10
# A run that never learned while its parameters moved this far from where they began (in their norm there) had
# steps too large, not too small (``Sentinel._moved_far``). Measured on 9 kinds of training (a CNN, a GRU, a
# transformer, a graph network, autoencoders, triplet, multitask, contrastive, Huber) at step 100: rates 1e-5,
# which never learn, moved them 0.0021 to 0.0086; rates 1e4 to 1e7 times too high, which killed them, 1.0 to 7;
# healthy rates 0.27 to 1.4.
MOVED = 0.5
# ... and further than a search moves them in as many steps: ``SEARCH`` at 100 steps, growing as the square root of
# the steps since the first copy (a random walk's distance). A rate that kills throws the weights out in its first
# steps; a network searching a plateau at a healthy rate wanders, and crossed ``MOVED`` late (stop 67, the verdict
# hunts' networks that sit at their chance level before they learn or never do, under in-job recovery: an LSTM
# recalling a token across ten steps 0.54 at step 99, a GRU adding two marked numbers 0.85 at step 274, an LSTM
# asked across a delay too long 0.50 at step 159, an MLP on a parity's random labels 0.50 at step 589, each read as
# killed and rolled back to its start; the networks killed: the digits' autoencoder at rate 1 44.7 at step 99, a
# recurrent classifier of the digits at its rate 100 relaunched lower 0.97 at step 31, a small GPT 1.32 at step 60).
SEARCH = 0.75
# The learning check's parts that backward and forward passes feed as they run: the objects the listeners hold,
# never copied into a rollback's state nor put back from one (what they saw of the passes rolled back stays seen).
LISTENING = ("chance", "term", "makeup", "surrogate", "input_blind", "motion", "killed", "rivals", "held_low")


@dataclass
class Verdict:
    """What the training loop must do after a step."""

    stop: bool = False
    findings: list[dict[str, Any]] = field(default_factory=list)


class Sentinel:
    # A divergence the learning check found in the losses of steps trained before this sentinel watched them
    # (``trained_unwatched``), reported at its first watched step.
    _unwatched_divergence: RuleFinding | None = None

    def __init__(
        self,
        model: nn.Module,
        rules: Iterable[Rule],
        *,
        action: str = "stop",
        capture: Capture,
        memory: MemoryTrial,
        checkpoint_dir: str | Path,
        failure_file: str | Path | None = None,
        write_findings: bool = True,
    ) -> None:
        if action not in ACTIONS:
            raise RuleConfigError(f"sentinel_action: expected one of {list(ACTIONS)}, got {action!r}")
        self.model = model
        self.rules = list(rules)
        self.action = action
        self.capture = capture
        self.memory = memory
        self.findings_path = Path(checkpoint_dir) / FINDINGS_FILE
        self.failure_file = Path(failure_file) if failure_file is not None else None
        # Under DDP only rank 0 writes findings.json; the other ranks hand theirs to it
        # (stabilizer_sentinel.integration.guard).
        self.write_findings = write_findings
        self._unwritable = False  # findings.json could not be written once: said then, not again
        self._params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        # The finite check runs always: with the list's ExplodingTensor, or with a default one.
        self._exploding = [rule for rule in self.rules if isinstance(rule, ExplodingTensor)] or [
            default_finite_rule(memory)
        ]
        # Thresholds from the run, overridden by the list's NotLearning / Diverging entries.
        self.learning = LearningCheck.configured(self.rules)
        self.learning.killed = self._killed  # a run whose weights went far is judged on its way (``_moved_far``)
        self._last: tuple[int, dict[str, Any]] | None = None  # step and context of the last step seen
        self._fired: set[int] = set()
        self._findings: list[dict[str, Any]] = []
        self.loss_history: deque[tuple[int, float]] = deque(maxlen=HISTORY)
        self._began = False  # a step had a loss or gradients other than exactly zero (after_backward)
        self.steps_idle = 0  # steps before that whose loss and gradients were exactly zero
        self.grad_norm_history: deque[tuple[int, float]] = deque(maxlen=HISTORY)
        self.rate_history: deque[tuple[int, float | None]] = deque(maxlen=HISTORY)
        self.first_nonfinite_layer: str | None = None
        self.stop_finding: dict[str, Any] | None = None
        # Why every finding of this run is told, never acted on (``told``: a search's trial, set by the launcher).
        self.told: str | None = None
        self._sweep: float | None = None  # the ratio of a rate range test that blew up and goes on (``_swept``)
        # System profiling (stabilizer_sentinel/capture/profiler.py): set by build_monitoring when it runs.
        self.profiler: system_profiler.SystemProfiler | None = None
        self._system_rules = [rule for rule in self.rules if rule.reads_system_metrics]
        # A stabilizer_sentinel.recovery.rewind.Rewind, when the training loop keeps one: persisted at the first
        # finding.
        self.rewind: Any = None
        self._moved_from: int | None = None  # the wreck's first step, for a finding ``_moved_far`` made Diverging
        # A stabilizer_sentinel.recovery.recovery.Recovery, when the job recovers in place: it may take a step's
        # findings (a rollback instead of a stop); its decisions are findings.json's ``rollbacks``.
        self.recovery: Any = None
        self.rollbacks: list[dict[str, Any]] = []
        # The run's summary (stabilizer_sentinel.summary), given how the run ended (None while it runs); set by
        # whoever watches the job. With it, findings.json is written at the end too, findings or not.
        self.summary: Callable[[str | None], dict[str, Any]] | None = None

    @property
    def findings(self) -> list[dict[str, Any]]:
        """Every finding recorded so far (this process's and, on DDP rank 0, the other ranks')."""
        return list(self._findings)

    @property
    def enabled(self) -> bool:
        return bool(self.rules)

    # -- per step
    def after_backward(
        self,
        step: int,
        *,
        epoch: int | None,
        phase: str | None,
        learning_rate: float | None,
        loss: torch.Tensor | float | None,
        grad_norm: torch.Tensor | float | None = None,
        inputs: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        outputs: torch.Tensor | None = None,
        rows: int | None = None,
    ) -> Verdict:
        """Check the step whose gradients were just computed; call before ``optimizer.step()``.

        ``loss`` may be None when the loop's loss is not known at this step (the launcher level
        reads it from log lines): the gradient norm is then checked alone. ``rows``: the rows of the step's batch,
        where the watcher saw them (the learning check leaves a loader's short last batch out).
        """
        context = {"epoch": epoch, "phase": phase, "learning_rate": learning_rate}
        # The finite check runs every step, whatever the rule list (stabilizer_sentinel.detection.health).
        loss_value, norm_value = self._sync_scalars(loss, grad_norm)
        # A loss and gradients exactly zero before any step had either: the run has not begun to learn (a
        # batch its mask left without a labelled sample, a loss weight warmed up from 0, a margin every
        # sample met). No start to judge it from: the learning check and the step's loss do not count it.
        # Once the run began, a zero is the run's (a network saturated to a loss that underflows is not
        # idle: a GAN's discriminator that won).
        idle = loss_value == 0.0 and norm_value == 0.0 and not self._began
        self._began = self._began or (loss_value is not None and not idle)
        self.steps_idle += idle
        evidence = None if idle else loss_value
        if evidence is not None:
            self.loss_history.append((step, evidence))
        self.grad_norm_history.append((step, norm_value))
        self.rate_history.append((step, None if learning_rate is None else float(learning_rate)))
        if self._sweep is not None and not sweep_goes_on(self._sweep, self.rate_history):
            self._after_sweep(step)
        cheap = self._finite_check(step, loss_value, norm_value)
        # A loop that reports no loss (the launcher before it found one) cannot be judged on learning.
        # The learning rate tells warm-up from the main phase when the script does not say.
        stalled = (self.learning.observe(step, evidence, phase, learning_rate, rows)
                   if evidence is not None else None)
        if self._unwatched_divergence is not None:
            stalled, self._unwatched_divergence = stalled or self._unwatched(step), None
        self._last = (step, context)
        force = ("gradients", "losses") if cheap is not None else ()
        if self.profiler is not None:
            self.profiler.current_step = step
        saved = self.capture.end_step(step, loss=loss_value, inputs=inputs, labels=labels, outputs=outputs, force=force)
        new: list[RuleFinding] = []
        if cheap is not None:
            self._fired.add(id(self._exploding[0]))
            new.append(cheap)
        if stalled is not None:
            new.append(stalled)
        if saved and self.enabled:
            new.extend(self._invoke(step))
        elif self._system_rules and step % SYSTEM_RULES_EVERY == 0:
            new.extend(self._invoke(step, self._system_rules))
        new = self.learning.arbitrate(step, new)  # never VanishingGradient while the loss climbs
        new = [self._moved_far(finding) for finding in new]
        try:
            return self._report(new, context)
        finally:
            self._moved_from = None

    def _moved_far(self, finding: RuleFinding) -> RuleFinding:
        """``finding`` as Diverging where it is NotLearning and the parameters moved ``MOVED`` times their
        norm from the first copy the rewind holds, and further than a search wanders (``_travel``;
        ``Rewind.travel``; the copy is kept for in-job recovery): the loss
        did not move because the steps killed the network (its units dead, its output saturated or
        collapsed to the targets' mean or the labels' prior), not because they were too small. An
        autoencoder at a rate a thousand times its healthy one went from 0.18 to the targets' mean in five
        steps and stayed; called NotLearning, it was answered with a rate ten times higher. As Diverging,
        the run is rolled back to that first copy (its wreck began at the first step: ``_entry``) and goes
        on at a lower rate; at the run's end, the relaunch lowers it. Where no first copy is held (no in-job
        recovery), or under DDP (another rank's own NotLearning would stop the job while this one rolled
        back), the finding stands; and where the loss fell beyond its noise
        (``LearningCheck.fell_beyond_noise``): a dead network's does not, and a run that learns what the
        check cannot see (a loss on a large constant offset, whose fall is never 5 % of its magnitude) would
        be rolled back to its start and its learning thrown away. Unless its network was found input-blind
        (``LearningCheck.blind``): then its loss fell to a constant prediction's, and learned nothing to lose.
        A blind network of a job that does not recover in place (``recovery`` relaunch: no first copy, and the
        finding stops the job either way) is Diverging without that measure: the policy's answer to
        NotLearning, a higher rate, cannot revive it, and the quantile fixture at a rate 1,000 times too high
        was relaunched at ten times that."""
        if finding.rule == NOT_LEARNING and self.learning.blind and self.recovery is None \
                and distributed.rank_and_size()[1] == 1:
            return replace(finding, rule=DIVERGING, message=(
                f"{finding.message}; a higher rate cannot bring dead or saturated units back, and a rate too "
                f"high is what most often kills them: diverging, not too low (the job keeps no first copy to "
                f"measure how far its parameters moved)"))
        travel = self._travel() if finding.rule == NOT_LEARNING else None
        if travel is None:
            return finding
        self._moved_from = self.rewind.first.next_step + 1
        return replace(finding, rule=DIVERGING, message=(
            f"{finding.message}; but its parameters moved {travel:.3g} times their norm away from where they "
            f"began (steps too small to move the loss move them by a hundredth of that): the rate is too high "
            f"and killed the network, not too low"))

    def _travel(self) -> float | None:
        """How far the parameters moved from the first copy the rewind holds, in its norm, where that is far enough
        for ``_moved_far`` to read a run that never learned as killed by steps too large (``MOVED``, and further
        than a search wanders in the steps since: ``SEARCH``); else None. The steps are counted since the copy's,
        rolled-back ones too: after a rollback the bound is higher than the steps trained make it."""
        learned_unseen = self.learning.fell_beyond_noise() and not self.learning.blind
        if self.rewind is None or self.rewind.first is None or distributed.rank_and_size()[1] > 1 or learned_unseen:
            return None
        travel = self.rewind.travel()
        steps = 1 if self._last is None else max(1, self._last[0] + 1 - self.rewind.first.next_step)
        return travel if travel is not None and travel >= max(MOVED, SEARCH * math.sqrt(steps / 100)) else None

    def _killed(self) -> bool:
        """Whether a run that never learned was killed by steps too large (``_travel``): the learning check then
        judges it on its way even where its weights move (``LearningCheck._moving``), for the rollback."""
        return self._travel() is not None

    def after_eval(
        self,
        step: int,
        *,
        epoch: int | None,
        phase: str | None,
        learning_rate: float | None,
        loss: float,
        labels: torch.Tensor | None = None,
        outputs: torch.Tensor | None = None,
    ) -> Verdict:
        """Record an evaluation (EVAL mode) at training step ``step`` and evaluate the rules."""
        context = {"epoch": epoch, "phase": phase, "learning_rate": learning_rate}
        saved = self.capture.end_step(step, mode="EVAL", loss=loss, labels=labels, outputs=outputs)
        new = self._invoke(step) if saved and self.enabled else []
        return self._report(new, context)

    def _sync_scalars(
        self, loss: torch.Tensor | float | None, grad_norm: torch.Tensor | float | None
    ) -> tuple[float | None, float]:
        if grad_norm is None:
            grads = [p.grad for _, p in self._params if p.grad is not None]
            grad_norm = gradients.total_norm(grads) if grads else 0.0
        if loss is None:
            return None, float(grad_norm)
        if isinstance(loss, torch.Tensor) and isinstance(grad_norm, torch.Tensor):
            if loss.device != grad_norm.device:
                loss = loss.detach().to(grad_norm.device)
            # One host synchronisation for both scalars; in float32 at least, in float64 where either is (a float64
            # loss above float32's range read as inf, a finite explosion called non-finite: stop 77's harm hunt).
            wide = torch.promote_types(torch.promote_types(loss.dtype, grad_norm.dtype), torch.float32)
            pair = torch.stack([loss.detach().to(wide).reshape(()), grad_norm.detach().to(wide).reshape(())])
            loss_value, norm_value = pair.tolist()
            return loss_value, norm_value
        return float(loss), float(grad_norm)

    def _finite_check(self, step: int, loss_value: float | None, norm_value: float) -> RuleFinding | None:
        rule = self._exploding[0]
        if id(rule) in self._fired:
            return None
        bad = math.isnan if rule.only_nan else (lambda x: not math.isfinite(x))
        if not ((loss_value is not None and bad(loss_value)) or bad(norm_value)):
            return None
        layer = self._first_nonfinite_layer(rule.only_nan)
        if layer is not None and self.first_nonfinite_layer is None:
            self.first_nonfinite_layer = layer
        if bad(norm_value):
            tensor = f"gradients/{layer}" if layer else "gradients"
            return RuleFinding(rule.name, step, tensor, _jsonable(norm_value),
                               f"gradient norm is non-finite at step {step}")
        return RuleFinding(rule.name, step, "losses/loss", _jsonable(loss_value), f"loss is non-finite at step {step}")

    def _first_nonfinite_layer(self, only_nan: bool) -> str | None:
        # Per-parameter synchronisation, but only on the step that already failed the cheap check.
        for name, param in self._params:
            grad = None if param.grad is None else gradients.stored(param.grad)
            if grad is not None and (torch.isnan(grad).any() if only_nan else (~torch.isfinite(grad)).any()).item():
                return name
        return None

    def _invoke(self, step: int, rules: list[Rule] | None = None) -> list[RuleFinding]:
        found: list[RuleFinding] = []
        for rule in self.rules if rules is None else rules:
            if id(rule) in self._fired:
                continue
            try:
                fired = rule.invoke_at_step(step)
            except Exception as exc:  # a broken custom rule must not kill a healthy job
                say(f"sentinel: rule {rule.name} failed at step {step}, disabled: {exc!r}")
                self._fired.add(id(rule))
                continue
            if fired and rule.finding is not None:
                self._fired.add(id(rule))
                found.append(rule.finding)
        return found

    def report(self, finding: RuleFinding, context: Mapping[str, Any], *, source: str) -> Verdict:
        """A finding from outside the per-step checks (``source``: "log", "loss_scaler", ...); an
        ``ExplodingTensor`` finding counts as the finite check's: it is reported once per run."""
        finite = self._exploding[0]
        if finding.rule == finite.name:
            if id(finite) in self._fired:
                return Verdict()
            self._fired.add(id(finite))
        return self._report([finding], context, source=source)

    def _report(self, new: list[RuleFinding], context: Mapping[str, Any], source: str | None = None) -> Verdict:
        if not new:
            return Verdict()
        entries = [{**self._entry(finding, context), **({"source": source} if source else {})} for finding in new]
        if any(entry.get("told") == RANGE_TEST for entry in entries):
            self._swept(new[-1].step)
        if self.recovery is not None and self.recovery.intercept(entries):
            entries = [entry for entry in entries if entry["action"] != "stop"]  # notices still go on record
            if not entries:
                return Verdict()
        elif self.rewind is not None and (steps := [entry["step"] for finding, entry in zip(new, entries, strict=True)
                                                    if finding.stops and not entry.get("told")]):
            # Before findings.json: whoever reads it finds the checkpoint there. Not for a notice nor a finding the
            # script meant (``told``), which no relaunch follows: the copies would stop there, and an explosion
            # after an LR finder's test could not be rolled back in the job (stop 71).
            self.rewind.persist(before_step=min(steps))
        for entry in entries:
            say(f"sentinel: {entry['rule']} at step {entry['step']}: {entry['message']}")
        self.adopt(entries)
        return Verdict(stop=any(entry["action"] == "stop" for entry in entries), findings=entries)

    def adopt(self, entries: list[dict[str, Any]]) -> None:
        """Record findings (this process's, or another rank's) and rewrite findings.json."""
        if not entries:
            return
        self._findings.extend(entries)
        stopping = [entry for entry in entries if entry.get("action", self.action) == "stop"]
        if stopping and self.stop_finding is None:
            self.stop_finding = stopping[0]
        self.write(ended=None)

    def write(self, ended: str | None) -> None:
        """Write findings.json (rank 0): the findings and, when someone watches the run, its summary."""
        if not self.write_findings:
            return
        document: dict[str, Any] = {"version": 2, "job_action": self.action, "findings": self._findings}
        if self.rollbacks:
            document["rollbacks"] = self.rollbacks
        if self.summary is not None:
            document["summary"] = self.summary(ended)
        try:
            worker_processes.write_findings(self.findings_path, document)  # one file for several processes
        except OSError as error:
            # A folder that cannot be made (outside a job, /opt/ml/checkpoints for a user who may not create it)
            # raised in the script's step, or printed a traceback at its exit (stop 63's hunt): said once.
            if not self._unwritable:
                self._unwritable = True
                say(f"sentinel: findings.json could not be written ({error}); the run goes on unrecorded")

    def rolled_back(self, decision: dict[str, Any]) -> None:
        """An in-job rollback (stabilizer_sentinel.recovery.recovery) went on from an earlier state: into
        findings.json."""
        self.rollbacks.append(decision)
        self.write(ended=None)

    def checks_state(self) -> dict[str, Any]:
        """What the per-step checks know of the run so far, for a rollback to put back (``load_checks_state``)."""
        # One copy of them all: a copy per attribute cost three times as much, and parted what two share.
        learning = copy.deepcopy({key: value for key, value in vars(self.learning).items()
                                  if key not in LISTENING})
        return {"learning": learning, "fired": set(self._fired), "first_nonfinite_layer": self.first_nonfinite_layer,
                "sweep": self._sweep}

    def shared_checks_state(self) -> dict[str, Any]:
        """``checks_state`` for another process (DDP rank 0's, sent to the others after a rollback): the
        rules that fired by name, since another process's rules are other objects."""
        state = self.checks_state()
        state["fired"] = sorted({rule.name for rule in (*self.rules, *self._exploding) if id(rule) in self._fired})
        return state

    def load_shared_checks_state(self, state: dict[str, Any]) -> None:
        names = set(state["fired"])
        fired = {id(rule) for rule in (*self.rules, *self._exploding) if rule.name in names}
        self.load_checks_state({**state, "fired": fired})

    def loss_level(self) -> float | None:
        """The mean of the last window's finite losses (None before any): how good the state after them is."""
        recent = [value for _, value in list(self.loss_history)[-self.learning.window:] if math.isfinite(value)]
        return sum(recent) / len(recent) if recent else None

    def load_checks_state(self, state: dict[str, Any]) -> None:
        vars(self.learning).update(state["learning"])
        self._fired = state["fired"]
        self.first_nonfinite_layer = state["first_nonfinite_layer"]
        self._sweep = state.get("sweep")

    def _entry(self, finding: RuleFinding, context: Mapping[str, Any]) -> dict[str, Any]:
        # The run-up (stabilizer_sentinel.detection.health.run_up): which checkpoints are healthy, which rate was
        # stable.
        start, scale = self.learning.rise_reference()
        wrecked = self.learning.wrecked_at if self._moved_from is None else self._moved_from
        before = run_up(self.grad_norm_history, self.rate_history, finding.step,
                        losses=self.loss_history, start_loss=start, scale=scale, wrecked_at=wrecked)
        # The rate at the explosion: for a run wrecked by a spike it never learned past, the spike's
        # (a schedule may have decayed it a hundredfold by the step the run is judged at).
        rate = self.learning.wrecked_rate if self.learning.wrecked_rate is not None else context["learning_rate"]
        # A rate range test's blow-up is the test's end, which the script reads: told, never acted on (no rollback,
        # no stop: stop 70's hunt, an LR finder rolled back, its curve flattened and its pick 130 times too high).
        sweep = rate_sweep(self.rate_history, finding.step) if finding.rule in SWEPT else None
        message = finding.message if sweep is None else (
            f"{finding.message}; the script raises its rate {sweep:.3g} times at each step (a rate range test): "
            f"told, not acted on")
        told = RANGE_TEST if sweep is not None else self.told
        return {
            "rule": finding.rule,
            "onset_step": before.onset_step,
            "stable_learning_rate": before.stable_learning_rate,
            "step": finding.step,
            "epoch": context["epoch"],
            "phase": context["phase"],
            "learning_rate": None if rate is None else _jsonable(float(rate)),
            "tensor": finding.tensor,
            "value": finding.value,
            "message": message,
            "action": "stop" if self.action == "stop" and finding.stops and sweep is None else "notify",  # Debugger's
            **({"told": told} if told else {}),
            **({"notify": list(finding.notify)} if finding.notify else {}),
            "evidence": {
                "loss_history": [[s, _jsonable(v)] for s, v in self.loss_history],
                "grad_norm_history": [[s, _jsonable(v)] for s, v in self.grad_norm_history],
                "first_nonfinite_layer": self.first_nonfinite_layer,
            },
        }

    def trained_unwatched(self, losses: list[float]) -> None:
        """The network trained ``len(losses)`` steps before this sentinel watched it, at those losses (the launcher
        attaches to a network trained after another at its 51st step): the learning check goes on from
        where it would stand had it watched them (its listeners, which read the passes, saw none), not from where
        it stood at its first watched step (stop 71's hunt: a network trained after a helper's one L-BFGS step
        was judged from its 51st, its loss 0.0016 there, and a curriculum's planned rise called Diverging). Their
        losses join the loss history; a divergence the check finds in them is reported at the first watched step
        (``_unwatched``). Until stop 87 the check took their start alone (the lineage a resumed run takes): an
        explosion in those steps went unjudged, and its run was called learned."""
        measured = replace(self.learning)  # the same settings, afresh, with no listeners: these passes are gone
        for step, loss in enumerate(losses):
            if math.isfinite(loss):
                found = measured.observe(step, loss, None, None)
                if found is not None and found.rule == DIVERGING:
                    self._unwatched_divergence = found
                self.loss_history.append((step, loss))
        if measured.start_loss is not None:  # where the check stands after them, as if it had watched them
            vars(self.learning).update({key: value for key, value in vars(measured).items() if key not in LISTENING})

    def _unwatched(self, step: int) -> RuleFinding:
        """The divergence found in the steps trained before this sentinel watched them (``trained_unwatched``: an
        explosion in a network's first steps, trained while the launcher still took its optimizer for another's),
        as the finding of ``step``, the first watched: a rollback counts the steps lost from here, and the run-up
        is read from those steps' losses, kept in the loss history."""
        found = self._unwatched_divergence
        assert found is not None
        return replace(found, step=step, message=f"{found.message}; found in the losses of the {step} steps it "
                                                 f"trained before the watcher took it for the run's network")

    @property
    def sweeping(self) -> bool:
        """Whether a rate range test blew up, told, and goes on (``_swept``)."""
        return self._sweep is not None

    def _swept(self, step: int) -> None:
        """A rate range test blew up at ``step``, told (``_entry``): its steps go unjudged until its rate stops
        rising by its ratio (``after_backward``), and the run is judged afresh from there (``_after_sweep``)."""
        self._sweep = rate_sweep(self.rate_history, step)
        self.learning.swept("the run ended inside a rate range test, past its blow-up")

    def _after_sweep(self, step: int) -> None:
        """The rate range test ended before ``step``: the run is judged afresh from it, its finite check and rules
        of what a test ends in (``SWEPT``) armed again for the training after it (stop 71: an LR finder's script
        was relaunched six times for the test's own blow-up)."""
        self._sweep = None
        self.learning.after_sweep(step)
        self._fired -= {id(rule) for rule in [*self._exploding, *self.rules] if rule.name in SWEPT}
        if self.rewind is not None:  # a rollback after the test goes back to where the run started over, not into it
            self.rewind.start_over(step)

    # -- ending the job
    def exit_for_rule_stop(self, *, leave: Callable[[], None] | None = None, echo: bool = True) -> NoReturn:
        """Close the tensor store, write the failure file, exit with status 86; ``echo``: print the failure
        reason to stderr too (a caller that said why it stops itself passes False).

        ``leave``, when given, runs last before the exit: the DDP ranks that agreed to stop wait there for
        each other (a barrier), as torchrun stops a host's other ranks once one has exited, and a rank
        stopped while it was still writing (rank 0's findings) would leave them half written."""
        finding = self.stop_finding or {"rule": "unknown", "step": -1, "message": "no finding recorded"}
        if self.profiler is not None:
            self.profiler.close()
        self.capture.close(status=ENDED_RULE_STOP)
        reason = f"{FAILURE_PREFIX} {finding['rule']} at step {finding['step']}: {finding['message']}"
        try:
            if self.summary is not None:
                self.write(ended=ENDED_RULE_STOP)
            if self.failure_file is not None:
                # Every rank may write it (one per node under multi-node DDP): same text, atomic rename.
                self.failure_file.parent.mkdir(parents=True, exist_ok=True)
                partial = self.failure_file.with_name(f".{self.failure_file.name}.{os.getpid()}")
                partial.write_text(reason + "\n")
                partial.replace(self.failure_file)
            if echo:
                say(reason)
        finally:  # a rank whose writing failed still meets the others, which would wait for it
            if leave is not None:
                # A rank already gone: gloo raises here (under NCCL its watchdog ends the wait, or torchrun does).
                with contextlib.suppress(RuntimeError):
                    leave()
        sys.exit(EXIT_RULE_STOP)

    def _never_due(self, rule: Any) -> bool:
        """The rule reads only configured collections with no step saved: nothing to judge, no name in question."""
        needed = list(rule.collections_needed())
        return bool(needed) and all(
            name in self.capture.collections and not self.memory.tensor_names(collection=name) for name in needed)

    def release(self) -> None:
        """The script let go of the network (the guard's ``release``): let go of it, its parameters, and the copies
        and captured tensors of it; what the checks saw stays, for the summary."""
        self.model, self._params, self.rewind, self.recovery = nn.Module(), [], None, None
        self.capture.release()

    def close(self, status: str = "completed") -> None:
        """End of the job; a completed run that never learned is reported (findings.json) here."""
        # Not where the watcher stood aside (stabilizer_sentinel.failsafe): the rest of the run went unwatched.
        if status == "completed" and self._last is not None and failsafe.failure() is None:
            step, context = self._last
            final = self.learning.at_end(step)
            if final is not None:
                self._report([self._moved_far(final)], context)
                self._moved_from = None
            # A rule that never saw a tensor it reads says so (rules.base.unmatched_findings), unless
            # its collections are configured and their schedule simply never came in this run.
            judged = [r for r in self.rules if id(r) not in self._fired and not self._never_due(r)]
            self._report(unmatched_findings(judged, step), context)
        if self.profiler is not None:
            self.profiler.close()
        if self.summary is not None:
            self.write(ended=status)
        self.capture.close(status=status)


def build_monitoring(
    model: nn.Module,
    *,
    sentinel_rules: str | list[Mapping[str, Any]] | None,
    sentinel_action: str,
    capture: str | Mapping[str, Any] | None,
    checkpoint_dir: str | Path,
    tensor_dir: str | Path | None,
    failure_file: str | Path | None = None,
    write_findings: bool = True,
    only_rules: Iterable[str] | None = None,
    profiler_interval_ms: int | None = None,
) -> tuple[Capture, Sentinel]:
    """Build capture and sentinel from the hyperparameters of the same names.

    Collections the rules need but ``capture`` does not list are held in memory only, on the
    rule's default schedule; collections ``capture`` lists are also written to ``tensor_dir``.
    ``only_rules`` keeps the rules of those names (DDP ranks other than 0 keep the finite check only).

    System profiling runs every ``profiler_interval_ms`` (else ``STABILIZER_PROFILER_INTERVAL_MS``;
    else every 500 ms when a profiler rule is configured; 0 turns it off), into ``tensor_dir/system``.
    """
    specs = parse_rule_list(sentinel_rules)  # the whole list is validated, whatever ``only_rules`` keeps
    if only_rules is not None:
        keep = set(only_rules)
        specs = [spec for spec in specs if spec.name in keep]
    cap = Capture(model, parse_capture(capture), out_dir=tensor_dir)
    memory = MemoryTrial()
    rules = [spec.build(memory) for spec in specs]
    if rules:
        needed: dict[str, int] = {}
        for rule in rules:
            for name, interval in rule.collections_needed().items():
                needed[name] = min(interval, needed.get(name, interval))
        for name, interval in needed.items():
            cap.require([name], memory, save_interval=interval)
        cap.memory = memory
    sentinel = Sentinel(model, rules, action=sentinel_action, capture=cap, memory=memory, checkpoint_dir=checkpoint_dir,
                        failure_file=failure_file, write_findings=write_findings)
    interval = profiler_interval_ms if profiler_interval_ms is not None else system_profiler.interval_from_env()
    if interval is None and any(rule.reads_system_metrics for rule in rules):
        interval = system_profiler.DEFAULT_INTERVAL_MS
    if interval:
        sentinel.profiler = system_profiler.SystemProfiler(
            interval, out_dir=tensor_dir, sinks=[memory.add_system]
        ).start()
    return cap, sentinel
