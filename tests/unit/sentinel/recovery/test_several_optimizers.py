"""In-job recovery with several optimizers (a GAN's two): every optimizer's state and parameters roll
back together, the rate factor applies to each, and the others' part goes back at their own next step.

The library runs in this process; the launcher runs the calibration corpus's GAN script unchanged in a
job process (tests/corpus/gan/train.py), as a job would.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from stabilizer_sentinel import watch
from stabilizer_sentinel.recovery.recovery import RateFactor
from stabilizer_sentinel.recovery.rewind import Rewind
from tests.unit.sentinel.support import FIXTURES, job_env, logged, run, summary

GAN = Path(__file__).resolve().parents[3] / "corpus" / "gan" / "train.py"


def gan(lr: float, steps: int, *, watched: bool, both: bool = False
        ) -> tuple[nn.Module, nn.Module, list[torch.optim.Optimizer], list]:
    """The corpus's GAN loop (tests/corpus/gan/train.py) with the library's lines: the discriminator is
    the watched model, the generator is known to the guard through its optimizer alone; with ``both``
    the watched model holds the two networks."""
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    discriminator = nn.Sequential(nn.Linear(1, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_d = torch.optim.SGD(discriminator.parameters(), lr=lr, momentum=0.9)
    opt_g = torch.optim.SGD(generator.parameters(), lr=lr, momentum=0.9)
    model = nn.ModuleDict({"discriminator": discriminator, "generator": generator}) if both else discriminator
    guard = watch(model, [opt_d, opt_g]) if watched else None
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
    losses = []
    for _ in range(steps):
        fake = generator(torch.randn(64, 4))
        real = torch.where(torch.rand(64, 1) < 0.5, -2.0, 2.0) + 0.5 * torch.randn(64, 1)
        d_loss = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
        opt_d.zero_grad()
        d_loss.backward()
        if guard is not None:
            guard.step(d_loss)
        opt_d.step()
        g_loss = bce(discriminator(fake), ones)  # through the generator as it made the batch
        opt_g.zero_grad()
        g_loss.backward()
        if guard is not None:
            guard.step(g_loss)
        opt_g.step()
        losses.append(d_loss.item())
    if guard is not None:
        guard.close()
    return generator, discriminator, [opt_d, opt_g], losses


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setenv("STABILIZER_CONFIG", json.dumps({"recovery": "in_job"}))
    monkeypatch.setenv("STABILIZER_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("STABILIZER_FAILURE_FILE", str(tmp_path / "failure"))
    return tmp_path


@pytest.mark.slow  # trains the GAN for 80 steps
@pytest.mark.parametrize("both", [False, True])
def test_a_gan_that_explodes_rolls_both_networks_back_and_trains_on_at_a_lower_rate_in_the_job(job, both):
    # With both networks in the watched model, the generator's weights still go back at its own step:
    # a copy into them at the discriminator's would break the backward pass of the batch it made.
    generator, discriminator, optimizers, losses = gan(3.0, 80, watched=True, both=both)
    document = json.loads((job / "checkpoints" / "findings.json").read_text())
    assert document["findings"] == []  # nothing left for the workflow to remedy
    decision = document["rollbacks"][0]
    assert decision["outcome"] == "recovered" and decision["learning_rate_after"] < 3.0
    # Both networks trained on from the restored state: nothing non-finite left in either.
    for network in (generator, discriminator):
        assert all(torch.isfinite(p).all() for p in network.parameters())
    assert all(math.isfinite(loss) for loss in losses[-20:])
    # The factor lived inside each optimizer's step alone: the rates the script set are as it set them.
    assert [group["lr"] for opt in optimizers for group in opt.param_groups] == [3.0, 3.0]
    assert document["summary"]["ended"] == "completed"


def test_a_healthy_gan_recovering_in_the_job_trains_exactly_as_unwatched(job):
    *_, watched = gan(0.002, 30, watched=True)
    *_, unwatched = gan(0.002, 30, watched=False)
    assert watched == unwatched


def test_a_second_optimizer_over_part_of_the_watched_network_puts_back_its_own_part_alone(job):
    """One network, its body under Adam and its head under SGD, both stepped each batch (body first). The
    second optimizer's part of the first copy is taken at its first step, after the body's first update:
    a rollback to that copy put the body back as that update left it (a hunt's digits MLP at Adam's rate 1
    was driven to a rate of 4e-5 by three rollbacks and ended at 11 times its unwatched loss)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    body, head = net[:2], net[2]
    opt_body = torch.optim.Adam(body.parameters(), lr=0.5)
    opt_head = torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9)
    guard = watch(net, opt_body)
    start = {name: value.clone() for name, value in net.state_dict().items()}
    for step in range(3):
        loss = nn.functional.cross_entropy(net(torch.randn(16, 4)), torch.randint(0, 2, (16,)))
        opt_body.zero_grad()
        opt_head.zero_grad()
        loss.backward()
        guard.step(loss)
        opt_body.step()
        if step == 0:  # as the launcher meets it, at its first step, with its guess of its network: all of it
            guard.add_optimizer(opt_head, net)
        opt_head.step()
    first = guard.rewind.first
    assert first is not None and first.next_step == 0
    guard.rewind.load(first)
    assert guard.rewind.load_other(opt_head)
    assert all(torch.equal(net.state_dict()[name], value) for name, value in start.items())
    guard.close()


def test_another_optimizers_part_of_a_copy_goes_back_at_its_own_next_step(tmp_path):
    model, other = nn.Linear(2, 1), nn.Linear(2, 1)
    first, second = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(other.parameters(), lr=0.1)
    rewind = Rewind(model, first, checkpoint_dir=tmp_path)
    rewind.keep(rewind.take_now(0))
    rewind.add_other(other, second)  # met at its first step: the copies held get its state as it is now
    before = {name: value.clone() for name, value in other.state_dict().items()}
    with torch.no_grad():
        for param in [*model.parameters(), *other.parameters()]:
            param.add_(1.0)
    rewind.load(rewind.kept()[0])
    assert torch.equal(model.weight, rewind.kept()[0].model["weight"])  # the model at once
    assert not torch.equal(other.weight, before["weight"])  # the other not yet: a graph may hold its weights
    assert rewind.load_other(second) is True
    assert all(torch.equal(other.state_dict()[name], value) for name, value in before.items())
    assert rewind.load_other(second) is False  # once per load


@pytest.mark.slow  # the job's own process
def test_the_launcher_rolls_back_an_unchanged_gan_script_inside_the_job(tmp_path):
    # The generator's batch is made before the discriminator steps and backwarded after: a copy into the
    # generator's weights at the discriminator's step would break that backward pass.
    result = run(["-m", "stabilizer_sentinel.launch", str(GAN), "--lr", "3"], GAN.parent,
                 job_env(tmp_path, {"recovery": "in_job"}))
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert document["findings"] == [] and document["rollbacks"][0]["outcome"] == "recovered"
    assert summary(tmp_path)["ended"] == "completed"
    last = [line for line in result.stdout.splitlines() if line.startswith("step 199 ")]
    assert last and "nan" not in last[0], result.stdout[-500:]


@pytest.mark.slow
@pytest.mark.long  # the job's own process, with Lightning: the launcher's GAN above and the callback's rollbacks
def test_the_lightning_callback_rolls_back_a_gan_with_both_networks_inside_the_job(tmp_path):
    # Under the SentinelCallback Lightning counts each optimizer's step (two a batch) and the callback
    # checks the first one's; the generator's part of a copy goes back at its own next step, as under the
    # launcher. The batch after each rollback starts from the generator the restored copy held, to the
    # last bit: the copy at step s was taken at the discriminator's step of batch (s - 1) // 2, before the
    # generator's (the first copy, at step 0, before any).
    script = FIXTURES / "loops" / "lightning_gan.py"
    result = run(["-m", "stabilizer_sentinel.launch", str(script), "--lr", "3", "--steps", "100", "--callback", "1"],
                 script.parent, job_env(tmp_path, {"recovery": "in_job"}))
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert document["summary"]["integration"] == "lightning" and document["summary"]["ended"] == "completed"
    rollbacks = document["rollbacks"]
    assert rollbacks and all(r["outcome"] == "recovered" for r in rollbacks)
    generators = dict(logged(result.stdout, "gen"))
    for rollback in rollbacks:
        restored, found = rollback["restored_step"], rollback["step"] // 2
        assert generators[found + 1] == generators[max(restored - 1, 0) // 2], rollback
        assert generators[found + 1] != generators[found]
    assert all(finding["rule"] != "ExplodingTensor" for finding in document["findings"])
    losses = [loss for _, loss in logged(result.stdout, "loss")]
    assert len(losses) == 100 and math.isfinite(losses[-1])


@pytest.mark.long  # two Lightning DDP processes: the callback's GAN above and test_ddp.py's DDP GAN in one
def test_the_lightning_callback_rolls_back_a_ddp_gan_on_every_rank_inside_the_job(tmp_path):
    # Lightning starts the second rank itself (the script again, with the callback); rank 0 decides and
    # the other rank follows, the generator's part of the state too: at every batch both ranks start
    # from the same generator, to the last bit, rollbacks included.
    script = FIXTURES / "loops" / "lightning_gan.py"
    result = run([str(script), "--lr", "3", "--steps", "100", "--callback", "1", "--devices", "2"],
                 script.parent, job_env(tmp_path, {"recovery": "in_job"}), timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert document["summary"]["integration"] == "lightning" and document["summary"]["ended"] == "completed"
    rollbacks = document["rollbacks"]
    assert rollbacks and all(r["outcome"] == "recovered" for r in rollbacks), rollbacks
    generators: dict[str, dict[int, str]] = {}
    for rank, step, gen in re.findall(r"rank=(\d) step=(\d+) loss=\S+ gen=(\S+)", result.stdout):
        generators.setdefault(rank, {})[int(step)] = gen
    assert sorted(generators) == ["0", "1"] and len(generators["0"]) == len(generators["1"]) == 50
    assert generators["0"] == generators["1"]  # one state on both ranks, batch by batch
    for rollback in rollbacks:  # ... and after each rollback, the restored copy's (as in the test above)
        restored, found = rollback["restored_step"], rollback["step"] // 2
        assert generators["0"][found + 1] == generators["0"][max(restored - 1, 0) // 2] != generators["0"][found]
    assert all(finding["rule"] != "ExplodingTensor" for finding in document["findings"])


class Factor(RateFactor):
    def __init__(self, factor: float, due: bool) -> None:
        self.factor, self.due = factor, due

    def put_back_other(self, optimizer: torch.optim.Optimizer) -> bool:
        return self.due


@pytest.mark.parametrize("due", [False, True])
def test_another_optimizer_steps_at_the_factor_in_force_or_not_at_all_right_after_its_state_went_back(due):
    weight = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    weight.grad = torch.ones(3)
    factor = Factor(0.1, due)
    factor.covered = frozenset({id(optimizer)})  # an optimizer the rollback held
    stepped = factor.scale_other(optimizer)
    seen = (optimizer.param_groups[0]["lr"], weight.grad)
    optimizer.step()
    assert factor.unscale_other(optimizer) is due  # True: the step was skipped
    assert stepped is not due and optimizer.param_groups[0]["lr"] == 0.5  # the script's rate back
    if due:  # its gradients predate the state put back: nothing applied, the gradients back after the step
        assert seen[1] is None and torch.equal(weight, torch.ones(3)) and torch.equal(weight.grad, torch.ones(3))
    else:
        assert seen[0] == pytest.approx(0.05) and torch.allclose(weight, torch.full((3,), 0.95))


@pytest.mark.long  # a Lightning rollback and a GAN's each run in make test
def test_the_launcher_rolls_back_a_lightning_gan_twice_inside_the_job(tmp_path):
    # Manual optimisation, each optimizer stepped with Lightning's closure. The second rollback goes back
    # to a copy of the lineage training went on from, never to one of the steps the first one undid.
    script = FIXTURES / "loops" / "lightning_gan.py"
    result = run(["-m", "stabilizer_sentinel.launch", str(script), "--lr", "3", "--steps", "100"], script.parent,
                 job_env(tmp_path, {"integration": "auto", "recovery": "in_job"}))
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    rollbacks = document["rollbacks"]
    assert len(rollbacks) >= 2 and all(r["outcome"] == "recovered" for r in rollbacks)  # 3 at stop 72
    first = rollbacks[0]
    for earlier, later in itertools.combinations(rollbacks, 2):  # no copy of a step an earlier rollback undid
        assert not earlier["restored_step"] < later["restored_step"] <= earlier["step"]
    # The probe at a third of the rate was thrown far up: however its spread reads, it is not the edge (the
    # job would go on at the next lower candidate). Whether the game then learns is the GAN's: at the rate
    # it goes on at, from the start, this one's discriminator loss ends where it began, and the end says so.
    thrown = max(first["probed"], key=lambda p: p["score"])
    below = max(p["factor"] for p in first["probed"] if p["factor"] < thrown["factor"])
    lowest = min(p["score"] for p in first["probed"])
    assert thrown["score"] > 100 * lowest and first["factor"] < below  # ~1e19 when written, 2,509 at stop 72
    written = document["summary"]
    assert (written["integration"], written["ended"]) == ("launcher", "completed")
    assert all(finding["rule"] != "ExplodingTensor" for finding in document["findings"])
    losses = [loss for _, loss in logged(result.stdout, "loss")]
    assert len(losses) == 100 and math.isfinite(losses[-1])
