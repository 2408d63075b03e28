"""The out-of-job rule evaluator: follow a tensor store while a job writes it, evaluate rules step by
step as Debugger's rule container does, and report Debugger-shaped statuses to a status file.

Local mode runs it next to each training job to emulate ``DebugRuleEvaluationStatuses``::

    cd model && python -m stabilizer_sentinel.evaluator --tensors DIR_OR_S3_URI --rules JSON_OR_@FILE \\
        --status-file FILE [--poll-seconds 1] [--idle-timeout 0]

Command line, status-file format and exit codes are defined in docs/contracts.md section 6.
It reads the store and writes only the status file; it never touches the training job.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stabilizer_sentinel.capture import store
from stabilizer_sentinel.capture.trial import FileTrial, create_trial
from stabilizer_sentinel.rules import Rule, RuleConfigError, parse_rule_list

IN_PROGRESS = "InProgress"
NO_ISSUES = "NoIssuesFound"
ISSUES = "IssuesFound"
ERROR = "Error"
STOPPED = "Stopped"
FINAL = {NO_ISSUES, ISSUES, ERROR, STOPPED}
EXIT_OK = 0
EXIT_BAD_CONFIG = 2


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class RuleStatus:
    name: str
    status: str = IN_PROGRESS
    details: str = ""
    modified: str = ""
    step: int | None = None

    def set(self, status: str, details: str = "", step: int | None = None) -> None:
        self.status, self.details, self.modified, self.step = status, details, _now(), step

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "RuleConfigurationName": self.name,
            "RuleEvaluationStatus": self.status,
            "LastModifiedTime": self.modified,
        }
        if self.details:
            out["StatusDetails"] = self.details
        return out


def _condition_met(status: RuleStatus, rule: Rule, step: int | None) -> None:
    """Debugger's wording for a rule that fired, with the rule's own finding after it."""
    detail = rule.finding.message if rule.finding else ""
    status.set(
        ISSUES,
        f"RuleEvaluationConditionMet: Evaluation of the rule {status.name} at step {step} "
        f"resulted in the condition being met. {detail}".strip(),
        step,
    )


def configuration_names(names: list[str]) -> list[str]:
    """Debugger needs unique configuration names: a repeated rule gets ``-2``, ``-3``, ..."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


class Evaluator:
    """Follows one store; ``poll()`` evaluates everything new and says whether evaluation is over."""

    def __init__(self, trial: FileTrial, rules: list[Rule], names: list[str], status_file: Path) -> None:
        self.trial = trial
        self.rules = rules
        self.statuses = [RuleStatus(name, modified=_now()) for name in names]
        self.status_file = status_file
        self.done_steps: set[tuple[int, str]] = set()
        self.last_step: int | None = None
        self.last_progress = time.monotonic()
        self.write()

    def write(self) -> None:
        store.write_json_atomic(
            self.status_file,
            {
                "DebugRuleEvaluationStatuses": [status.as_json() for status in self.statuses],
                "last_step": self.last_step,
                "loaded_all_steps": self.trial.loaded_all_steps,
            },
        )

    def _active(self) -> list[tuple[Rule, RuleStatus]]:
        return [(r, s) for r, s in zip(self.rules, self.statuses, strict=True) if s.status not in FINAL]

    def poll(self) -> bool:
        self.trial.refresh()
        ended = self.trial.loaded_all_steps
        new = sorted({(step, mode) for mode in store.MODES for step in self.trial.steps(mode)} - self.done_steps)
        changed = False
        for step in sorted({step for step, _ in new}):
            for rule, status in self._active():
                try:
                    fired = rule.invoke_at_step(step)
                except Exception as exc:
                    status.set(ERROR, f"ClientError: rule {status.name} raised {exc!r} at step {step}", step)
                    changed = True
                    continue
                if fired:
                    _condition_met(status, rule, step)
                    changed = True
            self.last_step = step
        if new:
            self.done_steps.update(new)
            self.last_progress = time.monotonic()
            changed = True
        if not new and not ended:
            changed |= self._idle(time.monotonic() - self.last_progress)
        if ended:
            for rule, status in self._active():
                why = rule.unmatched()  # a rule that never saw its tensors says so, never "no issues"
                if why is not None:
                    status.set(ERROR, f"ClientError: {why}", self.last_step)
                else:
                    skipped = rule.not_judged()  # part of the rule's check had nothing to judge: said
                    status.set(NO_ISSUES, f"No issue found up to step {self.last_step} ({self.trial.end_status})"
                               + (f"; {skipped}." if skipped else "."))
                changed = True
        if changed:
            self.write()
        return ended or not self._active()

    def _idle(self, seconds: float) -> bool:
        """Rules about time (StalledTrainingRule) are asked while no new step arrives."""
        changed = False
        for rule, status in self._active():
            try:
                fired = rule.invoke_idle(seconds, self.last_step)
            except Exception as exc:
                status.set(ERROR, f"ClientError: rule {status.name} raised {exc!r}", self.last_step)
                changed = True
                continue
            if fired:
                _condition_met(status, rule, self.last_step)
                changed = True
        return changed

    def finish(self, status: str, details: str) -> None:
        for _, each in self._active():
            each.set(status, details)
        self.write()


def _load_rules(text: str) -> Any:
    if text.startswith("@"):
        return json.loads(Path(text[1:]).read_text())
    return json.loads(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stabilizer_sentinel.evaluator", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--tensors", required=True, help="tensor store: a directory or s3://bucket/prefix")
    parser.add_argument("--rules", required=True, help="rule list as JSON, or @file holding it")
    parser.add_argument("--status-file", required=True, type=Path, help="where statuses are written (JSON)")
    parser.add_argument("--poll-seconds", type=float, default=1.0, help="seconds between looks at the store")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=0.0,
        help="give up (status Error) after this long without new steps or end marker; 0 waits forever",
    )
    args = parser.parse_args(argv)

    raw: Any = None
    try:
        raw = _load_rules(args.rules)
        specs = parse_rule_list(raw)
        trial = create_trial(args.tensors)
        rules = [spec.build(trial) for spec in specs]
    except (RuleConfigError, ValueError, TypeError, OSError) as exc:
        # json.JSONDecodeError is a ValueError; a rule refusing its parameters raises one of these.
        items = raw if isinstance(raw, list) else []
        names = [
            str(item.get("name") or item.get("RuleConfigurationName") or "?") if isinstance(item, dict) else "?"
            for item in items
        ]
        statuses = [RuleStatus(name) for name in configuration_names(names or ["RuleList"])]
        for status in statuses:
            status.set(ERROR, f"ClientError: {exc}")
        store.write_json_atomic(
            args.status_file,
            {
                "DebugRuleEvaluationStatuses": [s.as_json() for s in statuses],
                "last_step": None,
                "loaded_all_steps": False,
            },
        )
        print(f"evaluator: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG

    evaluator = Evaluator(trial, rules, configuration_names([spec.name for spec in specs]), args.status_file)

    stopping = {"flag": False}

    def on_signal(_signum: int, _frame: Any) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while True:
        if evaluator.poll():
            return EXIT_OK
        if stopping["flag"]:
            evaluator.poll()
            evaluator.finish(STOPPED, f"Stopped by request after step {evaluator.last_step}.")
            return EXIT_OK
        if args.idle_timeout and time.monotonic() - evaluator.last_progress > args.idle_timeout:
            evaluator.finish(
                ERROR,
                f"ClientError: no new tensors for {args.idle_timeout:g} s and no end-of-job marker "
                f"(last step {evaluator.last_step}).",
            )
            return EXIT_OK
        time.sleep(args.poll_seconds)


if __name__ == "__main__":
    sys.exit(main())
