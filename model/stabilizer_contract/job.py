"""The names the training job and the workflow both use (docs/contracts.md, sections 1, 2 and 8).

The workflow writes the configuration under `CONFIG_HYPERPARAMETER` and sets the checkpoint
directory; the job's library reads them, and when a rule stops the job it exits with
`EXIT_RULE_STOP` and a failure reason starting with `RULE_STOP_PREFIX`, which the monitor reads
back. The summary's `ended` says how the script ended. The library copies the training state every
`REWIND_EVERY` steps by default; the policy counts on that interval when it judges whether a
relaunch moved the explosion. Checkpoint file names: `stabilizer_contract.checkpoints`. Finding
names of the sentinel's own checks: `stabilizer_contract.parameters` (`NOT_LEARNING`, `DIVERGING`).
"""

from __future__ import annotations

# The one hyperparameter the workflow adds: the library's whole configuration as JSON text.
CONFIG_HYPERPARAMETER = "sagemaker_stabilizer"

# Where the job writes checkpoints and findings.json (SageMaker's CheckpointConfig.LocalPath), and
# the variable that tells the library and the training script.
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
CHECKPOINT_DIR_VARIABLE = "STABILIZER_CHECKPOINT_DIR"

# A rule stopped the job: its exit status, and how its failure reason begins.
EXIT_RULE_STOP = 86
RULE_STOP_PREFIX = "RuleStop:"

# How a script ended, as the summary's `ended` says it.
ENDED_COMPLETED = "completed"
ENDED_RULE_STOP = "rule_stop"
ENDED_EXCEPTION = "exception"
ENDED_INTERRUPTED = "interrupted"

# The library's rewind copies the training state every this many steps (its default).
REWIND_EVERY = 5

# A batch's fingerprint (stabilizer_sentinel.recovery.batches.fingerprint): a rollback's bad batch in
# findings.json, and the configuration's `skip_batches` a later job passes over.
FINGERPRINT_PATTERN = r"^[0-9a-f]{16}$"

# A rollback's outcomes in findings.json (docs/contracts.md, section 2) where the same rate trained past a
# sudden explosion (a one-off, or a bad batch skipped): the rate was not at fault.
PAST_OUTCOMES = ("transient", "bad_batch")

# The in-job decisions one job makes at most (stabilizer_sentinel.recovery.recovery): rollbacks that change
# the rate (a stop when no lower rate trained among them), and explosions the same rate trained past.
IN_JOB_ROLLBACKS, IN_JOB_TRANSIENTS = 3, 5
