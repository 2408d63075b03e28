"""The launcher level's global hooks: they find the model, the optimizer and the loss of a script that
knows nothing of the sentinel, and attach a guard to them.

``activate()`` installs them: the autostart ``sitecustomize`` calls it in a job, and
``python -m stabilizer_sentinel.launch`` runs the script in that same environment.

What the global hooks do (PyTorch's own global hooks; the two wrapped functions are GradScaler's,
stabilizer_sentinel.loops.step_clock, and ``torch.autograd.backward``, stabilizer_sentinel.loops.bare_tensors):

- ``register_module_forward_pre_hook`` / ``forward_hook`` watch every module call until the hooks
  attach: the outermost modules called are the candidate networks, and ``torch.nn`` loss modules
  (``_Loss`` subclasses) are remembered. Both are removed when they attach.
- ``register_optimizer_step_pre_hook``, and ``GradScaler.step`` (a skipped first step calls no
  optimizer hook): at the first step of the first optimizer, the network is the candidate sharing
  the most parameters with it (DDP and ``torch.compile`` wrappers unwrapped), and a ``Guard``
  (stabilizer_sentinel.integration.guard) is attached to them as ``watch()`` would; its hooks do the rest. An optimizer
  that steps later (a GAN's second) is added to it (``Guard.add_optimizer``); one that updates the same
  parameters (a second phase's, one built again each epoch) replaces it (``Guard.hand_over``). One over
  other parameters that goes on stepping after the first stopped (a student distilled after its teacher,
  the next model of a sweep: more than ``PHASE_STEPS`` of its steps in a row, and four times the longest such
  run while the first still stepped) is the next phase of training, and the run's from then on, judged as if
  watched from its first step (``Sentinel.trained_unwatched``) and rolled back to where it began
  (``Guard.held_other``): the guard of the phase before is let go without a summary and a new one attached to it
  (``_next_phase``),
  so a run is never judged on a phase that ended while the one after it trained unwatched. Where the
  script let go of the first optimizer (nothing but the watcher holds it: ``_let_go``), that is at the
  other's first step: a sweep's next model, bound to the names of the last, is the run's from its first
  step, and the model before is the script's to free. Where the script let go of it earlier (a search's trial
  trained in a function that returned), the guard lets go of it at the next backward pass that is not its
  network's (``_phase_over``, ``_release``): before that pass allocates the next network's gradients. A next
  phase whose network is the last one built again, trained from its start (a search's trial, a fold), has its
  findings told, never acted on (``_new_phase``).
- **Updated by hand** (no optimizer, ``p.data -= lr * p.grad``): until they attach, the hooks keep a
  copy of each candidate network's smallest parameter and compare it at its next training forward
  pass (one comparison per forward pass, until attached); a network whose weights changed with no
  optimizer step is attached with a backward-pass step clock (stabilizer_sentinel.loops.step_clock), counting
  from step 1: its first update happened before anything could tell. Its loss at that first step
  (the loss module's, else the log's) is where the learning check starts.
- **Bare tensors** (leaf tensors updated by hand, no module, no optimizer): at each backward pass
  until they attach, the graph of the backwarded scalar is walked to its leaves that require grad,
  and the smallest is compared at the next pass (stabilizer_sentinel.loops.bare_tensors); leaves that
  changed with no optimizer step are attached the same way, from step 1, and from then on the
  scalar each backward pass starts from is the step's loss. A loop that makes new leaf tensors at
  every step is said to be unwatchable in one line of stderr, and ends unwatched.
- **Nothing to attach to**: a network trained through weights kept outside it (``torch.func.functional_call``
  over a dictionary the loop replaces: no optimizer, no backward pass, its own weights unchanged), or bare
  tensors given gradients by ``torch.autograd.grad`` alone. The hooks never attach; at exit, where a network
  was called in training mode or the log reported a loss, one line on stderr says the run was not watched
  (``_say_unwatched``), and no summary is written: the workflow calls the run unwatched.
- **Training in child processes** (Hogwild!, a loop in a ``multiprocessing.Process``): a spawned or
  forkserver child of the entry point installs these hooks itself (the autostart), a forked one
  inherits them while they stand by (``os.register_at_fork``); a child that steps an optimizer is
  watched as a worker and writes its part of findings.json (stabilizer_sentinel.loops.worker_processes). A
  child forked after they attached (a DataLoader worker) drops its copy of the guard: it writes nothing.
- **Zero-code resume**: at the first forward pass of a network that fits the newest checkpoint (the
  job's own, else the ``resume`` channel's: stabilizer_sentinel.recovery.resume), its weights are loaded before that
  pass; when the hooks attach, the optimizer's state too, and the step count goes on from the
  checkpoint's. The summary records ``started_from`` and ``restores: true``. The script's own loop
  and schedule start over: it trains its full length again, from the loaded state. A loop watched as
  bare tensors (updated by hand, a functional model, Lightning's first closure) has no network to
  load a checkpoint into: its summary says ``restores: false``, and the workflow's relaunch starts fresh.
- How the script ended: an uncaught exception through ``sys.excepthook`` (stabilizer_sentinel.summary);
  ``sys.exit(n)``, ``exit(n)`` or a bare ``raise SystemExit(n)`` that ends it through
  stabilizer_sentinel.integration.exit_status (0 a normal end, any other status ``SystemExit: <status>``).
- The loss: the scalar each backward pass starts from (``torch.autograd.backward``, wrapped by
  stabilizer_sentinel.loops.bare_tensors), unscaled by stabilizer_sentinel.loops.backward_loss (divided by the
  accumulation steps, multiplied by a loss scaler, a sum divided by its count): a loss module, a
  functional loss, a loss computed inside the model (``outputs.loss``) or a sum of terms alike,
  every step, on the device (no host synchronisation). A step of several backward passes (gradient
  accumulation) has their mean. The backward passes before the first optimizer step are that step's,
  so the learning check starts from the first step's loss. Only a loop with no backward pass
  (``torch.autograd.grad``) has its loss from the log: the last number it reports
  (stabilizer_sentinel.integration.log_channel, read with the configuration's ``loss_regex``, by default
  ``loss=<number>``, ``loss: <number>``). The log is read in any case, as the second channel of the
  summary (``log_loss``).
- Nothing is stored on the script's objects: the few forward hooks a configuration needs on its
  modules (captured module outputs, the loss module's inputs for ``labels``) are routed from one
  global hook (stabilizer_sentinel.capture.module_hooks), none in the default configuration once attached,
  and the optimizer gets only step hooks (no ``state_dict`` keys), so its model pickles,
  deep-copies, saves whole, scripts, traces, compiles and exports as unwatched (docs/harmless.md).

Rules at this level: everything that reads gradients, weights, biases or module outputs
(``ExplodingTensor``, ``VanishingGradient``, ``WeightUpdateRatio``, ``AllZero``, ``UnchangedTensor``,
``DeadRelu``) and ``inputs``/``predictions``; ``LossNotDecreasing`` at every step (at the logged
steps for a loop with no backward pass); with a ``torch.nn`` loss module, ``labels``
(so ``ClassImbalance``) and its smdebug names: the loss module, called before the hooks attach, is
handed to the capture with that call's inputs (``Capture.loss_module_seen``), so step 0 has them too.
Not available: evaluation losses (so ``Overfit``): the launcher cannot tell them apart from other
tensors; use the plain-loop level for those.
"""

from __future__ import annotations

import atexit
import gc
import math
import multiprocessing.util
import os
import sys
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from stabilizer_sentinel import handle_ids
from stabilizer_sentinel.capture import module_hooks
from stabilizer_sentinel.failsafe import closing, shielded
from stabilizer_sentinel.integration import exit_status, log_channel, script_watch
from stabilizer_sentinel.integration.guard import Guard
from stabilizer_sentinel.job_config import JobPaths, StabilizerConfig, load_config
from stabilizer_sentinel.loops import backward_loss, bare_tensors, distributed, step_clock, worker_processes
from stabilizer_sentinel.loops.backward_loss import BackwardLoss
from stabilizer_sentinel.loops.networks import BareTensors, unwrap
from stabilizer_sentinel.recovery import resume
from stabilizer_sentinel.recovery.batches import Batches
from stabilizer_sentinel.recovery.rewind import state_on_host
from stabilizer_sentinel.say import say
from stabilizer_sentinel.summary import how_it_ended, watch_exit

_is_compiling = module_hooks.is_compiling


# Steps another optimizer takes in a row, the first not stepping, before its training is the run's (``_next_phase``).
PHASE_STEPS = 50
# An optimizer that steps a network watched as updated by hand, before that watch counted more steps than this,
# steps it for the first time: the change seen was within its first step (``LauncherHooks._taken_over``).
TAKEN_OVER = 2
PACKAGE = "stabilizer_sentinel"
HOLDER_LEVELS = 4  # how far above a called module the network holding the optimizer's parameters is looked for
# The values of each parameter read where a phase's network ended, spread evenly over it: a network built again
# draws them anew, a copy of where it ended holds them all (``_trained_again``). Spread, not its first values: those
# of an embedding's padding row are zeros in every trial (stop 75's review).
ENDED_VALUES = 1024
# The backward passes the launcher keeps for a guard not yet attached (a first step's micro-batches).
PENDING_PASSES = 256
# The modules of the packages that train a network several times to compare the runs (a hyperparameter search, a
# cross-validation): where one of them calls the training, its first run is a trial too (``search_driver``).
SEARCH_DRIVERS = ("sklearn.model_selection.", "optuna.", "ray.tune.", "hyperopt.", "skopt.")


def search_driver() -> str | None:
    """The package that calls the training under way to compare it with others (scikit-learn's ``GridSearchCV`` or
    ``cross_val_score`` fitting a skorch net, an Optuna study's objective), read from the call stack; None for a
    script's own loop. One walk of the stack, where a phase's guard attaches."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name.startswith(SEARCH_DRIVERS):
            return next(package.rstrip(".") for package in SEARCH_DRIVERS if name.startswith(package))
        frame = frame.f_back
    return None


def _updates(optimizer: torch.optim.Optimizer, model: nn.Module) -> bool:
    """Whether ``optimizer`` updates any of ``model``'s parameters (a network, or bare tensors)."""
    mine = {id(p) for p in model.parameters()}
    return any(id(p) in mine for group in optimizer.param_groups for p in group["params"])


def _trained_again(before: list[Ended], network: nn.Module) -> bool:
    """Whether ``network`` is the network of the phase before built again, to train from its start (a search's
    next trial, a cross-validation's next fold): parameters of the same shapes in the same order, none of them
    ``before``'s, and none holding where ``before``'s ended (a copy of it, or of its trunk under a new head,
    fine-tuned, goes on from there). ``before``: where the phase before's parameters ended (``ended``), read when
    it ended, its network perhaps freed since (``LauncherHooks._release``). Read once, at the phase's first step,
    on the device."""
    new = list(network.parameters())
    if not new or len(before) != len(new) or any(old.shape != p.shape for old, p in zip(before, new, strict=True)):
        return False
    if any(old.parameter() is p for old, p in zip(before, new, strict=True)):
        return False
    return not any(old.values is not None and (values := _spread_values(p)) is not None
                   and old.device == p.device and old.dtype == p.dtype and torch.equal(old.values, values)
                   for old, p in zip(before, new, strict=True))


@dataclass(frozen=True)
class Ended:
    """Where a parameter of a phase's network ended (``_trained_again``): held weakly, with values spread over it."""

    parameter: weakref.ref[torch.Tensor]
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    values: torch.Tensor | None


def ended(network: nn.Module) -> list[Ended]:
    """Where each of ``network``'s parameters ended: ``ENDED_VALUES`` of its values, copied on its device."""
    with torch.no_grad():
        return [Ended(weakref.ref(p), p.shape, p.dtype, p.device, _spread_values(p, copy=True))
                for p in network.parameters()]


def _spread_values(parameter: torch.Tensor, *, copy: bool = False) -> torch.Tensor | None:
    """At most ``ENDED_VALUES`` of a parameter's values, spread evenly over it, detached; None for a tensor
    subclass (a ``DTensor``, whose reshaping is a collective) or a sparse one."""
    if type(parameter) not in (nn.Parameter, torch.Tensor) or parameter.layout != torch.strided:
        return None
    flat = parameter.detach().reshape(-1)
    values = flat[::max(1, flat.numel() // ENDED_VALUES)][:ENDED_VALUES]
    return values.clone() if copy else values


def _holder(module: nn.Module, wanted: set[int]) -> nn.Module | None:
    """The module above ``module`` that holds every parameter in ``wanted``, or None: a network the script
    calls through a method of its own (``flow.log_prob(x)`` calling each of ``flow.layers``) has its children
    called alone, and the one the most parameters were found in holds a part of the optimizer's. Found
    through the ``_modules`` dicts that hold each level (``gc.get_referrers``: a walk of the process's
    objects, done once, and only then), at most ``HOLDER_LEVELS`` levels up."""
    level = [module]
    for _ in range(HOLDER_LEVELS):
        parents = {id(parent): parent for child in level for parent in _parents(child)}
        for parent in parents.values():
            if wanted <= {id(p) for p in parent.parameters()}:
                return parent
        level = list(parents.values())
        if not level:
            return None
    return None


def _parents(child: nn.Module) -> list[nn.Module]:
    """The modules that hold ``child`` in their ``_modules`` (a module's attributes may sit in its own dict,
    which then holds ``_modules``, or in the object itself)."""
    found = []
    for children in gc.get_referrers(child):
        if not isinstance(children, dict):
            continue
        for holder in gc.get_referrers(children):
            if isinstance(holder, nn.Module) and holder.__dict__.get("_modules") is children:
                found.append(holder)
            elif isinstance(holder, dict) and holder.get("_modules") is children:
                found += [module for module in gc.get_referrers(holder)
                          if isinstance(module, nn.Module) and module.__dict__ is holder]
    return found


def _wraps(module: nn.Module | None, network: nn.Module) -> bool:
    """``module`` is a wrapper of ``network`` (DDP's, a compiled one's) the script calls."""
    return module is not None and module is not network and unwrap(module) is network


def _owner(optimizer: torch.optim.Optimizer) -> nn.Module | None:
    """The module that holds every parameter of ``optimizer``, found from the module whose ``_parameters``
    hold its first (``gc.get_referrers``), and above it (``_holder``); None when none does. For a phase
    whose network was never called while the hooks watched module calls (they stop at the first attach)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params:
        return None
    wanted = {id(p) for p in params}
    for table in gc.get_referrers(params[0]):
        if not isinstance(table, dict):
            continue
        for holder in gc.get_referrers(table):
            owners = [holder] if isinstance(holder, nn.Module) and holder.__dict__.get("_parameters") is table else (
                [m for m in gc.get_referrers(holder) if isinstance(m, nn.Module) and m.__dict__ is holder]
                if isinstance(holder, dict) and holder.get("_parameters") is table else [])
            for module in owners:
                if wanted <= {id(p) for p in module.parameters()}:
                    return module
                return _holder(module, wanted)
    return None


def _began_as(began: tuple[dict[str, Any], dict[str, Any]] | None, model: nn.Module,
              optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``began`` (another optimizer's state where its training began, as the guard of the phase before copied it:
    ``Guard.held_other``) as a state of ``model``, the network the next phase's guard watches. A copy of its
    parameters alone (bare tensors, in the optimizer's order: the network was never called while the module hooks
    stood, they stop at the first attach) is named by the model's names, and the model's other entries (its
    buffers, weights no optimizer updates) are as they are now, where every one is finite. None where it cannot
    be: a parameter of the optimizer the model does not hold, a buffer the steps since made non-finite."""
    if began is None or isinstance(model, BareTensors):
        return None
    network, state = began
    live = model.state_dict(keep_vars=True)
    if list(network) == list(live):
        return began
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if list(network) != [f"tensor{index}" for index in range(len(params))]:
        return None
    index = {id(param): position for position, param in enumerate(params)}
    named: dict[str, Any] = {}
    for key, value in live.items():
        position = index.get(id(value))
        if position is not None:
            named[key] = network[f"tensor{position}"]
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return None
        else:
            named[key] = state_on_host(value)
    held = {id(value) for value in live.values()}
    return (named, state) if set(index) <= held else None


def _let_go(held: torch.optim.Optimizer | nn.Module) -> bool:
    """Whether nothing but the watcher holds ``held`` (an optimizer, a network): the script let go of it (a
    sweep's next model and optimizer bound to the names of the last, a search's trial function returned).
    Every object that refers to it (``gc.get_referrers``: a walk of the process's objects, done at another
    optimizer's first step, or at a backward pass not its network's: ``LauncherHooks._phase_over``) must be the
    watcher's (of this package), or a dict or sequence only the watcher's objects hold (a guard's attributes),
    and they must account for every reference it has: a running function's local (a GAN's two optimizers in
    the script's ``main()``) is a reference no object shows, and so is one C holds."""
    found = gc.get_referrers(held)
    shown = 0
    for holder in found:
        if not _watchers(holder, found, depth=1):
            return False
        shown += _references(holder, held)
    # Beside those: this function's argument and getrefcount's own.
    return sys.getrefcount(held) - 2 <= shown


def _references(holder: Any, target: object) -> int:
    """How many references to ``target`` ``holder`` (a dict, a sequence or an object's attributes) holds."""
    if isinstance(holder, dict):
        items = [*holder.keys(), *holder.values()]
    elif isinstance(holder, list | tuple):
        items = list(holder)
    else:
        items = list(getattr(holder, "__dict__", {}).values())
    return sum(1 for item in items if item is target)


def _watchers(holder: Any, walked: list[Any], depth: int) -> bool:
    """Whether ``holder`` belongs to the watcher (see ``_let_go``); ``walked``: the referrer list being read."""
    if (type(holder).__module__ or "").startswith(PACKAGE):
        return True
    if depth <= 0 or not isinstance(holder, dict | list | tuple):
        return False
    outer = gc.get_referrers(holder)
    held = False
    for other in outer:
        if other is walked or other is outer:
            continue
        if not _watchers(other, outer, depth - 1):
            return False
        held = True
    return held


class LauncherHooks:
    """Global hooks that find the model, the optimizer and the loss of a script that knows nothing of us."""

    # The first network called to train (its class's name) while the hooks stood by: said at exit where they never
    # attached (``_say_unwatched``).
    _trained: str | None = None
    # The phases in a row, up to this one, whose network was the one before built again (``_trained_again``).
    _trained_before = 0
    # Each network a phase before watched, and where its learning check stood when that phase ended (``_new_phase``).
    _lineages: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] | None = None
    # Where the network of a guard released ended (``_release``), for the next phase; the guard's step at which
    # ``_phase_over`` may next ask whether the script let go of its optimizer.
    _ended: list[Ended] | None = None
    _check_after = 0

    def __init__(self, config: StabilizerConfig, paths: JobPaths) -> None:
        self.config = config
        self.paths = paths
        self.guard: Guard | None = None
        self.stood_down = False
        self._depth = 0
        # Another optimizer's steps since the first one's last, the first's step count then, the longest such
        # run while the first still stepped (``_next_phase``).
        self._others_in_a_row, self._first_steps_then, self._longest_others = 0, -1, 0
        self._roots: dict[int, weakref.ref[nn.Module]] = {}
        self._loss_modules: dict[int, weakref.ref[nn.Module]] = {}
        self._fingerprints: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._pending_loss: torch.Tensor | float | None = None  # the log's, before the hooks attach
        # The backward passes' losses before the hooks attach (the latest ``PENDING_PASSES``: a script that takes
        # backward passes and no step, an input's saliency after a search's last trial, kept them all).
        self._pending_passes: deque[BackwardLoss] = deque(maxlen=PENDING_PASSES)
        self._backward_seen = False  # a backward pass gave the loss: the log is the second channel only
        self._loss_args: tuple[torch.Tensor, torch.Tensor] | None = None  # the first loss module's last inputs
        self._checkpoint: tuple[Any, dict[str, Any], nn.Module] | None = None  # read, loaded into that model
        self._candidate: tuple[Any, dict[str, Any]] | None = None  # the newest checkpoint, read
        self._looked_for_checkpoint = False
        with handle_ids.apart():
            self._module_handles = [module_hooks.process_wide(handle) for handle in (
                nn.modules.module.register_module_forward_pre_hook(shielded(self._module_called)),
                nn.modules.module.register_module_forward_hook(shielded(self._module_returned), always_call=True),
            )]
            self._optimizer_handle = register_optimizer_step_pre_hook(shielded(self._optimizer_stepping))
        self._scaler_handle = step_clock.stand_by(shielded(self._scaler_stepping))
        self._hand_updates = bare_tensors.HandUpdates()
        self._backward_handle = bare_tensors.listen(self._backward, gradients=True)
        self.channel = log_channel.install(config.effective_loss_regex, config.objective)
        self.channel.listeners.append(self._logged_loss)  # shielded where the log channel calls it
        self._watch_handle = script_watch.offer(self._script_watches)
        # The loaders' batches from the script's start: the guard attaches at the first optimizer step,
        # after that step's batches (stabilizer_sentinel.recovery.batches); it drops them if it keeps none.
        # One process only (torchrun's ranks say so now; a rank started otherwise, once the guard sees it).
        self.batches: Batches | None = None
        alone = distributed.rank_and_size()[1] == 1 and not worker_processes.is_worker()
        if alone and (config.effective_recovery == "in_job" or config.skip_batches or config.skip_nonfinite_batches):
            self.batches = Batches(config.skip_batches, skip_nonfinite=config.skip_nonfinite_batches)
            self.batches.activate()
        watch_exit()
        exit_status.install()  # sys.exit(n) and a bare raise SystemExit(n): how the script ended
        exit_status.on_hard_exit(self.close)  # os._exit runs no atexit handler: the summary is written first
        self._closed = False
        # Registered before the guard exists, so it runs after the guard's own close (atexit is LIFO).
        atexit.register(self.close)
        self_ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (hooks := self_ref()) is not None and hooks._forked())
        multiprocessing.util.register_after_fork(self, LauncherHooks._closed_by_multiprocessing)

    @shielded
    def _forked(self) -> None:
        """In a child forked from this process (stabilizer_sentinel.loops.worker_processes)."""
        if self._closed or self.stood_down:
            return
        if self.guard is not None:  # a copy of a watched process (a DataLoader worker): it writes nothing
            self.guard.discard()
            self.guard = None
            self.stood_down = True  # nor says anything: the process it copies is watched
            self.close()
            return
        # Standing by: a child that trains (Hogwild!, a loop in a multiprocessing.Process) is a worker.
        worker_processes.become_worker()
        self._drop_batches()

    def _closed_by_multiprocessing(self) -> None:
        """multiprocessing ends a forked child with os._exit (no atexit) after its exit finalizers, which
        it clears when the child starts and before it runs its after-fork callbacks: this one adds ours."""
        if worker_processes.is_worker() and not self._closed:
            multiprocessing.util.Finalize(None, self.close, exitpriority=0)

    # -- standby: the script may watch() itself
    @shielded
    def _script_watches(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> Guard | None:
        if self.guard is not None:
            if not self.guard.released and (optimizer is None or optimizer is self.guard.optimizer):
                return self.guard  # the script watches, after its first step, what the hooks attached to
            # It watches another optimizer (a pre-training ran first, then the fine-tuning it means to
            # watch): its own watch() decides, and the launcher's guard is dropped without a summary, which
            # would otherwise describe the wrong training, and overwrite the script's at exit.
            self.guard.discard()
            self.guard = None
        self._stand_down()
        return None

    def _stand_down(self) -> None:
        """The script watches itself (watch() before its first step): only the log channel stays."""
        self.stood_down = True
        if self._checkpoint is not None:  # loaded at a forward pass before watch(): the library's guard says so
            script_watch.preloaded(resume.started_from(self._checkpoint[0], self.paths))
        for handle in (*self._module_handles, self._optimizer_handle, self._scaler_handle, self._backward_handle):
            handle.remove()
        self._fingerprints.clear()
        self.channel.listeners.remove(self._logged_loss)
        self._drop_batches()

    def _drop_batches(self) -> None:
        if self.batches is not None and self.guard is None:
            self.batches.deactivate()
            self.batches = None

    # -- discovery, until the first optimizer step
    def _module_called(self, module: nn.Module, args: Any) -> None:
        if _is_compiling():
            # Traced into a compiled region (a compiled function that calls the model): nothing here is for
            # the graph (files read, weights compared), and a region compiled with fullgraph=True refuses it.
            return
        if self._depth == 0 and not isinstance(module, nn.modules.loss._Loss):
            self._roots.setdefault(id(module), weakref.ref(module))
            self._resume_into(module)
            if module.training and torch.is_grad_enabled():
                self._updated_by_hand(module)
        self._depth += 1

    def _module_returned(self, module: nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():
            return
        self._depth = max(self._depth - 1, 0)
        if isinstance(module, nn.modules.loss._Loss):
            self._loss_modules.setdefault(id(module), weakref.ref(module))
            if (next(iter(self._loss_modules)) == id(module) and torch.is_grad_enabled() and len(args) >= 2
                    and all(isinstance(a, torch.Tensor) for a in args[:2])):
                self._loss_args = (args[0].detach(), args[1].detach())  # the capture's <Loss>_input_0/1 of step 0

    def _updated_by_hand(self, module: nn.Module) -> None:
        """A training forward pass of a network whose weights changed with no optimizer step: a hand-written update."""
        # Not a lazy module's parameters before its first pass sizes them (their numel raises), nor inside a trace
        # (``torch.jit.trace`` compares the graphs of two calls, and a copy taken in one of them differs: it
        # raised TracingCheckError in the script; stop 63's hunt).
        params = [p for p in module.parameters()
                  if p.requires_grad and not isinstance(p, nn.parameter.UninitializedParameter)]
        if not params or self.guard is not None or torch.jit.is_tracing():
            return
        self._trained = self._trained or type(module).__name__
        known = self._fingerprints.get(id(module))
        if known is None:  # the smallest parameter: a cheap copy, compared until the first step
            smallest = min(params, key=lambda p: p.numel())
            self._fingerprints[id(module)] = (smallest, smallest.detach().clone())
        elif not torch.equal(known[0].detach(), known[1]):
            self._attach(module, None, start_step=1)  # its first update went unseen: steps count from 1

    def _optimizer_stepping(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.guard is not None and self.guard.released:
            self._new_phase(optimizer)  # the script let go of the last network (``_release``): this one's is the next
            return
        if self.guard is not None:
            if any(optimizer is other for other in self.guard.others) and self._next_phase(optimizer):
                return
            if any(optimizer is known for known in (self.guard.optimizer, *self.guard.inner, *self.guard.others)):
                return
            if self.guard.steps_inside(optimizer):  # a wrapper's base (SAM's, Lookahead's) no attribute held
                self.guard.add_inner(optimizer)
                return
            if self.guard.optimizer is None and self.guard.world_size == 1 and _updates(optimizer, self.guard.model):
                self._taken_over(optimizer)
                return
            if self.guard.replaced_by(optimizer):  # the script's next optimizer over the same parameters
                self.guard.hand_over(optimizer)
            elif self.guard.world_size == 1 and self.guard.optimizer is not None and _let_go(self.guard.optimizer):
                self._new_phase(optimizer)  # the script let go of the last: this one's training is the next
            else:
                self.guard.add_optimizer(optimizer, self._model_of(optimizer))  # a GAN's second, at its first step
                self._others_in_a_row, self._first_steps_then = 1, self.guard.record.steps_taken  # its first in a row
            return
        # The guard's pre-hook, registered now, still runs for this step (PyTorch iterates the
        # optimizer's own hooks after the global ones).
        self._attach(self._model_of(optimizer), optimizer)

    def _backward(self, tensors: Any, gradients: Any = None) -> None:
        """A backward pass is about to run: its scalar is the step's loss; a loop over bare tensors is found here."""
        if self.guard is not None and not self.guard.released and self._phase_over():
            self._release()
        if self.guard is None and not self.stood_down:
            found = self._hand_updates.backward(tensors)
            if found is not None:  # updated by hand since the last pass: its first update went unseen
                self._pending_loss = self._hand_updates.previous_loss
                self._pending_passes.clear()
                self._attach(BareTensors(found), None, start_step=1)
        read = backward_loss.read(tensors, gradients)
        if read is None:
            return
        self._backward_seen = True
        if self.guard is None or self.guard.released:
            self._pending_passes.append(read.kept())
        else:
            self.guard.backward_pass(read.value, read.kept())  # checked with this pass's gradients, at the step

    def _scaler_stepping(self, optimizer: torch.optim.Optimizer) -> None:
        """A GradScaler steps ``optimizer``: attach now, the step may be skipped and call no optimizer hook."""
        if self.guard is not None and self.guard.released:
            self._new_phase(optimizer)
        elif self.guard is None and not self.stood_down:
            self._attach(self._model_of(optimizer), optimizer)

    def _attach(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, start_step: int = 0,
                config: StabilizerConfig | None = None) -> None:
        exit_status.watch_main_frame()  # called from inside the script: its frame is on the stack
        for handle in self._module_handles:
            handle.remove()
        self._fingerprints.clear()
        self._check_after = 0
        driver = search_driver() if config is None else None
        if driver is not None:  # a search's first trial: told, never acted on, as its next trials are (``_new_phase``)
            config = replace(self.config, action="notify", recovery="relaunch")
        self.guard = Guard(model, optimizer, config=config or self.config, paths=self.paths, start_step=start_step,
                           integration="launcher", batches=self.batches)
        if driver is not None:
            self.guard.driven_by(driver)
        self.batches = self.guard.batches  # none where the guard keeps none: what was fetched so far let go
        self.guard.called_through([root for root in (ref() for ref in self._roots.values()) if _wraps(root, model)])
        atexit.register(exit_status.record_uncaught)  # after the guard's: at exit, it runs before the guard closes
        if not isinstance(model, BareTensors):  # a relaunch loads the newest checkpoint into the network
            self.guard.restores_checkpoints()  # (a loop over bare tensors has no network to load it into)
        self._resume_optimizer(model, optimizer)
        for ref in self._loss_modules.values():
            loss_module = ref()
            if loss_module is not None:
                # Called before the capture existed: its names (CrossEntropyLoss_output_0, ...) and this step's inputs.
                self.guard.capture.loss_module_seen(loss_module, self._loss_args)
                self._loss_args = None
        if start_step == 1 and (self._pending_passes or self._pending_loss is not None):
            # The loss of the update that went unseen (its backward passes', else the log's): step 0's,
            # where the run started, for the learning check. It is not the next step's.
            passes, logged = self._pending_passes, self._pending_loss
            value = sum(float(read.value) for read in passes) / len(passes) if passes else float(logged or 0.0)
            if math.isfinite(value):
                self.guard.sentinel.learning.observe(0, value, None, None)
        elif self._pending_passes:
            for read in self._pending_passes:  # this first step's passes (its micro-batches)
                self.guard.backward_pass(read.value, read)
        elif self._pending_loss is not None:
            self.guard.step(self._pending_loss, logged=True)  # the log's: a backward pass's would be a pass
        self._pending_loss = None
        self._pending_passes.clear()

    def _phase_over(self) -> bool:
        """Whether the script let go of the network and optimizer the guard watches, now that a backward pass is
        about to run that is no pass of theirs (the network was not called since its optimizer's last step:
        ``Guard.network_idle``): a search's trial function returned, and the next trial trains. Both: a network
        the script still holds may train again under a new optimizer, which takes over its guard's steps
        (``Guard.hand_over``: stop 75's review, a head trained after its pretraining's function returned). Read by
        ``_let_go`` (a walk of the process's objects): where it says no (a network trained in turns with another,
        a critic whose actor steps first), not again before the guard's step count has doubled. One process
        only, as ``_next_phase``."""
        guard = self.guard
        assert guard is not None
        if guard.world_size > 1 or guard.optimizer is None or not guard.network_idle():
            return False
        taken = guard.record.steps_taken
        if taken < self._check_after:
            return False
        if _let_go(guard.optimizer) and _let_go(guard.model):
            return True
        self._check_after = 2 * taken + 1
        return False

    def _release(self) -> None:
        """The guard lets go of the network and optimizer the script let go of (``_phase_over``, ``Guard.release``),
        before the next network's first backward pass allocates its gradients; where they ended and where the
        learning check stood are kept for the next phase (``_new_phase``), which begins at the next optimizer's
        first step."""
        guard = self.guard
        assert guard is not None
        if self._lineages is None:
            self._lineages = weakref.WeakKeyDictionary()
        self._lineages[guard.model] = guard.lineage()
        self._ended = ended(guard.model)
        guard.release()
        self.batches = None  # the guard's, deactivated with it

    def _next_phase(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` (another optimizer, stepping now) has gone on stepping after the first one
        stopped for so long that its training is the next phase (module docstring): then the guard of the
        phase before is let go, without a summary, and one attached to it. One process only (each DDP rank
        would decide on its own)."""
        guard = self.guard
        assert guard is not None
        taken = guard.record.steps_taken
        if taken != self._first_steps_then:  # the first stepped since: a GAN's or a critic's rhythm
            self._longest_others = max(self._longest_others, self._others_in_a_row)
            self._others_in_a_row, self._first_steps_then = 0, taken
        self._others_in_a_row += 1
        # Not sooner where the first network is idle: networks trained in turns (Lightning's k-fold example, a fold's
        # 25 steps each) would then change phase at every turn, each judged from its turn's first steps (stop 87).
        if self._others_in_a_row <= max(PHASE_STEPS, 4 * self._longest_others) or guard.world_size > 1:
            return False
        # Where the first one never stepped since this one's first step, the copies held have this one's state
        # then: where its training began.
        began = guard.held_other(optimizer) if self._longest_others == 0 else None
        self._new_phase(optimizer, earlier=guard.other_losses(optimizer, self._others_in_a_row - 1), began=began)
        return True

    def _taken_over(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer steps the weights of a network watched as updated by hand: its steps are the run's from
        now on (``_new_phase``). Where it steps before the guard of the hand-written update counted more than
        ``TAKEN_OVER`` steps, the change that guard was attached for was part of this step, not an update:
        sharpness-aware minimisation climbs to a nearby point after its first backward pass and takes its
        second there, before its first optimizer step (and comes back). The passes that guard counted are then
        this first step's, and their mean its loss, as the passes of a step are (gradient accumulation): the
        new guard starts from the step's own loss, not from the next one's, after the first update (a rate that
        explodes at once would otherwise start the learning check from the explosion). One process only, as
        ``_next_phase``: not tried under DDP, where every rank would have to let its guard go at the same step."""
        assert self.guard is not None
        counted = [value for _, value in self.guard.sentinel.loss_history]
        if not counted or self.guard.record.steps_taken > TAKEN_OVER:
            self._new_phase(optimizer)
            return
        device = next((p.device for p in self.guard.model.parameters()), None)
        self._new_phase(optimizer, torch.tensor(sum(counted) / len(counted), device=device))

    def _new_phase(self, optimizer: torch.optim.Optimizer, carried: torch.Tensor | None = None,
                   earlier: list[float] | None = None,
                   began: tuple[dict[str, Any], dict[str, Any]] | None = None) -> None:
        """Let the guard of the phase before go, without a summary (and with it the network and optimizer it
        held), and attach one to ``optimizer``. Its in-job decisions are the job's: findings.json keeps them,
        before the new phase's (a sweep's first model rolled back lost its record, and the workflow, which had
        read it, would have taken the next phase's first for it).

        A phase whose network is the one before built again, trained from its start (``_trained_again``: a
        search's trials, a cross-validation's folds, one architecture trained at several seeds) is a run the
        script compares with the others: its findings are told (action ``notify``), never acted on, no rollback
        and no stop. A trial at a rate that diverges is the search's to see: rolled back, it ended as well as
        the best and the script chose its rate (stop 70's hunt); stopped, the search ended there. Its summary
        says how many such phases came before it (``trained_before``). The first phase is acted on as any run
        (nothing says yet that another will follow) but where a search's package calls it (``search_driver``):
        scikit-learn's ``GridSearchCV`` fitting a skorch net at a rate that learns nothing was stopped at its
        first trial's patience, the whole search with it, and one at a rate that diverges rolled back, its
        cross-validated score another (stop 80's hunt).

        A network a phase before watched, trained again (two networks trained in turns, a search's best trials
        trained on), goes on from where its learning check stood then: judged against the start of its own
        training, as a resumed run is against its lineage's, not from a level it had learned to (stop 70's hunt:
        two networks trained in alternate epochs, each at 0.96 accuracy, ended NotLearning on the last epoch's
        19 steps). A network the guard of the phase before saw train (``earlier``: the losses of its steps before
        this one, under that guard as another optimizer's) is judged against the start they measured, its steps
        counted from there. A finding a rollback under way left standing as the phase before ended (``Guard.
        phase_ended``) stands for the run where the new phase's network is that one going on (a network pruned
        and its optimizer built again), as at the run's end; a trial's is its own."""
        assert self.guard is not None
        standing: list[dict[str, Any]] = []  # findings a rollback under way left standing as the phase ended
        if self.guard.released:  # its network let go of (``_release``): this step's passes are the launcher's
            before = self._ended or []
        else:
            passes = self.guard.pass_loss()  # this step's backward passes, read by the guard of the phase before
            carried = passes if carried is None else carried
            found = len(self.guard.sentinel.findings)
            self.guard.phase_ended()
            standing = self.guard.sentinel.findings[found:]
            if self._lineages is None:
                self._lineages = weakref.WeakKeyDictionary()
            self._lineages[self.guard.model] = self.guard.lineage()
            before = ended(self.guard.model)
        self._ended = None
        decided = self.guard.in_job_decisions()
        self.guard.discard()
        self.guard, self.batches = None, None
        self._others_in_a_row, self._first_steps_then, self._longest_others = 0, -1, 0
        model = self._model_of(optimizer)
        if isinstance(model, BareTensors):  # its network was never called while the module hooks stood
            model = unwrap(_owner(optimizer) or model)
        lineage = self._lineages.get(model)
        again = lineage is None and _trained_again(before, model)
        self._trained_before = self._trained_before + 1 if again else 0
        told_only = replace(self.config, action="notify", recovery="relaunch") if again else None
        began = _began_as(began, model, optimizer)  # before the attach: the buffers as they are now
        self._attach(model, optimizer, config=told_only, start_step=len(earlier or ()))
        if self.guard is not None:
            self.guard.carry_decisions(decided)
            if again:
                self.guard.trained_again(self._trained_before)
            if lineage is not None:
                self.guard.continues(lineage)
                # The network a rollback under way had not recovered trains on: its finding stands for the run, as
                # at the run's end (stop 79's harm hunt: a network pruned mid-probe, its optimizer built again,
                # was judged on its second phase alone, learned at a held-out accuracy of 0.56).
                self.guard.sentinel.adopt(standing)
            elif earlier:
                self.guard.trained_unwatched(earlier, began)
        if carried is not None and self.guard is not None:
            self.guard.backward_pass(carried)

    def _model_of(self, optimizer: torch.optim.Optimizer) -> nn.Module:
        wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
        best, best_shared = None, 0
        for ref in self._roots.values():
            module = ref()
            if module is None:
                continue
            shared = sum(1 for p in module.parameters() if id(p) in wanted)
            if shared > best_shared:
                best, best_shared = module, shared
        if best is not None:
            if best_shared < len(wanted):
                best = _holder(best, wanted) or best
            return unwrap(best)
        # No module call was seen (a functional model): the optimizer's own tensors, by position (an
        # nn.ParameterList would copy plain tensors into new Parameters, whose gradients stay empty).
        return BareTensors([p for group in optimizer.param_groups for p in group["params"]])

    # -- zero-code resume: the newest checkpoint into the first network that fits it
    def _resume_into(self, module: nn.Module) -> None:
        if self._checkpoint is not None or self.guard is not None:
            return
        if not self._looked_for_checkpoint:
            self._looked_for_checkpoint = True
            self._candidate = resume.read_newest(self.paths)
        found = self._candidate
        if found is None:
            return
        network = unwrap(module)
        source, state = found
        if resume.misfit(state, network, None) is not None:
            return  # not this module (a loss, an augmentation, another network): the next root may fit
        network.load_state_dict(state["model"])
        self._checkpoint = (source, state, network)
        say(f"sentinel: the launcher resumed {type(network).__name__} from {source}")

    def _resume_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        if self._checkpoint is None or self.guard is None:
            if self._candidate is not None:
                # Not "starting fresh": a script that keeps its own checkpoints there may have resumed itself.
                say(f"sentinel: checkpoint {self._candidate[0]} fits no network of this script, so the launcher "
                    f"loaded nothing from it")
            return
        source, state, network = self._checkpoint
        if network is not model:
            return
        if optimizer is not None and resume.misfit(state, model, optimizer) is None:
            resume.load_optimizer(state, optimizer)  # before this first step: its momentum applies to it
        self.guard.resumed(resume.started_from(source, self.paths), int(state["next_step"]))

    # -- the loss, after discovery: from each backward pass (_backward), else the log
    def _logged_loss(self, value: float) -> None:
        if self._backward_seen:
            return  # the backwarded scalar is exact and per step; log lines are neither
        if self.guard is None or self.guard.released:
            self._pending_loss = value
        else:
            self.guard.step(value, logged=True)

    @closing
    def close(self) -> None:
        """Remove the hooks, close the guard and say how many steps it watched; idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for handle in (*self._module_handles, self._optimizer_handle, self._watch_handle, self._scaler_handle,
                       self._backward_handle):
            handle.remove()
        if self.guard is not None:
            self.guard.close()
        else:
            self._say_unwatched()
        self._drop_batches()
        self.channel.uninstall()

    def _say_unwatched(self) -> None:
        """One line on stderr where the script trained, or logged losses, and the hooks never attached: no summary
        is written, and the workflow calls the run unwatched; the line says why. Not in a worker (a loader's, or
        a Hogwild! child that never stepped), nor where the workers wrote their findings (a Hogwild! parent, which
        tests what they trained). A loop refused as making new tensors at every step (bare_tensors.HandUpdates) is
        said so here, not when refused: an optimizer that stepped after it attached the hooks, and then it was no
        such loop."""
        if (self.stood_down or worker_processes.is_worker()
                or (self.paths.checkpoint_dir / worker_processes.PARTS).is_dir()):
            return
        if self._hand_updates.refused is not None:
            say(f"sentinel: not watched: {self._hand_updates.refused}")
            return
        if self._trained is not None:
            seen = f"{self._trained} was called in training mode"
        elif self._pending_loss is not None:
            seen = "the log reported a loss"
        else:
            return
        ended = how_it_ended()
        if ended.status in ("exception", "interrupted"):  # stop 86's harm hunt: it blamed weights kept outside
            say(f"sentinel: not watched: {seen}, and the script ended ({ended.status}) before any optimizer stepped "
                "or any weight changed: the run was not judged")
            return
        say(f"sentinel: not watched: {seen}, but no optimizer stepped and no weights changed in place (weights "
            "kept outside the network, as torch.func.functional_call's, cannot be followed): the run was not "
            "judged")


def activate(environ: Mapping[str, str] | None = None, *, force: bool = False,
             worker: bool = False) -> LauncherHooks | None:
    """Install the global hooks when the job asks for the launcher level (or ``force``); ``worker``: in a
    ``multiprocessing`` child of the entry point's process (stabilizer_sentinel.loops.worker_processes)."""
    config = load_config(environ)
    if not force and config.integration not in ("launcher", "auto"):
        return None
    from stabilizer_sentinel.capture.capture import parse_capture
    from stabilizer_sentinel.rules import parse_rule_list

    parse_rule_list(config.effective_rules)  # a bad configuration fails before the script starts
    parse_capture(config.effective_capture)
    if worker:
        worker_processes.become_worker()
    return LauncherHooks(config, JobPaths.from_env(environ))
