"""What the launcher reads of a backward pass's leaves (stabilizer_sentinel.loops.bare_tensors)."""

from __future__ import annotations

import torch

from stabilizer_sentinel.loops import bare_tensors


def test_a_leaf_whose_storage_was_freed_is_not_read():
    # FSDP2 frees a layer's gathered parameters between its passes (their storage resized to nothing, their shape
    # kept); stop 73's hunt: the launcher's look at the first pass's leaves copied the smallest, one of those, and
    # the process crashed (SIGSEGV).
    weight = torch.randn(3, 4, requires_grad=True)
    bias = torch.randn(3, requires_grad=True)
    loss = (torch.randn(5, 4) @ weight.t() + bias).pow(2).mean()
    bias.untyped_storage().resize_(0)
    assert not bare_tensors.readable(bias) and bare_tensors.readable(weight)
    hands = bare_tensors.HandUpdates()
    assert hands.backward([loss]) is None  # the first pass: a leaf is kept to compare with at the next
    kept = hands._watched
    assert kept is not None and kept[0]() is weight


def test_views_are_read_to_their_last_element():
    values = torch.arange(24.0)
    assert bare_tensors.readable(values[20:]) and bare_tensors.readable(values.view(4, 6).t())
    assert bare_tensors.readable(values[:0])
    shrunk = torch.arange(24.0)
    head, tail = shrunk[:20], shrunk[20:]
    shrunk.untyped_storage().resize_(80)  # 20 floats left: the tail's four are gone
    assert bare_tensors.readable(head) and not bare_tensors.readable(tail) and not bare_tensors.readable(shrunk)
