"""Tensor capture: decide which collections are due at a step, copy their tensors, hand them on.

A collection is a named group of tensors with its own schedule (``save_interval`` or
``save_steps``) and modes (TRAIN, EVAL). The tensors each collection holds, by name, and how a
custom collection's ``include_regex`` selects them: ``stabilizer_sentinel.capture.collection_members``.

Captured tensors go to a store writer on a background thread (disk collections, the ``capture``
hyperparameter) and to a ``MemoryTrial`` (collections the sentinel's rules need). The hot path
is ``end_step`` on a step where nothing is due: a few integer comparisons, no host synchronisation.
This module must not evaluate rules or decide about stopping: that is the sentinel's job.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from stabilizer_sentinel.capture import module_hooks, store
from stabilizer_sentinel.capture.collection_config import (
    BUILTIN_COLLECTIONS,
    DEFAULT_SAVE_INTERVAL,
    CaptureConfigError,
    CollectionConfig,
    default_modes,
    parse_capture,
)
from stabilizer_sentinel.capture.collection_members import builtin_names, sample_names, select_members, selectable_names
from stabilizer_sentinel.capture.loss_module import LossModuleWatch
from stabilizer_sentinel.capture.trial import MemoryTrial, smdebug_name

__all__ = ["BUILTIN_COLLECTIONS", "Capture", "CaptureConfigError", "CollectionConfig", "parse_capture"]


@dataclass
class _Collection:
    config: CollectionConfig
    to_disk: bool
    members: tuple[str, ...] = ()


class _Writer(threading.Thread):
    """Writes step records in order on its own thread, so the training step never waits on disk."""

    def __init__(self, writer: store.StoreWriter) -> None:
        super().__init__(name="tensor-store-writer", daemon=True)
        self.writer = writer
        self.queue: queue.Queue[store.StepRecord | None] = queue.Queue(maxsize=16)
        self.error: BaseException | None = None

    def run(self) -> None:
        while True:
            record = self.queue.get()
            try:
                if record is None:
                    return
                if self.error is None:
                    self.writer.write_step(record)
            except BaseException as exc:  # surfaced by Capture.close / the next put
                self.error = exc
            finally:
                self.queue.task_done()

    def put(self, record: store.StepRecord) -> None:
        if self.error is not None:
            raise RuntimeError(f"writing the tensor store failed: {self.error}") from self.error
        self.queue.put(record)


# Floating types NumPy holds as they are; others (bfloat16, the float8 types) are stored as float32.
NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A copy of ``tensor`` in host memory as NumPy holds it: a sparse tensor (an embedding's gradient
    with ``sparse=True``) as the dense tensor it stands for, a float type NumPy lacks as float32."""
    data = tensor.detach()
    if data.layout != torch.strided:
        data = data.to_dense()
    if data.is_floating_point() and data.dtype not in NUMPY_FLOATS:
        data = data.float()
    # .numpy() shares memory with the tensor; the optimizer updates parameters in place, so copy.
    return data.to("cpu").numpy().copy()


class Capture:
    """Saves due collections each step; names: ``stabilizer_sentinel.capture.collection_members``."""

    def __init__(
        self,
        model: nn.Module,
        collections: Mapping[str, CollectionConfig] | None = None,
        out_dir: str | Path | None = None,
        memory: MemoryTrial | None = None,
    ) -> None:
        self.model = model
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.memory = memory
        self._params = [(name, param) for name, param in model.named_parameters()]
        self._modules = {name: module for name, module in model.named_modules() if name}
        # smdebug's names need the network's class and the loss module's (found at its first call).
        self.model_name = type(model).__name__
        self.loss: LossModuleWatch | None = None
        self._collections: dict[str, _Collection] = {}
        for name, config in (collections or {}).items():
            self._collections[name] = _Collection(config, to_disk=True)
        self._resolve_members()
        self._watch_loss_if_needed()
        self._writer: _Writer | None = None
        self._hooks: list[Any] = []
        self._activations: dict[str, torch.Tensor] = {}
        self._activation_inputs: dict[str, torch.Tensor] = {}
        self._wanted_inputs: set[str] = set()
        self._armed_step: int | None = None
        self.last_step: int | None = None
        self._closed = False
        self._resolved = False
        if self.disk_enabled:
            self._ensure_writer()  # now, so a resumed job clears the previous end marker at once

    def release(self) -> None:
        """The script let go of the network (the guard's ``release``): let go of it, of its parameters and modules,
        and of the tensors captured from it."""
        self.model, self._params, self._modules = nn.Module(), [], {}
        self._activations, self._activation_inputs = {}, {}

    # -- configuration
    def require(self, collections: Iterable[str], memory: MemoryTrial, save_interval: int | None = None) -> None:
        """Make ``collections`` available in memory for rules; ones not configured get a default schedule."""
        self.memory = memory
        for name in collections:
            if name not in self._collections:
                if name not in BUILTIN_COLLECTIONS:
                    raise CaptureConfigError(
                        f"a rule needs collection {name!r}, which is neither built in "
                        f"({list(BUILTIN_COLLECTIONS)}) nor defined in the capture hyperparameter"
                    )
                config = CollectionConfig(name, save_interval or DEFAULT_SAVE_INTERVAL, modes=default_modes(name))
                self._collections[name] = _Collection(config, to_disk=False)
        self._resolve_members()
        self._watch_loss_if_needed()

    def _wants_loss_inputs(self) -> bool:
        return any(name in ("labels", "predictions") or name not in BUILTIN_COLLECTIONS for name in self._collections)

    def _watch_loss_if_needed(self) -> None:
        # Only where its inputs or names are wanted: a global module hook makes torch.compile warn.
        if self.loss is None and self._wants_loss_inputs():
            self.loss = LossModuleWatch(on_found=self._loss_found)

    @property
    def collections(self) -> dict[str, CollectionConfig]:
        return {name: coll.config for name, coll in self._collections.items()}

    @property
    def disk_enabled(self) -> bool:
        return self.out_dir is not None and any(coll.to_disk for coll in self._collections.values())

    def _candidates(self) -> dict[str, list[str]]:
        return builtin_names((name for name, _ in self._params), self._modules)

    def _alias(self, name: str) -> str | None:
        return smdebug_name(name, self.model_name, self.loss and self.loss.name)

    def loss_module_seen(self, module: nn.Module, args: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """The loss module, called before this capture existed, with its last training call's inputs."""
        # Its global hook goes at once; a hook on the loss module stays only where its inputs are wanted.
        self.loss = self.loss or LossModuleWatch(on_found=self._loss_found, inputs=self._wants_loss_inputs())
        self.loss.adopt(module, args)

    def _loss_found(self) -> None:
        self._resolve_members()

    def _everything(self) -> list[str]:
        """Every name a custom collection selects from: all built-in tensors, every named module's output and input."""
        return selectable_names(self._candidates(), self._modules)

    def _resolve_members(self) -> None:
        """Each collection's tensors: custom ones by name or smdebug's name (re.search, as smdebug's ``match_inc``)."""
        candidates = self._candidates()
        everything = self._everything()
        for name, coll in self._collections.items():
            coll.members = select_members(name, coll.config, candidates, everything, self._alias)

    def _refuse_unmatched(self) -> None:
        """After the first step (the loss module known): a collection whose regex matches nothing is an
        error naming it, with sample names in both forms (Debugger would leave it empty, unsaid)."""
        sample = sample_names(self._everything(), list(self._modules))
        for name, coll in self._collections.items():
            if not coll.members and coll.config.include_regex:
                raise CaptureConfigError(
                    f"capture.{name}: include_regex {list(coll.config.include_regex)} matches no tensor; names "
                    f"look like {sample} (as smdebug names them: {[self._alias(n) or n for n in sample]})")

    # -- the step loop
    def _due(self, step: int, mode: str, force: Iterable[str] = ()) -> list[_Collection]:
        forced = set(force)
        return [c for name, c in self._collections.items() if name in forced or c.config.due(step, mode)]

    def begin_step(self, step: int, mode: str = "TRAIN") -> None:
        """Arm forward hooks when module outputs are due at ``step``; call before the forward pass."""
        if not self._collections:
            return
        members = {member for coll in self._due(step, mode) for member in coll.members}
        self._wanted_inputs = {m[len("activation_inputs/") :] for m in members if m.startswith("activation_inputs/")}
        wanted = {m[len("activations/") :] for m in members if m.startswith("activations/")} | self._wanted_inputs
        self._disarm()
        for module_name in sorted(wanted):
            hook = module_hooks.forward_hook(self._modules[module_name], self._make_hook(module_name))
            self._hooks.append(hook)
        self._armed_step = step if wanted else None

    def _make_hook(self, module_name: str) -> Any:
        def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor):
                # A module called twice in one forward pass keeps its last output.
                self._activations[module_name] = output.detach().clone()
            if module_name in self._wanted_inputs and _inputs and isinstance(_inputs[0], torch.Tensor):
                self._activation_inputs[module_name] = _inputs[0].detach().clone()

        return hook

    def _disarm(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def end_step(
        self,
        step: int,
        *,
        mode: str = "TRAIN",
        loss: float | torch.Tensor | None = None,
        inputs: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        outputs: torch.Tensor | None = None,
        force: Iterable[str] = (),
    ) -> bool:
        """Save the collections due at ``step`` (after backward, before the optimizer step).

        ``force`` names collections to save now whatever their schedule (the sentinel forces
        gradients and losses at the step a rule fires). Returns True when anything was saved.
        """
        loss_args = self.loss.step_ended() if self.loss is not None else None
        if self._closed or not self._collections:
            return False
        if not self._resolved:  # after the first forward pass: the loss module is known by now
            self._resolved = True
            self._refuse_unmatched()
        due = self._due(step, mode, force)
        if not due:
            self._disarm()
            return False
        if loss_args is not None and mode == "TRAIN":  # smdebug's <Loss>_input_0 and _input_1
            outputs = loss_args[0] if outputs is None else outputs
            labels = loss_args[1] if labels is None else labels
        wanted = set().union(*(coll.members for coll in due))
        values = self._collect(wanted, mode=mode, loss=loss, inputs=inputs, labels=labels, outputs=outputs)
        self._disarm()
        self._activations = {}
        self._activation_inputs = {}
        memberships: dict[str, list[str]] = {}
        disk_names: set[str] = set()
        for coll in due:
            for member in coll.members:
                if member in values:
                    memberships.setdefault(member, []).append(coll.config.name)
                    if coll.to_disk:
                        disk_names.add(member)
        if not memberships:
            return False
        # Iterate values, not memberships: values are in network order, which readers rely on.
        record = {name: (tuple(memberships[name]), values[name]) for name in values if name in memberships}
        aliases = {name: alias for name in record if (alias := self._alias(name)) is not None}
        if self.memory is not None:
            self.memory.add(step, mode, record, aliases)
        if disk_names and self.out_dir is not None:
            on_disk = {name: rec for name, rec in record.items() if name in disk_names}
            self._ensure_writer().put(store.StepRecord(step, mode, on_disk, aliases))
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        return True

    def _collect(
        self,
        wanted: set[str],
        *,
        mode: str,
        loss: float | torch.Tensor | None,
        inputs: torch.Tensor | None,
        labels: torch.Tensor | None,
        outputs: torch.Tensor | None,
    ) -> dict[str, np.ndarray]:
        values: dict[str, np.ndarray] = {}
        # Parameters and gradients belong to training steps; an evaluation would only repeat them.
        for name, param in self._params if mode == "TRAIN" else ():
            if f"weights/{name}" in wanted:
                values[f"weights/{name}"] = _numpy(param)
            if f"biases/{name}" in wanted:
                values[f"biases/{name}"] = _numpy(param)
            if f"gradients/{name}" in wanted and param.grad is not None:
                values[f"gradients/{name}"] = _numpy(param.grad)
        if "losses/loss" in wanted and loss is not None:
            loss_value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
            # float32 as before, but a finite loss beyond its range (a float64 run's) as float64: not read as inf.
            wide = math.isfinite(loss_value) and abs(loss_value) > FLOAT32_MAX
            values["losses/loss"] = np.asarray(loss_value, dtype=np.float64 if wide else np.float32)
        if "inputs/inputs" in wanted and inputs is not None:
            values["inputs/inputs"] = _numpy(inputs)
        if "labels/labels" in wanted and labels is not None:
            values["labels/labels"] = _class_indices(labels)
        if "predictions/predictions" in wanted and outputs is not None:
            values["predictions/predictions"] = _class_indices(outputs)
        for module_name, output in self._activations.items():
            if f"activations/{module_name}" in wanted:
                values[f"activations/{module_name}"] = _numpy(output)
        for module_name, given in self._activation_inputs.items():
            if f"activation_inputs/{module_name}" in wanted:
                values[f"activation_inputs/{module_name}"] = _numpy(given)
        return values

    def _ensure_writer(self) -> _Writer:
        if self._writer is None:
            assert self.out_dir is not None
            writer = store.StoreWriter(self.out_dir)
            writer.write_collections({name: c.config.as_json() for name, c in self._collections.items() if c.to_disk})
            self._writer = _Writer(writer)
            self._writer.start()
        return self._writer

    def flush(self) -> None:
        """Wait until every step handed over so far is on disk (readers can see it)."""
        if self._writer is not None:
            self._writer.queue.join()
            if self._writer.error is not None:
                raise RuntimeError(f"writing the tensor store failed: {self._writer.error}") from self._writer.error

    def close(self, status: str = "completed") -> None:
        """Flush pending writes and write the end-of-job marker (``status``: completed, rule_stop, ...)."""
        if self._closed:
            return
        self._closed = True
        self._disarm()
        if self.loss is not None:
            self.loss.close()
        if self.memory is not None:
            self.memory.mark_end()
        if not self.disk_enabled:
            return
        writer = self._ensure_writer()
        writer.queue.put(None)
        writer.join()
        if writer.error is not None:
            raise RuntimeError(f"writing the tensor store failed: {writer.error}") from writer.error
        writer.writer.write_end(self.last_step, status)


def _class_indices(tensor: torch.Tensor) -> np.ndarray:
    """Labels or predictions as int64 class indices (arg-max over the last axis when 2-D)."""
    data = tensor.detach()
    if data.ndim >= 2:
        data = data.argmax(dim=-1)
    return data.to("cpu", torch.int64).numpy().copy()
