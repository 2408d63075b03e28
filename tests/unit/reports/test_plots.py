"""The notebook's figures, drawn by the same code as the report's: a line per attempt on a log
axis, the explosion marked where the last finite value was."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

from stabilizer.reports.plots import plot_layer_norms, plot_loss_and_grad
from stabilizer.reports.tensors import NonFinite


def test_loss_and_gradient_side_by_side_with_the_explosion_marked():
    nan = float("nan")
    loss = {1: [(0, 2.8), (1, 85.0), (2, 4e13), (3, nan)], 2: [(0, 2.3), (4, 1.1), (8, 0.7)]}
    grad = {1: [(0, 35.0), (1, 826.0), (3, nan)], 2: [(0, 3.0), (8, 1.5)]}
    figure = plot_loss_and_grad(loss, grad, marks={1: (3, "ExplodingTensor")}, title="run")
    loss_axes, grad_axes = figure.axes
    assert [line.get_label() for line in loss_axes.lines] == ["attempt 1", "attempt 2"]
    assert list(loss_axes.lines[0].get_ydata()) == [2.8, 85.0, 4e13]  # the NaN has no place on a log axis
    assert loss_axes.get_yscale() == grad_axes.get_yscale() == "log"
    (mark,) = loss_axes.collections
    assert [tuple(p) for p in mark.get_offsets()] == [(3.0, 4e13)]  # at the last finite value before step 3
    assert loss_axes.texts[0].get_text() == "ExplodingTensor @ 3"


def test_layer_norms_mark_the_layers_that_went_non_finite():
    norms = {0: {"stem.weight": 1.0, "fc.weight": 0.5}, 3: {"stem.weight": math.inf, "fc.weight": 40.0}}
    figure = plot_layer_norms(norms, NonFinite(step=3, layers=["stem.weight"], total_layers=2))
    (axes,) = figure.axes
    assert [t.get_text() for t in axes.get_xticklabels()] == ["stem.weight", "fc.weight"]
    assert [tuple(p) for p in axes.collections[0].get_offsets()] == [(0.0, 40.0)]
