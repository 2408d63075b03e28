"""What a guard watches: the user's network, found inside its wrappers, or a loop's bare tensors.

This module must not change parameters or their gradients.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The user's network inside DistributedDataParallel / DataParallel / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


class BareTensors(nn.Module):
    """A loop's leaf tensors as the guard's network: named ``tensor0``, ``tensor1``, ... in the given order.

    They are not registered as parameters: that would copy each into a new ``nn.Parameter`` (as
    ``nn.ParameterList`` does), whose gradient the loop never fills. ``named_parameters`` yields the
    loop's own tensors.
    """

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.tensors = list(tensors)
        if not self.tensors or not all(isinstance(t, torch.Tensor) for t in self.tensors):
            raise TypeError(f"watch: model must be an nn.Module or a non-empty list of tensors, got {tensors!r}")

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        for index, tensor in enumerate(self.tensors):
            yield f"{prefix}tensor{index}", tensor

    def state_dict(self, *args: Any, destination: dict[str, Any] | None = None, prefix: str = "",
                   keep_vars: bool = False) -> dict[str, Any]:
        """The loop's tensors by name: what a copy (stabilizer_sentinel.recovery.rewind) or a checkpoint
        of this network holds (a module's own would be empty: nothing is registered)."""
        out = destination if destination is not None else {}
        for name, tensor in self.named_parameters(prefix):
            out[name] = tensor if keep_vars else tensor.detach()
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Each saved tensor copied into the loop's own, in place: the loop holds those objects."""
        names = [name for name, _ in self.named_parameters()]
        missing = [name for name in names if name not in state_dict]
        unexpected = [key for key in state_dict if key not in names]
        if strict and (missing or unexpected):
            raise RuntimeError(f"BareTensors: missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            for name, tensor in zip(names, self.tensors, strict=True):
                if name in state_dict:
                    tensor.copy_(state_dict[name])
        return nn.modules.module._IncompatibleKeys(missing, unexpected)


def network_of(model: nn.Module | Sequence[torch.Tensor]) -> nn.Module:
    """The network a guard watches: ``model`` unwrapped, or its tensors as ``BareTensors``."""
    return unwrap(model) if isinstance(model, nn.Module) else BareTensors(model)
