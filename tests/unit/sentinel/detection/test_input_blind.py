"""A network whose output stopped depending on its input (dead, collapsed) did not learn, whatever its loss did.

The check reads real forward passes of real networks; the learning check's verdicts are fed synthetic losses.
"""

from __future__ import annotations

import copy
import io
import math
import pickle

import torch
from torch import nn

from stabilizer_sentinel.detection import input_blind
from stabilizer_sentinel.detection.input_blind import EVERY, STREAK, InputBlind, listen
from stabilizer_sentinel.detection.learning_check import LearningCheck

READ = STREAK * EVERY  # training passes for STREAK of them read


def regression(dead: bool) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    if dead:  # every unit's pre-activation below zero for any input in [0, 1): the output is the last bias
        with torch.no_grad():
            net[0].weight.abs_().neg_()
            net[0].bias.fill_(-1.0)
    return net


def passes(net: nn.Module, count: int, *, rows: int = 32, same_rows: bool = False) -> InputBlind:
    check, handle = listen(net)
    try:
        for _ in range(count):
            x = torch.rand(rows, 8)
            net(x[:1].expand(rows, 8) if same_rows else x)
    finally:
        handle.remove()
    return check


def test_a_dead_network_is_input_blind_and_a_live_one_is_not():
    assert passes(regression(dead=True), READ).streak() == STREAK
    assert passes(regression(dead=True), READ).blind() is not None
    assert passes(regression(dead=False), 2 * READ).streak() == 0
    assert passes(regression(dead=False), 2 * READ).blind() is None


def test_passes_that_cannot_tell_are_not_evidence():
    dead = regression(dead=True)
    assert passes(dead, READ, same_rows=True).streak() == 0  # the input's rows alike: nothing to ignore
    assert passes(dead, READ, rows=1).streak() == 0  # one row
    dead.eval()
    assert passes(dead, READ).streak() == 0  # an evaluation
    dead.train()
    with torch.no_grad():
        assert passes(dead, READ).streak() == 0  # no gradients: not a training pass


def test_one_live_pass_ends_the_streak_and_one_differing_value_is_a_live_pass():
    net = regression(dead=True)
    check, handle = listen(net)
    x = torch.rand(32, 8)
    for _ in range(READ - 1):
        net(x)
    with torch.no_grad():
        net[0].bias[0] = 5.0  # one unit alive: its output now differs between rows
    net(x)
    handle.remove()
    assert check.streak() == 0


def test_a_network_watched_this_way_still_pickles_deep_copies_and_saves():
    net = regression(dead=False)
    _, handle = listen(net)
    try:
        clone = copy.deepcopy(net)
        restored = pickle.loads(pickle.dumps(net))
        buffer = io.BytesIO()
        torch.save(net, buffer)
        assert not clone._forward_hooks and not restored._forward_hooks
    finally:
        handle.remove()


def test_the_forward_pass_and_its_gradients_are_unchanged_by_the_check():
    x = torch.rand(32, 8)
    plain = regression(dead=False)
    expected = plain(x).sum()
    expected.backward()
    watched = regression(dead=False)
    _, handle = listen(watched)
    got = watched(x).sum()
    got.backward()
    handle.remove()
    assert torch.equal(got, expected)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), watched.parameters(), strict=True))


def test_outputs_in_containers_count_and_any_live_one_is_enough():
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.live = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> dict[str, object]:
            return {"loss": x.sum(), "heads": (torch.zeros(x.shape[0], 3), self.live(x))}

    net = TwoHeads()
    assert passes(net, READ).streak() == 0
    with torch.no_grad():
        net.live.weight.zero_()
    assert passes(net, READ).streak() == STREAK


def verdict(losses: list[float], blind: InputBlind | None) -> object:
    check = LearningCheck(run_steps=len(losses))
    check.input_blind = blind
    for step, loss in enumerate(losses):
        finding = check.observe(step, loss, None, 0.05)
        if finding is not None:
            return finding, check
    return check.at_end(len(losses) - 1), check


class Streak(InputBlind):
    """An input-blind check that has counted ``count`` blind passes in a row."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self._streak = torch.tensor(count)


def test_a_loss_that_fell_is_no_learning_where_the_network_ended_input_blind():
    # A quantile regression at a rate that killed it: its loss fell from 1.4 to the targets' quantile's, 0.6.
    losses = [0.6 + 0.8 * math.exp(-step / 10) for step in range(60)]
    finding, check = verdict(losses, Streak(0))
    assert finding is None and check.learned
    finding, check = verdict(losses, Streak(STREAK))
    assert finding is not None and finding.rule == "NotLearning" and not check.learned
    assert "the same for every input" in finding.message


def test_before_the_end_a_blind_network_is_stopped_only_once_the_patience_is_spent():
    losses = [0.6 + 0.8 * math.exp(-step / 10) for step in range(300)]
    check = LearningCheck(run_steps=len(losses))
    check.input_blind = Streak(STREAK)
    fired = next(step for step, loss in enumerate(losses) if check.observe(step, loss, None, 0.05) is not None)
    assert fired + 1 >= check.patience_steps()
    check = LearningCheck(run_steps=len(losses))
    check.input_blind = Streak(STREAK - 1)  # one read short: never blind
    assert all(check.observe(step, loss, None, 0.05) is None for step, loss in enumerate(losses))
    assert check.at_end(len(losses) - 1) is None and check.learned


def test_one_training_pass_in_every_few_is_read():
    net = regression(dead=True)
    assert passes(net, READ - 1).streak() == STREAK - 1
    assert passes(net, READ).streak() == STREAK


def test_a_pass_it_cannot_read_turns_the_check_off_and_leaves_the_pass_alone():
    class Nested(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nested.nested_tensor([x[0], x[1, :3]])

    net = Nested()
    check, handle = listen(net)
    outs = [net(torch.rand(4, 8, requires_grad=True)) for _ in range(EVERY)]
    handle.remove()
    assert all(out.is_nested for out in outs) and check.off and check.blind() is None


# From the stop 56 hunt: three healthy networks the first form called blind.
def test_rows_equal_only_in_their_padding_are_not_blind():
    # A left-padded tagger: each row's first 103 positions (its first 512 values of 640) are padding the
    # network masks to 0, the same in every row; its tags at the end differ.
    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(50, 5, padding_idx=0)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.embed(tokens) * (tokens != 0).unsqueeze(-1)

    tokens = torch.zeros(32, 128, dtype=torch.long)
    tokens[:, -20:] = torch.randint(1, 50, (32, 20))
    net = Tagger()
    check, handle = listen(net)
    for _ in range(READ):
        net(tokens)
    handle.remove()
    assert check.streak() == 0


def test_outputs_equal_at_an_activations_bound_are_no_evidence():
    # A sigmoid classifier saturated to exactly 1.0 on rows all positive, a ReLU forecaster at its floor
    # for targets of 0: equal rows of alive networks.
    torch.manual_seed(0)
    confident = nn.Sequential(nn.Linear(8, 1), nn.Sigmoid())
    floor = nn.Sequential(nn.Linear(8, 1), nn.ReLU())
    with torch.no_grad():
        confident[0].weight.fill_(1.0)
        confident[0].bias.fill_(40.0)  # every row's logit above 17: sigmoid rounds to 1.0 in float32
        floor[0].weight.fill_(1.0)
        floor[0].bias.fill_(-40.0)  # every row below zero
    assert torch.equal(confident(torch.rand(32, 8)), torch.ones(32, 1))
    assert passes(confident, READ).streak() == 0
    assert passes(floor, READ).streak() == 0


def test_the_sampling_indices_kept_stay_few_when_the_width_changes_every_batch():
    net = nn.Conv1d(1, 2, 3, padding=1)
    check, handle = listen(net)
    for width in range(10, 10 + 4 * input_blind.INDICES):
        net(torch.rand(4, 1, width))
    handle.remove()
    assert len(check._indices) <= input_blind.INDICES


def test_a_pass_under_vmap_is_not_read(recwarn):
    # Per-sample work under torch.func.vmap: batched tensors, on which the sample would warn (no batching
    # rule for take) and leave a batched count that no read outside the transform can take.
    net = regression(dead=True)
    check, handle = listen(net)
    outs = [torch.func.vmap(net)(torch.rand(4, 32, 8)) for _ in range(READ)]
    handle.remove()
    assert outs[0].shape == (4, 32, 1) and check.streak() == 0 and not check.off
    assert not [w for w in recwarn if "batching rule" in str(w.message)]


def test_a_compiled_network_is_compiled_once_watched_as_unwatched():
    # torch.compile(model) traces the global forward hook into the compiled frame: a host count the hook
    # kept there (one pass in EVERY is read) became a guard, and every pass recompiled until Dynamo's limit.
    import torch._dynamo

    def graphs(watched: bool) -> int:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        handle = listen(model)[1] if watched else None
        compiled = torch.compile(model, backend="eager")
        for _ in range(3 * EVERY):
            compiled(torch.randn(4, 8)).sum().backward()
        if handle is not None:
            handle.remove()
        return torch._dynamo.utils.counters["stats"]["unique_graphs"]

    assert graphs(watched=True) == graphs(watched=False) == 1
