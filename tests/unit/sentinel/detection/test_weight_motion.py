"""Whether the network's weights move: a loss flat over moving weights is left to its end, over still ones stopped.

Stop 66's verdict hunt: an LSTM that must carry a token across a dozen steps sat at its chance level for 110
steps at Adam's 3e-3, then fell to 0.002 (test accuracy 1.000), and was stopped as NotLearning at step 99.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn
from torch.nn import functional

from stabilizer_sentinel.detection import weight_motion
from stabilizer_sentinel.detection.learning_check import LearningCheck
from stabilizer_sentinel.detection.weight_motion import WeightMotion


def test_the_move_is_the_sampled_weights_change_over_their_size():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    model[1].bias.requires_grad_(False)  # frozen: not read
    motion = WeightMotion(model)
    assert motion.moved() is None  # no mark yet
    motion.mark()
    assert motion.moved() == 0.0
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad]).double()
    with torch.no_grad():
        model[0].weight += 0.5
        model[1].bias += 100.0  # frozen: no part of the move
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad]).double()
    assert math.isclose(motion.moved(), float((after - before).norm() / before.norm()), rel_tol=1e-12)
    del model
    assert motion.moved() is None  # the network is gone



def test_a_complex_weight_moves_by_its_real_and_imaginary_parts_and_warns_of_nothing():
    # Stop 77's harm hunt: cast to double, a complex weight lost its imaginary part with a UserWarning, which a
    # script turning warnings into errors raised inside the watcher (it stood aside, 4 steps watched of 50).
    model = nn.Module()  # complex parameters made as the helper's script made them (``Module.to`` warns)
    model.weight = nn.Parameter(torch.randn(2, 3, dtype=torch.cfloat))
    model.bias = nn.Parameter(torch.randn(2, dtype=torch.cfloat))
    motion = WeightMotion(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        motion.mark()
        before = torch.view_as_real(model.weight.detach()).reshape(-1).double()
        with torch.no_grad():
            model.weight.imag += 1.0  # the imaginary part alone moves
        bias = torch.view_as_real(model.bias.detach()).reshape(-1).double()
        after = torch.view_as_real(model.weight.detach()).reshape(-1).double()
        moved = motion.moved()
    expected = float((after - before).norm() / torch.cat([before, bias]).norm())
    assert moved is not None and math.isclose(moved, expected, rel_tol=1e-6)

def test_a_large_parameter_is_read_at_most_sample_values_spread_over_it():
    model = nn.Linear(1000, 10)
    motion = WeightMotion(model)
    motion.mark()
    assert [values.numel() for _, _, values in motion._marked] == [weight_motion.SAMPLE, 10]


def test_the_weights_measured_are_those_that_trained_at_the_mark():
    # A trunk frozen at the mark and unfrozen later (stop 66's second hunt: stopped four steps after its unfreeze,
    # when the parameters read changed and the move was unknown) is no part of the move; the head's move stands.
    model = nn.Sequential(nn.Linear(50, 50), nn.Linear(50, 1))
    model[0].requires_grad_(False)
    motion = WeightMotion(model)
    motion.mark()
    head = torch.cat([model[1].weight.detach().reshape(-1), model[1].bias.detach()]).double()
    with torch.no_grad():
        model[1].weight += 0.1
    model[0].requires_grad_(True)
    with torch.no_grad():
        model[0].weight += 1.0  # unfrozen and moved: not measured
    moved = torch.cat([model[1].weight.detach().reshape(-1), model[1].bias.detach()]).double()
    assert math.isclose(motion.moved(), float((moved - head).norm() / head.norm()), rel_tol=1e-12)


def _flat_run(rate: float, steps: int = 300) -> tuple[LearningCheck, object, int]:
    """A classifier whose labels are drawn apart from its inputs, afresh each batch (its loss stays at its start, 10
    balanced classes from a uniform start: nothing to learn or memorise), at Adam's ``rate``, its weights read as
    the launcher's guard reads them: the first finding (or the end's) and its step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
    nn.init.zeros_(model[2].weight)  # a uniform start: at its chance level from its first step
    optimizer = torch.optim.Adam(model.parameters(), lr=rate)
    check = LearningCheck.configured([])
    check.motion = WeightMotion(model)
    for step in range(steps):
        loss = functional.cross_entropy(model(torch.randn(64, 20)), torch.randint(0, 10, (64,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        finding = check.observe(step, float(loss.detach()), None, rate)
        if finding is not None:
            return check, finding, step
    return check, check.at_end(steps - 1), steps - 1


def test_a_flat_loss_over_moving_weights_is_left_to_its_end_and_a_stalled_one_is_stopped():
    check, finding, step = _flat_run(3e-3)  # its weights move: a search, judged at its end
    assert finding is not None and finding.rule == "NotLearning" and step == 299 and not check.learned
    assert "it was left to run past its patience, its weights having moved" in finding.message
    check, finding, step = _flat_run(1e-7)  # a rate far too low: its weights stand still, stopped on its way
    assert finding is not None and finding.rule == "NotLearning" and step < 200 and "left to run" not in finding.message
    # Unread (no network: a loss the script reports itself), stopped on its way as before.
    check = LearningCheck.configured([])
    for step in range(300):
        finding = check.observe(step, math.log(10) + 0.01 * math.sin(step), None, 1e-3)
        if finding is not None:
            break
    assert finding is not None and finding.rule == "NotLearning" and step < 200
