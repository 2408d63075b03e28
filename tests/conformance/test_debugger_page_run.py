"""The Debugger page's estimator (docs/debugger.md, "Before and after"), as written there, run through
``client.start(job=estimator)`` locally on an ordinary script of a user's own (tests/conformance/mlp:
an ``nn.Sequential`` MLP, no module named ``fc``, an ``nn.CrossEntropyLoss`` module).

Its collection's regex ``.*fc_output|.*CrossEntropyLoss`` matches the loss module's tensors only, as
with Debugger: the job completes and the collection holds ``CrossEntropyLoss_input_0``, ``_input_1``
and ``_output_0`` from step 0 on, read back with the Trial API.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow
os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
sagemaker = pytest.importorskip("sagemaker")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "mlp" / "train.py"
PAGE = ROOT / "docs" / "debugger.md"
SECTION = "## Before and after"


def page_estimator_code() -> str:
    text = PAGE.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)[0]


def write_channels(data: Path) -> dict[str, str]:
    """Four classes of 8x8 images (one bright quadrant each, with noise), flattened: 512 to train on."""
    rng = np.random.default_rng(0)
    out = {}
    for name, count in (("train", 512), ("test", 128)):
        y = np.arange(count) % 4
        x = rng.normal(0, 0.3, (count, 8, 8)).astype("float32")
        for cls in range(4):
            row, col = divmod(cls, 2)
            x[y == cls, row * 4:row * 4 + 4, col * 4:col * 4 + 4] += 1.0
        folder = data / name
        folder.mkdir(parents=True)
        np.save(folder / "x.npy", x.reshape(count, 64))
        np.save(folder / "y.npy", y.astype("int64"))
        out[name] = f"file://{folder}"
    return out


def run_locally(tmp_path: Path, estimator) -> tuple[dict, str]:
    """The estimator's job through local mode with no relaunch: the final state and attempt 1's tensor store."""
    from stabilizer.client.local_client import LocalClient

    channels = write_channels(tmp_path / "data")
    with LocalClient.open(tmp_path / "runs", data_dir=tmp_path / "data") as client:
        arn = client.start({"wait_seconds": 1, "limits": {"max_num_retraining": 0}}, job=estimator, inputs=channels)
        view = client.wait(arn, timeout=300)
        state = view.state or {}
        assert view.status == "SUCCEEDED", (state.get("reason"), view.cause)
        return state, client.tensor_store(arn, 1)


def test_the_debugger_page_collection_saves_the_loss_tensors_of_a_sequential_mlp(tmp_path, monkeypatch):
    from sagemaker.local import LocalSession
    from sagemaker.pytorch import PyTorch

    from stabilizer_sentinel.smdebug_compat import create_trial

    (tmp_path / "src").mkdir()
    shutil.copy(SCRIPT, tmp_path / "src" / "train.py")
    monkeypatch.chdir(tmp_path)
    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    # The page's code as written; its estimator gets a local session and is not fitted on AWS.
    built: list = []
    init = PyTorch.__init__
    monkeypatch.setattr(PyTorch, "__init__", lambda self, *a, **kw: (
        built.append(self), init(self, *a, **{**kw, "sagemaker_session": LocalSession()}))[1])
    monkeypatch.setattr(PyTorch, "fit", lambda self, inputs=None, **_: None)
    namespace: dict = {"role": "arn:aws:iam::123456789012:role/sagemaker-execution"}
    exec(compile(page_estimator_code(), str(PAGE), "exec"), namespace)
    estimator = namespace["estimator"]
    assert built == [estimator]

    _, store = run_locally(tmp_path, estimator)
    trial = create_trial(store)
    loss_tensors = ["CrossEntropyLoss_input_0", "CrossEntropyLoss_input_1", "CrossEntropyLoss_output_0"]
    assert sorted(trial.tensor_names(collection="custom_collection")) == loss_tensors
    # 10 epochs of 32 steps, saved every 100 (train.save_interval), step 0 included.
    for name in loss_tensors:
        assert trial.tensor(name).steps(mode="TRAIN") == [0, 100, 200, 300], name
    labels = trial.tensor("CrossEntropyLoss_input_1").value(0, mode="TRAIN")
    assert labels.shape == (16,) and set(labels.tolist()) <= {0, 1, 2, 3}


@pytest.mark.long  # the page's own estimator runs in make test
def test_a_debugger_estimator_on_a_functional_loss_is_verified_and_its_whole_model_saved(tmp_path, monkeypatch):
    """Debugger's rules and hook configuration, a script whose loss is ``F.cross_entropy`` (no loss
    module) and whose log says ``xent``: the loss is read from its backward passes, so the run is
    judged (``succeeded``, not ``unverified``), and ``torch.save(model)`` works under the watcher."""
    from sagemaker.debugger import CollectionConfig, DebuggerHookConfig, Rule, rule_configs
    from sagemaker.local import LocalSession
    from sagemaker.pytorch import PyTorch

    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    estimator = PyTorch(
        entry_point="train.py", source_dir=str(SCRIPT.parents[1] / "functional"),
        role="arn:aws:iam::123456789012:role/sagemaker-execution", framework_version="2.8.0", py_version="py312",
        instance_type="ml.m5.xlarge", instance_count=1, hyperparameters={"epochs": 3, "lr": 0.05},
        rules=[Rule.sagemaker(rule_configs.exploding_tensor()), Rule.sagemaker(rule_configs.loss_not_decreasing())],
        debugger_hook_config=DebuggerHookConfig(collection_configs=[CollectionConfig(name="gradients")]),
        sagemaker_session=LocalSession(),
    )
    state, _ = run_locally(tmp_path, estimator)
    assert state["outcome"] == "succeeded", state.get("reason")
    (attempt,) = state["attempts"]
    assert attempt["status"] == "Completed" and attempt["watched"]["steps_observed"] == 3 * 32, attempt
