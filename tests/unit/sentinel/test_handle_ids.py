"""The watcher's hook handles take numbers of their own: a script's hooks are numbered as unwatched.

torch numbers every hook handle from one counter and pickles a module's hook tables under those numbers, so a
model the script saved whole with a hook of its own was another file watched (stop 79's harm hunt).
"""

from __future__ import annotations

import io

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from stabilizer_sentinel import handle_ids
from stabilizer_sentinel.integration import launcher_hooks


def _unchanged(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """A hook of the script's own."""


def test_handles_registered_apart_leave_the_scripts_counter_where_it_was():
    before = RemovableHandle.next_id
    model = nn.Linear(2, 2)
    with handle_ids.apart():
        ours = model.register_forward_hook(lambda module, args, output: None)
        with handle_ids.apart():  # one inside another counts on from the outer one's numbers
            inner = nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
        after_inner = model.register_forward_pre_hook(_unchanged)
    assert RemovableHandle.next_id == before
    assert handle_ids.FIRST <= ours.id < inner.id < after_inner.id  # all of the watcher's range, none reused
    assert model.register_forward_pre_hook(_unchanged).id == before  # the script's next number, as unwatched
    for handle in (ours, inner, after_inner):
        handle.remove()


def test_a_model_saved_whole_with_a_hook_of_its_own_is_the_same_file_once_the_launcher_hooks_are_in():
    def saved() -> bytes:
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        handle = model.register_forward_pre_hook(_unchanged)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        handle.remove()
        RemovableHandle.next_id -= 1  # the next model's hook is numbered as this one was
        return buffer.getvalue()

    unwatched = saved()
    hooks = launcher_hooks.activate(force=True)
    try:
        assert saved() == unwatched
    finally:
        hooks.close()
