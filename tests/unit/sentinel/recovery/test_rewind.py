"""Rewind: the last healthy state is kept in memory (bounded) and written as a checkpoint when a rule fires."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn.utils import prune

from stabilizer_contract.checkpoints import checkpoint_name, checkpoints_in
from stabilizer_sentinel.detection.sentinel import build_monitoring
from stabilizer_sentinel.recovery.rewind import Rewind
from tests.unit.sentinel.detection.test_sentinel import poison_layer
from tests.unit.sentinel.tinynet import batch, tiny_net


def train(tmp_path, steps, *, every=5, keep=2, poison=None, action="stop"):
    """The loop of train.py with a rewind wired into the sentinel; returns the weights after each step."""
    model = tiny_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cap, sentinel = build_monitoring(model, sentinel_rules=[], sentinel_action=action, capture={},
                                     checkpoint_dir=tmp_path, tensor_dir=None)
    rewind = Rewind(model, optimizer, checkpoint_dir=tmp_path, every=every, keep=keep, extra={"config": {"n": 1}})
    sentinel.rewind = rewind
    weights = {0: {k: v.clone() for k, v in model.state_dict().items()}}
    for step in range(steps):
        x, y = batch(step)
        cap.begin_step(step)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        if poison:
            poison(step, model)
        verdict = sentinel.after_backward(step, epoch=0, phase="main", learning_rate=0.1, loss=loss, outputs=logits)
        if verdict.stop:
            break
        optimizer.step()
        rewind.after_step(step + 1)
        weights[step + 1] = {k: v.clone() for k, v in model.state_dict().items()}
    return rewind, weights


def test_copies_every_few_steps_and_keeps_only_the_newest(tmp_path):
    rewind, _ = train(tmp_path, 23, every=5, keep=2)
    assert [s.next_step for s in rewind.snapshots] == [15, 20]
    assert 0 < rewind.snapshots[0].nbytes < 10_000  # weights and momentum of the tiny net, nothing else
    assert checkpoints_in(tmp_path) == []  # nothing is written while the run is healthy


def test_a_rule_that_fires_writes_the_copies_from_before_the_bad_step(tmp_path):
    rewind, weights = train(tmp_path, 30, poison=poison_layer(17, "head.weight"))
    assert rewind.frozen
    # Copies at 10 and 15 are both before step 17: both are written, 15 is the one to resume from.
    assert [p.name for p in checkpoints_in(tmp_path)] == [checkpoint_name(10), checkpoint_name(15)]
    path = rewind.persisted
    assert path.name == checkpoint_name(15)
    saved = torch.load(path, weights_only=True)
    assert saved["next_step"] == 15 and saved["config"] == {"n": 1}
    for name, value in weights[15].items():
        assert torch.equal(saved["model"][name], value)  # a copy, not a view of the weights that went on
    assert saved["optimizer"]["state"]  # momentum buffers travel with the weights
    findings = json.loads((tmp_path / "findings.json").read_text())["findings"]
    assert findings[0]["step"] == 17


def test_the_copy_taken_at_the_bad_step_is_never_the_one_resumed(tmp_path):
    # The state at step 15 produced the non-finite gradient of step 15: resuming there fails again.
    rewind, _ = train(tmp_path, 30, poison=poison_layer(15, "head.weight"))
    assert [p.name for p in checkpoints_in(tmp_path)] == [checkpoint_name(10)]
    assert rewind.persisted.name == checkpoint_name(10)


def test_before_the_first_copy_nothing_is_written(tmp_path):
    rewind, _ = train(tmp_path, 30, poison=poison_layer(3, "head.weight"))
    assert rewind.persisted is None and checkpoints_in(tmp_path) == []


def test_after_a_finding_no_more_copies_are_taken(tmp_path):
    rewind, _ = train(tmp_path, 30, poison=poison_layer(12, "head.weight"), action="notify")
    assert rewind.frozen and [s.next_step for s in rewind.snapshots] == [5, 10]
    assert [p.name for p in checkpoints_in(tmp_path)] == [checkpoint_name(5), checkpoint_name(10)]


def test_a_notice_or_a_finding_the_script_meant_stops_no_copies(tmp_path):
    # Stop 71: a rate range test's told blow-up froze the copies, and the explosion of the training after the test
    # could not be rolled back in the job. Only a finding a relaunch may follow writes and freezes them.
    from stabilizer_sentinel.detection.sentinel import TRIAL
    from stabilizer_sentinel.rules import RuleFinding

    rewind, _ = train(tmp_path, 12, action="notify")
    sentinel = build_monitoring(rewind.model, sentinel_rules=[], sentinel_action="notify", capture={},
                                checkpoint_dir=tmp_path, tensor_dir=None)[1]
    sentinel.rewind = rewind
    context = {"epoch": 0, "phase": "main", "learning_rate": 0.1}
    notice = RuleFinding("VanishingGradient", 11, "gradients/head.weight", 1e-9, "vanished; the loss learned",
                         stops=False)
    sentinel.report(notice, context, source="test")
    assert not rewind.frozen
    sentinel.told = TRIAL  # every finding of a search's later trial is told
    sentinel.report(RuleFinding("Diverging", 11, "losses/loss", 1e4, "jumped"), context, source="test")
    assert not rewind.frozen and sentinel.findings[-1]["told"] == TRIAL
    sentinel.told = None
    sentinel.report(RuleFinding("Diverging", 11, "losses/loss", 1e4, "jumped"), context, source="test")
    assert rewind.frozen and [p.name for p in checkpoints_in(tmp_path)] == [checkpoint_name(5), checkpoint_name(10)]


def test_a_copy_of_a_loops_bare_tensors_holds_them_and_puts_them_back_in_place(tmp_path):
    """A loop over bare tensors (no module: a functional model, or one whose forward runs inside a
    closure the guard attached before) is watched as BareTensors: its copies hold those tensors, and a
    rollback writes them back into the loop's own objects."""
    from stabilizer_sentinel.loops.networks import BareTensors

    weight, bias = torch.randn(4, 3, requires_grad=True), torch.zeros(4, requires_grad=True)
    network = BareTensors([weight, bias])
    optimizer = torch.optim.SGD([weight, bias], lr=0.1)
    rewind = Rewind(network, optimizer, checkpoint_dir=tmp_path, every=5, keep=2)
    copy = rewind.take_now(0)
    assert set(copy.model) == {"tensor0", "tensor1"}
    before = weight.detach().clone()
    with torch.no_grad():
        weight.mul_(float("nan"))
    rewind.load(copy)
    assert torch.equal(weight, before) and network.tensors[0] is weight and weight.requires_grad


def test_the_optimizers_tensors_beside_the_network_go_back_with_the_copy(tmp_path):
    """One optimizer over an encoder and a head kept apart (the network the hooks find holds the encoder
    alone): the head's weights are copied and put back with the encoder's, in place."""
    encoder, head = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1, momentum=0.9)
    rewind = Rewind(encoder, optimizer, checkpoint_dir=tmp_path, every=5, keep=2)
    assert rewind.loose == [head.weight, head.bias]
    copy = rewind.take_now(0)
    before = {name: value.detach().clone() for name, value in head.state_dict().items()}
    with torch.no_grad():
        head.weight.mul_(float("nan"))
        head.bias.add_(1.0)
    rewind.load(copy)
    assert all(torch.equal(head.state_dict()[name], value) for name, value in before.items())
    assert set(copy.model) == {"weight", "bias"}  # the network's own entries: a checkpoint holds the encoder's


class Companion:
    """The sentinel's part of a copy, for a rewind that serves in-job recovery (it searches for shadows)."""

    def checks_state(self):
        return None

    def loss_level(self):
        return None


def test_a_network_kept_beside_the_trained_one_goes_back_with_the_copy(tmp_path):
    """A DQN's target network (the online one's shapes, trained by no optimizer) is part of the state a rollback
    puts back; a wrapper of the trained network, an average, a smaller module and a network gone are not."""
    online = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    target = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    wrapper = torch.nn.ModuleDict({"online": online})  # holds the online network's own parameters
    other = torch.nn.Linear(8, 16)  # another network's shapes
    optimizer = torch.optim.Adam(online.parameters(), lr=1e-3)
    rewind = Rewind(online, optimizer, checkpoint_dir=tmp_path, every=5, keep=2)
    assert rewind.take_now(0).shadows == []  # no companion (no in-job recovery): no search
    rewind.companion = Companion()
    target.load_state_dict(online.state_dict())
    copy = rewind.take_now(0)
    assert [shadow() for shadow in rewind.shadows] == [target]
    before = {name: value.clone() for name, value in target.state_dict().items()}
    with torch.no_grad():
        for param in target.parameters():
            param.mul_(1e6)  # copied from the run-up's online network
        kept = other.weight.clone()
    rewind.load(copy)
    assert all(torch.equal(target.state_dict()[name], value) for name, value in before.items())
    assert torch.equal(other.weight, kept) and wrapper["online"] is online
    class HalfBuilt(torch.nn.Module):
        def parameters(self, recurse=True):
            raise AttributeError("its __init__ raised before Module.__init__ ran")

    odd = HalfBuilt()
    torch.nn.utils.prune.l1_unstructured(target[0], "weight", amount=0.5)  # its entries changed since the copy
    rewind.load(copy)  # the copy no longer loads into it: left as it is, nothing raised in the script
    assert "weight_orig" in target[0].state_dict()
    del target
    rewind.load(copy)  # a network gone since: nothing to put back
    rewind.start_over(5)  # a new series searches again: a module of odd making is no shadow, and raises nothing
    assert rewind.shadows == [] and odd is not None


def test_a_group_added_to_the_optimizer_lets_the_copies_before_it_go_and_copies_at_once(tmp_path):
    """``add_param_group`` (a head joins at step 3): the copies before it hold one group, the optimizer two,
    and ``load_state_dict`` refuses such a copy. They go; the copy taken at once holds the new group's
    tensors, and a rollback to it puts them back."""
    encoder, head = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1, momentum=0.9)
    rewind = Rewind(encoder, optimizer, checkpoint_dir=tmp_path, every=2, keep=2)
    for step in range(5):
        if step == 3:
            optimizer.add_param_group({"params": head.parameters()})
        loss = head(encoder(torch.randn(8, 3))).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        rewind.after_step(step + 1)
        if step == 3:
            copied = head.weight.detach().clone()
    assert [s.next_step for s in rewind.snapshots] == [4]  # 2 and 4 held one group: 2 went, 4 was copied at once
    assert rewind.loose == [head.weight, head.bias] and rewind.first is None  # no companion: no first kept
    with torch.no_grad():
        head.weight.mul_(float("nan"))
    rewind.load(rewind.snapshots[-1])
    assert torch.equal(head.weight, copied) and len(optimizer.param_groups) == 2


def test_a_copy_from_before_the_network_was_pruned_no_longer_fits_and_the_next_copy_lets_it_go(tmp_path):
    """``torch.nn.utils.prune`` turns ``weight`` into ``weight_orig`` and ``weight_mask``: a copy from before
    no longer loads (a rollback to one raised in the script, stop 63). It does not fit, and the next copy
    lets the copies from before go."""
    network = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1)
    rewind = Rewind(network, optimizer, checkpoint_dir=tmp_path, every=2, keep=2)
    rewind.after_step(2)
    before = rewind.snapshots[-1]
    assert rewind.fits(before)
    prune.l1_unstructured(network[0], "weight", amount=0.5)
    assert not rewind.fits(before)
    rewind.after_step(4)
    assert [s.next_step for s in rewind.snapshots] == [4] and rewind.fits(rewind.snapshots[-1])


def test_a_group_added_before_a_step_is_copied_from_the_state_that_step_starts_from(tmp_path):
    """``before_step``: the state the new group's first step starts from is a copy to roll back to (the
    first steps of a backbone unfrozen at ten times its rate explode)."""
    encoder, head = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    rewind = Rewind(encoder, optimizer, checkpoint_dir=tmp_path, every=5, keep=2)
    rewind.before_step(7)
    assert not rewind.snapshots  # no group added: nothing copied
    optimizer.add_param_group({"params": encoder.parameters()})
    rewind.before_step(7)
    assert [s.next_step for s in rewind.snapshots] == [7] and rewind.fits(rewind.snapshots[-1])


class Sharded(torch.optim.SGD):
    """An optimizer whose state cannot be read at every step, as ``ZeroRedundancyOptimizer``'s until its shards
    are consolidated."""

    def state_dict(self):
        raise RuntimeError("Optimizer state has not been consolidated on this rank.")


def test_an_optimizer_whose_state_cannot_be_read_gets_no_copies_and_its_run_goes_on(tmp_path, capsys):
    # The copy raised in the script at its first step (stop 63's hunt, ZeroRedundancyOptimizer in the job).
    network = torch.nn.Linear(3, 2)
    rewind = Rewind(network, Sharded(network.parameters(), lr=0.1), checkpoint_dir=tmp_path, every=1, keep=2)
    assert rewind.try_take(0) is None
    rewind.after_step(1)
    assert rewind.frozen and not rewind.snapshots and rewind.first is None
    assert "the optimizer's state cannot be read" in capsys.readouterr().err


class Sharing(torch.optim.Optimizer):
    """An optimizer as SAM's is commonly written: its base optimizer is built over its own groups (the same
    dicts), keeps the momentum, and is stepped inside its step."""

    def __init__(self, params) -> None:
        super().__init__(params, {"lr": 0.1})
        self.base = torch.optim.SGD(self.param_groups, lr=0.1, momentum=0.9)
        self.param_groups = self.base.param_groups

    def step(self, closure=None):
        return self.base.step(closure)


def test_an_inner_optimizers_state_goes_back_with_the_copy_and_the_scripts_groups_stay_its_own(tmp_path):
    model = tiny_net()
    optimizer = Sharing(model.parameters())
    rewind = Rewind(model, optimizer, checkpoint_dir=tmp_path, every=2)
    rewind.add_inner(optimizer.base)

    def step(n):
        x, y = batch(n)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for n in range(2):
        step(n)
    copy = rewind.take_now(2)
    momentum = [optimizer.base.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    held = optimizer.param_groups[0]  # a script that writes its rate into the group it holds
    for n in range(2, 5):
        step(n)
    rewind.load(copy)
    restored = [optimizer.base.state[p]["momentum_buffer"] for p in model.parameters()]
    assert all(torch.equal(now, then) for now, then in zip(restored, momentum, strict=True))
    # load_state_dict alone puts new group dicts in place: the script's and the base's would part.
    assert optimizer.param_groups[0] is held and optimizer.base.param_groups[0] is held


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="copies from CUDA memory need a GPU")


@needs_cuda
def test_a_copy_from_cuda_memory_is_queued_without_waiting_and_holds_the_state_of_its_step(tmp_path):
    """The copy goes into pinned memory in the stream's order: updates queued after it do not reach it, and
    loading it back, or writing it, waits for it first (each is checked on a copy of its own, taken while
    the stream is busy, so that each waits itself)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    rewind = Rewind(model, optimizer, checkpoint_dir=tmp_path, every=1)

    def step() -> None:
        optimizer.zero_grad()
        model(torch.randn(256, 512, device="cuda")).square().mean().backward()
        optimizer.step()

    def busy_copy(next_step: int) -> tuple[dict[str, torch.Tensor], object]:
        """The state now, read waiting; then a copy of it queued behind a busy stream, and steps after it."""
        torch.cuda.synchronize()
        expected = {name: value.detach().cpu() for name, value in model.state_dict().items()}
        torch.cuda._sleep(200_000_000)  # the queue is busy for a while: the copy cannot be done when it returns
        snapshot = rewind.take_now(next_step)
        assert snapshot.copied and not all(event.query() for event in snapshot.copied)
        assert all(value.is_pinned() for value in snapshot.model.values())
        for _ in range(3):
            step()  # queued after the copy, in the same stream
        return expected, snapshot

    step()
    expected, loaded = busy_copy(1)
    rewind.load(loaded)  # waits for the copy itself
    for name, value in model.state_dict().items():
        assert torch.equal(value.cpu(), expected[name]) and torch.equal(loaded.model[name], expected[name])
    expected, written = busy_copy(5)
    assert rewind.persist_point(written) is not None  # waits for the copy itself
    saved = torch.load(rewind.persisted, weights_only=True)
    assert all(torch.equal(saved["model"][name], expected[name]) for name in expected)
    assert not torch.equal(model.state_dict()["0.weight"].cpu(), expected["0.weight"])  # the model went on


def test_a_network_trained_before_its_guard_attached_is_rolled_back_to_where_it_began(tmp_path):
    # Stop 87: the guard of a first network copies a second one's state at that one's first step (as another
    # optimizer's); where the second's training becomes the run's, its guard's first copy is that state, from
    # which a divergence in its first steps rolls back, not the state it was attached at.
    from stabilizer_sentinel.integration.launcher_hooks import _began_as
    from stabilizer_sentinel.loops.networks import BareTensors

    first = tiny_net()
    first_optimizer = torch.optim.SGD(first.parameters(), lr=0.1)
    held = Rewind(first, first_optimizer, checkpoint_dir=tmp_path, every=5, keep=2)
    held.keep(held.take_now(0))
    second = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(second.parameters(), lr=30.0)
    began = {key: value.clone() for key, value in second.state_dict().items()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    held.add_other(BareTensors(params), optimizer)  # the network was never seen called: its tensors alone
    for _ in range(3):
        optimizer.zero_grad()
        second(torch.randn(16, 4)).pow(2).mean().backward()
        optimizer.step()
    state = _began_as(held.held_other(optimizer), second, optimizer)
    assert state is not None and list(state[0]) == list(second.state_dict())
    rewind = Rewind(second, optimizer, checkpoint_dir=tmp_path, every=5, keep=2)
    _, rewind.companion = build_monitoring(second, sentinel_rules=[], sentinel_action="stop", capture={},
                                           checkpoint_dir=tmp_path, tensor_dir=None)  # in-job recovery's
    assert rewind.begin_from(state, 0, 0.5) and rewind.first.next_step == 0 and rewind.first.own == 0.5
    assert not rewind.begin_from(state, 0, 0.5)  # a first copy is held already
    rewind.load(rewind.first)
    for key in ("0.weight", "0.bias", "2.weight"):
        assert torch.equal(second.state_dict()[key], began[key])
    assert optimizer.state_dict()["state"] == {}  # Adam's moments as they were before its first step
    # A buffer the steps since made non-finite cannot be put back as it began: no such copy.
    second[1].running_var.fill_(float("nan"))
    assert _began_as(held.held_other(optimizer), second, optimizer) is None
    assert _began_as(held.held_other(first_optimizer), second, optimizer) is None  # not another optimizer's
