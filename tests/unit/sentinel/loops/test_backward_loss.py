"""The loss a backward pass starts from (stabilizer_sentinel.loops.backward_loss.read)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from stabilizer_sentinel.loops import backward_loss


def _losses() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x, labels, target = torch.randn(8, 3), torch.randint(2, (8,)), torch.randn(8, 2)
    outputs = model(x)
    return nn.functional.cross_entropy(outputs, labels), nn.functional.mse_loss(outputs, target)


def test_one_scalar_is_read_with_its_scaling_undone():
    entropy, _ = _losses()
    read = backward_loss.read([entropy / 4])
    assert read is not None and read.scaled and read.node is not None
    assert float(read.value) == pytest.approx(float(entropy))


def test_several_scalars_are_read_as_their_sum_as_written():
    # torch.autograd.backward([l1 / 2, l2]) computes the gradients of l1 / 2 + l2: the halves weight the
    # objective, not undone (as one scalar's scaling is).
    entropy, error = _losses()
    read = backward_loss.read([entropy / 2, error])
    assert read is not None and read.node is None and not read.scaled
    assert float(read.value) == pytest.approx(float(entropy) / 2 + float(error))



def test_several_float64_scalars_beyond_float32s_range_are_read_as_a_finite_sum():
    # Stop 77's harm hunt: a float64 run's losses read through float32 overflowed to inf ("non-finite").
    weight = torch.ones(2, dtype=torch.float64, requires_grad=True)
    read = backward_loss.read([weight.sum() * 1e39, weight.sum() * 2e39])
    assert read is not None and read.value.dtype == torch.float64 and float(read.value) == pytest.approx(6e39)

def test_a_pass_from_a_tensor_that_is_no_scalar_has_no_loss():
    entropy, _ = _losses()
    outputs = nn.Linear(3, 2)(torch.randn(4, 3))
    assert backward_loss.read([outputs]) is None
    assert backward_loss.read([entropy, outputs]) is None
    assert backward_loss.read([entropy.detach(), entropy]) is None  # a scalar with no graph


def test_a_factor_is_undone_by_its_magnitude_and_a_zero_one_leaves_the_scalar():
    entropy, _ = _losses()
    negated = backward_loss.read([-2.0 * entropy])  # an objective to ascend keeps its sign
    assert negated is not None and float(negated.value) == pytest.approx(-float(entropy))
    halved = backward_loss.read([entropy / -2])
    assert halved is not None and float(halved.value) == pytest.approx(-float(entropy))
    off = backward_loss.read([0.0 * entropy])  # a term switched off: 0, not 0 / 0
    assert off is not None and float(off.value) == 0.0


def test_a_per_element_loss_given_weights_is_their_weighted_sum_and_an_activation_no_loss():
    torch.manual_seed(0)
    outputs, labels = nn.Linear(3, 2)(torch.randn(8, 3)), torch.randint(2, (8,))
    per_sample = nn.functional.cross_entropy(outputs, labels, reduction="none")
    weights = torch.full_like(per_sample, 1 / 8)
    read = backward_loss.read([per_sample], (weights,))
    assert read is not None and read.kind[0] == "weighted" and read.node is None
    assert float(read.value) == pytest.approx(float(per_sample.mean()))
    # A pipeline stage's activations backwarded with the gradient of what follows them: no loss to read.
    assert backward_loss.read([outputs], torch.ones_like(outputs)) is None
    assert backward_loss.read([per_sample], torch.ones(3)) is None  # weights of another shape


def test_a_reading_says_what_divides_the_scalar_as_written_into_the_loss():
    entropy, _ = _losses()
    read = backward_loss.read([entropy * 65536 / 4])
    assert read is not None and read.kind == ("DivBackward0", "MulBackward0", "NllLossBackward0")
    assert float(read.written) == pytest.approx(float(entropy) * 16384)
    assert float(read.written / read.divisor) == pytest.approx(float(read.value))
    summed = nn.functional.cross_entropy(torch.randn(6, 3, requires_grad=True), torch.arange(6) % 3, reduction="sum")
    read = backward_loss.read([summed])
    assert read is not None and read.kind[-1] == "sum" and float(read.divisor) == 6.0


@pytest.mark.parametrize("form", ["summed", "summed_kept_dim", "summed_over_accumulation", "squared_error"])
def test_a_per_element_loss_the_script_sums_is_read_as_its_mean_per_element(form):
    # Stop 72's hunt: a loss of shape [1], the per-row cross-entropy summed over the rows and divided by the batch,
    # was read through the division as the sum: the summary's losses were the batch size times the script's.
    torch.manual_seed(0)
    outputs, labels, target = nn.Linear(3, 4)(torch.randn(8, 3)), torch.randint(4, (8,)), torch.randn(8, 4)
    labels[0] = -100  # ignored: no part of the mean
    per_row = nn.functional.cross_entropy(outputs, labels, reduction="none")
    scalar, mean = {
        "summed": (per_row.sum() / 8, nn.functional.cross_entropy(outputs, labels)),
        "summed_kept_dim": (per_row.sum(0, keepdim=True) / 8, nn.functional.cross_entropy(outputs, labels)),
        "summed_over_accumulation": (per_row.sum() / 8 / 4, nn.functional.cross_entropy(outputs, labels)),
        "squared_error": (nn.functional.mse_loss(outputs, target, reduction="none").sum().view(1),
                          nn.functional.mse_loss(outputs, target)),
    }[form]
    read = backward_loss.read([scalar])
    assert read is not None and read.node is not None and read.kind[-1] == "sum"
    assert float(read.value) == pytest.approx(float(mean))
    assert float(read.written / read.divisor) == pytest.approx(float(read.value))
    # A sum of the per-element losses weighed first (a mask, a policy's advantages) is the scalar as written.
    weighed = backward_loss.read([(per_row * torch.rand(8)).sum() / 8])
    assert weighed is not None and weighed.node is None


@pytest.mark.parametrize("form", ["by_the_mask", "by_its_integer_count", "negated_inside", "by_a_number",
                                  "then_accumulated", "then_scaled"])
def test_a_sum_divided_by_its_count_is_a_mean_written_by_hand_and_read_as_written(form):
    # Stop 82's hunt: a token-level loss averaged over the tokens its mask keeps (TRL's SFT loss, a plain loop's)
    # was read through the division as the batch's sum over its tokens, which follows how many there are: a run at
    # rate 0 whose batches went longest first was called learned.
    torch.manual_seed(0)
    logits, targets = nn.Linear(3, 5)(torch.randn(4, 6, 3)), torch.randint(5, (4, 6))
    mask = (torch.rand(4, 6) > 0.3).float()
    log_probs = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mean = -(log_probs * mask).sum() / mask.sum()
    scalar, undone = {
        "by_the_mask": (mean, 1.0),
        "by_its_integer_count": (-(log_probs * mask).sum() / mask.long().sum(), 1.0),
        "negated_inside": ((-log_probs * mask).sum() / mask.sum(), 1.0),
        "by_a_number": (-(log_probs * mask).sum() / int(mask.sum()), 1.0),
        "then_accumulated": (mean / 4, 0.25),  # an accumulation's division above it is still undone
        "then_scaled": (mean * 1024.0, 1024.0),  # and so is a loss scaler's factor
    }[form]
    read = backward_loss.read([scalar])
    assert read is not None and read.node is None and read.kind[-1] == "mean"
    assert float(read.value) == pytest.approx(float(mean))
    assert float(read.divisor) == pytest.approx(undone)


def _policy() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The log-probabilities of eight actions a policy took, and advantages of both signs and of one."""
    torch.manual_seed(0)
    log_probs = torch.log_softmax(nn.Linear(3, 4)(torch.randn(8, 3)), dim=1)[:, 0]
    advantages = torch.randn(8)
    return log_probs, advantages - advantages.mean(), advantages.abs()


@pytest.mark.parametrize("form", ["sum", "mean", "negated_first", "times_minus_one", "gathered", "stacked",
                                  "actor_critic", "summed_over_steps", "masked", "ppo_clipped", "ppo_min"])
def test_a_sum_of_terms_weighted_by_constants_of_both_signs_is_a_surrogate(form):
    log_probs, advantages, _ = _policy()
    entropy, error = _losses()
    loss = {
        "sum": -(log_probs * advantages).sum() / 8,
        "mean": -(log_probs * advantages).mean(),
        "negated_first": (-log_probs * advantages).sum(),
        "times_minus_one": (log_probs * advantages).mean() * -1,
        # Each step's -log_prob * R, gathered (pytorch/examples' REINFORCE: torch.cat(policy_loss).sum()).
        "gathered": torch.cat([-log_probs[i:i + 1] * advantages[i] for i in range(8)]).sum(),
        "stacked": torch.stack([-log_probs[i] * float(advantages[i]) for i in range(8)]).sum(),
        # An actor-critic's: the surrogate beside a value loss and an entropy bonus (stop 65's hunt: A2C on CartPole,
        # its value loss rising with the returns, stopped as NotLearning while its episodes grew from 24 steps to 127).
        "actor_critic": -(log_probs * advantages).mean() + 0.5 * error - 0.01 * entropy,
        # Two episodes of four steps: summed over each episode's steps, averaged over episodes; or multiplied by
        # a mask of the steps each episode lived (stop 69's hunt: a healthy REINFORCE written so was rolled back).
        "summed_over_steps": -(log_probs.view(2, 4) * advantages.view(2, 4)).sum(1).mean(),
        "masked": -(log_probs * advantages * (torch.arange(8) < 6).float()).mean(),
        # PPO's clipped surrogate beside its value loss and entropy bonus, as CleanRL writes it (stop 81's RL hunt:
        # a healthy run rolled back three times as Diverging, its value loss rising with the returns), and as
        # Stable-Baselines3 does.
        "ppo_clipped": torch.max(-advantages * log_probs.exp(), -advantages * log_probs.exp().clamp(0.8, 1.2)).mean()
        - 0.01 * entropy + 0.5 * error,
        "ppo_min": -torch.min(advantages * log_probs.exp(), advantages * log_probs.exp().clamp(0.8, 1.2)).mean(),
    }[form]
    signed = backward_loss.signed_weights([loss])
    assert signed is not None and bool(signed)


@pytest.mark.parametrize("form", ["cosine_similarity", "normalized", "byol", "norm_by_hand"])
def test_a_cosine_similarity_to_fixed_directions_is_no_surrogate(form):
    # From stop 71's hunt: a healthy BYOL and a regression onto fixed directions by their angle, their targets'
    # entries of both signs, were read as a policy gradient's surrogate and left unjudged.
    torch.manual_seed(0)
    prediction = torch.randn(8, 4, requires_grad=True) * 1.0
    target = torch.randn(8, 4)  # the target branch's output, detached, or plain data
    loss = {
        "cosine_similarity": 1 - nn.functional.cosine_similarity(prediction, target, dim=1).mean(),
        "normalized": -(nn.functional.normalize(prediction, dim=1) * nn.functional.normalize(target, dim=1))
        .sum(dim=1).mean(),
        "byol": (2 - 2 * (nn.functional.normalize(prediction, dim=-1) * nn.functional.normalize(target, dim=-1))
                 .sum(dim=-1)).mean(),
        "norm_by_hand": -((prediction / prediction.pow(2).sum(1, keepdim=True).sqrt()) * target).sum(1).mean(),
    }[form]
    assert not bool(backward_loss.signed_weights([loss]))


def test_a_loss_weighted_by_constants_of_one_sign_or_inside_another_function_is_no_surrogate():
    log_probs, advantages, weights = _policy()
    entropy, error = _losses()
    assert not bool(backward_loss.signed_weights([-(log_probs * weights).mean()]))  # class weights, a mask
    margins = (1 - advantages.sign() * log_probs).clamp(min=0).mean()  # a hinge: the product is inside
    written = torch.max(torch.zeros(8), 1 - advantages.sign() * log_probs).mean()  # the same hinge, as a choice
    for loss in (margins, written, entropy, error, entropy + error):
        assert backward_loss.signed_weights([loss]) is None
    assert not bool(backward_loss.signed_weights([(log_probs * weights).sum() + error]))  # weighted, beside a fit
    alive = (torch.arange(8) < 6).float()  # a mask over class weights, reduced twice: still of one sign
    assert not bool(backward_loss.signed_weights([-(log_probs * weights * alive).view(2, 4).sum(1).mean()]))
    squared = (log_probs - advantages) ** 2  # a squared error weighted by one sign: the walk stops at the square
    assert not bool(backward_loss.signed_weights([(squared * weights).view(2, 4).sum(1).mean()]))


class _LossInForward(nn.Module):
    """A model that computes its loss in its forward pass, as a Hugging Face model's ``outputs.loss`` does: summed
    over the labels and divided by a count handed in (the labels of every rank, as a ``Trainer`` counts them)."""

    def __init__(self) -> None:
        super().__init__()
        self.head, self.unused = nn.Linear(3, 4), nn.Linear(3, 4)

    def forward(self, x: torch.Tensor, labels: torch.Tensor, count: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(x)
        summed = nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
        return {"logits": logits, "loss": summed / count}


@pytest.fixture
def one_rank():
    """A process group of one rank, in this process (DDP's own forward pass needs one)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_loss_computed_in_a_ddp_forward_pass_is_read_through_ddps_passthrough(one_rank, ranks):
    # Stop 73's hunt: a Hugging Face Trainer under two ranks multiplies its loss by the ranks (its count is every
    # rank's labels); DDP with find_unused_parameters (the Trainer's default) hands the model's outputs on through
    # its passthrough, where the walk stopped: the loss was read at half, and as no cross-entropy.
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_LossInForward(), find_unused_parameters=True)
    x, labels = torch.randn(8, 3), torch.randint(4, (8,))
    labels[0] = -100
    kept = labels.ne(-100).sum()
    outputs = model(x, labels, kept * ranks)
    loss = outputs["loss"]
    loss *= ranks  # the Trainer's own scaling, in place
    assert loss.grad_fn.name() == "MulBackward0" and "_DDPSinkBackward" in str(loss.grad_fn.next_functions)
    read = backward_loss.read([loss])
    assert read is not None and read.node is not None and read.kind[-1] == "sum"
    assert "_DDPSinkBackward" in read.kind
    assert float(read.value) == pytest.approx(float(nn.functional.cross_entropy(outputs["logits"], labels)))
    assert float(read.written / read.divisor) == pytest.approx(float(read.value))


def test_a_sum_computed_in_a_ddp_forward_pass_is_walked_through_ddps_passthrough(one_rank):
    # The walks that name a loss's terms (stabilizer_sentinel.detection.loss_makeup) and find its one term of known
    # level (chance_level.known_term) go through the passthrough too: before, they saw one term, DDP's.
    from stabilizer_sentinel.detection import chance_level, loss_makeup

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_LossInForward(), find_unused_parameters=True)
    x, labels = torch.randn(8, 3), torch.randint(4, (8,))
    outputs = model(x, labels, labels.ne(-100).sum())
    loss = outputs["loss"] + 0.01 * outputs["logits"].pow(2).mean()
    alone = _LossInForward()(x, labels, labels.ne(-100).sum())
    assert loss_makeup.makeup([loss]) == loss_makeup.makeup([alone["loss"] + 0.01 * alone["logits"].pow(2).mean()])
    term = chance_level.known_term([loss])
    assert term is not None and [node.name() for node, _ in term[0]] == ["NllLossBackward0"] and not term[1]


class _WithNumbers(nn.Module):
    """A forward pass returning a number beside its loss, before it or after it (a Hugging Face model's cache)."""

    def __init__(self, before: bool) -> None:
        super().__init__()
        self.head, self.before = nn.Linear(3, 4), before

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        logits = self.head(x)
        loss, aux = nn.functional.cross_entropy(logits, labels), logits.pow(2).sum() / 1000
        return {"epoch": 1, "loss": loss, "aux": aux} if self.before else {"loss": loss, "cache": "kept", "aux": aux}


@pytest.mark.parametrize("before", [True, False])
def test_a_number_a_ddp_forward_pass_returns_before_its_loss_stops_the_walk_at_the_passthrough(one_rank, before):
    # The review of stop 74: the passthrough numbers its outputs over every value returned and its graph inputs over
    # the tensors alone; with a number before the loss, the walk read the next output, 1,000 times the loss.
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_WithNumbers(before), find_unused_parameters=True)
    x, labels = torch.randn(8, 3), torch.randint(4, (8,))
    loss = model(x, labels)["loss"]
    read = backward_loss.read([loss])
    assert read is not None and float(read.value) == pytest.approx(float(loss))
    assert read.node is None if before else read.node is not None


def test_a_tensor_the_scripts_saved_tensor_hooks_packed_is_not_read():
    # Reading it would run the script's unpack hook, which may consume it before the backward pass needs it.
    store: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> int:
        store[len(store)] = tensor
        return len(store) - 1

    model = nn.Linear(3, 2)
    x, labels = torch.randn(8, 3), torch.randint(2, (8,))
    with torch.autograd.graph.saved_tensors_hooks(pack, store.pop):
        loss = nn.functional.cross_entropy(model(x), labels, reduction="sum") / 4
    held = len(store)
    with pytest.raises(backward_loss.ScriptHeld):
        backward_loss.saved(loss.grad_fn.next_functions[0][0], "target")
    read = backward_loss.read([loss])  # what needs no saved tensor is read: the scalar, its scaling undone
    assert read is not None and float(read.value) == pytest.approx(float(loss) * 4) and len(store) == held
    assert backward_loss.signed_weights([loss]) is None and len(store) == held
    loss.backward()  # every tensor the script packed is still there for it
    assert store == {} and model.weight.grad is not None
