"""What the evidence of one attempt says: the verdict of a job no rule stopped, and findings read
from the losses where no rule fired.

Pure: it reads an `Observation` (DescribeTrainingJob plus findings.json, its `summary` above all)
and the state's `Watched` record, and returns outcomes, reasons and findings. It never decides a
remedy (stabilizer_workflow.remedies.policy) nor what the execution does next (stabilizer_workflow.monitoring.monitor).

The rules (docs/contracts.md, "Outcomes"):

* **succeeded** needs positive evidence: a summary; the sentinel observed at least one step and its
  observed plus skipped steps cover every step the job took; the last loss is finite; the run
  learned, or, started from a trained state, ended no worse than it started (by the learning
  check's margin); and the job's own loss lines (the second channel) never printed a non-finite
  loss.
* no summary: **unwatched**; a summary with too little in it: **unverified**; each says what is
  missing.
* a non-finite or diverged loss seen anywhere (the summary, the log lines, the loss metric's final
  value, a failed job's last losses) is an explosion, answered by the policy as one: the finding
  it returns is `Diverging`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stabilizer_workflow.evidence.observation import Observation
from stabilizer_workflow.evidence.sentinel_files import Summary, SummaryObjective, finite, nonfinite
from stabilizer_workflow.execution.state import Attempt, Finding, Watched

# The sentinel's Diverging check: a loss ten times where the run started (docs/contracts.md, 3).
DIVERGING_FACTOR = 10.0
# The learning check's margin (docs/contracts.md, 3): a loss 5 % under its start has learned; a
# run resumed from a trained state that ends more than 5 % above where it started has degraded,
# and a loss 5 % above its start is climbing.
MARGIN = 0.05
# Windows of the learning check: losses are averaged over 5 steps before they are compared.
WINDOW = 5
# The same words wherever the workflow says that nothing watched a job.
UNWATCHED = "the script never called watch() and the launcher never attached; set job.integration to launcher"


@dataclass(frozen=True)
class Verdict:
    """An outcome with its one-line reason, or an explosion (`finding`) for the policy to remedy."""

    outcome: str | None
    reason: str
    finding: Finding | None = None


def _g(value: float | str | None) -> str:
    number = finite(value)
    return f"{number:.4g}" if number is not None else str(value)


def watched(obs: Observation) -> Watched | None:
    return obs.summary.watched() if obs.summary is not None else None


def _diverging(message: str, *, step: int | None, value: str | None, source: str) -> Finding:
    return Finding(rule="Diverging", step=step, value=value, message=message, source=source)  # type: ignore[arg-type]


def explosion_in_logs(obs: Observation, loss_metric: str | None) -> Finding | None:
    """A non-finite loss printed by the job itself: its loss lines (`log_loss`) or the final value
    of its loss metric in DescribeTrainingJob. Either is an explosion, whoever watched the hooks (the
    sentinel leaves out of ``log_loss`` a number printed after a step its hooks read finite)."""
    summary = obs.summary
    log = summary.log_loss if summary is not None else None
    if log is not None and log.exploded:
        where = f" at step {log.nonfinite_step}" if log.nonfinite_step is not None else ""
        value = str(log.last) if nonfinite(log.last) else "non-finite"
        return _diverging(
            f"the job's own loss lines printed a {value} loss{where}",
            step=log.nonfinite_step, value=value, source="log",
        )
    if loss_metric and loss_metric in obs.final_metrics and not math.isfinite(obs.final_metrics[loss_metric]):
        value = str(obs.final_metrics[loss_metric])
        return _diverging(
            f"the final value of the loss metric {loss_metric} in DescribeTrainingJob is {value}",
            step=None, value=value, source="log",
        )
    return None


def crash_diagnosis(obs: Observation) -> Finding | None:
    """A job that failed (not a rule stop): was its loss blowing up before it died?

    The summary's last loss non-finite, or at least `DIVERGING_FACTOR` times its first (or best)
    loss, is a divergence whatever error ended the script (an overflow, a NaN check of its own).
    """
    summary = obs.summary
    if summary is None:
        return None
    crash = f" before the job failed ({summary.exception})" if summary.exception else " before the job failed"
    last = summary.last_loss
    if nonfinite(last):
        return _diverging(f"the loss was {last}{crash}", step=summary.last_step, value=str(last), source="summary")
    start = finite(summary.first_loss) or finite(summary.best_loss)
    end = finite(last)
    if start is not None and end is not None and start > 0 and end >= DIVERGING_FACTOR * start:
        return _diverging(
            f"the loss rose from {_g(start)} to {_g(end)} ({end / start:.0f}x){crash}",
            step=summary.last_step, value=_g(end), source="summary",
        )
    return None


def _window_means(history: list[tuple[int, float | str | None]]) -> tuple[float, float] | None:
    values = [finite(value) for _, value in history]
    if any(value is None for value in values):
        return None
    numbers = [v for v in values if v is not None]
    if len(numbers) < 2:
        return None
    width = min(WINDOW, len(numbers) // 2) or 1
    return sum(numbers[:width]) / width, sum(numbers[-width:]) / width


def _history_rise(history: list) -> tuple[str, str] | None:
    if any(nonfinite(value) for _, value in history):
        first = next((finite(v) for _, v in history if finite(v) is not None), None)
        last = next(str(v) for _, v in history if nonfinite(v))
        return (_g(first) if first is not None else "?"), last
    means = _window_means(history)
    if means and means[1] > means[0] * (1 + MARGIN):
        return _g(means[0]), _g(means[1])
    return None


def loss_rise(seen: Watched | None, history: list | None = None) -> tuple[str, str] | None:
    """(from, to) when the loss climbed over the attempt, else None.

    From the finding's loss history when it holds enough (first and last 5-step windows; a
    non-finite value is a climb), and from the summary's first and last losses: either is a climb.
    The history holds the last steps before the finding only, so a loss that climbed earlier and
    stayed up shows in the summary alone; reading one channel when the other says it climbed would
    call one attempt two things (the monitor reads the history, the policy the summary), and size
    its next rate from evidence that left out the rate it failed at. Climbing: the end more than the
    learning check's margin above the start.
    """
    if history and (_window_means(history) or any(nonfinite(value) for _, value in history)):
        rise = _history_rise(history)
        if rise is not None:
            return rise
    if seen is None or seen.first_loss is None or seen.last_loss is None:
        return None
    if nonfinite(seen.last_loss):
        return _g(seen.first_loss), str(seen.last_loss)
    end = finite(seen.last_loss)
    if end is not None and end > seen.first_loss * (1 + MARGIN):
        return _g(seen.first_loss), _g(end)
    return None


def rediagnose(finding: Finding, seen: Watched | None, history: list | None = None) -> Finding:
    """VanishingGradient is never the diagnosis while the loss climbs: tiny gradients beside a rising
    loss are a saturated, diverging network, and raising its learning rate makes it worse."""
    if finding.rule != "VanishingGradient":
        return finding
    rise = loss_rise(seen, history)
    if rise is None:
        return finding
    return finding.model_copy(
        update={
            "rule": "Diverging",
            "message": f"VanishingGradient fired while the loss rose from {rise[0]} to {rise[1]}: a climbing "
            "loss is a divergence, not vanishing gradients",
        }
    )


def told_only(finding: Finding, seen: Watched | None) -> bool:
    """A notice, not a failure: VanishingGradient reported by the sentinel without a stop in a run whose
    loss learned (a tensor whose gradient vanished while the rest trained: converged or saturated), or a
    finding the sentinel told because the script meant it (``told``: a rate range test's blow-up, a
    search's trial; the run is judged afresh after it). The sentinel does not stop such a run
    (docs/rules.md); it ends on the evidence, the notice named."""
    if finding.source != "sentinel" or finding.action != "notify":
        return False
    return finding.told is not None or (finding.rule == "VanishingGradient" and seen is not None
                                        and seen.learned is True)


def told_why(finding: Finding) -> str:
    """The words a notice (``told_only``) is named with in an attempt's ending."""
    return finding.told or "a tensor's gradient vanished while the loss learned"


def has_learned(seen: Watched | None) -> bool:
    """The summary says the run learned: the learning check's word, else its best loss 5 % under its first."""
    if seen is None:
        return False
    if seen.learned is not None:
        return seen.learned
    return seen.first_loss is not None and seen.best_loss is not None and (
        seen.best_loss < seen.first_loss * (1 - MARGIN)
    )


def judge_completed(obs: Observation, attempt: Attempt) -> Verdict:
    """The verdict of a job that completed with no finding: the summary must earn `succeeded`."""
    summary = obs.summary
    n = attempt.number
    if summary is None:
        return Verdict("unwatched", f"attempt {n} completed unwatched: {UNWATCHED}")
    by = f" (watched by the {summary.integration})" if summary.integration else ""
    taken, observed, skipped = summary.steps_taken, summary.steps_observed or 0, summary.steps_skipped or 0
    of = f" of {taken} taken" if taken is not None else ""
    if observed <= 0:
        return Verdict("unverified", f"attempt {n} completed{by} but the sentinel checked no step{of}")
    if summary.watching_failed:
        # The watcher's own code failed and stood aside: the rest of the run went unwatched, whatever its loss did.
        return Verdict("unverified", f"attempt {n} completed{by} but the watcher failed after {observed} steps "
                                     f"checked{of} ({summary.watching_failed}) and the rest ran unwatched")
    if summary.ended == "interrupted":
        # A run cut short (a signal) is not a finished run, whatever its loss did so far.
        cut = f"({observed} steps checked{of})"
        return Verdict("unverified", f"attempt {n} completed{by} but its summary says it was interrupted {cut}")
    if taken is not None and observed + skipped < taken:
        return Verdict(
            "unverified",
            f"attempt {n} completed{by} but the sentinel checked {observed} steps ({skipped} skipped) of "
            f"{taken} taken; the rest ran unchecked",
        )
    return _by_the_loss(summary, f"attempt {n} completed{by}", f"{observed} steps checked" + (
        f", {skipped} skipped" if skipped else ""))


def _deciding_objective(summary: Summary) -> SummaryObjective | None:
    """The job's objective metric where it set the summary's ``learned``: where the loss left it open, or against a
    loss that learned while the objective never improved (stabilizer_sentinel.summary.RunRecord.summary)."""
    objective = summary.objective
    return objective if objective is not None and objective.decided and summary.learned is not None else None


def _without_the_loss(summary: Summary, ended: str, steps: str) -> Verdict:
    """A completed job watched over every step whose loss does not decide: its objective metric where that did
    (``_by_the_objective``); else where no loss was seen, idle at every step (its loss and gradients exactly 0,
    ``steps_idle``: nothing trained, and no remedy would change that), or unverified."""
    objective = _deciding_objective(summary)
    if objective is not None:
        return _by_the_objective(summary, objective.says, ended, steps)
    if summary.steps_idle and summary.steps_idle >= (summary.steps_observed or 0):
        return Verdict("did_not_learn", f"{ended} but its loss and gradients were exactly 0 at every one of its "
                                        f"{steps}: nothing trained (a loss multiplied by 0, a mask that left no "
                                        f"sample)")
    return Verdict("unverified", f"{ended} but no loss was seen in its {steps}")


def _by_the_objective(summary: Summary, says: str, ended: str, steps: str) -> Verdict:
    """A completed job whose objective metric said whether it learned (``_deciding_objective``), in ``says``."""
    if summary.learned:
        return Verdict("succeeded", f"{ended}: {steps}, {says}: learned")
    finding = Finding(rule="NotLearning", step=summary.last_step, message=f"the summary says {says}",
                      source="summary")
    return Verdict(None, finding.message, finding)


def _by_the_loss(summary: Summary, ended: str, steps: str) -> Verdict:
    """A completed job that was watched over every step: its losses decide."""
    if nonfinite(summary.last_loss):
        finding = _diverging(
            f"the last loss the sentinel saw is {summary.last_loss}",
            step=summary.last_step, value=str(summary.last_loss), source="summary",
        )
        return Verdict(None, finding.message, finding)
    last = finite(summary.last_loss)
    if last is None or _deciding_objective(summary) is not None:
        return _without_the_loss(summary, ended, steps)
    first = finite(summary.first_loss)
    trend = f"loss {_g(first)} -> {_g(last)}" if first is not None else f"last loss {_g(last)}"
    if summary.learned:
        how = f" ({summary.learned_by})" if summary.learned_by else ""
        return Verdict("succeeded", f"{ended}: {steps}, {trend}, learned{how}")
    if summary.started_from and first is not None:
        # Started from a trained state, a loss near where it started is no failure to learn.
        kept = last <= first * (1 + MARGIN)
        return Verdict(
            "succeeded" if kept else "did_not_learn",
            f"{ended}: {steps}, started from {summary.started_from}, {trend}, not degraded"
            if kept
            else f"{ended} but degraded from {summary.started_from}: {trend}, more than {MARGIN:.0%} worse",
        )
    if summary.learned is False:
        finding = Finding(
            rule="NotLearning", step=summary.last_step, message=f"the summary says the loss never fell ({trend})",
            source="summary",
        )
        return Verdict(None, finding.message, finding)
    why = f"; {summary.unjudged}" if summary.unjudged else ", too few losses seen to judge whether it learned"
    if summary.unjudged:
        why += f"; {summary.objective.says}" if summary.objective is not None else (
            "; job.objective can name a metric the script prints that says whether it learned")
    return Verdict("unverified", f"{ended}: {steps}, {trend}{why}")


def why_fresh(integration: str, attempt: Attempt) -> str | None:
    """Why a relaunch after `attempt` will NOT load a checkpoint handed to it; None when it will.

    It will when the attempt's summary says its integration restores (the launcher does for a
    network, not for a loop over bare tensors; the library when the script calls `guard.restore()`),
    or when the attempt itself loaded the checkpoint it was given; without a summary, only the
    launcher is known to.
    """
    seen = attempt.watched
    if seen is not None:
        if seen.restores or (seen.integration == "launcher" and seen.restores is None):
            return None
        if attempt.resumed_from and seen.started_from:
            return None
        if seen.restores is False:
            if seen.integration == "launcher":
                return "the launcher watched a loop over bare tensors, which it cannot load a checkpoint into"
            return "the script does not call guard.restore()"
    if integration == "launcher":
        return None
    return "no summary of the last attempt says its script loads a checkpoint"
