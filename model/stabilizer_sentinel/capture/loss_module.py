"""The training loop's ``torch.nn`` loss module, found at its first call, as smdebug's PyTorch hook
registers it: its class names the loss tensors (``CrossEntropyLoss_output_0``, ``_input_0``,
``_input_1``), and its inputs are the training step's predictions and labels, so rules that read
labels work on a loop that never passes them (the launcher's unchanged script included).

This module keeps references to the last training call's inputs (detached, no copy); it must not
copy tensors or decide what is saved: that is ``stabilizer_sentinel.capture.capture``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

from stabilizer_sentinel import handle_ids
from stabilizer_sentinel.capture import module_hooks
from stabilizer_sentinel.failsafe import shielded

# The store's tensors that take their smdebug names from the loss module
# (stabilizer_sentinel.capture.trial.smdebug_name).
LOSS_TENSORS = ("losses/loss", "labels/labels", "predictions/predictions")


class LossModuleWatch:
    """A global forward hook until the first loss module is called, then a hook on that module alone.

    ``on_found`` is called once the loss module is known. Without ``inputs`` only its name is kept (the
    losses collection's smdebug names), and no hook stays once it is found. A step that ends with no loss module
    seen after a forward pass means there is none (a functional loss): the global hook goes. A loss
    module called before the watch existed (the launcher attaches at the first optimizer step) is
    handed over with ``adopt``.
    """

    def __init__(self, on_found: Callable[[], None], *, inputs: bool = True) -> None:
        self.name: str | None = None
        self._on_found = on_found
        self._inputs = inputs  # its inputs are wanted (labels, predictions): else only its name
        self._args: tuple[torch.Tensor, torch.Tensor] | None = None
        self._forward_seen = False
        with handle_ids.apart():
            hook = register_module_forward_hook(shielded(self._module_called))
        self._hooks: list[Any] = [module_hooks.process_wide(hook)]

    def _module_called(self, module: nn.Module, args: Any, output: Any) -> None:
        self._forward_seen = True
        if not isinstance(module, nn.modules.loss._Loss) or self.name is not None:
            return
        self._found(module)
        self._loss_called(module, args, output)

    def _found(self, module: nn.Module) -> None:
        self.name = type(module).__name__
        self.close()
        if self._inputs:
            self._hooks = [module_hooks.forward_hook(module, self._loss_called)]
        self._on_found()

    def adopt(self, module: nn.Module, args: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """The loss module, found before this watch existed, and the inputs of its last training call
        (the step under way's); ignored once a loss module is known."""
        if self.name is not None or not isinstance(module, nn.modules.loss._Loss):
            return
        self._forward_seen = True
        self._found(module)
        self._args = args

    def _loss_called(self, module: nn.Module, args: Any, output: Any) -> None:
        # Training losses only: an evaluation under no_grad reports its labels itself (after_eval).
        if torch.is_grad_enabled() and len(args) >= 2 and all(isinstance(a, torch.Tensor) for a in args[:2]):
            self._args = (args[0].detach(), args[1].detach())

    def step_ended(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step's (predictions, labels) as the loss module received them, if it was called."""
        if self.name is None and self._forward_seen:
            self.close()
        args, self._args = self._args, None
        return args

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
