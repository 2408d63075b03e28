"""What a guard watches: the user's network, found inside its wrappers, or a loop's bare tensors.

This module must not change parameters or their gradients.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

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


def network_of(model: nn.Module | Sequence[torch.Tensor]) -> nn.Module:
    """The network a guard watches: ``model`` unwrapped, or its tensors as ``BareTensors``."""
    return unwrap(model) if isinstance(model, nn.Module) else BareTensors(model)
