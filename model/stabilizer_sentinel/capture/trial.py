"""The Trial API: read captured tensors by name, step and mode, while the job writes them or afterwards.

``create_trial(path)`` opens a tensor store in a local directory or under an ``s3://`` prefix (boto3
is imported only then). ``MemoryTrial`` offers the same reading interface over tensors held in
memory; the in-job sentinel evaluates rules against it, so a rule runs unchanged in the job, in the
out-of-job evaluator and in a notebook. This module reads; it never writes a store.
"""

from __future__ import annotations

import re
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

import numpy as np

from stabilizer_sentinel.capture import store
from stabilizer_sentinel.capture.profiler import read_samples


class ModeKeys(StrEnum):
    TRAIN = "TRAIN"
    EVAL = "EVAL"


class TensorUnavailableForStep(LookupError):  # noqa: N818 - the name smdebug users know
    """The tensor was not saved at that step (or that mode), or is no longer held in memory."""


class TensorUnavailable(LookupError):  # noqa: N818 - the name smdebug users know
    """No tensor of that name exists in the trial (yet)."""


def _modes(mode: str | ModeKeys | None) -> tuple[str, ...]:
    if mode is None:
        return store.MODES
    text = str(mode.value if isinstance(mode, ModeKeys) else mode).upper()
    if text not in store.MODES:
        raise ValueError(f"mode must be one of {store.MODES}, got {mode!r}")
    return (text,)


def _as_patterns(regex: str | Iterable[str] | None) -> list[re.Pattern[str]]:
    if regex is None:
        return []
    items = [regex] if isinstance(regex, str) else list(regex)
    return [re.compile(item) for item in items if item]


def smdebug_name(name: str, model: str | None = None, loss: str | None = None) -> str | None:
    """The name smdebug's PyTorch hook gives the same tensor, or None when it has none.

    ``activations/layer1.relu`` -> ``layer1.relu_output_0``, ``activation_inputs/relu`` -> ``relu_input_0``;
    with the network's class name (``model``): ``weights/fc.weight`` -> ``Net_fc.weight``,
    ``gradients/fc.weight`` -> ``gradient/Net_fc.weight``, ``inputs/inputs`` -> ``Net_input_0``; with
    the loss module's class name (``loss``): ``losses/loss`` -> ``CrossEntropyLoss_output_0``,
    ``labels/labels`` -> ``CrossEntropyLoss_input_1``, ``predictions/predictions`` ->
    ``CrossEntropyLoss_input_0`` (the loss module's first input; the store keeps its arg-max).
    """
    collection, _, rest = name.partition("/")
    if collection == "activations":
        return f"{rest}_output_0"
    if collection == "activation_inputs":
        return f"{rest}_input_0"
    by_model = {"weights": f"{model}_{rest}", "biases": f"{model}_{rest}", "gradients": f"gradient/{model}_{rest}",
                "inputs": f"{model}_input_0"}
    if model and collection in by_model:
        return by_model[collection]
    by_loss = {"losses/loss": "_output_0", "labels/labels": "_input_1", "predictions/predictions": "_input_0"}
    if loss and name in by_loss:
        return f"{loss}{by_loss[name]}"
    return None


def matches(name: str, patterns: list[re.Pattern[str]], alias: str | None = None) -> bool:
    """Debugger's convention: a regex may match anywhere in the name (``re.search``).

    A tensor also answers to its smdebug name (``alias``, else what ``smdebug_name`` makes of the
    name alone), so Debugger's patterns (``.*relu_output``, ``CrossEntropyLoss_input_1``) select the
    tensors they select there.
    """
    alias = alias or smdebug_name(name)
    return any(pattern.search(name) or (alias is not None and pattern.search(alias)) for pattern in patterns)


class Tensor:
    """One named tensor of a trial. Values are NumPy arrays."""

    def __init__(self, trial: Trial, name: str) -> None:
        self.trial = trial
        self.name = name

    def steps(self, mode: str | ModeKeys | None = None) -> list[int]:
        return self.trial._tensor_steps(self.name, _modes(mode))

    def value(self, step: int, mode: str | ModeKeys | None = None) -> np.ndarray:
        """The value at ``step``; with no mode, the TRAIN value if there is one, else the EVAL value."""
        for each in _modes(mode):
            found = self.trial._value(self.name, step, each)
            if found is not None:
                return found
        raise TensorUnavailableForStep(f"tensor {self.name!r} has no value at step {step} (mode {mode})")

    def values(self, mode: str | ModeKeys | None = ModeKeys.TRAIN) -> dict[int, np.ndarray]:
        return {step: self.value(step, mode) for step in self.steps(mode)}

    @property
    def collections(self) -> tuple[str, ...]:
        return self.trial._tensor_collections(self.name)

    def __repr__(self) -> str:
        return f"Tensor({self.name!r})"


class Trial:
    """Common reading interface. Subclasses hold the index: (step, mode) -> {tensor: collections}."""

    def __init__(self) -> None:
        self._index: dict[tuple[int, str], dict[str, tuple[str, ...]]] = {}
        self._by_tensor: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        self._collections_of: dict[str, tuple[str, ...]] = {}
        self._ended = False
        self._system: list[dict[str, Any]] = []
        # Native name <-> the name smdebug's PyTorch hook gives the tensor, as the job recorded it.
        self._aliases: dict[str, str] = {}
        self._natives: dict[str, str] = {}

    # -- index bookkeeping shared by both kinds of trial
    def _add_aliases(self, aliases: Mapping[str, str]) -> None:
        for name, alias in aliases.items():
            if alias and name not in self._aliases:
                self._aliases[name] = alias
                self._natives.setdefault(alias, name)

    def _add_index(self, step: int, mode: str, tensors: Mapping[str, Iterable[str]]) -> None:
        self._index[(step, mode)] = {name: tuple(colls) for name, colls in tensors.items()}
        for name, colls in tensors.items():
            steps = self._by_tensor[name][mode]
            if not steps or steps[-1] < step:
                steps.append(step)
            elif step not in steps:
                steps.append(step)
                steps.sort()
            merged = dict.fromkeys((*self._collections_of.get(name, ()), *colls))
            self._collections_of[name] = tuple(merged)

    # -- public API
    @property
    def loaded_all_steps(self) -> bool:
        """True once the end-of-job marker was seen and every step it covers is loaded."""
        return self._ended

    def refresh(self) -> None:
        """Pick up steps written since the last call (a no-op for finished or in-memory trials)."""

    def steps(self, mode: str | ModeKeys | None = None) -> list[int]:
        wanted = _modes(mode)
        return sorted({step for (step, each) in self._index if each in wanted})

    def tensor_names(
        self,
        regex: str | Iterable[str] | None = None,
        collection: str | Iterable[str] | None = None,
        mode: str | ModeKeys | None = None,
        step: int | None = None,
    ) -> list[str]:
        """Names of tensors saved at least once, filtered by regex, collection (any of each), mode, step."""
        modes = _modes(mode)
        names = [name for name, per_mode in self._by_tensor.items() if any(each in per_mode for each in modes)
                 and (step is None or any(step in per_mode.get(each, ()) for each in modes))]
        # First-saved order, which is network order for parameters and gradients.
        return self._selected(names, regex, collection)

    def _selected(self, names: Iterable[str], regex: str | Iterable[str] | None,
                  collection: str | Iterable[str] | None) -> list[str]:
        """Those of ``names`` that match ``regex`` (any of them) and belong to ``collection`` (any of them)."""
        patterns = _as_patterns(regex)
        wanted = {collection} if isinstance(collection, str) else set(collection or ())
        return [name for name in names if (not patterns or matches(name, patterns, self._aliases.get(name)))
                and (not wanted or wanted.intersection(self._collections_of.get(name, ())))]

    def system_samples(self) -> list[dict[str, Any]]:
        """System-metric samples of the profiler (stabilizer_sentinel/capture/profiler.py), oldest first."""
        return self._system

    def smdebug_name_of(self, name: str) -> str:
        """The name smdebug would give this tensor (the name itself when it has no other)."""
        return self._aliases.get(name) or smdebug_name(name) or name

    def native_name_of(self, name: str) -> str | None:
        """The store's name of a tensor given by either name; None when the trial has no such tensor."""
        if name in self._by_tensor:
            return name
        if name in self._natives:
            return self._natives[name]
        return next((known for known in self._by_tensor if smdebug_name(known) == name), None)

    def has_tensor(self, name: str) -> bool:
        return self.native_name_of(name) is not None

    def tensor(self, name: str) -> Tensor:
        """A tensor by its name in the store or by the name smdebug gives it."""
        native = self.native_name_of(name)
        if native is None:
            known = sorted(self.smdebug_name_of(n) for n in self._by_tensor)[:20]
            raise TensorUnavailable(f"no tensor named {name!r}; known: {known}")
        return Tensor(self, native)

    def collections(self) -> dict[str, list[str]]:
        """Collection name -> tensor names seen in it."""
        out: dict[str, list[str]] = defaultdict(list)
        for name, colls in self._collections_of.items():
            for coll in colls:
                out[coll].append(name)
        return {coll: sorted(names) for coll, names in sorted(out.items())}

    # -- internals used by Tensor
    def _tensor_steps(self, name: str, modes: tuple[str, ...]) -> list[int]:
        per_mode = self._by_tensor.get(name, {})
        return sorted({step for each in modes for step in per_mode.get(each, ())})

    def _tensor_collections(self, name: str) -> tuple[str, ...]:
        return self._collections_of.get(name, ())

    def _value(self, name: str, step: int, mode: str) -> np.ndarray | None:
        raise NotImplementedError


class FileTrial(Trial):
    """A store in a local directory or under an S3 prefix, possibly still being written."""

    def __init__(self, path: str, storage: store.Storage, cache_steps: int = 4) -> None:
        super().__init__()
        self.path = path
        self.storage = storage
        self._files: dict[tuple[int, str], str] = {}
        self._cache: OrderedDict[tuple[int, str], dict[str, np.ndarray]] = OrderedDict()
        self._cache_steps = cache_steps
        self._end: dict[str, Any] | None = None
        self.collection_config: dict[str, Any] = {}
        self._system_files: set[str] = set()
        self.refresh()

    def refresh(self) -> None:
        if self._ended:
            return
        # Read the marker before listing: steps listed afterwards include everything it covers.
        end = store.read_json(self.storage, store.END_MARKER)
        if not self.collection_config:
            meta = store.read_json(self.storage, store.COLLECTIONS_FILE) or {}
            self.collection_config = meta.get("collections", {})
        for key, index_key in sorted(store.list_steps(self.storage).items()):
            if key in self._index:
                continue
            entry = store.read_json(self.storage, index_key)
            if entry is None:
                continue
            self._files[key] = entry["file"]
            self._add_index(key[0], key[1], {name: meta["collections"] for name, meta in entry["tensors"].items()})
            self._add_aliases({name: meta["smdebug"] for name, meta in entry["tensors"].items() if "smdebug" in meta})
        new_samples = read_samples(self.storage, self._system_files)
        if new_samples:
            self._system = sorted([*self._system, *new_samples], key=lambda sample: sample["timestamp"])
        if end is not None:
            self._end = end
            self._ended = True

    @property
    def end_status(self) -> str | None:
        """The status the job wrote into its end marker (``completed``, ``rule_stop``, ...), if ended."""
        return None if self._end is None else self._end.get("status")

    def _value(self, name: str, step: int, mode: str) -> np.ndarray | None:
        key = (step, mode)
        if key not in self._index or name not in self._index[key]:
            return None
        if key not in self._cache:
            data = self.storage.read(self._files[key])
            if data is None:
                return None
            self._cache[key] = store.load_archive(data)
            while len(self._cache) > self._cache_steps:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return self._cache[key].get(name)

    def __repr__(self) -> str:
        return f"FileTrial({self.path!r}, steps={len(self._index)}, ended={self._ended})"


class MemoryTrial(Trial):
    """Tensors held in memory by the running job, with bounded history.

    Scalars (the loss) keep ``scalar_history`` values; larger tensors keep the last
    ``tensor_history`` saved values each, which is all the built-in rules look back.
    """

    def __init__(self, tensor_history: int = 4, scalar_history: int = 100_000) -> None:
        super().__init__()
        self.tensor_history = tensor_history
        self.scalar_history = scalar_history
        self._values: dict[tuple[str, str], OrderedDict[int, np.ndarray]] = {}
        self._steps: dict[str, dict[int, None]] = {}
        # Mode -> step -> the names whose value at that step is held: a rule asks for one step's tensors every
        # step, and walking every name ever saved (each parameter's gradient, once saved) would cost each step
        # that many lookups. The tuples are shared (``_shared``): most steps hold the same few names.
        self._held_at: dict[str, dict[int, tuple[str, ...]]] = {}
        self._shared: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._rank: dict[str, int] = {}  # position in first-saved order

    def add(self, step: int, mode: str, tensors: Mapping[str, tuple[Iterable[str], np.ndarray]],
            aliases: Mapping[str, str] | None = None) -> None:
        (mode,) = _modes(mode)
        self._add_aliases(aliases or {})
        gone: dict[int, set[str]] = {}  # step -> the names whose value at it a history let go just now
        for name, (colls, array) in tensors.items():
            history = self._values.setdefault((name, mode), OrderedDict())
            history[step] = array
            limit = self.scalar_history if array.size <= 1 else self.tensor_history
            while len(history) > limit:
                gone.setdefault(history.popitem(last=False)[0], set()).add(name)
            if name not in self._collections_of or mode not in self._by_tensor[name]:
                self._by_tensor[name][mode] = []  # existence only: steps come from what is retained
                merged = dict.fromkeys((*self._collections_of.get(name, ()), *colls))
                self._collections_of[name] = tuple(merged)
        self._steps.setdefault(mode, {})[step] = None
        held = self._held_at.setdefault(mode, {})
        for old, names in gone.items():
            self._hold(held, old, [each for each in held.get(old, ()) if each not in names])
        # A name whose own history let this very step go (it is larger now, and keeps fewer) is not held at it.
        self._hold(held, step, [*held.get(step, ()), *(name for name in tensors if step in self._values[(name, mode)])])
        steps = self._steps[mode]
        while len(steps) > self.scalar_history:
            steps.pop(next(iter(steps)))

    def _hold(self, held: dict[int, tuple[str, ...]], step: int, names: list[str]) -> None:
        """``names`` are the names held at ``step``."""
        if names:
            held[step] = self._share(tuple(dict.fromkeys(names)))
        else:
            held.pop(step, None)

    def _share(self, names: tuple[str, ...]) -> tuple[str, ...]:
        if len(self._shared) > 4096:  # names that change from step to step: sharing saves nothing
            self._shared.clear()
        return self._shared.setdefault(names, names)

    def steps(self, mode: str | ModeKeys | None = None) -> list[int]:
        return sorted({step for each in _modes(mode) for step in self._steps.get(each, {})})

    def tensor_names(
        self,
        regex: str | Iterable[str] | None = None,
        collection: str | Iterable[str] | None = None,
        mode: str | ModeKeys | None = None,
        step: int | None = None,
    ) -> list[str]:
        modes = _modes(mode)
        if step is None:
            names = super().tensor_names(regex=regex, collection=collection)
            return [name for name in names if any((name, each) in self._values for each in modes)]
        saved = dict.fromkeys(name for each in modes for name in self._held_at.get(each, {}).get(step, ()))
        held = self._selected(saved, regex, collection)
        if any(name not in self._rank for name in held):
            self._rank = {name: index for index, name in enumerate(self._by_tensor)}
        return sorted(held, key=self._rank.__getitem__)

    def _tensor_steps(self, name: str, modes: tuple[str, ...]) -> list[int]:
        return sorted({step for each in modes for step in self._values.get((name, each), {})})

    def add_system(self, sample: dict[str, Any]) -> None:
        """One profiler sample (called from the profiler's thread; appending to a list is atomic)."""
        self._system.append(sample)
        if len(self._system) > self.scalar_history:
            del self._system[: len(self._system) - self.scalar_history]

    def mark_end(self) -> None:
        self._ended = True

    def _value(self, name: str, step: int, mode: str) -> np.ndarray | None:
        history = self._values.get((name, mode))
        return None if history is None else history.get(step)


def create_trial(path: str, client: Any = None) -> FileTrial:
    """Open the tensor store at a local directory or an ``s3://bucket/prefix``."""
    return FileTrial(str(path), store.open_storage(path, client=client))
