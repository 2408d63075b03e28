"""The notebook runs top to bottom in local mode and draws its plots; the committed copy has no outputs.

The kernel is this interpreter (a kernelspec written for the test into a temporary JUPYTER_PATH,
so no kernel needs installing and a user's own ``python3`` kernelspec cannot shadow it). Runs and
data go to a temporary directory through ``STABILIZER_RUN_DIR``. The executed copy is kept next to
them for reading when something fails.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "stabilizer.ipynb"
KERNEL = "stabilizer-test-python"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_notebook() -> Any:
    import nbformat
    return nbformat.read(NOTEBOOK, as_version=4)


def test_the_committed_notebook_has_no_outputs():
    notebook = read_notebook()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, "the notebook has no code cells"
    dirty = [i for i, cell in enumerate(code) if cell.outputs or cell.execution_count is not None]
    assert not dirty, f"code cells {dirty} carry outputs or execution counts: strip them before committing"


def test_the_notebook_is_valid():
    import nbformat
    nbformat.validate(read_notebook())


def images(cell: Any) -> list[bytes]:
    return [
        base64.b64decode(output["data"]["image/png"])
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]


def text_of(cell: Any) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output["text"])
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def cell_with(notebook: Any, source: str) -> Any:
    found = [cell for cell in notebook.cells if cell.cell_type == "code" and source in cell.source]
    assert len(found) == 1, f"expected one code cell containing {source!r}, found {len(found)}"
    return found[0]


@pytest.fixture
def kernel_for_this_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "stabilizer tests",
                "language": "python",
            }
        )
    )
    # JUPYTER_PATH comes first in Jupyter's data path, before the user's and the environment's.
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


@pytest.mark.slow
@pytest.mark.long
def test_the_notebook_runs_top_to_bottom_in_local_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_for_this_interpreter: str
):
    import ipykernel  # noqa: F401  (the kernel the notebook runs in)
    import nbclient
    import nbformat
    monkeypatch.setenv("STABILIZER_RUN_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("STABILIZER_STACK", raising=False)
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = read_notebook()

    started = time.monotonic()
    client = nbclient.NotebookClient(
        notebook,
        kernel_name=kernel_for_this_interpreter,
        timeout=300,  # per cell; the whole notebook is meant to take well under 5 minutes
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    try:
        client.execute()
    finally:
        nbformat.write(notebook, tmp_path / "executed.ipynb")
        print(f"notebook ran in {time.monotonic() - started:.0f} s; executed copy: {tmp_path / 'executed.ipynb'}")

    # Every plot cell drew a non-empty PNG: the curves per attempt, the system usage the jobs'
    # profiler sampled, the layers of the exploded attempt, the policies side by side.
    for source in ("plots.plot_loss_and_grad(", "trial.system_samples()", "plots.plot_layer_norms(", "axes_.bar("):
        pictures = images(cell_with(notebook, source))
        assert pictures, f"the cell with {source} drew no image"
        for png in pictures:
            assert png.startswith(PNG_MAGIC) and len(png) > 5_000, f"the cell with {source} drew an empty image"

    # What a reader is told along the way.
    watched = text_of(cell_with(notebook, "view = executions.follow("))
    assert "SUCCEEDED" in watched, watched
    attempts = text_of(cell_with(notebook, 'title="attempts"'))
    assert "ExplodingTensor at step" in attempts, attempts
    usage = text_of(cell_with(notebook, "trial.system_samples()"))
    # The jobs' profiler sampled (an attempt stopped within its first half second may have none).
    assert "samples, CPU median" in usage, usage
    notes = text_of(cell_with(notebook, "client.notifications(arn)"))
    assert "launched" in notes and "relaunching" in notes, notes
    layers = text_of(cell_with(notebook, "tensors.first_nonfinite(trial)"))
    assert "first non-finite layer:" in layers and "first saved step with a non-finite gradient" in layers, layers
    comparison = text_of(cell_with(notebook, 'title="policies on the same problem"'))
    # The headline: the default policy recovers in 2 jobs where the original ladder takes 7.
    assert re.search(r"^default\s+succeeded\s+2\s", comparison, re.MULTILINE), comparison
    assert re.search(r"^original\s+succeeded\s+7\s", comparison, re.MULTILINE), comparison
    # A SageMaker Python SDK estimator handed to the client ran as a job of its own, on the image
    # the SDK names for it, and recovered through its declared knobs.
    sdk = text_of(cell_with(notebook, "job=estimator"))
    assert "pytorch-training:2.8.0-cpu-py312" in sdk and "SUCCEEDED" in sdk, sdk
    assert (tmp_path / "runs" / "notebook").is_dir(), "the local runs did not go where STABILIZER_RUN_DIR says"
