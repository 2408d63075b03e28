"""The ``stabilizer`` command.

``stabilizer run --local`` runs the project's state machine and Lambda code on this machine (the
local engine), with each training job a real process. It prints one line per SNS notification
(its subject) as it is published, shows a progress bar per attempt on a terminal, ends with a
table of the attempts, and writes a report (run.json, report.md with every notification's body,
plots) in the run directory. It starts with a short header (what runs, the rules watching it, the
limits); ``--verbose`` also prints the whole input, the bodies and every observation.

Exit status, one per outcome (docs/contracts.md, "Outcomes"): 0 succeeded (every step watched, a
finite loss, learned) or stopped early (a plateau or overfitting after the run learned; the best
checkpoint is kept); 3 unwatched (nothing watched the job) or unverified (watched too little to
judge); 2 diverged, did not learn or gave up (the workflow ended on its own terms without a
success); 1 failed; 130 interrupted (Ctrl-C: the running job is stopped and its checkpoint kept);
64 bad usage or input (nothing was launched).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn, TextIO

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_GAVE_UP = 2
EXIT_UNVERIFIED = 3
EXIT_USAGE = 64
EXIT_INTERRUPTED = 130
# The exit status of each outcome (stabilizer.reports.report.verdict).
EXIT_STATUS = {
    "succeeded": EXIT_SUCCEEDED,
    "stopped_early": EXIT_SUCCEEDED,
    "unwatched": EXIT_UNVERIFIED,
    "unverified": EXIT_UNVERIFIED,
    "diverged": EXIT_GAVE_UP,
    "did_not_learn": EXIT_GAVE_UP,
    "gave_up": EXIT_GAVE_UP,
    "failed": EXIT_FAILED,
    "interrupted": EXIT_INTERRUPTED,
}
# Local jobs start in about a second, and a check is a few milliseconds in process: checking every
# second reacts to a finding within a second (in the cloud the default wait is 300 s). At that
# pace the cloud's cap of 300 checks would end a run after five minutes, so the local cap is an hour.
# A job's end wakes the execution at once; wait_seconds is only the fallback check. 1,500 checks
# fit Step Functions' 25,000-event history (lambdas/stabilizer_workflow/execution/service_limits.py) as in the cloud.
LOCAL_DEFAULTS = {"wait_seconds": 2, "limits": {"max_monitor_transitions": 1500}}


class UsageError(Exception):
    """Bad usage or input; reported in one line, nothing launched."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


RUN_EPILOG = """\
examples:
  stabilizer run --local                                  the reference problem, policy "default"
  stabilizer run --local --policy original                the original sample's remedy ladder
  stabilizer run --local num_epochs=1 max_steps=20        shorter runs (run_spec fields)
  stabilizer run --local --input input.json limits.max_num_retraining=3
  stabilizer run --local --strict num_epochs=1            refuse what the stack's IAM would deny on AWS

local defaults (when not given): wait_seconds=2, limits.max_monitor_transitions=1500.

keys: the fields of the execution input (lambdas/stabilizer_workflow/execution/state.py,
  schemas/execution-input.schema.json):
  policy, wait_seconds, run_spec.<field> (or just <field>), limits.<field>; with a job (--input),
  job.<field> (job.recovery=relaunch, job.hyperparameters.<name>) and, for one of its hyperparameters,
  just <name> (lr=0.4). Values are JSON when they parse (1, 0.05, true, [..]), text otherwise (elu).

exit status: 0 succeeded or stopped early, 3 unwatched or unverified, 2 diverged / did not learn /
gave up, 1 failed, 130 interrupted, 64 bad input (nothing launched).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="stabilizer",
        description="Detect exploding, vanishing and stalled training runs, stop them, notify, and relaunch "
        "them with a recipe that works.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    run = commands.add_parser(
        "run",
        help="run an execution of the workflow to its end",
        description="Start an execution of the state machine and follow it to its end: one line per SNS "
        "notification (its subject) as it is published; on a terminal, a progress bar per attempt with "
        "steps, time left, loss and gradient norm; a table of attempts at the end; a report (run.json, "
        "report.md with the notification bodies, plots/) in the run directory. Ctrl-C stops the running "
        "training job cleanly and says where its checkpoint is.",
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--local",
        action="store_true",
        help="run on this machine: the same ASL definition and Lambda code, training jobs as local processes "
        "(required: AWS executions are started from the console, the notebook or stabilizer.client)",
    )
    run.add_argument("--input", type=Path, metavar="FILE", help="a JSON file with the execution input")
    run.add_argument(
        "--policy", choices=["original", "default"], help="the remediation policy (default: the input's, else default)"
    )
    run.add_argument(
        "--run-dir",
        type=Path,
        default=Path("runs"),
        metavar="DIR",
        help="where each run gets its directory (jobs, logs, report); default: ./runs",
    )
    run.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="train/ and test/ channels (x.npy, y.npy); default: the offline digits set, prepared once in "
        "<run-dir>/data/digits",
    )
    run.add_argument("--name", help="the execution name (default: local-<time>-<random>)")
    run.add_argument(
        "--plain",
        action="store_true",
        help="the same lines without the live progress bars (automatic when not on a terminal)",
    )
    run.add_argument(
        "--debugger-rules",
        action="store_true",
        help="also configure SageMaker Debugger built-in rules on each job (DEBUGGER_RULES_ENABLED); locally "
        "their statuses come from the rule engine's out-of-job evaluator",
    )
    run.add_argument(
        "--strict",
        action="store_true",
        help="judge every AWS call of the functions, the state machine and the training jobs by the IAM "
        "policies of the synthesized stack, and refuse (AccessDenied) what AWS would deny; needs the dev "
        "extra and Node.js to synthesize (also: STABILIZER_STRICT=1). The calls and verdicts go to "
        "iam-calls.tsv in the run directory",
    )
    run.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print the whole execution input, each notification's body and every observation (states, "
        "job statuses, logged steps)",
    )
    run.add_argument("pairs", nargs="*", metavar="key=value", help="execution input fields (see below)")
    return parser


def prepare_data(args: argparse.Namespace, model_dir: Path, out: TextIO) -> Path:
    from stabilizer.local.offline_digits import DataPreparationError, channels_present, ensure_offline_digits

    if args.data_dir is not None:
        for channel in ("train", "test"):
            for name in ("x.npy", "y.npy"):
                if not (args.data_dir / channel / name).is_file():
                    raise UsageError(f"--data-dir {args.data_dir}: missing {channel}/{name}")
        return args.data_dir
    data_dir = args.run_dir / "data" / "digits"
    if not channels_present(data_dir):
        out.write(f"preparing the offline data set (scikit-learn digits) in {data_dir}\n")
    try:
        return ensure_offline_digits(data_dir, model_dir)
    except DataPreparationError as error:
        raise UsageError(str(error)) from None


def exit_code(record: Any) -> int:
    from stabilizer.reports.report import verdict

    if record.status == "FAILED" and record.error == "InvalidInput" and not record.attempts:
        return EXIT_USAGE  # found by the workflow's ValidateInput: the input is wrong, as when found before starting
    return EXIT_STATUS.get(verdict(record), EXIT_FAILED)


class Interrupts:
    """First Ctrl-C asks for a clean stop; a second one stops waiting for it."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested.is_set():
            raise KeyboardInterrupt
        self.requested.set()


def run_local(args: argparse.Namespace, out: TextIO) -> int:
    from stabilizer.client.inputs import build_input, check_execution_name, execution_input_module
    from stabilizer.local.engine.deployment import LocalSettings, Project, strict_from_environment
    from stabilizer.local.engine.engine import LocalEngine
    from stabilizer.local.engine.staging import source_summary
    from stabilizer.source.sourcedir import mark_run_directory

    # The input is checked first: a wrong input is the person's to fix, whatever else is missing.
    state_module = execution_input_module()
    execution_input = build_input(
        state_module=state_module,
        input_file=args.input,
        pairs=args.pairs,
        policy=args.policy,
        defaults=LOCAL_DEFAULTS,
        leave_out=[args.run_dir],
    )
    if args.name is not None:
        check_execution_name(args.name, "--name")
    project = Project.discover()
    data_dir = prepare_data(args, project.model, out)
    name = args.name or f"local-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    run_dir = args.run_dir / name
    if run_dir.exists():
        raise UsageError(f"the run directory {run_dir} already exists; choose another --name")
    run_dir.mkdir(parents=True)
    mark_run_directory(args.run_dir)  # earlier runs never travel in a job's source
    # Library warnings (moto's interpreter logs every caught task failure) go to the run's log.
    logging.basicConfig(filename=run_dir / "engine.log", level=logging.WARNING, force=True)
    settings = LocalSettings(debugger_rules_enabled=args.debugger_rules)
    out.write(header(name, run_dir, execution_input, state_module, verbose=args.verbose))
    source = source_summary(execution_input, _shown_path(str((execution_input.get("job") or {}).get("source"))))
    if source:
        out.write(source + "\n")
    accelerated = gpu_instance_note(execution_input, settings.instance_type)
    if accelerated:
        out.write(accelerated + "\n")
        logging.getLogger("stabilizer.local").warning(accelerated)
    strict = args.strict or strict_from_environment()
    if strict:
        out.write("strict: every AWS call judged by the synthesized stack's IAM policies (synthesizing it first)\n")
        out.flush()
    live = out.isatty() and not args.plain
    engine = LocalEngine(run_dir, data_dir, project=project, settings=settings, strict=strict)
    with engine, Interrupts() as interrupts:
        from stabilizer.cli.progress import LiveProgress, PlainProgress

        progress = LiveProgress(out, name, verbose=args.verbose) if live else PlainProgress(out, verbose=args.verbose)
        with progress:
            record = engine.run(execution_input, name=name, observer=progress, interrupt=interrupts.requested)
    if engine.access is not None:
        out.write(access_summary(engine.access, run_dir / "iam-calls.tsv"))
    return finish(record, run_dir, out)


def gpu_instance_note(execution_input: dict[str, Any], default_instance_type: str) -> str | None:
    """One line when the run asks for a GPU instance: its request gets the GPU image, as on AWS,
    but local mode has no GPU and trains on this machine's CPU."""
    from stabilizer.training_images import is_gpu_instance

    given = [(execution_input.get(part) or {}).get("instance_type") for part in ("job", "run_spec")]
    instance_type = next((t for t in given if isinstance(t, str)), default_instance_type)
    if not is_gpu_instance(instance_type):
        return None
    return (
        f"{instance_type} is a GPU instance: its job gets the GPU image, as on AWS, but local mode "
        "has no GPU and trains it on this machine's CPU"
    )


def access_summary(access: Any, path: Path) -> str:
    """Write every (principal, action, resource, verdict) to `path`; one line saying how many were denied."""
    rows = access.table()
    # The API operation each request came from, as a fifth column (one operation may ask several).
    operations = list(dict.fromkeys((*call.row(), call.operation) for call in access.calls))
    header = ("principal", "action", "resource", "verdict", "operation")
    path.write_text("".join("\t".join(row) + "\n" for row in [header, *operations]))
    denied = [row for row in rows if row[3] != "allowed"]
    lines = f"strict: {len(access.calls)} IAM requests judged ({len(rows)} distinct), {len(denied)} denied: {path}\n"
    return lines + "".join(f"  DENIED {who} {action} on {resource}\n" for who, action, resource, _ in denied)


def header(name: str, run_dir: Path, execution_input: dict[str, Any], state_module: Any, verbose: bool) -> str:
    """The lines a run starts with: what runs, what watches it, where its files go; with
    ``verbose``, the whole execution input after them."""
    what, watching = input_summary(execution_input, state_module)
    text = f"execution {name}: {what}\n{watching}\nrun directory: {run_dir}\n"
    if verbose:
        text += "input: " + json.dumps(execution_input, indent=2) + "\n"
    return text


def input_summary(execution_input: dict[str, Any], state_module: Any) -> tuple[str, str]:
    """Two lines: what runs and under which policy; what watches it and the limits (the whole
    input is in the report, and on the terminal with --verbose)."""
    given = state_module.parse_execution_input(execution_input)
    if given.job is not None:
        job = given.job
        what = f"job {job.entry_point} from {_shown_path(job.source)}"
        if job.integration == "launcher":
            what += " through the launcher"
        monitoring = given.monitoring or state_module.Monitoring()
    else:
        spec = given.run_spec or state_module.RunSpec()
        changed = [
            f"{key}={json.dumps(value, separators=(',', ':'))}"
            for key, value in (execution_input.get("run_spec") or {}).items()
            if key not in state_module.MONITORING_FIELDS
        ]
        what = "the reference ResNet" + (f" with {' '.join(changed)}" if changed else ", every default")
        monitoring = given.monitoring or spec.monitoring()
    # Whatever the list, the sentinel checks that the loss and gradients are finite, that the loss learns
    # and that it does not run away (docs/rules.md, "The sentinel's own checks"); a list's entry under the
    # last two names sets their thresholds.
    named = [rule.name for rule in monitoring.rules if rule.name not in ("Diverging", "NotLearning")]
    own = ("" if "ExplodingTensor" in named else "finite check, ") + "Diverging and NotLearning"
    rules = f"rules {', '.join(named)} and the sentinel's own {own}" if named else f"the sentinel's own {own}"
    limits = given.limits
    watching = (
        f"{rules} ({monitoring.sentinel_action} when one fires); at most {limits.max_num_retraining} "
        f"relaunches, {limits.max_monitor_transitions} checks {given.wait_seconds} s apart, "
        f"{limits.max_total_training_seconds / 3600:g} h of training"
    )
    return f"{what}; policy {given.policy}", watching


def _shown_path(source: str) -> str:
    """A local source as the person would type it from here; an s3:// URI as it is."""
    if "://" in source:
        return source
    try:
        return str(Path(source).resolve().relative_to(Path.cwd()))
    except ValueError:
        return source


def finish(record: Any, run_dir: Path, out: TextIO) -> int:
    from stabilizer.local.engine.execution_follower import failure_message
    from stabilizer.reports.report import outcome, table_text, timing, write_report

    paths = write_report(record, run_dir)
    out.write("\n" + table_text(record) + "\n\n")
    t = timing(record)
    out.write(
        f"outcome: {outcome(record)} ({record.status}{', ' + record.error if record.error else ''}) after "
        f"{len(record.attempts)} attempt(s), {t['wall_seconds']:.0f} s\n"
    )
    reason = (record.state or {}).get("reason")
    if reason:
        out.write(f"reason: {reason}\n")
    elif record.status == "FAILED" and record.cause:
        out.write(f"cause: {failure_message(record.cause)}\n")
    if record.interrupted:
        for attempt in record.attempts:
            if attempt.status in ("Stopped", "Stopping"):
                checkpoint = attempt.newest_checkpoint()
                out.write(
                    f"stopped {attempt.job_name} ({attempt.status}); "
                    + (
                        f"checkpoint: {checkpoint} (also under {attempt.checkpoint_uri} in the local S3)\n"
                        if checkpoint
                        else f"no checkpoint was written (checkpoint directory: {attempt.checkpoint_dir})\n"
                    )
                )
    for attempt in record.attempts:  # a script that failed on its own: its output says why
        log = run_dir / "jobs" / attempt.job_name / "logs" / "training.log"
        if attempt.status == "Failed" and "ExecuteUserScriptError" in (attempt.failure_reason or "") and log.is_file():
            out.write(f"the script's output (attempt {attempt.number}): {log}\n")
    out.write(f"report: {paths['markdown']}  data: {paths['json']}  plots: {run_dir / 'plots'}\n")
    return exit_code(record)


def main(argv: list[str] | None = None) -> int:
    out = sys.stdout
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            if not args.local:
                raise UsageError(
                    "run needs --local; on AWS, start an execution from the console ({} runs the reference "
                    "problem), from the notebook, or with stabilizer.client.aws_client.AwsClient"
                )
            return run_local(args, out)
    except UsageError as error:
        sys.stderr.write(f"stabilizer: {error}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Before the execution started, or a second Ctrl-C: the engine has stopped its jobs on the way out.
        sys.stderr.write("stabilizer: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as error:
        from stabilizer.client.inputs import InputProblemError
        from stabilizer.local.engine.deployment import EngineError

        if isinstance(error, InputProblemError | EngineError):
            sys.stderr.write(f"stabilizer: {error}\n")
            return EXIT_USAGE
        raise
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
