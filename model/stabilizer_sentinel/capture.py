"""Tensor capture: decide which collections are due at a step, copy their tensors, hand them on.

A collection is a named group of tensors with its own schedule (``save_interval`` or
``save_steps``) and modes (TRAIN, EVAL). Built-in collections and the tensor names they hold:

==============  ======================================================================
collection      tensors
==============  ======================================================================
``weights``     ``weights/<parameter>`` for every parameter whose name does not end in ``bias``
``biases``      ``biases/<parameter>`` for every parameter whose name ends in ``bias``
``gradients``   ``gradients/<parameter>`` for every parameter with a gradient
``losses``      ``losses/loss`` (TRAIN: the batch loss; EVAL: the mean loss of the evaluation)
``activations`` ``activations/<module>``: outputs of the network's blocks (modules whose class
                name ends in ``Block``), or of the modules its ``include_regex`` names
``activation_outputs`` ``activations/<module>`` for activation-function modules (ReLU, ELU, ...)
``activation_inputs`` ``activation_inputs/<module>``: what those modules received
``inputs``      ``inputs/inputs`` (the input batch)
``labels``      ``labels/labels`` (class indices)
``predictions`` ``predictions/predictions`` (arg-max class indices)
==============  ======================================================================

Any other name is a custom collection selected by ``include_regex`` over all of the names above,
where ``activations/<module>`` exists for every named module (searched anywhere in the name, as Debugger does).

Captured tensors go to a store writer on a background thread (disk collections, the ``capture``
hyperparameter) and to a ``MemoryTrial`` (collections the sentinel's rules need). The hot path
is ``end_step`` on a step where nothing is due: a few integer comparisons, no host synchronisation.
This module must not evaluate rules or decide about stopping: that is the sentinel's job.
"""

from __future__ import annotations

import json
import queue
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from stabilizer_sentinel import store
from stabilizer_sentinel.trial import MemoryTrial

BUILTIN_COLLECTIONS = (
    "weights",
    "biases",
    "gradients",
    "losses",
    "activations",
    "activation_outputs",
    "activation_inputs",
    "inputs",
    "labels",
    "predictions",
)
ACTIVATION_TYPES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid)
# Debugger's hook saves every 500 steps by default; our runs are short, so collections a rule
# needs but the capture hyperparameter does not list are held in memory every 100 steps.
DEFAULT_SAVE_INTERVAL = 100
_PARAMETER_COLLECTIONS = ("weights", "biases", "gradients")
_CONFIG_KEYS = {"save_interval", "save_steps", "include_regex", "modes"}


class CaptureConfigError(ValueError):
    """The capture configuration is wrong; the message names the field and what was expected."""


@dataclass(frozen=True)
class CollectionConfig:
    name: str
    save_interval: int | None = DEFAULT_SAVE_INTERVAL
    save_steps: frozenset[int] = frozenset()
    include_regex: tuple[str, ...] = ()
    modes: tuple[str, ...] = store.MODES

    def due(self, step: int, mode: str) -> bool:
        if mode not in self.modes:
            return False
        # Evaluations are rare (once per epoch or less), so every one is recorded.
        if mode == "EVAL":
            return True
        if step in self.save_steps:
            return True
        return self.save_interval is not None and step % self.save_interval == 0

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"modes": list(self.modes)}
        if self.save_steps:
            out["save_steps"] = sorted(self.save_steps)
        if self.save_interval is not None:
            out["save_interval"] = self.save_interval
        if self.include_regex:
            out["include_regex"] = list(self.include_regex)
        return out


def default_modes(name: str) -> tuple[str, ...]:
    """Parameters and their gradients exist only while training; everything else also in EVAL."""
    return ("TRAIN",) if name in _PARAMETER_COLLECTIONS else store.MODES


def _positive_int(value: Any, where: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise CaptureConfigError(f"{where}: expected a positive integer, got {value!r}") from None
    if number < 1:
        raise CaptureConfigError(f"{where}: expected a positive integer, got {value!r}")
    return number


def _regex_list(value: Any, where: str) -> tuple[str, ...]:
    items = [part.strip() for part in value.split(",")] if isinstance(value, str) else list(value)
    for item in items:
        try:
            re.compile(item)
        except re.error as exc:
            raise CaptureConfigError(f"{where}: {item!r} is not a valid regular expression ({exc})") from None
    return tuple(item for item in items if item)


def parse_collection(name: str, raw: Mapping[str, Any]) -> CollectionConfig:
    where = f"capture.{name}"
    if not isinstance(raw, Mapping):
        raise CaptureConfigError(f'{where}: expected an object such as {{"save_interval": 10}}, got {raw!r}')
    unknown = set(raw) - _CONFIG_KEYS
    if unknown:
        raise CaptureConfigError(f"{where}: unknown keys {sorted(unknown)}; valid keys: {sorted(_CONFIG_KEYS)}")
    save_steps: frozenset[int] = frozenset()
    interval: int | None = DEFAULT_SAVE_INTERVAL
    if "save_steps" in raw:
        steps = raw["save_steps"]
        if isinstance(steps, str):
            steps = [part for part in steps.split(",") if part.strip()]
        try:
            save_steps = frozenset(int(str(step)) for step in steps)
        except (TypeError, ValueError):
            raise CaptureConfigError(f"{where}.save_steps: expected a list of step numbers, got {steps!r}") from None
        if any(step < 0 for step in save_steps):
            raise CaptureConfigError(f"{where}.save_steps: steps must be >= 0, got {sorted(save_steps)}")
        interval = None
    if "save_interval" in raw:
        interval = _positive_int(raw["save_interval"], f"{where}.save_interval")
    include = _regex_list(raw.get("include_regex", ()), f"{where}.include_regex")
    if name not in BUILTIN_COLLECTIONS and not include:
        raise CaptureConfigError(
            f"{where}: a custom collection needs include_regex; built-in collections are {list(BUILTIN_COLLECTIONS)}"
        )
    modes_raw = raw.get("modes", list(default_modes(name)))
    modes_list = [modes_raw] if isinstance(modes_raw, str) else list(modes_raw)
    modes = tuple(str(mode).upper() for mode in modes_list)
    bad = [mode for mode in modes if mode not in store.MODES]
    if bad or not modes:
        raise CaptureConfigError(f"{where}.modes: expected a list of {list(store.MODES)}, got {modes_raw!r}")
    return CollectionConfig(name, interval, save_steps, include, modes)


def parse_capture(raw: str | Mapping[str, Any] | None) -> dict[str, CollectionConfig]:
    """Parse the ``capture`` hyperparameter (a JSON object, or the object itself)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CaptureConfigError(f"capture: expected a JSON object, got {raw!r} ({exc})") from None
    if not isinstance(raw, Mapping):
        raise CaptureConfigError(f"capture: expected a JSON object of collection -> settings, got {raw!r}")
    return {str(name): parse_collection(str(name), settings) for name, settings in raw.items()}


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


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    # .numpy() shares memory with the tensor; the optimizer updates parameters in place, so copy.
    return tensor.detach().to("cpu").numpy().copy()


class Capture:
    """Saves due collections each step; see the module docstring for names and the store layout."""

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
        self._collections: dict[str, _Collection] = {}
        for name, config in (collections or {}).items():
            self._collections[name] = _Collection(config, to_disk=True)
        self._resolve_members()
        self._writer: _Writer | None = None
        self._hooks: list[Any] = []
        self._activations: dict[str, torch.Tensor] = {}
        self._activation_inputs: dict[str, torch.Tensor] = {}
        self._wanted_inputs: set[str] = set()
        self._armed_step: int | None = None
        self.last_step: int | None = None
        self._closed = False
        if self.disk_enabled:
            self._ensure_writer()  # now, so a resumed job clears the previous end marker at once

    # -- configuration
    @classmethod
    def from_hyperparameter(
        cls, model: nn.Module, capture: str | Mapping[str, Any] | None, out_dir: str | Path | None
    ) -> Capture:
        return cls(model, parse_capture(capture), out_dir=out_dir)

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

    @property
    def collections(self) -> dict[str, CollectionConfig]:
        return {name: coll.config for name, coll in self._collections.items()}

    @property
    def disk_enabled(self) -> bool:
        return self.out_dir is not None and any(coll.to_disk for coll in self._collections.values())

    def _candidates(self) -> dict[str, list[str]]:
        names = {
            "weights": [f"weights/{n}" for n, _ in self._params if not n.endswith("bias")],
            "biases": [f"biases/{n}" for n, _ in self._params if n.endswith("bias")],
            "gradients": [f"gradients/{n}" for n, _ in self._params],
            "losses": ["losses/loss"],
            "inputs": ["inputs/inputs"],
            "labels": ["labels/labels"],
            "predictions": ["predictions/predictions"],
        }
        # Inputs of activation-function modules (SaturatedActivation, PoorWeightInitialization).
        names["activation_inputs"] = [
            f"activation_inputs/{n}" for n, m in self._modules.items() if isinstance(m, ACTIVATION_TYPES)
        ]
        names["activation_outputs"] = [
            f"activations/{n}" for n, m in self._modules.items() if isinstance(m, ACTIVATION_TYPES)
        ]
        names["activations"] = [
            f"activations/{n}" for n, m in self._modules.items() if type(m).__name__.endswith("Block")
        ]
        return names

    def _resolve_members(self) -> None:
        candidates = self._candidates()
        everything = [name for names in candidates.values() for name in names if not name.startswith("activations/")
                      and not name.startswith("activation_inputs/")]
        everything += [f"activations/{name}" for name in self._modules]
        for name, coll in self._collections.items():
            patterns = [re.compile(regex) for regex in coll.config.include_regex]
            if name in BUILTIN_COLLECTIONS and not patterns:
                members = candidates[name]
            elif name in ("activations", "activation_outputs"):
                members = [n for n in everything if n.startswith("activations/") and any(p.search(n) for p in patterns)]
            elif name in BUILTIN_COLLECTIONS:
                members = [n for n in candidates[name] if any(p.search(n) for p in patterns)]
            else:
                members = [n for n in everything if any(p.search(n) for p in patterns)]
            if not members:
                raise CaptureConfigError(
                    f"capture.{name}: include_regex {list(coll.config.include_regex)} matches no tensor; "
                    f"names look like {[*everything[:3], everything[-1]]}"
                )
            coll.members = tuple(members)

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
            hook = self._modules[module_name].register_forward_hook(self._make_hook(module_name))
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
        if self._closed or not self._collections:
            return False
        due = self._due(step, mode, force)
        if not due:
            self._disarm()
            return False
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
        if self.memory is not None:
            self.memory.add(step, mode, record)
        if disk_names and self.out_dir is not None:
            on_disk = {name: rec for name, rec in record.items() if name in disk_names}
            self._ensure_writer().put(store.StepRecord(step, mode, on_disk))
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
            values["losses/loss"] = np.asarray(loss_value, dtype=np.float32)
        if "inputs/inputs" in wanted and inputs is not None:
            values["inputs/inputs"] = _numpy(inputs)
        if "labels/labels" in wanted and labels is not None:
            values["labels/labels"] = _class_indices(labels)
        if "predictions/predictions" in wanted and outputs is not None:
            values["predictions/predictions"] = _class_indices(outputs)
        for module_name, output in self._activations.items():
            if f"activations/{module_name}" in wanted:
                values[f"activations/{module_name}"] = output.to("cpu").numpy()
        for module_name, given in self._activation_inputs.items():
            if f"activation_inputs/{module_name}" in wanted:
                values[f"activation_inputs/{module_name}"] = given.to("cpu").numpy()
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
