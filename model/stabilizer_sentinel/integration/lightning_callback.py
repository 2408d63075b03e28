"""The sentinel for PyTorch Lightning: one callback, configured by the job like ``watch()``.

    from stabilizer_sentinel.lightning_callback import SentinelCallback
    trainer = lightning.Trainer(..., callbacks=[SentinelCallback()])

Lightning runs forward and backward inside ``optimizer.step(closure)``, so an optimizer pre-hook
would see no gradients; the callback drives the same ``Guard`` from Lightning's own hooks instead:
the loss from ``on_before_backward``, the check from ``on_before_optimizer_step`` (after backward,
before the update, so a stopped step never reaches the weights), step numbers from
``trainer.global_step``. A stop ends the process with status 86 and the failure file, as at the other
levels. Every optimizer of the module is checked (a GAN's second with the finite check of its
gradients, stabilizer_sentinel.loops.optimizer_hooks); the first one's steps are the run's. The run's summary
(integration "lightning") goes into findings.json at the end of training, or when it fails
(``on_exception``: ended "exception" with the exception's line, or "interrupted"). Precision
"16-mixed" with a GradScaler: the optimizer's hooks check the steps the scaler applies and the steps
it skips are counted and judged as in a plain loop (stabilizer_sentinel.loops.step_clock), since Lightning's own
hook comes before the scaler decides. "bf16-mixed" needs no scaler and is watched as any step.

With ``recovery`` ``in_job`` in the job's configuration, an explosion or a divergence is answered in the
process as at the other levels (stabilizer_sentinel.recovery.recovery): the module and the optimizer are
loaded from a copy in place (the Trainer holds the same objects), the rate is applied around the
update by the first optimizer's step hooks, and Lightning's step count goes on. A sudden explosion is
replayed with the failing step's own batch first (stabilizer_sentinel.recovery.batches): the loaders are
watched from ``setup``, before Lightning fetches its first batch (it fetches one ahead where the data
has no length). Needs the ``lightning`` package (extra ``lightning``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import lightning

from stabilizer_sentinel.failsafe import closing, shielded
from stabilizer_sentinel.integration.guard import Guard
from stabilizer_sentinel.integration.script_watch import claim, supersede
from stabilizer_sentinel.job_config import JobPaths, load_config
from stabilizer_sentinel.loops import distributed
from stabilizer_sentinel.recovery.batches import Batches

LINEAGE = "stabilizer_lineage"  # the checkpoint's key for where the learning check stood (``on_save_checkpoint``)


class SentinelCallback(lightning.Callback):
    def __init__(
        self,
        *,
        rules: list[Mapping[str, Any]] | None = None,
        capture: Mapping[str, Any] | None = None,
        action: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = load_config(environ).with_defaults(
            rules=list(rules) if rules is not None else None,
            capture=dict(capture) if capture is not None else None,
            action=action,
        )
        self.paths = JobPaths.from_env(environ)
        self.guard: Guard | None = None
        self.scaled = False
        self.batches: Batches | None = None
        self._lineage: dict[str, Any] | None = None  # where the learning check stood in the checkpoint resumed from

    def setup(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, stage: str) -> None:
        # The loaders' batches from before the first fetch (the guard is made as training starts, after
        # Lightning fetched ahead); the guard drops them if it keeps none. One process only.
        config = self.config
        if stage == "fit" and distributed.rank_and_size()[1] == 1 and trainer.world_size == 1 and (
                config.effective_recovery == "in_job" or config.skip_batches or config.skip_nonfinite_batches):
            self.batches = Batches(config.skip_batches, skip_nonfinite=config.skip_nonfinite_batches)
            self.batches.activate()

    @closing
    def teardown(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, stage: str) -> None:
        self._release_batches()

    def _release_batches(self) -> None:
        """The loaders as torch has them, unless this fit's guard holds the watch (its close puts it back):
        training never started, or failed before it did (Lightning calls ``on_exception`` then, not
        ``teardown``)."""
        if self.batches is not None and (self.guard is None or self.guard.batches is not self.batches):
            self.batches.deactivate()
        self.batches = None

    @shielded
    def on_train_start(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        claim(pl_module, optimizer)  # under "auto" the launcher stands by: it stands down for the callback
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        # With a GradScaler the optimizer's own hooks check the steps it applies and count those it skips
        # (stabilizer_sentinel.loops.step_clock): checked here, a calibrating scaler's overflow would read as an
        # explosion.
        self.scaled = scaler is not None and scaler.is_enabled()
        self.guard = Guard(pl_module, optimizer, config=self.config, paths=self.paths,
                           start_step=trainer.global_step, install_hooks=self.scaled, integration="lightning",
                           batches=self.batches)
        for other in trainer.optimizers[1:]:
            self.guard.add_optimizer(other)
        supersede(self.guard)  # a second Trainer's fit: the earlier fits' in-job decisions stay in findings.json
        if self._lineage is not None:  # a fit resumed from a checkpoint a watched fit saved (``on_load_checkpoint``)
            self.guard.continues(self._lineage)
            self.guard.resumed(str(trainer.ckpt_path) if trainer.ckpt_path else None)
            self._lineage = None

    @shielded
    def on_save_checkpoint(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """The checkpoint keeps where the learning check stands (``LINEAGE``, the guard's lineage), beside
        Lightning's own keys: a fit resumed from it (``ckpt_path``) is judged against the start of the training
        it continues, as a relaunch resumed from the sentinel's copies is. Judged from its own first steps, a fit
        resumed at its floor has nothing left to fall by (stop 86's harm hunt: a second fit resumed from
        ``last.ckpt`` was found NotLearning, its loss 0.076 to 0.028 over 45 noisy steps). A key of its own, not
        the callback's ``state_dict``: a Trainer without this callback that resumes from the checkpoint warns of
        callbacks' states it lacks, and of none of the checkpoint's other keys."""
        if self.guard is not None:
            checkpoint[LINEAGE] = self.guard.lineage()

    @shielded
    def on_load_checkpoint(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        lineage = checkpoint.get(LINEAGE)
        self._lineage = dict(lineage) if isinstance(lineage, Mapping) else None

    @shielded
    def on_train_batch_start(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.guard is not None:
            self.guard.begin_step(trainer.global_step)

    @shielded
    def on_before_backward(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule,
                           loss: Any) -> None:
        if self.guard is not None:
            self.guard.step(loss, epoch=trainer.current_epoch)

    def _checks(self, optimizer: Any) -> bool:
        return self.guard is not None and optimizer is self.guard.optimizer and not self.scaled

    def _meet_ranks(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule, optimizer: Any) -> None:
        if self._checks(optimizer):  # where the step is checked, the ranks meet (stabilizer_sentinel.failsafe)
            self.guard.meet_ranks()

    @functools.partial(shielded, meeting=_meet_ranks)
    def on_before_optimizer_step(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule,
                                 optimizer: Any) -> None:
        if self._checks(optimizer):
            self.guard.check_counted(trainer.global_step)  # Lightning counts its steps itself

    @closing
    def on_train_end(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        if self.guard is not None:
            self.guard.close()

    @closing
    def on_exception(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule,
                     exception: BaseException) -> None:
        if self.guard is not None and not isinstance(exception, SystemExit):  # SystemExit: a rule stop, recorded
            self.guard.failed(exception)
        self._release_batches()
