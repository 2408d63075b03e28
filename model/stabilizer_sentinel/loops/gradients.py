"""Gradients of any layout, as the finite check reads them.

A layer built with ``sparse=True`` (``nn.Embedding``, ``nn.EmbeddingBag``) gives a sparse gradient:
``torch.nn.utils.get_total_norm`` and ``torch.isfinite`` have no kernel for it. Its stored values are
what the optimizer applies, so they are what is checked, coalesced first (an index the batch holds
twice has its two rows summed, as the dense gradient would).

This module must not change gradients: it reads them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def stored(grad: torch.Tensor) -> torch.Tensor:
    """``grad``'s values: itself when dense, its stored entries when sparse."""
    if grad.layout == torch.strided:
        return grad
    if grad.layout == torch.sparse_coo:
        return grad.coalesce().values()
    return grad.values()  # compressed layouts (CSR, CSC, BSR, BSC)


def total_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The 2-norm over every gradient in ``grads`` together, on their device (no host synchronisation)."""
    return torch.nn.utils.get_total_norm([stored(grad) for grad in grads])
