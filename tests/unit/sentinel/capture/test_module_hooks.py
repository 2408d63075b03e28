"""The watcher's process-wide module hooks are not the script's global hooks to torch.compile's wrapper."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn
from torch.nn.modules import module as torch_module

from stabilizer_sentinel.capture import module_hooks


def test_torch_counts_the_scripts_global_hooks_and_not_the_watchers():
    # torch.compile(module)'s wrapper warns at each call site where _has_any_global_hook() is true; watched,
    # the watcher's hooks made it warn (and raise, under warnings.simplefilter("error")) where unwatched it did not.
    assert not torch_module._has_any_global_hook(), "a global hook left behind by another test"
    network = nn.Linear(2, 2)
    calls: list[nn.Module] = []
    ours = module_hooks.forward_hook(network, lambda module, args, output: calls.append(module))
    try:
        assert not torch_module._has_any_global_hook()
        for register in (torch_module.register_module_forward_hook, torch_module.register_module_forward_pre_hook):
            theirs = register(lambda *args: None)
            assert torch_module._has_any_global_hook()  # the script's own: torch warns, as unwatched
            theirs.remove()
            assert not torch_module._has_any_global_hook()
        network(network.weight)
        assert calls == [network]  # the watcher's hook still runs
    finally:
        ours.remove()
    assert not torch_module._has_any_global_hook()


def test_torchs_answer_keeps_its_shape_a_table_of_the_scripts_hooks_or_an_empty_one():
    # Stop 86's harm hunt: a script that printed the answer read False and True, watched, where torch's own is
    # ``table or table or ...``: an empty OrderedDict, or the table that holds the script's hook.
    ours = module_hooks.forward_hook(nn.Linear(2, 2), lambda module, args, output: None)
    try:
        assert torch_module._has_any_global_hook() == OrderedDict()
        script = lambda *args: None  # noqa: E731 - a hook as a script writes one
        theirs = torch_module.register_module_forward_hook(script)
        try:
            assert torch_module._has_any_global_hook() == OrderedDict([(theirs.id, script)])
        finally:
            theirs.remove()
    finally:
        ours.remove()
