"""Forward hooks on chosen modules, kept outside them.

A hook registered on a module (``module.register_forward_hook``) lives in that module's
``_forward_hooks``: it is pickled with it (``torch.save(model)``), deep-copied with it (an EMA or a
best-model copy), scripted with it (``torch.jit.script`` compiles a module's hooks) and it is in
every copy the script makes. The sentinel's hooks are bound to objects holding threads, locks and
open files, so a watched script could do none of those things. Here a single process-wide forward
hook (``register_module_forward_hook``: torch keeps it in a table of its own, not in any module)
calls the hooks registered for the module that has just run, found by identity. The modules stay
exactly as the script built them.

Cost: one call of ``is_compiling`` and one dictionary lookup per module call while any hook is registered;
nothing once none is.

Inside a compiled region (``torch.compile(model)`` traces the process-wide hook into the model's compiled
frame) no hook is called: the hooks keep host-side counts and state, which Dynamo would guard on and
recompile for at every change, up to its limit (the second recovery hunt, stop 62: 8 graphs where the
unwatched model has 1, each forward pass 3.5 times slower).

Every process-wide hook of the watcher's is registered through ``process_wide``, and PyTorch's
``torch.nn.modules.module._has_any_global_hook`` leaves them out: its only reader,
``torch.compile(module)``'s wrapper, warns at each call site that global hooks will fire for it an extra
time. Watched, a compiled model's first calls printed that warning where the unwatched script printed
none, and a script that turns warnings into errors (``warnings.simplefilter("error")``, ``python -W
error``) raised it at its first forward pass (stop 68's harm hunt). A global hook of the script's own
still makes it warn, as unwatched.

This module must not read or change tensors: it only routes calls.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

from stabilizer_sentinel import handle_ids
from stabilizer_sentinel.failsafe import shielded

Hook = Callable[[nn.Module, Any, Any], None]

_BY_MODULE: dict[int, tuple[weakref.ref[nn.Module], dict[int, Hook]]] = {}
_NUMBERS = itertools.count()
_GLOBAL: list[Any] = []  # the process-wide hook's handle, while any hook is registered
_OURS: set[int] = set()  # the ids of the watcher's process-wide hooks' handles (torch never reuses one)


def _compiling_check() -> Any:
    """``torch.compiler.is_compiling`` (torch 2.3 on), ``torch._dynamo.is_compiling`` before it (the library
    takes torch 2.1 on): True while Dynamo traces, which reads it as a constant."""
    found = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if found is None:
        found = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return found if found is not None else (lambda: False)


is_compiling = _compiling_check()


class Handle:
    """Removes one hook; idempotent, as torch's handles are."""

    def __init__(self, module_id: int, number: int) -> None:
        self._module_id = module_id
        self._number = number

    def remove(self) -> None:
        entry = _BY_MODULE.get(self._module_id)
        if entry is None:
            return
        entry[1].pop(self._number, None)
        if not entry[1]:
            del _BY_MODULE[self._module_id]
        if not _BY_MODULE and _GLOBAL:
            _GLOBAL.pop().remove()


def forward_hook(module: nn.Module, hook: Hook) -> Handle:
    """Call ``hook(module, args, output)`` after each forward pass of ``module``, as its own hook would."""
    key = id(module)
    entry = _BY_MODULE.get(key)
    if entry is None or entry[0]() is not module:  # a new module, or one that reuses a dead module's id
        entry = (weakref.ref(module), {})
        _BY_MODULE[key] = entry
    number = next(_NUMBERS)
    entry[1][number] = hook
    if not _GLOBAL:
        with handle_ids.apart():
            _GLOBAL.append(process_wide(register_module_forward_hook(shielded(_dispatch))))
    return Handle(key, number)


def process_wide(handle: Any) -> Any:
    """``handle``, a process-wide module hook's (``register_module_forward_hook``, its pre-hook), known as
    the watcher's own: ``torch.nn.modules.module._has_any_global_hook`` no longer counts it."""
    _OURS.add(handle.id)
    _leave_ours_out()
    return handle


def _leave_ours_out() -> None:
    """Put in torch's ``_has_any_global_hook`` the same test with the watcher's hooks left out (once)."""
    module = torch.nn.modules.module
    original = getattr(module, "_has_any_global_hook", None)
    if original is None or getattr(original, "leaves_out_the_watcher", False):
        return
    # The tables it reads (``_global_forward_hooks``, ...), as this torch names them.
    tables = tuple(name for name in original.__code__.co_names if name.startswith("_global_"))

    def _has_any_global_hook() -> Any:
        # torch's answer is ``table or table or ...``: the first table that holds a hook, else the last, empty one;
        # here the first that holds one of the script's, as the script's hooks alone would make it (a table that
        # holds the watcher's too, copied without them), else an empty table (stop 86's harm hunt: a bool, printed).
        try:
            answer: Any = False
            for name in tables:
                table = getattr(module, name, None)
                if not isinstance(table, dict):
                    continue
                theirs = [(key, hook) for key, hook in list(table.items()) if key not in _OURS]
                if theirs:
                    return table if len(theirs) == len(table) else type(table)(theirs)
                answer = table if not table else type(table)()
            return answer
        except Exception:  # never the script's error: torch's own answer instead
            return bool(original())

    _has_any_global_hook.__doc__ = original.__doc__
    _has_any_global_hook.leaves_out_the_watcher = True  # type: ignore[attr-defined]
    module._has_any_global_hook = _has_any_global_hook


def _dispatch(module: nn.Module, args: Any, output: Any) -> None:
    if is_compiling():  # traced into a compiled frame: nothing here is for the graph
        return
    entry = _BY_MODULE.get(id(module))
    if entry is None or entry[0]() is not module:
        return
    for hook in list(entry[1].values()):
        hook(module, args, output)
