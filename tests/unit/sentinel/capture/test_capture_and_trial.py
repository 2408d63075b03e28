"""Capture writes the documented store; the Trial API reads it back, also while it is being written."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
import torch

from stabilizer_sentinel import create_trial
from stabilizer_sentinel.capture.capture import Capture, CaptureConfigError, parse_capture
from stabilizer_sentinel.capture.trial import MemoryTrial, TensorUnavailableForStep
from tests.unit.sentinel.tinynet import batch, tiny_net


def train(capture: Capture, model: torch.nn.Module, steps: int, lr: float = 0.1) -> dict[int, dict[str, np.ndarray]]:
    """Plain SGD with the capture hook points; returns what the parameters and gradients were, per step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    truth: dict[int, dict[str, np.ndarray]] = {}
    for step in range(steps):
        x, y = batch(step)
        capture.begin_step(step)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        truth[step] = {f"weights/{n}": p.detach().clone().numpy() for n, p in model.named_parameters()}
        truth[step].update({f"gradients/{n}": p.grad.clone().numpy() for n, p in model.named_parameters()})
        truth[step]["losses/loss"] = np.float32(loss.item())
        capture.end_step(step, loss=loss, inputs=x, labels=y, outputs=logits)
        optimizer.step()
    return truth


def test_collections_are_saved_on_their_own_schedules_and_read_back(tmp_path):
    model = tiny_net()
    config = parse_capture(json.dumps({
        "weights": {"save_interval": 4},
        "gradients": {"save_steps": [1, 6]},
        "losses": {"save_interval": 1},
        "activations": {"save_interval": 5},
        "labels": {"save_interval": 3},
        "predictions": {"save_interval": 3},
        "head_only": {"include_regex": "gradients/head\\..*", "save_interval": 2},
    }))
    capture = Capture(model, config, out_dir=tmp_path / "tensors")
    truth = train(capture, model, steps=8)
    capture.close()

    trial = create_trial(str(tmp_path / "tensors"))
    assert trial.loaded_all_steps and trial.end_status == "completed"
    assert trial.steps() == list(range(8))
    assert trial.tensor("weights/stem.weight").steps() == [0, 4]
    assert trial.tensor("gradients/stem.weight").steps() == [1, 6]
    assert trial.tensor("gradients/head.weight").steps() == [0, 1, 2, 4, 6]  # head_only, plus save_steps
    assert trial.tensor("activations/blocks.0").steps() == [0, 5]
    assert trial.tensor_names(collection="head_only") == ["gradients/head.weight", "gradients/head.bias"]
    assert trial.tensor_names(collection="biases") == []  # not configured, so not saved
    assert trial.tensor_names(regex="activations/") == ["activations/blocks.0", "activations/blocks.1"]
    # Values are what the job had at that step (weights before the optimizer step), in float32.
    np.testing.assert_array_equal(trial.tensor("weights/stem.weight").value(4), truth[4]["weights/stem.weight"])
    np.testing.assert_array_equal(trial.tensor("gradients/head.bias").value(6), truth[6]["gradients/head.bias"])
    losses = trial.tensor("losses/loss").values()
    assert sorted(losses) == list(range(8)) and losses[3].shape == ()
    assert float(losses[3]) == pytest.approx(float(truth[3]["losses/loss"]))
    assert trial.tensor("labels/labels").value(3).dtype == np.int64
    assert trial.tensor("predictions/predictions").value(3).shape == (16,)
    with pytest.raises(TensorUnavailableForStep):
        trial.tensor("weights/stem.weight").value(1)


def test_store_layout_is_json_index_plus_npz_without_pickle(tmp_path):
    model = tiny_net()
    capture = Capture(model, parse_capture({"gradients": {"save_interval": 2}}), out_dir=tmp_path)
    train(capture, model, steps=3)
    capture.close(status="rule_stop")
    archives = sorted(p.name for p in (tmp_path / "steps").iterdir())
    assert archives == ["000000000000_TRAIN.npz", "000000000002_TRAIN.npz"]
    index = json.loads((tmp_path / "index" / "000000000002_TRAIN.json").read_text())
    assert index["file"] == "steps/000000000002_TRAIN.npz" and index["mode"] == "TRAIN"
    expected = {"collections": ["gradients"], "shape": [8, 6], "dtype": "float32",
                "smdebug": "gradient/TinyNet_stem.weight"}  # the name smdebug gives it
    assert index["tensors"]["gradients/stem.weight"] == expected
    with np.load(tmp_path / "steps" / "000000000002_TRAIN.npz", allow_pickle=False) as archive:
        assert "gradients/head.bias" in archive.files
    meta = json.loads((tmp_path / "collections.json").read_text())
    assert meta == {"format": "stabilizer-tensors/1",
                    "collections": {"gradients": {"save_interval": 2, "modes": ["TRAIN"]}}}
    assert json.loads((tmp_path / "training_end.json").read_text())["status"] == "rule_stop"


def test_trial_follows_a_store_while_it_is_written(tmp_path):
    model = tiny_net()
    capture = Capture(model, parse_capture({"losses": {"save_interval": 1}}), out_dir=tmp_path)
    train(capture, model, steps=2)
    capture.flush()
    trial = create_trial(str(tmp_path))
    assert trial.steps() == [0, 1] and not trial.loaded_all_steps
    for step in (2, 3):
        capture.end_step(step, loss=float(step))
    capture.flush()
    trial.refresh()
    assert trial.steps() == [0, 1, 2, 3] and not trial.loaded_all_steps
    capture.close()
    trial.refresh()
    assert trial.loaded_all_steps and float(trial.tensor("losses/loss").value(3)) == 3.0


def test_an_index_entry_without_its_archive_is_not_a_step_yet(tmp_path):
    """A synced copy (S3) can show the small index entry before the archive it describes."""
    model = tiny_net()
    capture = Capture(model, parse_capture({"losses": {"save_interval": 1}}), out_dir=tmp_path / "job")
    train(capture, model, steps=3)
    capture.close()
    partial = tmp_path / "synced"
    shutil.copytree(tmp_path / "job", partial)
    (partial / "steps" / "000000000002_TRAIN.npz").unlink()
    (partial / "training_end.json").unlink()
    trial = create_trial(str(partial))
    assert trial.steps() == [0, 1] and not trial.loaded_all_steps


def test_eval_mode_records_losses_but_not_parameters(tmp_path):
    model = tiny_net()
    capture = Capture(model, parse_capture({"losses": {"save_interval": 1}, "weights": {"save_interval": 1}}),
                      out_dir=tmp_path)
    train(capture, model, steps=2)
    capture.end_step(1, mode="EVAL", loss=0.75)
    capture.close()
    trial = create_trial(str(tmp_path))
    assert trial.steps(mode="EVAL") == [1]
    assert float(trial.tensor("losses/loss").value(1, mode="EVAL")) == 0.75
    assert trial.tensor_names(mode="EVAL") == ["losses/loss"]
    assert trial.tensor("losses/loss").value(1, mode="TRAIN") != 0.75


def test_create_trial_reads_an_s3_prefix(tmp_path):
    import boto3
    import moto
    model = tiny_net()
    capture = Capture(model, parse_capture({"gradients": {"save_interval": 2}, "losses": {"save_interval": 1}}),
                      out_dir=tmp_path)
    train(capture, model, steps=4)
    capture.close()
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bucket")
        for path in tmp_path.rglob("*"):
            if path.is_file():
                key = f"executions/e/attempt-1/checkpoints/tensors/{path.relative_to(tmp_path)}"
                s3.upload_file(str(path), "bucket", key)
        trial = create_trial("s3://bucket/executions/e/attempt-1/checkpoints/tensors", client=s3)
        assert trial.steps() == [0, 1, 2, 3] and trial.loaded_all_steps
        assert trial.tensor("gradients/stem.weight").steps() == [0, 2]
        local = create_trial(str(tmp_path))
        np.testing.assert_array_equal(trial.tensor("gradients/stem.weight").value(2),
                                      local.tensor("gradients/stem.weight").value(2))


@pytest.mark.parametrize("raw,message", [
    ({"gradients": {"save_intervall": 5}}, "capture.gradients: unknown keys ['save_intervall']"),
    ({"gradients": {"save_interval": 0}}, "capture.gradients.save_interval: expected a positive integer"),
    ({"mine": {"save_interval": 5}}, "capture.mine: a custom collection needs include_regex"),
    ({"losses": {"modes": ["TEST"]}}, "capture.losses.modes: expected a list of ['TRAIN', 'EVAL']"),
    ({"gradients": {"save_steps": "a,b"}}, "capture.gradients.save_steps: expected a list of step numbers"),
    ("[1]", "capture: expected a JSON object"),
])
def test_bad_capture_settings_name_the_field(raw, message):
    with pytest.raises(CaptureConfigError) as error:
        parse_capture(raw if isinstance(raw, str) else json.dumps(raw))
    assert message in str(error.value)


def test_a_resumed_job_writing_to_the_same_store_clears_the_old_end_marker(tmp_path):
    model = tiny_net()
    first = Capture(model, parse_capture({"losses": {"save_interval": 1}}), out_dir=tmp_path)
    train(first, model, steps=2)
    first.close(status="stopped")
    assert create_trial(str(tmp_path)).loaded_all_steps
    resumed = Capture(model, parse_capture({"losses": {"save_interval": 1}}), out_dir=tmp_path)
    resumed.end_step(2, loss=1.0)
    resumed.flush()
    trial = create_trial(str(tmp_path))
    assert trial.steps() == [0, 1, 2] and not trial.loaded_all_steps
    resumed.close()
    trial.refresh()
    assert trial.loaded_all_steps and trial.end_status == "completed"


@pytest.mark.parametrize("tensor_history, scalar_history", [(2, 6), (1, 3), (0, 0)])
def test_a_memory_trial_names_one_steps_tensors_as_a_walk_of_every_name_does(tensor_history, scalar_history):
    """A step's names come from an index of what is held at that step, not a walk of every name ever saved:
    the same names in the same (first-saved) order, whatever the histories let go of, a step saved again (a
    rollback's replay), or a name whose size changes (a last batch of one) and is kept the shorter time."""
    rng = random.Random(tensor_history)
    trial = MemoryTrial(tensor_history=tensor_history, scalar_history=scalar_history)
    names = [("losses/loss", "losses"), ("gradients/b", "gradients"), ("weights/a", "weights"),
             ("gradients/a", "gradients"), ("labels/labels", "labels")]
    for _ in range(120):
        step = rng.randrange(-2, 40)
        for mode in ("TRAIN", "EVAL"):
            saved = {name: ((coll,), np.full(rng.choice((1, 3)), float(step)))
                     for name, coll in names if rng.random() < 0.6}
            trial.add(step, mode, saved)
    asked = 0
    for step in range(-3, 41):
        for mode in (None, "TRAIN", "EVAL"):
            for regex, collection in ((None, None), ("grad", None), (None, "gradients"), (["loss", "a$"], None),
                                      (None, ["weights", "labels"])):
                walked = [name for name in trial.tensor_names(regex=regex, collection=collection, mode=mode)
                          if step in trial.tensor(name).steps(mode)]
                assert trial.tensor_names(regex=regex, collection=collection, mode=mode, step=step) == walked
                asked += bool(walked)
    assert asked > 20 or not scalar_history  # questions with an answer to compare; none is held at 0
