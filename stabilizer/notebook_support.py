"""What the notebook needs beyond the client: a target, data channels, tables, tensors and plots.

``notebooks/stabilizer.ipynb`` drives the workflow on this machine (the local engine) or on a
deployed stack (``AwsClient``). Everything it asks about an execution goes through the client in
``stabilizer.client``, whose two sides answer the same questions; this module turns the answers
into what a person reads in a notebook (an attempts table, a refreshing status, the notifications,
loss and gradient-norm curves read back from the tensor store with the rule engine's Trial API,
the layers that went non-finite) and prepares the data channels each target trains on.

It reads executions and tensor stores and writes data channels; it never decides anything about a
run and never calls Step Functions or SageMaker itself.
"""

from __future__ import annotations

import atexit
import html
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabilizer.report import RECIPE_KEYS

CHANNELS = ("train", "test")
CHANNEL_FILES = ("x.npy", "y.npy")


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]


def use_model_sources(root: Path | None = None) -> Path:
    """Put ``model/`` on ``sys.path``: the rule engine and data module import as they do in the job."""
    model = (root or project_root()) / "model"
    if str(model) not in sys.path:
        sys.path.insert(0, str(model))
    return model


# ---------------------------------------------------------------------------- target and data
def prepare_digits(directory: Path) -> Path:
    """The offline digits channels (``model/data.py``), written once under ``directory``."""
    directory = Path(directory)
    if not all((directory / c / f).is_file() for c in CHANNELS for f in CHANNEL_FILES):
        use_model_sources()
        import data  # model/data.py: the single definition of the channels

        data.prepare_digits(directory)
    return directory


def prepare_cifar10(directory: Path, tarball: Path | None = None) -> Path:
    """CIFAR-10 channels under ``directory`` (downloads the official tarball unless one is given)."""
    directory = Path(directory)
    if not all((directory / c / f).is_file() for c in CHANNELS for f in CHANNEL_FILES):
        use_model_sources()
        import data

        data.prepare_cifar10(directory, tarball=tarball)
    return directory


def upload_channels(client: Any, directory: Path, prefix: str = "data") -> dict[str, str]:
    """Upload ``train/`` and ``test/`` to ``s3://<bucket>/<prefix>/<channel>/`` (the stack's default channels).

    A file already there with the same size is not sent again. Returns channel -> S3 URI.
    """
    directory = Path(directory)
    uris = {}
    for channel in CHANNELS:
        for name in CHANNEL_FILES:
            path = directory / channel / name
            if not path.is_file():
                raise FileNotFoundError(f"{channel} channel: expected {name} in {directory / channel}")
            key = f"{prefix}/{channel}/{name}"
            if _object_size(client.s3, client.bucket, key) != path.stat().st_size:
                client.s3.upload_file(str(path), client.bucket, key)
        uris[channel] = f"s3://{client.bucket}/{prefix}/{channel}/"
    return uris


def _object_size(s3: Any, bucket: str, key: str) -> int | None:
    from botocore.exceptions import ClientError

    try:
        return int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def open_local(run_dir: Path, data_dir: Path, **settings: Any) -> Any:
    """Start the local engine (closed when the kernel exits, or with ``close_local``) and return its client."""
    from stabilizer.client import LocalClient
    from stabilizer.local.engine import LocalEngine, LocalSettings, Project

    engine = LocalEngine(
        Path(run_dir), Path(data_dir), project=Project.discover(project_root()), settings=LocalSettings(**settings)
    )
    engine.__enter__()
    atexit.register(engine.close)
    return LocalClient(engine)


def close_local(client: Any) -> None:
    """Stop the local engine behind a ``LocalClient`` (its running jobs get SIGTERM)."""
    engine = getattr(client, "engine", None)
    if engine is not None:
        engine.close()
        atexit.unregister(engine.close)


# ---------------------------------------------------------------------------- attempts and decisions
def recipe(run_spec: dict[str, Any] | None) -> str:
    """A run_spec's recipe in a few words: ``warm-up LR 0.1, LR 0.1, no BN``."""
    spec = {k: (run_spec or {}).get(k) for k in RECIPE_KEYS}
    parts = []
    if isinstance(spec["warmup_learning_rate"], int | float):
        parts.append(f"warm-up LR {spec['warmup_learning_rate']:g}")
    if isinstance(spec["learning_rate"], int | float):
        parts.append(f"LR {spec['learning_rate']:g}")
    parts.append("BN" if spec["add_batch_norm"] in (1, True) else "no BN")
    if isinstance(spec["grad_clip"], int | float) and spec["grad_clip"]:
        parts.append(f"clip {spec['grad_clip']:g}")
    return ", ".join(parts)


def attempt_rows(view: Any) -> list[dict[str, str]]:
    """One row per attempt of the state payload: recipe, status, finding, decision and its reason."""
    rows = []
    for attempt in view.attempts:
        finding = attempt.get("finding") or {}
        decision = attempt.get("decision") or {}
        rows.append(
            {
                "#": str(attempt.get("number", "")),
                "job": attempt.get("job_name", ""),
                "recipe": recipe(attempt.get("run_spec")),
                "status": attempt.get("status", ""),
                "steps": _text(attempt.get("steps")),
                "seconds": _text(attempt.get("seconds")),
                "finding": (
                    f"{finding.get('rule')} at step {finding.get('step')} ({finding.get('phase') or '?'}), "
                    f"{finding.get('tensor') or '-'} = {finding.get('value')}"
                    if finding
                    else "-"
                ),
                "decision": decision.get("remedy") or decision.get("action") or "-",
                "reason": decision.get("reason") or "-",
            }
        )
    return rows


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def html_table(rows: list[dict[str, str]], columns: Iterable[str] | None = None) -> str:
    if not rows:
        return "<p><em>nothing yet</em></p>"
    columns = list(columns or rows[0])
    cell = "<{tag} style='text-align:left'>{text}</{tag}>"
    head = "".join(cell.format(tag="th", text=html.escape(c)) for c in columns)
    body = "".join(
        "<tr>" + "".join(cell.format(tag="td", text=html.escape(str(r.get(c, "")))) for c in columns) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def text_table(rows: list[dict[str, str]], columns: Iterable[str] | None = None, width: int = 70) -> str:
    if not rows:
        return "(nothing yet)"
    columns = list(columns or rows[0])
    cells = [[str(r.get(c, ""))[:width] for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


class Table:
    """Rows shown as HTML in a notebook and as aligned text elsewhere."""

    def __init__(self, rows: list[dict[str, str]], columns: Iterable[str] | None = None, title: str = "") -> None:
        self.rows = rows
        self.columns = list(columns) if columns else None
        self.title = title

    def _repr_html_(self) -> str:
        title = f"<p><strong>{html.escape(self.title)}</strong></p>" if self.title else ""
        return title + html_table(self.rows, self.columns)

    def __repr__(self) -> str:
        return (self.title + "\n" if self.title else "") + text_table(self.rows, self.columns)


def status_text(view: Any, started: float | None = None) -> str:
    """A few lines on where an execution is: status, each attempt, the reason once it ended."""
    elapsed = f" after {time.monotonic() - started:.0f} s" if started is not None else ""
    lines = [f"{view.name}: {view.status}{elapsed}"]
    for row in attempt_rows(view):
        lines.append(f"  attempt {row['#']} [{row['recipe']}] {row['status']}; finding: {row['finding']}")
        if row["decision"] != "-":
            lines.append(f"    -> {row['decision']}: {row['reason']}")
    state = view.state or {}
    if view.done:
        lines.append(f"outcome: {state.get('outcome') or view.status}; {state.get('reason') or view.cause or ''}")
    return "\n".join(lines)


def watch(
    client: Any,
    execution_arn: str,
    *,
    poll_seconds: float = 1.0,
    timeout: float = 3600,
    show: Callable[[str], None] | None = None,
) -> Any:
    """Refresh one status display until the execution ends (or ``timeout``); returns the last view.

    In a notebook the status is one output updated in place (``display(..., display_id=True)``).
    """
    if show is None:
        show = _display_updater()
    started = time.monotonic()
    while True:
        view = client.describe(execution_arn)
        show(status_text(view, started))
        if view.done or time.monotonic() - started > timeout:
            return view
        time.sleep(poll_seconds)


def _display_updater() -> Callable[[str], None]:
    from IPython.display import display

    handle = None

    class _Text:
        def __init__(self, text: str) -> None:
            self.text = text

        def __repr__(self) -> str:
            return self.text

    def show(text: str) -> None:
        nonlocal handle
        if handle is None:
            handle = display(_Text(text), display_id=True)
        else:
            handle.update(_Text(text))

    return show


def notification_rows(notes: Iterable[Any]) -> list[dict[str, str]]:
    return [
        {
            "seconds": f"{note.received:.1f}",
            "event": note.event_type or note.attributes.get("source", "-"),
            "attempt": note.attributes.get("attempt", "-"),
            "subject": note.subject,
        }
        for note in notes
    ]


# ---------------------------------------------------------------------------- tensors
@dataclass
class Curves:
    """Loss and total gradient norm per saved step of one attempt (NaN where not finite)."""

    loss_steps: list[int]
    loss: list[float]
    grad_steps: list[int]
    grad_norm: list[float]


def curves(trial: Any) -> Curves:
    """``losses/loss`` and the norm over all ``gradients/*`` tensors at each TRAIN step they were saved."""
    import numpy as np

    loss_steps, loss = [], []
    if trial.has_tensor("losses/loss"):
        tensor = trial.tensor("losses/loss")
        for step in tensor.steps(mode="TRAIN"):
            loss_steps.append(step)
            loss.append(float(np.asarray(tensor.value(step, mode="TRAIN")).reshape(-1)[0]))
    names = trial.tensor_names(collection="gradients", mode="TRAIN")
    grad_steps, grad_norm = [], []
    for step in trial.steps(mode="TRAIN"):
        present = trial.tensor_names(collection="gradients", mode="TRAIN", step=step)
        if not present or len(present) < len(names):
            continue  # a step where only some gradients were saved has no total norm
        total = 0.0
        for name in present:
            value = np.asarray(trial.tensor(name).value(step, mode="TRAIN"), dtype=np.float64)
            total += float(np.sum(value * value))
        grad_steps.append(step)
        grad_norm.append(math.sqrt(total) if math.isfinite(total) else float("nan"))
    return Curves(loss_steps, loss, grad_steps, grad_norm)


@dataclass
class NonFinite:
    """The first saved step at which some gradient was not finite, and which ones (network order)."""

    step: int
    layers: list[str]
    total_layers: int


def first_nonfinite(trial: Any, collection: str = "gradients") -> NonFinite | None:
    import numpy as np

    names = trial.tensor_names(collection=collection, mode="TRAIN")
    for step in trial.steps(mode="TRAIN"):
        bad = []
        for name in trial.tensor_names(collection=collection, mode="TRAIN", step=step):
            if not np.all(np.isfinite(trial.tensor(name).value(step, mode="TRAIN"))):
                bad.append(name.split("/", 1)[1])
        if bad:
            return NonFinite(step=step, layers=bad, total_layers=len(names))
    return None


def layer_norms(trial: Any, step: int, collection: str = "gradients", biases: bool = False) -> dict[str, float]:
    """Norm of each tensor of a collection at one step, in network order (NaN/inf kept as such).

    Biases are left out unless asked for: their norms are orders of magnitude below the weights'
    and interleaving them hides the trend across layers.
    """
    import numpy as np

    out = {}
    for name in trial.tensor_names(collection=collection, mode="TRAIN", step=step):
        if not biases and name.endswith("bias"):
            continue
        value = np.asarray(trial.tensor(name).value(step, mode="TRAIN"), dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            out[name.split("/", 1)[1]] = float(np.sqrt(np.sum(value * value)))
    return out


def plot_curves(per_attempt: dict[int, Curves], findings: dict[int, dict[str, Any]], title: str = "") -> Any:
    """Loss and gradient norm per attempt, log scale; a finding's step is marked with an x on its line."""
    import matplotlib.pyplot as plt

    figure, (loss_axes, grad_axes) = plt.subplots(1, 2, figsize=(12, 4.2))
    for number, c in sorted(per_attempt.items()):
        for axes, steps, values in ((loss_axes, c.loss_steps, c.loss), (grad_axes, c.grad_steps, c.grad_norm)):
            finite = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v) and v > 0]
            if not steps:
                continue
            (line,) = axes.plot([s for s, _ in finite], [v for _, v in finite], marker=".", label=f"attempt {number}")
            finding = findings.get(number)
            if finding and finding.get("step") is not None and finite:
                # A non-finite value has no place on a log axis: mark the last finite value before it.
                step = int(finding["step"])
                before = [v for s, v in finite if s <= step] or [finite[-1][1]]
                axes.scatter([step], [before[-1]], marker="x", s=120, color=line.get_color(), zorder=5)
                axes.annotate(
                    f"{finding.get('rule')} @ {step}",
                    (step, before[-1]),
                    textcoords="offset points",
                    xytext=(4, 6),
                    fontsize=8,
                )
    for axes, label in ((loss_axes, "training loss"), (grad_axes, "gradient norm (all layers)")):
        axes.set_yscale("log")
        axes.set_xlabel("step")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_layer_norms(norms_by_step: dict[int, dict[str, float]], nonfinite: NonFinite | None, title: str = "") -> Any:
    """Gradient norm of every layer (network order) at each saved step; non-finite layers marked."""
    import matplotlib.pyplot as plt

    layers = list(next(iter(norms_by_step.values()), {}))
    figure, axes = plt.subplots(figsize=(12, 4.2))
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


# ---------------------------------------------------------------------------- policies side by side
def policy_summary(view: Any) -> dict[str, str]:
    """Attempts, training steps and job seconds an execution consumed, and how it ended."""
    state = view.state or {}
    attempts = view.attempts
    steps = sum(a.get("steps") or 0 for a in attempts)
    seconds = sum(a.get("seconds") or 0 for a in attempts)
    final = attempts[-1].get("run_spec") if attempts else None
    return {
        "policy": str(state.get("policy") or view.input.get("policy") or "default"),
        "outcome": str(state.get("outcome") or view.status),
        "attempts": str(len(attempts)),
        "training steps": str(steps),
        "job seconds": str(seconds),
        "final recipe": recipe(final) if final else "-",
    }


def check_input(execution_input: dict[str, Any]) -> dict[str, Any]:
    """Validate an execution input as the state machine's first step would; InputProblemError names the field."""
    from stabilizer.inputs import validate_execution_input, workflow_state_module

    return validate_execution_input(execution_input, workflow_state_module(project_root() / "lambdas"))
