"""A binary cross-entropy's chance level, and the one term of known level a sum of terms adds up.

A classifier that learns only its labels' prior has not learned, whatever its loss did: its loss falls from
a badly scaled start to the prior's entropy. Where the loss is a binary cross-entropy that level is now
known; where it is a sum (a cross-entropy plus a hand-written penalty on the weights) the penalty's fall
alone read as learning, and stop 64's verdict hunt found such a run, recall 0 on data 90/10, called
learned. Each is judged against its own level at the end of a run given its patience.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional

from stabilizer_sentinel.detection.chance_level import (
    ALIKE,
    BINARY,
    ChanceLevel,
    TermLevel,
    known_term,
    listen,
    listen_term,
)
from stabilizer_sentinel.detection.learning_check import LearningCheck


def _fed(loss_of, steps: int = 40) -> tuple[ChanceLevel, TermLevel]:
    """The chance level and the term level fed by ``steps`` backward passes of ``loss_of(model, x)``."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    owner = object.__new__(LearningCheck)
    chance, term = listen(owner), listen_term(owner, 2)
    for _ in range(steps):
        loss_of(model, torch.randn(8, 4)).backward()
    del owner
    return chance, term


def _binary_entropy(p: torch.Tensor) -> float:
    p = p.double()
    return float((-torch.xlogy(p, p) - torch.xlogy(1 - p, 1 - p)).mean())


def test_the_chance_level_of_a_binary_cross_entropy_is_the_entropy_of_each_columns_mean_target():
    targets = torch.tensor([[1, 0, 0.5]] * 2 + [[0, 0, 0.25]] * 6, dtype=torch.float32)  # column means 1/4, 0, 5/16
    loss, term = _fed(lambda model, x: functional.binary_cross_entropy_with_logits(model(x), targets))
    chance = term.levels[0]  # judged at the end of a run given its patience, not by the learning check all along
    assert loss.level() is None and loss.reason == BINARY and term.alone
    assert math.isclose(chance.level(), _binary_entropy(targets.mean(0)), rel_tol=1e-9)
    _, probabilities = _fed(lambda model, x: functional.binary_cross_entropy(torch.sigmoid(model(x)), targets))
    assert math.isclose(probabilities.levels[0].level(), chance.level(), rel_tol=1e-9)
    assert chance.ceiling() == chance.level() and chance.error() > 0


def test_a_binary_cross_entropy_weighted_or_a_gans_all_alike_labels_leave_the_level_unknown():
    targets = torch.tensor([[1.0, 0, 1]] * 8)
    _, weighted = _fed(lambda model, x: functional.binary_cross_entropy_with_logits(
        model(x), targets, pos_weight=torch.full((3,), 2.0)))
    assert weighted.off and weighted.levels[0].level() is None and "weighs" in weighted.levels[0].reason
    # A GAN's passes: all-real labels, then all-fake, then the generator's all-real: pooled, a prior of 2/3
    # that no pass's loss is on.
    labels = iter([torch.ones(8, 3), torch.zeros(8, 3), torch.ones(8, 3)] * 20)
    _, gan = _fed(lambda model, x: functional.binary_cross_entropy_with_logits(model(x), next(labels)), steps=60)
    assert gan.levels[0].level() is None and gan.levels[0].reason == ALIKE
    # A few batches of a 90/10 label all of one class are no GAN: the level stands.
    torch.manual_seed(1)
    rare = iter([(torch.rand(8, 3) < 0.1).float() if step % 10 else torch.zeros(8, 3) for step in range(60)])
    _, imbalanced = _fed(lambda model, x: functional.binary_cross_entropy_with_logits(model(x), next(rare)), steps=60)
    assert imbalanced.levels[0].level() is not None


def test_a_sums_one_term_of_known_level_is_found_and_valued_as_its_node_computes_it():
    labels = torch.tensor([0, 1, 2, -100, 1, 2, 0, -100])
    seen: list[torch.Tensor] = []

    def with_penalty(model: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        term = functional.cross_entropy(model(x), labels)
        seen.append(term.detach())
        return 0.5 * term + 1e-2 * sum((p ** 2).sum() for p in model.parameters())

    chance, term = _fed(with_penalty, steps=20)
    assert chance.off and chance.level() is None  # the sum has none
    assert not term.off and term.names == ("NllLossBackward0",) and not term.full and not term.alone
    passes, median, error, level = term.tails()[0]
    values = torch.stack(seen).double()
    assert passes == 20 and math.isclose(median, float(values.median()), rel_tol=1e-6)
    spread = 1.4826 * float((values - values.median()).abs().median())
    assert math.isclose(error, 1.2533 * spread / math.sqrt(20), rel_tol=1e-5)
    assert math.isclose(level, math.log(3), rel_tol=1e-9)  # the labels not ignored: 2 : 2 : 2
    assert level == term.levels[0].level()


@pytest.mark.parametrize("objective", ["two losses", "subtracted", "alone", "no other term"])
def test_no_term_is_read_where_the_sum_is_not_one_known_loss_and_others(objective):
    model = nn.Linear(4, 1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    mse = functional.mse_loss(model(x), y)
    penalty = (model.weight ** 2).sum()
    loss = {"two losses": mse + functional.l1_loss(model(x), y) + functional.mse_loss(model(x), -y),
            "subtracted": penalty - mse, "alone": mse * 2, "no other term": mse + 1.0}[objective]
    assert known_term([loss]) is None
    ((node, _),), alone = known_term([mse + penalty])
    assert node.name() == "MseLossBackward0" and not alone
    ((node, factor),), alone = known_term([2 * mse - penalty])  # what a subtraction subtracts from is walked
    assert node.name() == "MseLossBackward0" and not alone and float(factor) == 2
    ((node, factor),), alone = known_term([0.5 * functional.binary_cross_entropy_with_logits(model(x),
                                                                                          (y > 0).float())])
    assert node.name() == "BinaryCrossEntropyWithLogitsBackward0" and alone and float(factor) == 0.5


def test_a_term_weighted_by_zero_or_a_negative_number_is_not_counted():
    targets = torch.randn(8, 3)
    weights = iter([0.0] * 10 + [-1.0] * 10)
    _, term = _fed(lambda model, x: next(weights) * functional.mse_loss(model(x), targets)
                   + (model.weight ** 2).sum(), steps=20)
    assert not term.off and term.tails() == []  # no pass of the term counted


def _classifier_run(penalty: float = 0.0, steps: int = 400, *, rare: float = 0.1, smoothing: float = 0.0,
                    shuffled: bool = False, subtracted: bool = False) -> tuple[LearningCheck, object]:
    """A two-class classifier on data whose ``rare`` class its features tell apart, trained by a cross-entropy
    (label-smoothed by ``smoothing``) plus ``penalty`` times the weights' squared norm (written as the negated
    norm subtracted where ``subtracted``, as TabNet subtracts its sparsity term), its labels ``shuffled`` apart
    from its inputs where asked (it can learn their prior alone), as a check under the launcher reads it."""
    torch.manual_seed(0)
    y = (torch.rand(3000) < rare).long()
    x = torch.randn(3000, 20) + 1.5 * y[:, None] * (torch.arange(20) < 4)
    labels = y[torch.randperm(3000)] if shuffled else y
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=penalty)
    check = LearningCheck.configured([])
    for step in range(steps):
        rows = torch.randint(0, 3000, (64,))
        loss = functional.cross_entropy(model(x[rows]), labels[rows], label_smoothing=smoothing)
        if penalty:
            norm = sum((p ** 2).sum() for name, p in model.named_parameters() if "weight" in name)
            loss = loss - penalty * -norm if subtracted else loss + penalty * norm
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert check.observe(step, float(loss.detach()), None, 1e-2) is None
    return check, check.at_end(steps - 1)


def test_a_penalty_that_falls_while_the_cross_entropy_learns_only_the_prior_is_no_learning():
    check, finding = _classifier_run(penalty=1.0)
    assert finding is not None and finding.rule == "NotLearning" and not check.learned
    assert "its cross-entropy term ended at" in finding.message and "the fall was its other terms'" in finding.message
    # The same script with a penalty a thousand times lighter learns: its term ends far below the prior.
    check, finding = _classifier_run(penalty=1e-3)
    assert finding is None and check.learned
    # Sixty steps are short of the patience a run is given to learn (100): its sum's fall stands.
    check, finding = _classifier_run(penalty=1.0, steps=60)
    assert finding is None and check.learned
    # A term subtracted from the cross-entropy (stop 83's hunt: TabNet's ``loss - lambda * M_loss``) hid it before.
    check, finding = _classifier_run(penalty=1.0, subtracted=True)
    assert finding is not None and "its cross-entropy term ended at" in finding.message and not check.learned
    check, finding = _classifier_run(penalty=1e-3, subtracted=True)
    assert finding is None and check.learned


def test_a_binary_classifier_that_learned_only_its_prior_never_learned():
    torch.manual_seed(0)
    y = (torch.rand(2000) < 0.1).float()
    model = nn.Linear(10, 1)
    model.bias.data.fill_(3.0)  # a badly scaled start: the loss falls from 2.7 to the prior's 0.33
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    check = LearningCheck.configured([])
    for step in range(300):
        rows = torch.randint(0, 2000, (64,))
        loss = functional.binary_cross_entropy_with_logits(model(torch.randn(64, 10)).squeeze(1), y[rows])  # noise
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert check.observe(step, float(loss.detach()), None, 0.5) is None
    finding = check.at_end(299)
    assert finding is not None and finding.rule == "NotLearning" and not check.learned
    assert "it learned the labels' prior and nothing beyond it" in finding.message


def test_a_few_passes_far_off_move_no_verdict_on_the_term():
    # An L-BFGS closure evaluated at trial points a line search rejects (the corpus's ridge regression at ten
    # times its rate: 1e31 where the fit is at 0.01, one pass in six): its mean is those passes', its median the
    # fit's.
    torch.manual_seed(0)
    targets = torch.randn(32, 1)
    passes = iter([1e16 if index % 6 == 0 else 1.0 for index in range(60)])
    _, term = _fed(lambda model, x: functional.mse_loss(model(torch.randn(32, 4))[:, :1] * next(passes), targets)
                   + 1e-4 * (model.weight ** 2).sum(), steps=60)
    passes, median, error, _ = term.tails()[0]
    assert passes == 60 and median < 10 * term.levels[0].level() and error < median


def test_a_binary_cross_entropys_floor_is_its_soft_targets_own_entropy():
    soft = torch.tensor([[0.9, 0.5, 0.0]] * 4 + [[0.7, 0.2, 1.0]] * 4)
    _, term = _fed(lambda model, x: functional.binary_cross_entropy_with_logits(model(x), soft))
    assert math.isclose(term.levels[0].floor(), _binary_entropy(soft), rel_tol=1e-6)  # each in single precision
    assert 0 < term.levels[0].floor() < term.levels[0].level()
    _, hard = _fed(lambda model, x: functional.binary_cross_entropy_with_logits(model(x), (soft > 0.6).float()))
    assert hard.levels[0].floor() == 0.0
    labels = torch.tensor([0, 1, 2, 1, 0, 2, 1, 0])
    chance, _ = _fed(lambda model, x: functional.cross_entropy(model(x), labels))
    assert chance.level() is not None and chance.floor() is None


def _student_run(scale: float, *, blind: bool = False, bias: float = 0.0,
                 steps: int = 300) -> tuple[LearningCheck, object]:
    """A linear student distilled from a linear teacher's probabilities (its logits ``scale`` per feature's
    weight), by a binary cross-entropy on those soft targets, as a check under the launcher reads it; a
    ``blind`` student sees other inputs than the teacher's. The first finding (or the end's), and the check."""
    torch.manual_seed(0)
    teacher = torch.randn(10) * scale
    student = nn.Linear(10, 1)
    nn.init.zeros_(student.weight)
    nn.init.constant_(student.bias, bias)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    check = LearningCheck.configured([])
    for step in range(steps):
        x = torch.randn(64, 10)
        seen = torch.randn(64, 10) if blind else x
        loss = functional.binary_cross_entropy_with_logits(student(seen).squeeze(1), torch.sigmoid(x @ teacher))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        finding = check.observe(step, float(loss.detach()), None, 1e-2)
        if finding is not None:
            return check, finding
    return check, check.at_end(steps - 1)


def test_a_student_that_falls_to_its_soft_targets_entropy_learned():
    # Its start 0.690, its targets' entropy 0.672: a fall to it is 2.6 % of the start, and 5 % was asked (stopped
    # as NotLearning at step 99 before the floor was known, as stop 65's hunt found a distilled student).
    check, finding = _student_run(0.12)
    assert finding is None and check.learned
    assert check.last_window_loss < check.term.levels[0].level() and 0.67 < check.term.levels[0].floor() < 0.68
    # A student that cannot see the teacher's inputs does not fall, floor or no floor.
    check, finding = _student_run(0.12, blind=True)
    assert finding is not None and finding.rule == "NotLearning" and not check.learned
    assert "5% of the start's height above the loss's floor 0.67" in finding.message
    # One that starts badly scaled and falls only to the targets' prior: below its start, never below the level.
    check, finding = _student_run(0.3, blind=True, bias=3.0)
    assert finding is not None and finding.rule == "NotLearning" and not check.learned
    assert "its height above the targets' own entropy 0.59" in finding.message


def test_soft_targets_about_as_uncertain_as_their_prior_leave_the_run_unjudged():
    # The teacher's probabilities all within a hair of 0.5: no student's loss can be told from the prior's.
    check, finding = _student_run(0.001, blind=True, bias=3.0)
    assert finding is None and not check.learned and "not judged" in check.unjudged


def test_a_label_smoothed_cross_entropys_own_cross_entropy_is_its_known_term():
    # torch weighs the two terms of a label-smoothed cross-entropy by numbers (MulBackward1), not by tensors.
    scores, labels = torch.randn(8, 4, requires_grad=True), torch.randint(0, 4, (8,))
    ((node, factor),), alone = known_term([functional.cross_entropy(scores, labels, label_smoothing=0.1)])
    assert node.name() == "NllLossBackward0" and not alone and math.isclose(float(factor), 0.9, rel_tol=1e-12)


def test_a_label_smoothed_classifier_that_learned_only_its_prior_never_learned():
    # Stop 66's hunt: its smoothed loss fell from 1.9 to 1.02 while it learned its shuffled labels' prior alone
    # (1.06 the prior's), called learned.
    check, finding = _classifier_run(rare=0.25, smoothing=0.1, shuffled=True)
    assert finding is not None and finding.rule == "NotLearning" and not check.learned
    assert "its cross-entropy term ended at" in finding.message
    check, finding = _classifier_run(rare=0.25, smoothing=0.1)
    assert finding is None and check.learned


def test_several_cross_entropies_are_one_term_weighted_as_the_loss_weighs_them():
    # A network's main head beside an auxiliary one weighted 0.4 (deep supervision), over labels of two priors.
    main_labels, aux_labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), torch.tensor([0, 0, 0, 0, 0, 0, 1, 2])
    seen: list[torch.Tensor] = []

    def supervised(model: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        main, aux = functional.cross_entropy(model(x), main_labels), functional.cross_entropy(model(-x), aux_labels)
        seen.append(torch.stack([main, aux]).detach())
        return main + 0.4 * aux

    chance, term = _fed(supervised, steps=30)
    assert chance.off and term.names == ("NllLossBackward0", "NllLossBackward0") and term.alone
    (passes, median, error, level), *each = term.tails()
    main_level, aux_level = (level.level() for level in term.levels)
    assert math.isclose(main_level, -sum(p * math.log(p) for p in (3 / 8, 3 / 8, 2 / 8)), rel_tol=1e-9)
    assert math.isclose(aux_level, -sum(p * math.log(p) for p in (6 / 8, 1 / 8, 1 / 8)), rel_tol=1e-9)
    assert math.isclose(level, (main_level + 0.4 * aux_level) / 1.4, rel_tol=1e-9)
    weighted = (torch.stack(seen).double() @ torch.tensor([1.0, 0.4], dtype=torch.float64)) / 1.4
    assert passes == 30 and math.isclose(median, float(weighted.median()), rel_tol=1e-6) and error > 0
    # Then each alone, over the passes that weigh it.
    alone = torch.stack(seen).double()
    assert [(n, level) for n, _, _, level in each] == [(30, main_level), (30, aux_level)]
    assert [median for _, median, _, _ in each] == pytest.approx([float(alone[:, 0].median()),
                                                                  float(alone[:, 1].median())], rel=1e-6)
    # With a penalty beside them they are still read together, and the sum is no longer theirs alone.
    scores = torch.randn(8, 3, requires_grad=True)
    terms, alone = known_term([functional.cross_entropy(scores, main_labels) + functional.cross_entropy(
        -scores, aux_labels) + (scores ** 2).mean()])
    assert len(terms) == 2 and not alone


@pytest.mark.parametrize("objective", ["two binary", "mixed kinds", "two squared errors"])
def test_several_losses_of_known_level_are_read_together_only_where_all_are_multi_class_cross_entropies(objective):
    scores, labels = torch.randn(8, 3, requires_grad=True), torch.randint(0, 3, (8,))
    real, fake = torch.ones(8, 3), torch.zeros(8, 3)
    loss = {"two binary": functional.binary_cross_entropy_with_logits(scores, real)
            + functional.binary_cross_entropy_with_logits(-scores, fake),
            "mixed kinds": functional.cross_entropy(scores, labels) + functional.binary_cross_entropy_with_logits(
                scores, real),
            "two squared errors": functional.mse_loss(scores, real) + functional.mse_loss(-scores, fake)}[objective]
    assert known_term([loss]) is None


def test_a_discriminators_two_class_cross_entropies_on_all_real_and_all_fake_labels_are_not_judged():
    # Each term's labels are all of one class: its prior's entropy is 0, which no loss gets below.
    _, term = _fed(lambda model, x: functional.cross_entropy(model(x)[:, :2], torch.ones(8, dtype=torch.long))
                   + functional.cross_entropy(model(-x)[:, :2], torch.zeros(8, dtype=torch.long)), steps=30)
    assert not term.off and term.levels[0].level() == 0 and term.tails() == []


def _contrastive_run(paired: bool, steps: int = 200) -> tuple[LearningCheck, object]:
    """A two-view contrastive encoder trained by a symmetric InfoNCE (the cross-entropy of a batch's score matrix
    and of its transpose, halved; CLIP's), its views of one sample where ``paired``, of two unrelated ones where
    not (no encoder tells a positive from the batch's others), as a check under the launcher reads it (stop 78's
    verdict hunt: the unpaired run ended at ln 128 and was called learned by its fall from a start above it)."""
    torch.manual_seed(0)
    signal = torch.randn(1400, 16)
    encoder = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
    scale = nn.Parameter(torch.tensor(math.log(10.0)))
    optimizer = torch.optim.Adam([*encoder.parameters(), scale], lr=1e-3)

    def view(rows: torch.Tensor) -> torch.Tensor:
        return torch.cat([signal[rows] + 0.3 * torch.randn(len(rows), 16), 2.0 * torch.randn(len(rows), 48)], 1)

    check = LearningCheck.configured([])
    for step in range(steps):
        rows = torch.randint(0, 1400, (128,))
        other = rows if paired else torch.randint(0, 1400, (128,))
        first, second = functional.normalize(encoder(view(rows)), dim=1), functional.normalize(
            encoder(view(other)), dim=1)
        scores, labels = first @ second.t() * scale.exp(), torch.arange(128)
        loss = (functional.cross_entropy(scores, labels) + functional.cross_entropy(scores.t(), labels)) / 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert check.observe(step, float(loss.detach()), None, 1e-3) is None
    return check, check.at_end(steps - 1)


def test_a_contrastive_loss_that_ends_at_its_batchs_chance_level_never_learned():
    check, finding = _contrastive_run(paired=False)
    assert finding is not None and finding.rule == "NotLearning" and not check.learned
    assert "its 2 cross-entropy terms, weighted as the loss weighs them, ended at 4.8" in finding.message
    assert f"not below the loss {math.log(128):.4g} of a prediction that ignores the inputs" in finding.message
    check, finding = _contrastive_run(paired=True)
    assert finding is None and check.learned


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_mixup_classifiers_two_cross_entropies_are_judged_by_the_weights_each_batch_draws(shuffled):
    # Mixup: each batch's inputs mixed with a permutation of them by a weight drawn from Beta(0.4, 0.4), the loss the
    # two labels' cross-entropies weighted by it and by one less it: the level of each pass is its own mixture of the
    # two terms' levels (equal here: one prior). On labels shuffled apart from the inputs, 70 % of one class, its loss
    # falls from ln 4 to about their prior's entropy, a fall that alone read as learning.
    torch.manual_seed(0)
    y = torch.where(torch.rand(3000) < 0.7, 0, torch.randint(1, 4, (3000,)))
    x = torch.randn(3000, 20) + 2.0 * functional.one_hot(y, 20).float()
    labels = y[torch.randperm(3000)] if shuffled else y
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    beta = torch.distributions.Beta(0.4, 0.4)
    check = LearningCheck.configured([])
    for step in range(300):
        rows, weight = torch.randint(0, 3000, (64,)), float(beta.sample())
        mixed = torch.randperm(64)
        scores = model(weight * x[rows] + (1 - weight) * x[rows][mixed])
        loss = (weight * functional.cross_entropy(scores, labels[rows])
                + (1 - weight) * functional.cross_entropy(scores, labels[rows][mixed]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert check.observe(step, float(loss.detach()), None, 1e-2) is None
    finding = check.at_end(299)
    assert check.term.names == ("NllLossBackward0", "NllLossBackward0") and check.term.alone
    assert (finding is not None and finding.rule == "NotLearning") == shuffled and check.learned != shuffled


def test_a_network_with_one_head_that_learned_beside_one_whose_task_is_hopeless_learned():
    # A shared trunk, a ten-class head on labels drawn apart from the inputs (at chance, ln 10) and a two-class head
    # whose labels its features tell apart but for 30 % flipped (no prediction scores below 0.61, 12 % below ln 2),
    # the first started badly scaled (its loss falls from 4.7 to its labels' prior, and the sum by 45 %): at the end
    # the two heads' losses together are 2 % below their levels, the second's alone 6 %. The run learned (stop 79's
    # hunt: a masked language model's tokens learned beside a sentence task at chance, called NotLearning).
    torch.manual_seed(0)
    x = torch.randn(3000, 10)
    hopeless = torch.randint(0, 10, (3000,))
    noisy = ((x[:, 0] > 0) ^ (torch.rand(3000) < 0.3)).long()
    trunk, first, second = nn.Sequential(nn.Linear(10, 32), nn.ReLU()), nn.Linear(32, 10), nn.Linear(32, 2)
    nn.init.uniform_(first.bias, -4.0, 4.0)  # a badly scaled start: its loss falls to the labels' prior
    optimizer = torch.optim.Adam([*trunk.parameters(), *first.parameters(), *second.parameters()], lr=1e-2)
    check = LearningCheck.configured([])
    for step in range(300):
        rows = torch.randint(0, 3000, (64,))
        features = trunk(x[rows])
        loss = functional.cross_entropy(first(features), hopeless[rows]) + functional.cross_entropy(
            second(features), noisy[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert check.observe(step, float(loss.detach()), None, 1e-2) is None
    (_, together, _, level), (_, _, _, _), (_, learner, _, learner_level) = check.term.tails()
    assert level - together < 0.05 * level and learner < 0.95 * learner_level
    assert check.at_end(299) is None and check.learned


@pytest.mark.parametrize(("second", "alone"), [("the same", False), ("permuted", False), ("another task's", True),
                                               ("more of them", True)])
def test_cross_entropies_of_one_tasks_labels_are_judged_together_alone(second, alone):
    # A batch's augmentations, a contrastive loss's transpose, mixup's permuted batch: one task seen several ways,
    # whose terms judged apart would each be one more chance to read a fall as learning. Other tasks' labels (another
    # head's, a masked language model's tokens beside a sentence label): each term is judged alone too.
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    other = {"the same": labels, "permuted": labels.flip(0), "another task's": torch.tensor([2, 2, 2, 0, 1, 0, 1, 2]),
             "more of them": torch.cat([labels, labels])}[second]
    _, term = _fed(lambda model, x: functional.cross_entropy(model(x), labels) + functional.cross_entropy(
        model(torch.cat([x, x])[:len(other)]), other), steps=30)
    assert len(term.tails()) == (3 if alone else 1)


class _Tagged(torch.Tensor):
    """A tensor subclass that keeps its class through every operation, as MONAI's ``MetaTensor`` does: autograd
    records each result as an alias (``AliasBackward0``) of the operation's own."""


def test_a_tensor_subclasss_losses_are_read_through_the_aliases_autograd_records_for_it():
    # From stop 83's hunt: MONAI's DiceCE loss on its MetaTensors, a segmenter at a thousand times its rate that
    # predicted background everywhere, was called learned: its cross-entropy term, under an alias, was never found.
    labels = torch.tensor([0, 1, 2, 1, 0, 2, 1, 0])

    def tagged(model: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(model(x.as_subclass(_Tagged)), labels)

    chance, _ = _fed(tagged)
    prior = torch.tensor([3, 3, 2], dtype=torch.float64) / 8  # the labels' counts
    assert chance.kind == "cross_entropy" and math.isclose(chance.level(), float(-(prior * prior.log()).sum()),
                                                           rel_tol=1e-9)
    model = nn.Linear(4, 3)
    scores = model(torch.randn(8, 4).as_subclass(_Tagged))
    loss = functional.cross_entropy(scores, labels) + scores.abs().mean()
    assert loss.grad_fn.name() == "AliasBackward0"
    ((node, _),), alone = known_term([loss])
    assert node.name() == "NllLossBackward0" and not alone
