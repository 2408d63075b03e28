"""The calibration benchmark: every run of the corpus (`tests/corpus`, read by `stabilizer.bench.corpus`)
through local mode with both policies, judged against the outcome written beside it.

    python -m stabilizer.bench --corpus                         # every run, both policies
    python -m stabilizer.bench --corpus --kinds rnn_lm,gan --jobs 2 --json corpus.json
    python -m stabilizer.bench --corpus --runs gan-healthy-lr0.002 --policy default
    python -m stabilizer.bench --corpus --policy default --recovery both   # in the job and relaunched, side by side
    python -m stabilizer.bench --corpus --policy default --healthy-seeds 3  # healthy runs at 3 seeds each
    python -m stabilizer.bench --corpus --policy default --healthy-seeds 3 --failing-seeds 3  # and failing runs
    python -m stabilizer.bench --corpus --policy default --healthy-seeds 3 --length 4  # every run 4 times as long

Each (run, policy) is one execution through the real local workflow: the project's ASL in moto's
interpreter, the Lambdas in process, the user's script as a real local training job. Per policy it
counts, per kind and in total:

- false positives: a healthy run stopped or relaunched, or not ending with its expected outcome;
- false negatives: a failing run whose first attempt is called healthy, one that ends `succeeded`
  in a single attempt, or one that no declared knob can fix ending `succeeded`;
- misdiagnoses: a failing first attempt called the wrong failure (diverged for did_not_learn or the
  reverse), or a relaunch moving a hyperparameter against the direction the manifest gives;
- attempts, and steps: computed in all attempts and wasted (computed but not in the lineage of the
  final model; every step when the execution ended without one, or when a failing run's model was
  called healthy), counted from the step numbers of the script's own log lines (the manifest's
  `step_regex`; a script that logs every k-th step is counted to within k steps an attempt).

then lists every false positive, false negative and misdiagnosis by run name, and the recovered
quality: each failing run that ended `succeeded`, where its final model ended (the loss the script
prints for it on a fixed set after training, the manifest's `final_regex`; the last window's mean
and the last step's loss beside it) over where a healthy run of the same script and setting ended.
With `--healthy-seeds N` each healthy run also runs at N-1 other seeds (`<run>@seed<k>`, judged as
healthy runs too): the reference is then the median of its seeds, and the count within the range
they ended in follows, for a target finer than a healthy run's own spread cannot be met. With
`--failing-seeds N` each failing run also runs at N-1 other seeds (judged as failing runs, against its
manifest's expectations): the count of failing runs within 10 % by the median of their seeds follows,
for one draw of a recovered run is as noisy as one of a healthy run. With
`--length K` every run trains K times as long (the hyperparameter its manifest names as `length`, healthy
and failing runs alike, so each is still read against a healthy run of its own length): a rollback's lost
and probed steps are a fixed cost, a large part of these short runs and a small one of a long run, and
the recovered quality at K > 1 tells that cost apart from the rate the job went on at. Only that
hyperparameter grows: a warm-up's steps do not (`late_divergence` warms up for 200 of 240 steps, and of
960 at K = 4, so its divergence comes at the same step, early in the longer run). The manifests'
expected outcomes were written for their own length. Figures are
measured; `tests/e2e/test_corpus_slice.py` runs a few runs through this code and asserts each against
its manifest.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from itertools import pairwise
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from stabilizer.bench.corpus import SUCCESS, Expect, Run, load, select

POLICIES = ("default", "original")
# A policy label with this suffix runs with job.recovery relaunch (every remedy a new job); without it,
# the workflow's own choice (in the job where the remedy allows, stabilizer_workflow.remedies.in_job).
RELAUNCHED = ":relaunch"


def ways(policies: list[str], recovery: str) -> list[str]:
    """The policy labels to run: each policy, in the job and/or relaunched (`recovery`: in_job, relaunch, both);
    the original policy always relaunches, so it runs once."""
    labels = []
    for policy in policies:
        if recovery in ("in_job", "both") or policy == "original":
            labels.append(policy)
        if recovery in ("relaunch", "both") and policy != "original":
            labels.append(policy + RELAUNCHED)
    return labels
# What the first attempt is called from the rule of its finding, on code whose attempts carry no
# outcome of their own.
RULE_CALLS = {
    "ExplodingTensor": "diverged", "Diverging": "diverged",
    "NotLearning": "did_not_learn", "LossNotDecreasing": "did_not_learn", "VanishingGradient": "did_not_learn",
    "Overfit": "stopped_early",
}
# A recovered run is as good as a healthy one when its final loss is at most this times the healthy run's.
QUALITY_WITHIN = 1.1
# A healthy run again at another seed (--healthy-seeds): "<run>@seed<k>", judged as a healthy run and, for
# the recovered quality, one draw more of where the healthy setting ends.
SEEDED = "@seed"
# The quality measures, best first: the final model's loss on a fixed set (the script prints it), the
# mean of the last window of training losses, the last step's loss.
MEASURES = (("final evaluation", "final_eval"), ("last window", "final_window"), ("last step", "final_loss"))
# Calls that say the failure went unseen.
UNDETECTED = ("unwatched", "unverified", "none")


@dataclass
class Result:
    run: str
    kind: str
    policy: str
    healthy: bool
    outcome: str
    attempts: int
    first_call: str
    steps_computed: int
    wasted_steps: int
    wall_seconds: float
    changes: list[dict[str, list[Any]]] = field(default_factory=list)  # per relaunch: hyperparameter -> [old, new]
    false_positive: str = ""  # why, when it is one
    false_negative: str = ""
    misdiagnosis: str = ""
    outcome_met: bool = False  # judged entirely right: the expected outcome, and no FP, FN or misdiagnosis
    run_dir: str = ""
    detection_step: int | None = None  # the step of the first attempt's finding (or rollback), when it had one
    rollbacks: int = 0  # in-job rollbacks over all attempts (job.recovery in_job)
    rate_rollbacks: int = 0  # of those, the ones that lowered the rates (not a batch the same rate trained past)
    rolled_back_steps: int = 0  # their steps lost and probed: computed, not in the final model
    final_loss: float | None = None  # the last attempt's last loss the sentinel saw (its summary)
    final_window: float | None = None  # the mean of its last window of losses (the summary's last_window_loss)
    final_eval: float | None = None  # the loss of its final model on a fixed set, as the script printed it
    reason: str = ""  # the execution's reason, as the workflow gave it
    setting: str = ""  # its hyperparameters but those its knobs set (``setting``): the script's configuration
    # A failing run whose fault a lower rate fixes (``lower_rate_fixes``): issue 26's target for recovered quality.
    lower_rate_fixes: bool = True


# ---------------------------------------------------------------------------- reading one execution
def attempt_call(attempt: dict[str, Any]) -> str:
    """What the workflow called an attempt: its own outcome when it has one, else its first rollback's
    class (the job answered a finding itself, job.recovery in_job), else its finding's class."""
    if attempt.get("outcome"):
        return str(attempt["outcome"])
    rollbacks = attempt.get("rollbacks") or []
    if rollbacks:
        return RULE_CALLS.get(rollbacks[0].get("rule"), f"finding {rollbacks[0].get('rule')}")
    rule = (attempt.get("finding") or {}).get("rule")
    if rule:
        return RULE_CALLS.get(rule, f"finding {rule}")
    decision = attempt.get("decision") or {}
    if decision.get("outcome") and decision["outcome"] not in SUCCESS:
        return str(decision["outcome"])
    if attempt.get("status") == "Failed":
        return "failed"
    return "succeeded"


def logged_steps(log: str, step_regex: str) -> tuple[int, int] | None:
    """(first, last) step number the script logged; None when it logged none. A regex with no group
    matches a line the script prints once a step (and no step number): each match counts one step."""
    matches = list(re.finditer(step_regex, log, flags=re.MULTILINE))
    if not matches:
        return None
    if re.compile(step_regex).groups == 0:
        return (0, len(matches) - 1)
    steps = [int(m.group(1)) for m in matches]
    return (min(steps), max(steps))


def changes_between(attempts: list[dict[str, Any]]) -> list[dict[str, list[Any]]]:
    """For each relaunch, the hyperparameters that moved: name -> [old, new]."""
    moved = []
    for before, after in pairwise(attempts):
        old, new = before.get("run_spec") or {}, after.get("run_spec") or {}
        moved.append({k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)})
    return moved


def _healthy_run_disturbed(result: Result, expected: tuple[str, ...] | list[str]) -> str:
    """Why a healthy run's result is a false positive, or "" when it is none."""
    if result.attempts != 1:
        return f"{result.attempts} attempts (first called {result.first_call})"
    if result.rollbacks:
        return f"rolled back {result.rollbacks} time(s) in the job (first called {result.first_call})"
    if result.outcome not in expected:
        return f"ended {result.outcome}"
    return ""


def judge(run: Run, result: Result) -> Result:
    """Fill the false positive / false negative / misdiagnosis columns from the manifest."""
    expect = run.expect
    if run.healthy:
        result.false_positive = _healthy_run_disturbed(result, expect.outcome)
        result.outcome_met = not result.false_positive
        return result
    if result.first_call in (*SUCCESS, *UNDETECTED) and result.first_call not in expect.first_attempt:
        result.false_negative = f"first attempt called {result.first_call}"
    elif result.outcome == "succeeded" and result.attempts == 1 and not result.rollbacks:
        result.false_negative = "succeeded in one attempt, nothing found"
    elif result.outcome == "succeeded" and "succeeded" not in outcomes(expect, result) and not result.rollbacks:
        result.false_negative = f"ended succeeded after {result.attempts} attempts; no declared knob fixes it"
    wrong = []
    if not result.false_negative and result.first_call not in expect.first_attempt:
        wrong.append(f"first attempt called {result.first_call}, expected {'/'.join(expect.first_attempt)}")
    rates = _rates(run)
    result.lower_rate_fixes = lower_rate_fixes(run)
    for name in sorted(rates):  # a rollback that did not trust its own rate lowered it
        if result.rate_rollbacks and expect.remedy.get(name) in ("up", "keep"):
            wrong.append(f"rolled back {result.rate_rollbacks} time(s) to lower rates in the job, "
                         f"expected {name} {expect.remedy[name]}")
    for number, moved in enumerate(result.changes, start=2):
        for name, (old, new) in moved.items():
            direction = expect.remedy.get(name)
            if direction is None or not all(isinstance(v, int | float) for v in (old, new)):
                continue
            if (direction == "down" and new > old) or (direction == "up" and new < old) or (
                    direction == "keep" and new != old):
                wrong.append(f"attempt {number}: {name} {old} -> {new}, expected {direction}")
    result.misdiagnosis = "; ".join(wrong)
    met = result.outcome in outcomes(expect, result)
    result.outcome_met = met and not (result.false_negative or result.misdiagnosis)
    return result


def _rates(run: Run) -> set[str]:
    """The hyperparameters the run's learning-rate knobs set."""
    knobs = run.job.get("knobs") or {}
    return {knob.get("hyperparameter") for role, knob in knobs.items() if role.endswith("learning_rate")}


def lower_rate_fixes(run: Run) -> bool:
    """Whether a failing run's fault is one a lower rate fixes: its manifest's remedy neither raises its rate (a
    rate too low) nor keeps it (a corrupt batch). A twin declaring no knob (``-noknobs``) shares its base's fault."""
    return not any(run.expect.remedy.get(name) in ("up", "keep") for name in _rates(run))


def outcomes(expect: Expect, result: Result) -> tuple[str, ...]:
    """The outcomes the run may end with: ``outcome_in_job`` where the job rolled back inside itself
    (it lowers its own rate, knob or none), else ``outcome``."""
    return expect.outcome_in_job if result.rollbacks and expect.outcome_in_job is not None else expect.outcome


def final_evaluation(log: str, final_regex: str) -> float | None:
    """The last loss the script printed for its final model (``final_regex``'s group); None without one."""
    if not final_regex:
        return None
    matches = re.findall(final_regex, log, flags=re.MULTILINE)
    try:
        value = float(matches[-1]) if matches else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def reseeded(run: Run, seed: int) -> Run:
    """``run`` at another ``seed`` hyperparameter, named ``<run>@seed<k>``."""
    hyperparameters = {**run.job.get("hyperparameters", {}), "seed": seed}
    return replace(run, name=f"{run.name}{SEEDED}{seed}", job={**run.job, "hyperparameters": hyperparameters})


def with_seeds(runs: list[Run], count: int, failing: int = 1) -> list[Run]:
    """``runs``, then each healthy one that takes a ``seed`` hyperparameter again at its next ``count - 1``
    seeds, and each failing one at its next ``failing - 1``."""
    for option, value in (("--healthy-seeds", count), ("--failing-seeds", failing)):
        if value < 1:
            raise ValueError(f"{option}: expected a whole number >= 1, got {value}")
    more = [reseeded(run, int(run.job["hyperparameters"]["seed"]) + k) for run in runs
            if isinstance(run.job.get("hyperparameters", {}).get("seed"), int)
            for k in range(1, count if run.healthy else failing)]
    return [*runs, *more]


def stretched(runs: list[Run], factor: int) -> list[Run]:
    """``runs``, each trained ``factor`` times as long (its manifest's ``length`` hyperparameter times
    ``factor``); ValueError, before anything runs, where ``factor`` is not a whole number >= 1 or a run's
    kind names no ``length``."""
    if not isinstance(factor, int) or factor < 1:
        raise ValueError(f"--length: expected a whole number >= 1, got {factor}")
    if factor == 1:
        return runs
    if unnamed := sorted({run.kind for run in runs if not run.length}):
        raise ValueError(f"--length: the manifest of {', '.join(unnamed)} names no length (the hyperparameter "
                         f"that sets how long a run trains)")
    out = []
    for run in runs:
        hyperparameters = run.job.get("hyperparameters", {})
        longer = {**hyperparameters, run.length: int(hyperparameters[run.length]) * factor}
        out.append(replace(run, job={**run.job, "hyperparameters": longer}))
    return out


def by_name(runs: list[Run], name: str, length: int = 1) -> Run:
    """The run of ``runs`` named ``name``, or of its base run at the seed it names (``with_seeds``), trained
    ``length`` times as long (``stretched``)."""
    base, _, seed = name.partition(SEEDED)
    [run] = stretched(select(runs, names=[base]), length)
    return reseeded(run, int(seed)) if seed else run


def _final_loss(attempts: list[dict[str, Any]]) -> float | None:
    last = ((attempts[-1].get("watched") or {}).get("last_loss")) if attempts else None
    return float(last) if isinstance(last, int | float) and math.isfinite(last) else None


def _reference(healthy: list[Result], attribute: str) -> list[float]:
    """Where the healthy runs ``healthy`` ended by ``attribute``: the values of the run (with its seeds,
    ``SEEDED``) whose median is lowest; [] when none has one."""
    runs: dict[str, list[float]] = {}
    for h in healthy:
        if (value := getattr(h, attribute)) is not None:
            runs.setdefault(h.run.partition(SEEDED)[0], []).append(value)
    return min(runs.values(), key=statistics.median) if runs else []


def quality_lines(results: list[Result]) -> list[str]:
    """Each failing run that ended succeeded: where it ended over where the best healthy run of the same
    script ended (the same kind, policy and ``setting``: its configuration, at settings of its knobs it
    takes), and how many are within 10 %: by the final model's loss on a fixed set where the script
    prints one (``final_eval``), by the last window's mean loss (``final_window``), and by the last
    step's loss. A healthy run run at several seeds (``--healthy-seeds``) is where its seeds' median ends,
    and the count within the range its seeds ended in follows; a failing run run at several seeds
    (``--failing-seeds``) is one line each, and the count by the median of each run's seeds follows. A run
    no healthy run shares a setting with is measured against its kind's (said on its line); so is every run
    of results kept before the setting was (all read as one). The count against the best healthy run of any
    setting of the kind follows, for comparison with those. Where some of them are runs no lower rate fixes (a
    rate too low, a corrupt batch: ``lower_rate_fixes``), the count of the others, issue 26's target, follows each
    measure's."""
    lines: list[str] = []
    ratios: dict[str, dict[str, list[float]]] = {}
    spread: dict[str, dict[str, list[bool]]] = {}
    of_kind: dict[str, dict[str, list[float]]] = {}
    seeds: dict[str, dict[str, dict[str, list[float]]]] = {}  # policy, measure, failing run: its seeds' ratios
    target: dict[str, dict[str, list[float]]] = {}  # the ratios of the runs a lower rate fixes (issue 26's target)
    for r in results:
        if r.healthy or r.outcome != "succeeded" or r.final_loss is None:
            continue
        kind = [h for h in results if h.healthy and h.kind == r.kind and h.policy == r.policy
                and h.outcome in SUCCESS]
        same = [h for h in kind if h.setting == r.setting]
        parts, alone = [], False
        for label, attribute in MEASURES:
            mine, theirs = getattr(r, attribute), _reference(same, attribute)
            if mine is None:
                continue
            if not theirs:  # no healthy run of its setting measured this: its kind's
                theirs, alone = _reference(kind, attribute), True
            if not theirs or (reference := statistics.median(theirs)) <= 0:
                continue
            ratio = mine / reference
            ratios.setdefault(r.policy, {}).setdefault(label, []).append(ratio)
            if r.lower_rate_fixes:
                target.setdefault(r.policy, {}).setdefault(label, []).append(ratio)
            seeds.setdefault(r.policy, {}).setdefault(label, {}).setdefault(r.run.partition(SEEDED)[0], []).append(
                ratio)
            drawn = ""
            if len(theirs) > 1:
                spread.setdefault(r.policy, {}).setdefault(label, []).append(mine <= max(theirs))
                drawn = f" (healthy at {len(theirs)} seeds {min(theirs):.4g}-{max(theirs):.4g})"
            parts.append(f"{label} {mine:.4g} / healthy {reference:.4g} = {ratio:.2f}{drawn}")
            if label != "last step" and (anyone := _reference(kind, attribute)) and statistics.median(anyone) > 0:
                of_kind.setdefault(r.policy, {}).setdefault(label, []).append(mine / statistics.median(anyone))
        if parts:
            against = "; against its kind: no healthy run of its setting" if alone else ""
            lines.append(f"  {r.run} ({r.policy}): {'; '.join(parts)} ({r.rollbacks} in job, {r.attempts} job(s)"
                         f"{against})")
    head = ["recovered quality (failing runs that ended succeeded: the loss of the final model on a fixed set, "
            "the mean loss of their last window and the last step's loss alone, which is noisier, each over the "
            "lowest of a healthy run of the same script and setting, the median of its seeds where it ran at "
            "several):"]
    order = [label for label, _ in MEASURES]
    for policy, by in ratios.items():
        for label, mine in sorted(by.items(), key=lambda item: order.index(item[0])):
            head += _quality_counts(f"  {policy} by {label}", mine, spread.get(policy, {}).get(label, []),
                                    target.get(policy, {}).get(label, []), seeds[policy][label])
    head += [f"  {policy} by {label} against the lowest healthy run of any setting of the kind: "
             f"{sum(x <= QUALITY_WITHIN for x in mine)} of {len(mine)} within {QUALITY_WITHIN - 1:.0%}, "
             f"median ratio {statistics.median(mine):.2f}"
             for policy, by in of_kind.items() for label, mine in sorted(by.items(), key=lambda i: order.index(i[0]))]
    return [*head, *lines]


def _quality_counts(named: str, mine: list[float], within: list[bool], fixed: list[float],
            runs: dict[str, list[float]]) -> list[str]:
    """``quality_lines``' counts of one policy by one measure (``named``): the failing runs' ratios ``mine``, whether
    each is ``within`` the range of the healthy seeds, the ratios of those a lower rate fixes (``fixed``), and each
    failing run's ratios at its seeds (``runs``)."""
    drawn = f"; {sum(within)} of {len(within)} within the range of the healthy seeds" if within else ""
    lines = [f"{named}: {sum(x <= QUALITY_WITHIN for x in mine)} of {len(mine)} within {QUALITY_WITHIN - 1:.0%}, "
             f"median ratio {statistics.median(mine):.2f}{drawn}"]
    if fixed and len(fixed) < len(mine):
        lines.append(f"{named}, the runs a lower rate fixes (not those whose remedy raises the rate or keeps it): "
                     f"{sum(x <= QUALITY_WITHIN for x in fixed)} of {len(fixed)} within {QUALITY_WITHIN - 1:.0%}, "
                     f"median ratio {statistics.median(fixed):.2f}")
    if any(len(draws) > 1 for draws in runs.values()):  # failing runs at several seeds (--failing-seeds)
        medians = [statistics.median(draws) for draws in runs.values()]
        lines.append(f"{named}, each failing run the median of its seeds (1-{max(map(len, runs.values()))} that "
                     f"ended succeeded): {sum(x <= QUALITY_WITHIN for x in medians)} of {len(medians)} within "
                     f"{QUALITY_WITHIN - 1:.0%}, median ratio {statistics.median(medians):.2f}")
    return lines


def _window_loss(findings: Path) -> float | None:
    """The ``last_window_loss`` of a job's findings.json summary; None without one."""
    try:
        value = (json.loads(findings.read_text()).get("summary") or {}).get("last_window_loss")
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def setting(job: dict[str, Any]) -> str:
    """The job's hyperparameters but those its knobs set (the rate, a warm-up, clipping) and its ``seed``:
    what makes two runs of a kind the same script at different settings of what the workflow may change,
    or two configurations of it (another network or data). A seed is a draw of the same configuration."""
    knobs = {knob.get("hyperparameter") for knob in (job.get("knobs") or {}).values() if isinstance(knob, dict)}
    knobs.add("seed")  # a draw, not a configuration
    return json.dumps({k: v for k, v in (job.get("hyperparameters") or {}).items() if k not in knobs},
                      sort_keys=True, default=str)


def measure(run: Run, policy: str, state: dict[str, Any], status: str, logs: list[str], wall: float) -> Result:
    attempts = state.get("attempts") or []
    outcome = state.get("outcome") or ("failed" if status != "SUCCEEDED" else "unknown")
    spans = [logged_steps(log, run.step_regex) for log in logs]
    computed = sum(last - first + 1 for first, last in (s for s in spans if s is not None))
    last = spans[-1] if spans else None
    # The final model descends from every step up to where the last attempt ended (through any
    # checkpoint it resumed from); nothing is usable when the execution ended without a model.
    useful = last[1] + 1 if last is not None and outcome in SUCCESS else 0
    rollbacks = [r for a in attempts for r in a.get("rollbacks") or []]
    last_rolled = sum(r.get("steps_lost", 0) + r.get("probe_steps", 0) for r in (attempts[-1].get("rollbacks") or [])
                      ) if attempts else 0
    useful = max(0, useful - last_rolled)  # the last attempt's discarded steps are not in its model
    first = attempts[0] if attempts else {}
    detected = (first.get("finding") or {}).get("step")
    if first.get("rollbacks"):
        detected = first["rollbacks"][0].get("step")
    result = judge(run, Result(
        run=run.name, kind=run.kind, policy=policy, healthy=run.healthy, outcome=outcome, attempts=len(attempts),
        first_call=attempt_call(attempts[0]) if attempts else "none", steps_computed=computed,
        wasted_steps=max(0, computed - useful), wall_seconds=round(wall, 1), changes=changes_between(attempts),
        detection_step=detected, reason=str(state.get("reason") or ""),
        rollbacks=len(rollbacks) + sum(a.get("rollbacks_let_go") or 0 for a in attempts),  # the state's oldest let go
        rate_rollbacks=sum(1 for r in rollbacks if not r.get("transient")),
        rolled_back_steps=sum(r.get("steps_lost", 0) + r.get("probe_steps", 0) for r in rollbacks),
        final_loss=_final_loss(attempts), setting=setting(run.job),
        final_eval=final_evaluation(logs[-1], run.final_regex) if logs else None,
    ))
    if result.false_negative:  # a failing run called healthy: its "final model" is the failure itself
        result.wasted_steps = computed
    return result


def execute(run: Run, policy: str, data_dir: Path, run_root: Path, job_environment: dict[str, str] | None = None
            ) -> Result:
    """One execution of one run through the local workflow, measured and judged; `job_environment`
    is what this machine adds to each job's as its image (LocalSettings.job_environment)."""
    from stabilizer.client.inputs import check_input
    from stabilizer.local.checkout import project_root
    from stabilizer.local.engine.deployment import LocalSettings
    from stabilizer.local.engine.engine import LocalEngine, Project

    name = f"{run.name}-{policy.replace(RELAUNCHED, '-relaunch')}-{time.strftime('%H%M%S')}"
    run_dir = run_root / name
    raw = run.execution_input(policy.removesuffix(RELAUNCHED))
    if policy.endswith(RELAUNCHED):
        raw["job"] = {**raw["job"], "recovery": "relaunch"}
    execution_input = check_input(raw)
    settings = LocalSettings(job_environment=dict(job_environment or {}))
    with LocalEngine(run_dir, data_dir, project=Project.discover(project_root()), settings=settings) as engine:
        record = engine.run(execution_input, name=name)
    logs = []
    for attempt in record.attempts:
        path = run_dir / "jobs" / attempt.job_name / "logs" / "training.log"
        logs.append(path.read_text() if path.is_file() else "")
    result = measure(run, policy, record.state or {}, record.status, logs, record.wall_seconds)
    result.run_dir = str(run_dir)
    if record.attempts:
        result.final_window = _window_loss(run_dir / "jobs" / record.attempts[-1].job_name / "checkpoints"
                                           / "findings.json")
    return result


def worker_init(log_file: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.basicConfig(filename=log_file, level=logging.WARNING, force=True)


def _execute_by_name(name: str, policy: str, data_dir: str, run_root: str, length: int = 1) -> Result:
    run = by_name(load(), name, length)
    try:
        return execute(run, policy, Path(data_dir), Path(run_root))
    except Exception as error:  # one broken execution is a row of the table, not the end of the benchmark
        logging.exception("execution of %s with %s failed", name, policy)
        return judge(run, Result(run=run.name, kind=run.kind, policy=policy, healthy=run.healthy,
                                 outcome=f"error {type(error).__name__}", attempts=0, first_call="none",
                                 steps_computed=0, wasted_steps=0, wall_seconds=0.0))


# ---------------------------------------------------------------------------- the tables
ROW_COLUMNS = ("run", "kind", "policy", "healthy", "attempts", "steps", "wasted", "wall s", "first call", "outcome",
               "verdict")


def verdict(r: Result) -> str:
    flags = [f"FP: {r.false_positive}" if r.false_positive else "", f"FN: {r.false_negative}" if r.false_negative
             else "", f"MISDIAGNOSIS: {r.misdiagnosis}" if r.misdiagnosis else ""]
    text = "; ".join(f for f in flags if f)
    if not text and not r.outcome_met:
        text = f"outcome {r.outcome} not expected"
    return text or "ok"


def table(header: tuple[str, ...], cells: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    return lines + ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip() for cell in cells]


def row_lines(results: list[Result]) -> list[str]:
    return table(ROW_COLUMNS, [[
        r.run, r.kind, r.policy, "yes" if r.healthy else "no",
        str(r.attempts) + (f" +{r.rollbacks} in job" if r.rollbacks else ""), str(r.steps_computed),
        str(r.wasted_steps), f"{r.wall_seconds:.0f}", r.first_call, r.outcome, verdict(r)] for r in results])


def _counts(results: list[Result]) -> dict[str, Any]:
    healthy = [r for r in results if r.healthy]
    failing = [r for r in results if not r.healthy]
    return {
        "healthy": len(healthy), "failing": len(failing),
        "fp": sum(bool(r.false_positive) for r in healthy), "fn": sum(bool(r.false_negative) for r in failing),
        "misdiagnosed": sum(bool(r.misdiagnosis) for r in failing),
        "outcome_met": sum(r.outcome_met for r in results),
        "attempts": sum(r.attempts for r in results), "rollbacks": sum(r.rollbacks for r in results),
        "steps": sum(r.steps_computed for r in results),
        "wasted": sum(r.wasted_steps for r in results), "wall": sum(r.wall_seconds for r in results),
    }


SUMMARY_COLUMNS = ("kind", "runs h/f", "FP", "FN", "misdiag", "right", "attempts", "in job", "steps", "wasted",
                   "wall s")


def summary_lines(results: list[Result]) -> list[str]:
    """Per kind, then in total: each policy's figures side by side (`default | original`)."""
    policies = list(dict.fromkeys(r.policy for r in results))
    kinds = sorted({r.kind for r in results})
    cells = []
    for kind in [*kinds, "total"]:
        mine = [r for r in results if kind in ("total", r.kind)]
        per = [_counts([r for r in mine if r.policy == p]) for p in policies]

        def side(key: str, fmt: str = "{}", per: list[dict[str, Any]] = per) -> str:
            return " | ".join(fmt.format(c[key]) for c in per)

        first = per[0] if per else _counts([])
        cells.append([
            kind, f"{first['healthy']}/{first['failing']}",
            side("fp"), side("fn"), side("misdiagnosed"),
            " | ".join(f"{c['outcome_met']}/{c['healthy'] + c['failing']}" for c in per),
            side("attempts"), side("rollbacks"), side("steps"), side("wasted"), side("wall", "{:.0f}"),
        ])
    return [f"per kind, {' | '.join(policies)} side by side:", *table(SUMMARY_COLUMNS, cells)]


def listing_lines(results: list[Result]) -> list[str]:
    lines = []
    for policy in dict.fromkeys(r.policy for r in results):
        mine = [r for r in results if r.policy == policy]
        for label, attribute in (("false positives", "false_positive"), ("false negatives", "false_negative"),
                                 ("misdiagnoses", "misdiagnosis")):
            hits = [r for r in mine if getattr(r, attribute)]
            lines.append(f"{policy} {label} ({len(hits)}):" + ("" if hits else " none"))
            lines += [f"  {r.run}: {getattr(r, attribute)}" for r in hits]
    return lines


def load_results(path: Path) -> list[Result]:
    """The rows of a ``--json`` file; a row kept before ``setting`` was gets its run's from the corpus."""
    names = set(Result.__dataclass_fields__)
    results = [Result(**{k: v for k, v in entry.items() if k in names}) for entry in json.loads(path.read_text())]
    if any(not r.setting for r in results):
        fill_settings(results, load())
    return results


def fill_settings(results: list[Result], runs: list[Run]) -> None:
    """Give each result without a ``setting`` its run's (by name, where ``runs`` has it)."""
    jobs = {run.name: run.job for run in runs}
    for result in results:
        if not result.setting and result.run in jobs:
            result.setting = setting(jobs[result.run])


def _write(path: Path | None, results: list[Result]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([asdict(r) for r in results], indent=2, default=str))


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kinds", help="corpus: comma-separated kinds (default: all)")
    parser.add_argument("--runs", help="corpus: comma-separated run names (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="corpus: executions run in parallel processes")
    parser.add_argument("--json", type=Path, help="corpus: write every result here (after each execution)")
    parser.add_argument("--recovery", choices=["in_job", "relaunch", "both"], default="in_job",
                        help="corpus: job.recovery; both runs each run both ways, side by side (default policy "
                        "labels: default, default:relaunch)")
    parser.add_argument("--healthy-seeds", type=int, default=1, metavar="N",
                        help="corpus: each healthy run at N seeds (its own and the next N-1), for the spread of "
                        "where a healthy run ends that the recovered quality is read against")
    parser.add_argument("--failing-seeds", type=int, default=1, metavar="N",
                        help="corpus: each failing run at N seeds (its own and the next N-1): more draws of each "
                        "failure for the detection counts, and the recovered quality of each failing run as the "
                        "median of its seeds")
    parser.add_argument("--length", type=int, default=1, metavar="K",
                        help="corpus: every run trains K times as long (the hyperparameter its manifest names as "
                        "length), for the recovered quality where a rollback's lost steps are a small part of the run")


def main(args: argparse.Namespace) -> int:
    """`python -m stabilizer.bench --corpus ...` (arguments parsed by stabilizer.bench)."""
    from stabilizer.cli.commands import UsageError, prepare_data
    from stabilizer.local.checkout import project_root

    if args.report:
        results = [r for path in args.report for r in load_results(path)]
        for line in [*row_lines(results), "", *summary_lines(results), "", *listing_lines(results), "",
                     *quality_lines(results)]:
            print(line)
        return 0
    try:
        kinds = args.kinds.split(",") if args.kinds else None
        runs = with_seeds(select(load(), kinds, args.runs.split(",") if args.runs else None), args.healthy_seeds,
                          args.failing_seeds)
        stretched(runs, args.length)  # a kind that names no length is an error before anything runs
        if args.jobs < 1:
            raise ValueError(f"--jobs: expected a whole number >= 1, got {args.jobs}")
        digits = prepare_data(argparse.Namespace(data_dir=args.data_dir, run_dir=Path("runs")),
                              project_root() / "model", sys.stdout)
    except (ValueError, UsageError) as error:
        print(f"python -m stabilizer.bench --corpus: {error}", file=sys.stderr)
        return 64
    run_root = (args.run_dir / "corpus").resolve()
    run_root.mkdir(parents=True, exist_ok=True)
    policies = ways(list(POLICIES) if args.policy == "both" else [args.policy], args.recovery)
    tasks = [(run, policy) for run in runs for policy in policies]
    print(f"cpus: {os.cpu_count()}  load average before: {os.getloadavg()[0]:.2f}  {len(runs)} runs "
          f"({sum(r.healthy for r in runs)} healthy, {sum(not r.healthy for r in runs)} failing) x "
          f"{len(policies)} policies, {args.jobs} in parallel"
          + (f", each {args.length} times as long" if args.length > 1 else ""), flush=True)
    started = time.monotonic()
    results: list[Result] = []
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn"), initializer=worker_init,
                             initargs=(str(run_root / "engine.log"),)) as pool:
        futures = [pool.submit(_execute_by_name, run.name, policy, str(digits), str(run_root), args.length)
                   for run, policy in tasks]
        for future in as_completed(futures):
            result = future.result()
            results.append(result)
            print("  " + row_lines([result])[-1], flush=True)
            _write(args.json, results)
    order = {(run.name, policy): i for i, (run, policy) in enumerate(tasks)}
    results.sort(key=lambda r: order[(r.run, r.policy)])
    _write(args.json, results)
    print()
    for line in [*row_lines(results), "", *summary_lines(results), "", *listing_lines(results), "",
                 *quality_lines(results)]:
        print(line)
    print(f"wall {time.monotonic() - started:.0f} s for {len(tasks)} executions, {args.jobs} in parallel; "
          f"load average after: {os.getloadavg()[0]:.2f}")
    return 0
