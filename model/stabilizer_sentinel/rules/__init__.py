"""Rules: the base class and registry (``base``), and the built-in rules by family.

``tensors``        ExplodingTensor, VanishingGradient, WeightUpdateRatio, AllZero, UnchangedTensor,
                   TensorVariance, PoorWeightInitialization
``training``       LossNotDecreasing, Overfit, Overtraining, StalledTrainingRule
``activations``    DeadRelu, SaturatedActivation
``classification`` ClassImbalance, Confusion, CheckInputImages
``system``         LowGPUUtilization, CPUBottleneck, IOBottleneck, OverallSystemUsage (system metrics)
``checks``         NotLearning, Diverging: thresholds of the sentinel's own checks, not rules of their own
``smdebug_compat`` smdebug's custom-rule API (``Rule``, ``invoke_rule``, ``create_trial``), so Debugger rules
                   run unchanged (``custom``'s ``CustomRule``); documented as ``stabilizer_sentinel.smdebug_compat``

Every built-in rule keeps Debugger's name, parameters and defaults as the rule catalogue
(``stabilizer_contract.catalogue``) lists them. Rules read tensors only through the Trial API, so they run
unchanged on a ``MemoryTrial`` in the job and on a store afterwards. This package must not stop
jobs or write files.

It stands on capture/ (the Trial API, the profiler's samples) and ``summary``; the detection and
integration subpackages import it, never the other way round.
"""

from stabilizer_contract.catalogue import RuleConfigError
from stabilizer_sentinel.rules.activations import DeadRelu, SaturatedActivation
from stabilizer_sentinel.rules.base import (
    RULES,
    Rule,
    RuleFinding,
    RuleSpec,
    parse_rule,
    parse_rule_list,
    register_rule,
    rule_parameters,
)
from stabilizer_sentinel.rules.checks import Diverging, NotLearning
from stabilizer_sentinel.rules.classification import CheckInputImages, ClassImbalance, Confusion
from stabilizer_sentinel.rules.custom import CustomRule
from stabilizer_sentinel.rules.system import CPUBottleneck, IOBottleneck, LowGPUUtilization, OverallSystemUsage
from stabilizer_sentinel.rules.tensors import (
    AllZero,
    ExplodingTensor,
    PoorWeightInitialization,
    TensorVariance,
    UnchangedTensor,
    VanishingGradient,
    WeightUpdateRatio,
)
from stabilizer_sentinel.rules.training import LossNotDecreasing, Overfit, Overtraining, StalledTrainingRule

__all__ = [
    "RULES",
    "AllZero",
    "CPUBottleneck",
    "CheckInputImages",
    "ClassImbalance",
    "Confusion",
    "CustomRule",
    "DeadRelu",
    "Diverging",
    "ExplodingTensor",
    "IOBottleneck",
    "LossNotDecreasing",
    "LowGPUUtilization",
    "NotLearning",
    "OverallSystemUsage",
    "Overfit",
    "Overtraining",
    "PoorWeightInitialization",
    "Rule",
    "RuleConfigError",
    "RuleFinding",
    "RuleSpec",
    "SaturatedActivation",
    "StalledTrainingRule",
    "TensorVariance",
    "UnchangedTensor",
    "VanishingGradient",
    "WeightUpdateRatio",
    "parse_rule",
    "parse_rule_list",
    "register_rule",
    "rule_parameters",
]
