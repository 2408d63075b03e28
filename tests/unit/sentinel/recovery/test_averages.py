"""The script's averaged copies of the network after a rollback (stabilizer_sentinel.recovery.averages)."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from stabilizer_sentinel.recovery import averages


def test_an_average_of_the_rolled_back_network_restarts_and_takes_its_weights_at_the_next_update():
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    other = nn.Linear(3, 3)  # another model's average: left as it is
    ema = AveragedModel(network, multi_avg_fn=get_ema_multi_avg_fn(0.99))
    swa = AveragedModel(network)
    kept = AveragedModel(other)
    for _ in range(3):
        for average, model in ((ema, network), (swa, network), (kept, other)):
            average.update_parameters(model)
    with torch.no_grad():
        for p in network.parameters():
            p.mul_(1e18)  # the exploded steps the averages took in
        for average in (ema, swa):
            average.update_parameters(network)
        for p in network.parameters():
            p.div_(1e18)  # the rollback put the weights back

    assert averages.restart(network, torch.optim.SGD(network.parameters(), lr=0.1), []) == 2
    assert (int(ema.n_averaged), int(swa.n_averaged), int(kept.n_averaged)) == (0, 0, 3)
    ema.update_parameters(network)
    assert all(torch.equal(a, p) for a, p in zip(ema.module.parameters(), network.parameters(), strict=True))


def test_an_average_is_known_by_the_parameters_an_optimizer_trains_and_nothing_else_is_touched():
    generator, critic = nn.Linear(2, 5), nn.Linear(5, 1)
    optimizer = torch.optim.SGD(generator.parameters(), lr=0.1)
    average = AveragedModel(generator)
    average.update_parameters(generator)
    lazy = nn.LazyLinear(3)  # no shapes before its first call: never matched, never an error
    # The generator's optimizer held with a network that is not the generator (a lazy one): found by its parameters.
    assert averages.restart(critic, torch.optim.SGD(critic.parameters(), lr=0.1), [(lazy, optimizer)]) == 1
    assert int(average.n_averaged) == 0
    seven = nn.Linear(7, 7)
    assert averages.restart(seven, torch.optim.SGD(seven.parameters(), lr=0.1), []) == 0
