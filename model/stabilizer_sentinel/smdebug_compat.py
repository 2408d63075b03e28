"""The documented import path of smdebug's API over the rule engine (docs/rules.md, docs/debugger.md)::

    from stabilizer_sentinel.smdebug_compat import create_trial

It lives in stabilizer_sentinel.rules.smdebug_compat; this module only re-exports its public names.
"""

from stabilizer_sentinel.rules.smdebug_compat import (
    EVAL,
    GLOBAL,
    PREDICT,
    REDUCTION_NAMES,
    TRAIN,
    ModeKeys,
    NoMoreData,
    Rule,
    RuleEvaluationConditionMet,
    SMDebugError,
    SmdebugTensor,
    SmdebugTrial,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
    as_smdebug_trial,
    create_trial,
    invoke_once,
    invoke_rule,
    load_rule,
    reduce,
)

__all__ = [
    "EVAL",
    "GLOBAL",
    "PREDICT",
    "REDUCTION_NAMES",
    "TRAIN",
    "ModeKeys",
    "NoMoreData",
    "Rule",
    "RuleEvaluationConditionMet",
    "SMDebugError",
    "SmdebugTensor",
    "SmdebugTrial",
    "StepUnavailable",
    "TensorUnavailable",
    "TensorUnavailableForStep",
    "as_smdebug_trial",
    "create_trial",
    "invoke_once",
    "invoke_rule",
    "load_rule",
    "reduce",
]
