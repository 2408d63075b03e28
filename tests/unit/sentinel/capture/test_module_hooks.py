"""The watcher's process-wide module hooks are not the script's global hooks to torch.compile's wrapper."""

from __future__ import annotations

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
