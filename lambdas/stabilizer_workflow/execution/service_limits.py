"""The AWS limits an execution must fit, checked when the input is read, before anything launches.

Step Functions: an execution that outlives its `TimeoutSeconds`, or writes more than 25,000
history events, fails with no Catch and no notification (Step Functions developer guide, "Step
Functions service quotas": 25,000 events in an execution's history, a hard quota). The
workflow's own limits (`limits.max_monitor_transitions` checks at most `wait_seconds` apart,
relaunches) must therefore end every execution well inside both.

SageMaker: CreateTrainingJob rejects a hyperparameter value over 2,500 characters, a tag value
outside `[\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*` or over 256 characters, and more than 20 Debugger
collections or a collection value over 256 characters (botocore's SageMaker model,
HyperParameterValue, TagValue and DebugHookConfig; tests/unit/workflow compare these constants with it). Found at
input, such a request says which field to change instead of failing the first launch.

Pure: a request or a value in, a problem (naming its field) out. The bounds of a whole execution
(its history, its timeout, its state's size) are checked by `stabilizer_workflow.execution.execution_bounds`
with the constants here; this module imports nothing of the state, so `stabilizer_workflow.execution.job` can
check its hyperparameters here before any state exists.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# The definition's TimeoutSeconds (statemachine/stabilizer.asl.json; a test keeps them equal).
EXECUTION_TIMEOUT_SECONDS = 2_678_400  # 31 days: room for limits.max_total_training_seconds (30 days)
HISTORY_EVENT_QUOTA = 25_000

# History events each part of an execution writes, counted by event type in Step Functions'
# history (and measured in moto's interpreter by tests/asl/test_bounds.py, which must not exceed them):
# - start and end: ExecutionStarted, ValidateInput (TaskStateEntered, TaskScheduled, TaskStarted,
#   TaskSucceeded, TaskStateExited), the final state entered/exited and ExecutionSucceeded/Failed,
#   with a failure path (StopJobOfFailedLaunch, StopJobAndNotify, NotifyFailure) on top;
# - a launch: one Lambda task, 5 events;
# - a check: AwaitJobChange (entered, scheduled, started, submitted, succeeded or timed out,
#   exited: 6), or, when parking fails, its failure (5) plus WaitForProgress (2); then
#   CheckJobAndRules (5) and DecideNextStep (2).
EVENTS_START_AND_END = 25
EVENTS_PER_LAUNCH = 5
EVENTS_PER_CHECK = 14
# A retried Lambda step writes TaskFailed, TaskScheduled and TaskStarted again; kept in reserve.
EVENTS_RESERVED_FOR_RETRIES = 2_500

# Wall time each part may take beyond waiting: a check's Lambda with its retries (six tries
# 2..30 s apart plus the calls), and a launch with the capacity back-off (60+120+240+480+600 s).
CHECK_SECONDS_BEYOND_WAIT = 120
LAUNCH_SECONDS = 1_800

HYPERPARAMETER_VALUE_MAX = 2_500
TAG_VALUE_MAX = 256
# DebugHookConfig (botocore's model, CollectionConfigurations and CollectionConfiguration): at most
# 20 collections, each name and each CollectionParameters value at most 256 characters.
DEBUGGER_COLLECTIONS_MAX = 20
DEBUGGER_COLLECTION_TEXT_MAX = 256
_TAG_PUNCTUATION = frozenset("_.:/=+-@")


def hyperparameter_value_problem(field: str, name: str, value: str, holding: str = "") -> str | None:
    """Why `value` (JSON text, as every value travels) cannot be the training job's hyperparameter
    `name`, naming the input `field` behind it and, when given, what the value `holding`; None
    when it fits. The one check of SageMaker's limit on a hyperparameter value: a job's own
    hyperparameters, the sentinel configuration and the whole request all use it."""
    if len(value) <= HYPERPARAMETER_VALUE_MAX:
        return None
    what = f"{holding} take " if holding else ""
    return (
        f"{field}: {what}{len(value):,} characters as the training job's hyperparameter {name!r} "
        f"(JSON-encoded); SageMaker allows at most {HYPERPARAMETER_VALUE_MAX:,}"
    )


def _tag_value_ok(value: str) -> bool:
    # \p{L} letters, \p{Z} separators, \p{N} numbers, and _.:/=+-@
    return len(value) <= TAG_VALUE_MAX and all(
        ch in _TAG_PUNCTUATION or unicodedata.category(ch)[0] in ("L", "Z", "N") for ch in value
    )


# StartExecution's name: 1 to 80 characters (botocore's states model, Name), none of white space, brackets,
# wildcards, " # % \\ ^ | ~ ` $ & , ; : / or control characters (its documentation, "A name must not contain").
EXECUTION_NAME_MAX = 80
_NAME_REFUSED = re.compile(r'[\s<>{}\[\]?*"#%\\^|~`$&,;:/\x00-\x1f\x7f-\x9f]')


def execution_name_problem(name: str) -> str | None:
    """Why Step Functions would refuse ``name`` for an execution, or SageMaker the tag each job carries with
    it (``stabilizer:execution``); None when both take it."""
    if not 1 <= len(name) <= EXECUTION_NAME_MAX:
        return f"{name!r}: an execution's name is 1 to {EXECUTION_NAME_MAX} characters, got {len(name)}"
    refused = _NAME_REFUSED.search(name)
    if refused:
        return (f"{name!r}: Step Functions refuses {refused.group()!r} in an execution's name (white space, "
                f"brackets, ? * \" # % \\ ^ | ~ ` $ & , ; : / and control characters); letters, digits, - and _ "
                f"are safe")
    if not _tag_value_ok(name):
        return (f"{name!r}: each job is tagged with its execution's name, and a SageMaker tag value holds letters, "
                f"digits, spaces and _ . : / = + - @ only; letters, digits, - and _ are safe")
    return None


# Which input field a tag value comes from (requests.py writes these tags).
_TAG_SOURCES = {
    "stabilizer:execution": "execution name (the name given when the execution was started)",
    "stabilizer:policy": "policy",
}


def request_problems(request: dict[str, Any], sources: dict[str, str] | None = None) -> list[str]:
    """CreateTrainingJob values SageMaker would reject. `sources` names the input field behind
    each hyperparameter (`sagemaker_stabilizer` -> `monitoring`); unnamed ones are named as such."""
    problems = []
    for name, value in (request.get("HyperParameters") or {}).items():
        problem = hyperparameter_value_problem((sources or {}).get(name, f"hyperparameter {name!r}"), name, value)
        if problem:
            problems.append(problem)
    for tag in request.get("Tags") or []:
        if not _tag_value_ok(tag["Value"]):
            where = _TAG_SOURCES.get(tag["Key"], f"tag {tag['Key']!r}")
            problems.append(
                f"{where}: {tag['Value']!r} cannot be a SageMaker tag value (letters, digits, spaces and "
                f"_ . : / = + - @ only, at most {TAG_VALUE_MAX} characters); start the execution with a name "
                f"made of those"
                if tag["Key"] == "stabilizer:execution"
                else f"{where}: {tag['Value']!r} cannot be a SageMaker tag value"
            )
    return problems


_QUOTA_NAME = re.compile(r"service limit '([^']+)'")


def quota_advice(message: str) -> str:
    """What to do about SageMaker's ResourceLimitExceeded `message`, naming the quota it names.

    SageMaker's message reads "The account-level service limit '<quota>' is N Instances, with
    current utilization of M Instances and a request delta of K Instances. Please use AWS Service
    Quotas to request an increase for this quota." Quotas are raised in the Service Quotas console
    (service "Amazon SageMaker"); they do not come back by waiting, so the launch is not retried.
    """
    found = _QUOTA_NAME.search(message or "")
    quota = f"the SageMaker quota {found.group(1)!r}" if found else "a SageMaker account quota"
    return (
        f"{quota} is used up: request an increase in Service Quotas (service Amazon SageMaker), "
        "stop the account's other jobs that use it, or start the execution with a job.instance_type "
        "you have quota for"
    )
