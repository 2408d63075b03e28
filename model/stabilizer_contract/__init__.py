"""What the training job and the workflow agree on, in one place both sides import.

The rule catalogue (``catalogue``, its vocabulary in ``parameters``): every rule name a rule list
may use, its parameters, defaults and bounds. The workflow checks an execution input against it
and the in-job sentinel converts the same list with the same functions. The job's names
(``job``): the configuration hyperparameter, the checkpoint directory, the rule stop's exit status
and failure reason, how a run ended, the rewind interval. Checkpoint file names (``checkpoints``).
The reference job's recipe: each hyperparameter's default, bounds and meaning (``reference_recipe``).

Dependency-free (the standard library only): the Lambda asset build copies this package into the
asset, and the job's library channel carries it beside ``stabilizer_sentinel``. Nothing here may
import the sentinel, the workflow, torch, boto3 or pydantic.
"""
