"""Loss and gradient-norm curves per attempt, and gradient norms per layer: drawn the same way for
the report (from the jobs' logs and findings) and the notebook (from the tensor store).

Log scale; a value that is not finite has no place on it, so where an attempt blew up is marked
with an x on the last finite value before that step. It draws; it reads nothing itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# (step, value) pairs of one quantity of one attempt.
Series = Sequence[tuple[int, float]]
# Where an attempt blew up: (step, label), e.g. (3, "ExplodingTensor").
Mark = tuple[int, str]


def _pyplot() -> Any:
    import matplotlib.pyplot as plt  # the caller picks the backend (the report: Agg; a notebook: inline)

    return plt


def draw_attempts(axes: Any, series: Mapping[int, Series], marks: Mapping[int, Mark], label: str) -> None:
    """One line per attempt on ``axes``; each attempt's mark as an x at the last finite value before it."""
    for number, points in sorted(series.items()):
        finite = [(s, v) for s, v in points if math.isfinite(v) and v > 0]
        mark = marks.get(number)
        if not finite and mark is None:
            continue
        (line,) = axes.plot([s for s, _ in finite], [v for _, v in finite], marker=".", label=f"attempt {number}")
        if mark is not None:
            step, text = mark
            before = [v for s, v in finite if s <= step] or [finite[-1][1] if finite else 1.0]
            axes.scatter([step], [before[-1]], marker="x", s=120, color=line.get_color(), zorder=5)
            axes.annotate(f"{text} @ {step}", (step, before[-1]), textcoords="offset points", xytext=(5, 8), fontsize=8)
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel(label)
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=8)


def plot_quantity(series: Mapping[int, Series], marks: Mapping[int, Mark], label: str, title: str = "") -> Any:
    """One quantity for every attempt in a figure of its own (the report's plots/<quantity>.png)."""
    figure, axes = _pyplot().subplots(figsize=(8, 4.5))
    draw_attempts(axes, series, marks, label)
    if title:
        axes.set_title(title)
    figure.tight_layout()
    return figure


def plot_loss_and_grad(
    loss: Mapping[int, Series], grad_norm: Mapping[int, Series], marks: Mapping[int, Mark], title: str = ""
) -> Any:
    """Training loss and gradient norm side by side, a line per attempt (the notebook's figure)."""
    figure, (loss_axes, grad_axes) = _pyplot().subplots(1, 2, figsize=(12, 4.2))
    draw_attempts(loss_axes, loss, marks, "training loss")
    draw_attempts(grad_axes, grad_norm, marks, "gradient norm (all layers)")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_layer_norms(norms_by_step: Mapping[int, Mapping[str, float]], nonfinite: Any, title: str = "") -> Any:
    """Gradient norm of every layer (network order) at each saved step; non-finite layers marked."""
    layers = list(next(iter(norms_by_step.values()), {}))
    figure, axes = _pyplot().subplots(figsize=(12, 4.2))
    for step, norms in sorted(norms_by_step.items()):
        xs = [i for i, layer in enumerate(layers) if math.isfinite(norms.get(layer, float("nan")))]
        if not xs:
            continue
        axes.plot(xs, [norms[layers[i]] for i in xs], marker=".", label=f"step {step}")
    if nonfinite is not None:
        bad = [layers.index(layer) for layer in nonfinite.layers if layer in layers]
        top = max((v for n in norms_by_step.values() for v in n.values() if math.isfinite(v)), default=1.0)
        axes.scatter(bad, [top] * len(bad), marker="x", color="red", label=f"non-finite at step {nonfinite.step}")
    axes.set_yscale("log")
    axes.set_xticks(range(len(layers)))
    axes.set_xticklabels(layers, rotation=90, fontsize=6)
    axes.set_ylabel("gradient norm")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    if title:
        axes.set_title(title)
    figure.tight_layout()
    return figure
