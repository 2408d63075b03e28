"""A model of the time from an explosion to the next job's first training step, on AWS.

Nothing here is measured on AWS (the project has no account to measure in); each part is a
figure with its source: documented by AWS, measured on the development machine, derived from
the workflow's own settings, or assumed (and then says why that figure). The benchmark
(`python -m stabilizer.bench.latency`) prints the parts side by side for the original sample's
way and stabilizer's, with the totals and their ratio. Change a figure here, with its source,
when a real account measures it.

The two ways, step by step:

- the sample: SageMaker Debugger's rule job sees the explosion at the next saved step; the state
  machine sees the rule's verdict at its next check (a Wait of `wait_seconds`); it asks
  StopTrainingJob, which ends the job 120 s later (the training toolkit does not forward SIGTERM
  to the script, so nothing ends it sooner); the next check, a full `wait_seconds` after the stop,
  sees it Stopped and relaunches; the new job provisions an instance and pulls the image.
- stabilizer in the job (job.recovery in_job, where the remedy is a rate): the sentinel sees it at
  the step; the job loads its last good copy from host memory and probes lower rates for a few
  steps each; no new job, instance or image.
- stabilizer by relaunch: the sentinel in the job sees the non-finite gradient at the step it happens and
  ends the job itself (exit status 86, no StopTrainingJob); SageMaker's "Training Job State
  Change" event reaches the watch function through EventBridge, which sends the parked
  execution its task token; the monitor decides, the train function launches; with a warm pool
  (`warm_pool_seconds`) the next job starts on the instance the last one used.

Whether the job-end event wakes the execution is not assumed: `python -m stabilizer.bench.latency`
runs the true path in local mode (the event in the shape SageMaker documents, the project's watch
function, the task token) and measures it. When the event does not wake the execution, the
execution sees the job's end only at its next check, and the model says so (`WakeMeasurement`).

This module must not import the workflow or call AWS (the in-job way reads the probe counts from
stabilizer_sentinel.recovery.recovery).
"""

from __future__ import annotations

from dataclasses import dataclass

DOCUMENTED = "documented"
PUBLISHED = "AWS blog"
MEASURED = "measured"
DERIVED = "derived"
ASSUMED = "assumed"


@dataclass(frozen=True)
class Figure:
    seconds: float
    kind: str  # documented | AWS blog | measured | derived | assumed
    source: str


# --- the figures, each with its source ------------------------------------------------------

# One training step of ResNet-20 (batch 128) on a CPU: python -m stabilizer.bench.overhead on the
# development machine (docs/figures.md: 155 ms a step).
STEP = Figure(0.155, MEASURED, "stabilizer.bench.overhead: 155 ms a ResNet-20 step on 2 CPU cores")
# The state machine's check interval; both ways default to 300 s (the sample's and ours).
WAIT_SECONDS = 300.0
# A check lands uniformly within a wait: on average half of it.
POLL_DELAY = Figure(WAIT_SECONDS / 2, DERIVED, "mean of a uniform wait of wait_seconds=300 s")
# The sample's Debugger hook saved every `debugger_save_interval` steps (taken as 100 here); a
# rule sees an explosion at the next saved step, on average half an interval later...
DEBUGGER_SAVE_INTERVAL = 100
DEBUGGER_SAVE_DELAY = Figure(
    DEBUGGER_SAVE_INTERVAL / 2 * STEP.seconds, ASSUMED,
    "half of debugger_save_interval (taken as 100 steps) at the measured step time",
)
# ...and its rule job reads the saved step from S3 afterwards. Not documented as a figure.
DEBUGGER_RULE_LAG = Figure(
    30.0, ASSUMED,
    "rule job's S3 upload-then-read of the saved step; no AWS figure (Debugger rule jobs poll S3)",
)
# StopTrainingJob "delays job termination for 120 seconds" after SIGTERM (StopTrainingJob API
# reference); the framework containers' training toolkit does not pass SIGTERM on to the
# script, so the script cannot end sooner.
STOP_GRACE = Figure(120.0, DOCUMENTED, "StopTrainingJob API reference: termination delayed 120 s")
# After asking the stop, the sample sees Stopped only at its next check, a full wait later (the
# 120 s stop lies inside it).
NEXT_CHECK = Figure(WAIT_SECONDS, DERIVED, "the next check after the stop: one full wait_seconds")
# The sentinel checks gradients for non-finite values at every step (model/stabilizer_sentinel/detection/sentinel.py).
SENTINEL = Figure(STEP.seconds, DERIVED, "in-job check at the step of the explosion: at most one step")
# The job's own end: SageMaker uploads the model directory and the last checkpoint sync, then
# reports Failed. No AWS figure; the reference job's model and checkpoints are a few MB.
JOB_END = Figure(10.0, ASSUMED, "Uploading of a few MB then Failed; no AWS figure")
# EventBridge delivers service events to rule targets in near real time; AWS gives no bound.
EVENT_DELIVERY = Figure(1.0, ASSUMED, "EventBridge rule to Lambda target; AWS publishes no latency figure")
# A Lambda invocation from cold: the handlers' cold import measured at 0.33-0.34 s
# (docs/figures.md), plus the runtime start and one or two AWS calls.
LAMBDA_COLD = Figure(1.0, ASSUMED, "cold import measured 0.33 s locally; runtime start and calls added")
# Step Functions moves between states in well under a second; no AWS figure.
TRANSITIONS = Figure(0.5, ASSUMED, "a few state transitions; no AWS figure")
# A training job from CreateTrainingJob to its first step on a fresh instance: provisioning plus
# the multi-GB PyTorch image pull. AWS documents warm pools as removing this "cold-start startup
# time" but gives no figure for it.
COLD_START = Figure(180.0, ASSUMED, "instance provisioning and image pull; AWS gives no figure")
# On a warm pool's instance the job skips provisioning; AWS's warm pools post ("Best practices for
# Amazon SageMaker Training Managed Warm Pools", AWS ML blog) targets start-up "under 20 seconds".
WARM_START = Figure(20.0, PUBLISHED, "AWS ML blog on managed warm pools: start-up under 20 s")
# The script's own start on either: Python, torch import, data load (the digits set locally).
SCRIPT_START = Figure(10.0, ASSUMED, "torch import and data load inside the container")


@dataclass(frozen=True)
class Part:
    name: str
    figure: Figure


@dataclass(frozen=True)
class Way:
    name: str
    parts: tuple[Part, ...]

    @property
    def seconds(self) -> float:
        return sum(part.figure.seconds for part in self.parts)


def sample_way() -> Way:
    return Way("the original sample (Debugger rule, 300 s polling, no warm pool)", (
        Part("explosion seen by the rule", Figure(
            DEBUGGER_SAVE_DELAY.seconds + DEBUGGER_RULE_LAG.seconds, ASSUMED,
            f"{DEBUGGER_SAVE_DELAY.source} + {DEBUGGER_RULE_LAG.source}")),
        Part("the workflow's next check", POLL_DELAY),
        Part("StopTrainingJob until Stopped", Figure(0.0, DERIVED, "inside the next wait (120 s < 300 s)")),
        Part("next check sees Stopped", NEXT_CHECK),
        Part("decide and launch", Figure(LAMBDA_COLD.seconds * 2 + TRANSITIONS.seconds, ASSUMED,
                                         "two Lambda steps and transitions")),
        Part("new instance and image", COLD_START),
        Part("script to its first step", SCRIPT_START),
    ))


@dataclass(frozen=True)
class WakeMeasurement:
    """What the true path did in local mode: did the job-end event wake the parked execution, and
    how long from the job's end to the execution's next check (seconds, wall clock)."""

    woken: bool
    seconds: float
    wait_seconds: int

    @property
    def source(self) -> str:
        how = ("woken by the job-end event" if self.woken
               else f"NOT woken: timed out after wait_seconds={self.wait_seconds}")
        return f"local mode, SageMaker's documented event shape: {how}, {self.seconds:.1f} s job end to check"


def stabilizer_way(warm_pool: bool, wake: WakeMeasurement | None = None) -> Way:
    """stabilizer's way; `wake` is the measured true path (None: the event is taken to wake it)."""
    start = WARM_START if warm_pool else COLD_START
    if wake is None or wake.woken:
        seen = (
            Part("job-end event to the watch function", EVENT_DELIVERY),
            Part("execution woken (SendTaskSuccess)", LAMBDA_COLD),
        )
    else:
        # The event found no parked execution: the job's end is seen at the next check.
        seen = (Part("job end seen at next check (no wake)", Figure(
            POLL_DELAY.seconds, DERIVED, f"{POLL_DELAY.source}; {wake.source}")),)
    return Way(f"stabilizer (sentinel, job-end event, {'warm pool' if warm_pool else 'no warm pool'})", (
        Part("explosion seen by the sentinel", SENTINEL),
        Part("job ends itself (Uploading, Failed)", JOB_END),
        *seen,
        Part("decide and launch", Figure(LAMBDA_COLD.seconds * 2 + TRANSITIONS.seconds, ASSUMED,
                                         "two Lambda steps and transitions")),
        Part("instance for the next job", start),
        Part("script to its first step", SCRIPT_START),
    ))


def in_job_way(rollback_seconds: float | None = None) -> Way:
    """stabilizer's in-job recovery (job.recovery in_job): the same job goes on; no instance, no image.

    The rollback's own time on the step of the reference ResNet: loading a copy from host memory,
    then the probe steps (every candidate's; the job trains during them, at the probed rates).
    `rollback_seconds`, when measured locally, is shown beside the model's figure."""
    from stabilizer_sentinel.recovery.recovery import FACTORS, PROBE_STEPS

    probes = len(FACTORS) * PROBE_STEPS
    measured = f"; measured locally on the quickstart: {rollback_seconds:.2f} s" if rollback_seconds is not None else ""
    return Way("stabilizer in the job (rollback, probing, same job)", (
        Part("explosion seen by the sentinel", SENTINEL),
        Part("copy loaded from host memory", Figure(0.01, ASSUMED, "as long as taking the copy, which "
                                                    "stabilizer.bench.overhead measures in milliseconds")),
        Part(f"{probes} probe steps to the chosen rate", Figure(
            probes * STEP.seconds, DERIVED, f"{len(FACTORS)} rates x {PROBE_STEPS} steps of {STEP.source}{measured}")),
    ))


def ways(wake: WakeMeasurement | None = None, rollback_seconds: float | None = None) -> list[Way]:
    return [sample_way(), stabilizer_way(warm_pool=False, wake=wake), stabilizer_way(warm_pool=True, wake=wake),
            in_job_way(rollback_seconds)]
