"""The Lightning level: SentinelCallback stops a diverging LightningModule before the bad update."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

lightning = pytest.importorskip("lightning")
from stabilizer_sentinel.lightning_callback import SentinelCallback  # noqa: E402


class Regression(lightning.LightningModule):
    def __init__(self, lr: float, fail_at: int = -1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.lr = lr
        self.fail_at = fail_at
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at:
            raise ValueError(f"bad batch at step {self.global_step}")
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit(tmp_path, lr: float, steps: int, fail_at: int = -1, plugins=None):
    torch.manual_seed(0)
    x = torch.randn(64, 8) * 3
    y = x @ torch.randn(8, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
    module = Regression(lr, fail_at)
    environ = {"STABILIZER_CONFIG": json.dumps({"rules": [{"name": "ExplodingTensor"}]}),
               "STABILIZER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
               "STABILIZER_FAILURE_FILE": str(tmp_path / "failure")}
    trainer = lightning.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, plugins=plugins,
                                callbacks=[SentinelCallback(environ=environ)], default_root_dir=tmp_path)
    return module, trainer, data


def test_the_callback_stops_a_diverging_module_at_its_first_non_finite_step(tmp_path):
    module, trainer, data = fit(tmp_path, lr=3.0, steps=12)
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(module, data)
    assert stopped.value.code == 86
    first_bad = next(i for i, loss in enumerate(module.losses) if not torch.isfinite(torch.tensor(loss)))
    (finding,) = json.loads((tmp_path / "ckpt" / "findings.json").read_text())["findings"]
    assert finding["rule"] == "ExplodingTensor" and finding["step"] == first_bad
    assert finding["tensor"].startswith("gradients/net.")
    assert all(torch.isfinite(p).all() for p in module.parameters())  # the bad update never happened
    assert (tmp_path / "failure").read_text().startswith(f"RuleStop: ExplodingTensor at step {first_bad}")


def document(tmp_path) -> dict:
    return json.loads((tmp_path / "ckpt" / "findings.json").read_text())


def test_a_healthy_module_trains_to_the_end_and_the_callback_writes_its_summary(tmp_path):
    module, trainer, data = fit(tmp_path, lr=0.01, steps=12)
    trainer.fit(module, data)
    assert trainer.global_step == 12
    written = document(tmp_path)
    assert written["findings"] == []
    summary = written["summary"]
    assert (summary["integration"], summary["ended"]) == ("lightning", "completed")
    assert (summary["steps_taken"], summary["steps_observed"], summary["first_step"], summary["last_step"]) == (
        12, 12, 0, 11)
    assert summary["learned"] is True


@pytest.mark.slow  # trains a Lightning module twice
def test_a_fit_resumed_from_a_watched_fits_checkpoint_is_judged_from_the_start_of_the_training_it_continues(
        tmp_path):
    # Stop 86's harm hunt: a second fit resumed with ckpt_path from a checkpoint at its floor was judged from its own
    # first steps and found NotLearning (a stop and a remedy for a healthy run).
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1) + 0.5 * torch.randn(256, 1)  # a floor of 0.25, reached within the first fit
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True)
    environ = {"STABILIZER_CONFIG": "{}", "STABILIZER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
               "STABILIZER_FAILURE_FILE": str(tmp_path / "failure")}

    def trainer(steps: int) -> lightning.Trainer:
        saved = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "saved", save_last=True)
        return lightning.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                                 enable_model_summary=False, callbacks=[saved, SentinelCallback(environ=environ)],
                                 default_root_dir=tmp_path)

    first = Regression(0.05)
    trainer(96).fit(first, data)
    started = document(tmp_path)["summary"]
    assert started["learned"] is True
    last = tmp_path / "saved" / "last.ckpt"
    assert "stabilizer_lineage" in torch.load(last, weights_only=False)
    second = Regression(0.05)
    trainer(192).fit(second, data, ckpt_path=last)
    written = document(tmp_path)
    summary = written["summary"]
    assert written["findings"] == [] and summary["learned"] is True
    assert (summary["first_step"], summary["started_from"]) == (96, str(last))
    assert summary["first_loss"] == started["first_loss"]  # the lineage's start, not the resumed fit's first steps
    assert sum(second.losses[:8]) / 8 < started["first_loss"] / 4  # resumed near its floor


@pytest.mark.slow  # trains a Lightning module twice
def test_with_in_job_recovery_the_callback_holds_the_batches_and_changes_no_loss(tmp_path):
    """In-job recovery holds each step's batches for a replay (stabilizer_sentinel.recovery.batches, the loader
    iterator's stand-in from ``setup``): on data without a length, which Lightning fetches a batch ahead, a
    healthy module trains to the same losses as without the callback, bit for bit, and the loader's method
    is torch's own again once training ends."""
    original = torch.utils.data.dataloader._BaseDataLoaderIter.__next__

    class Records(torch.utils.data.IterableDataset):
        def __iter__(self):
            generator = torch.Generator().manual_seed(1)
            for _ in range(96):
                x = torch.randn(8, generator=generator) * 3
                yield x, x.sum(0, keepdim=True)

    def train(callbacks):
        torch.manual_seed(0)
        module = Regression(0.01)
        trainer = lightning.Trainer(max_steps=20, accelerator="cpu", logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                                    default_root_dir=tmp_path)
        trainer.fit(module, torch.utils.data.DataLoader(Records(), batch_size=16))
        return module.losses

    environ = {"STABILIZER_CONFIG": json.dumps({"recovery": "in_job"}),
               "STABILIZER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
               "STABILIZER_FAILURE_FILE": str(tmp_path / "failure")}
    callback = SentinelCallback(environ=environ)
    watched = train([callback])
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__ is original
    assert (callback.guard.batches.per_step, callback.guard.batches.lag) == (1, 1)  # known: one fetched ahead
    assert len(watched) == 20 and watched == train([])
    assert document(tmp_path)["findings"] == []


def test_a_fit_that_fails_before_training_puts_the_loader_method_back(tmp_path):
    """The callback watches the loaders from ``setup``; a fit that fails before training starts (here in
    ``configure_optimizers``) reaches ``on_exception``, not ``teardown``: the method is torch's again."""
    original = torch.utils.data.dataloader._BaseDataLoaderIter.__next__

    class Broken(Regression):
        def configure_optimizers(self):
            raise ValueError("no optimizer")

    environ = {"STABILIZER_CONFIG": json.dumps({"recovery": "in_job"}),
               "STABILIZER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
               "STABILIZER_FAILURE_FILE": str(tmp_path / "failure")}
    callback = SentinelCallback(environ=environ)
    _, _, data = fit(tmp_path, lr=0.01, steps=4)  # its data alone
    trainer = lightning.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
                                default_root_dir=tmp_path)
    with pytest.raises(ValueError, match="no optimizer"):
        trainer.fit(Broken(0.01), data)
    assert callback.guard is None and callback.batches is None
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__ is original


def test_a_module_that_fails_leaves_the_summary_with_its_exception(tmp_path):
    module, trainer, data = fit(tmp_path, lr=0.01, steps=12, fail_at=4)
    with pytest.raises(ValueError, match="bad batch"):
        trainer.fit(module, data)
    summary = document(tmp_path)["summary"]
    assert (summary["ended"], summary["exception"]) == ("exception", "ValueError: bad batch at step 4")
    assert summary["steps_taken"] == 4


def test_float16_mixed_precision_calibrating_its_scale_is_healthy_and_its_skipped_steps_are_counted(tmp_path):
    # Lightning's "16-mixed" with a real float16 GradScaler (Lightning builds none on the CPU): from the
    # default scale (2**16) the first steps overflow and the scaler skips them, as it does on a GPU.
    from lightning.pytorch.plugins import MixedPrecision

    precision = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    module, trainer, data = fit(tmp_path, lr=0.01, steps=16, plugins=[precision])
    trainer.fit(module, data)
    written = document(tmp_path)
    assert written["findings"] == []
    summary = written["summary"]
    assert summary["steps_skipped"] >= 1
    assert summary["steps_observed"] + summary["steps_skipped"] == summary["steps_taken"] == 16
    assert summary["loss_scale"]["last"] < 2.0**16


def test_float16_mixed_precision_whose_gradients_stay_non_finite_is_stopped_though_the_scaler_skips_them(tmp_path):
    # At lr 3 the loss jumps to 4.6e5 and the gradients overflow float16 at every scale: the scaler skips
    # every step and halves its scale down to 0.5, which no calibrating run reaches.
    from lightning.pytorch.plugins import MixedPrecision

    precision = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    module, trainer, data = fit(tmp_path, lr=3.0, steps=40, plugins=[precision])
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(module, data)
    assert stopped.value.code == 86
    (finding,) = document(tmp_path)["findings"]
    assert (finding["rule"], finding["tensor"], finding["source"]) == ("ExplodingTensor", "loss_scale", "loss_scaler")
    assert finding["value"] < 1 and len(module.losses) == finding["step"] + 1  # no step after it
    summary = document(tmp_path)["summary"]
    assert summary["steps_skipped"] > 4 and summary["ended"] == "rule_stop"
