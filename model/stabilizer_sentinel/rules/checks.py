"""NotLearning and Diverging: rule-list entries that configure the sentinel's own checks.

The learning and divergence checks (``stabilizer_sentinel.detection.learning_check``) run in the job every step,
whatever the rule list, on the loss the sentinel sees. An entry named ``NotLearning`` or
``Diverging`` in the rule list does not add a rule: it carries the checks' thresholds, which
otherwise come from the run's own statistics (docs/rules.md, "The sentinel's own checks").
The objects built from these entries never fire; the sentinel reads their ``parameters``.

Names and defaults are in the catalogue (``stabilizer_contract.catalogue``), like every built-in rule's.
This module must not stop jobs or write files.
"""

from __future__ import annotations

from typing import Any

from stabilizer_sentinel.capture.trial import Trial
from stabilizer_sentinel.rules.base import Rule, register_rule


class _SentinelCheck(Rule):
    """A rule-list entry holding parameters of a sentinel check; evaluated at save steps, it never fires."""

    def __init__(self, base_trial: Trial, **parameters: Any) -> None:
        super().__init__(base_trial)
        self.parameters = parameters

    def invoke_at_step(self, step: int) -> bool:
        return False  # the sentinel runs the check itself, every step (stabilizer_sentinel.detection.learning_check)


@register_rule
class NotLearning(_SentinelCheck):
    """Thresholds of the learning check (finding ``NotLearning``); None means "from the run"."""

    def __init__(
        self,
        base_trial: Trial,
        *,
        window: int = 5,
        patience: int | None = None,
        min_decrease: float = 0.05,
        confidence: float = 3.0,
        patience_windows: int = 6,
        min_patience: int = 100,
        warmup_multiple: float = 1.0,
        run_fraction: float = 0.1,
        run_steps: int | None = None,
        infer_phase: bool = True,
        lr_rise: float = 1e-3,
    ) -> None:
        super().__init__(
            base_trial, window=window, patience=patience, min_decrease=min_decrease, confidence=confidence,
            patience_windows=patience_windows, min_patience=min_patience, warmup_multiple=warmup_multiple,
            run_fraction=run_fraction,
            run_steps=run_steps, infer_phase=infer_phase, lr_rise=lr_rise,
        )


@register_rule
class Diverging(_SentinelCheck):
    """Thresholds of the divergence check (finding ``Diverging``); None means "from the run"."""

    def __init__(
        self,
        base_trial: Trial,
        *,
        spreads: float = 9.0,
        noise_spreads: float = 3.0,
        persistence: int = 3,
        jump_spreads: float = 90.0,
        thrown_spreads: float = 3.0,
        relapse_spreads: float = 1.0,
        rising: float = 0.5,
        baseline: float | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__(
            base_trial, spreads=spreads, noise_spreads=noise_spreads, persistence=persistence,
            jump_spreads=jump_spreads, thrown_spreads=thrown_spreads,
            relapse_spreads=relapse_spreads, rising=rising,
            baseline=baseline, scale=scale,
        )
