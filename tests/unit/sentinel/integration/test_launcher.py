"""The unchanged-script level: an unmodified script stopped by the sentinel, by command and in a job."""

from __future__ import annotations

import math
import shutil

import pytest

from tests.helpers import MODEL_DIR, in_make_test_all
from tests.unit.sentinel.support import FIXTURES, findings, job_env, logged, run, summary

pytestmark = pytest.mark.slow  # every test runs a script as its own process

SCRIPT = FIXTURES / "regression" / "unchanged.py"
DIVERGING = ["--lr", "3", "--steps", "12"]


def first_non_finite_loss(tmp_path) -> int:
    free = run([str(SCRIPT), *DIVERGING], SCRIPT.parent, job_env(tmp_path / "free"))
    assert free.returncode == 0, free.stderr
    return next(step for step, loss in logged(free.stdout, "loss") if not math.isfinite(loss))


# Long: make test stops unchanged loops at their first non-finite step through the launcher (test_loops.py,
# a loss read from the log line among them).
@pytest.mark.parametrize("loss_source", in_make_test_all("log line", "loss module"))
def test_python_m_stabilizer_sentinel_launch_stops_an_unmodified_script(tmp_path, loss_source):
    expected = first_non_finite_loss(tmp_path)
    job = tmp_path / "job"
    extra = ["--functional-loss", "1"] if loss_source == "log line" else []
    result = run(["-m", "stabilizer_sentinel.launch", str(SCRIPT), *DIVERGING, *extra], SCRIPT.parent, job_env(job))
    assert result.returncode == 86, result.stdout + result.stderr
    (finding,) = findings(job)
    # The gradient norm goes non-finite at the step whose loss does: the optimizer pre-hook sees it first.
    assert finding["rule"] == "ExplodingTensor" and finding["step"] == expected
    assert finding["tensor"].startswith("gradients/0.")  # named after the network the hooks found
    history = finding["evidence"]["loss_history"]
    assert history, "the loss reached the sentinel"
    if loss_source == "loss module":
        assert [step for step, _ in history] == list(range(expected + 1))
    assert (job / "failure").read_text().startswith(f"RuleStop: ExplodingTensor at step {expected}")
    assert "done" not in result.stdout
    # The reason once, as it was found; the stop says what became of it (a newcomer read it three times).
    assert result.stderr.count(finding["message"]) == 1, result.stderr
    assert f"sentinel stopped the job at step {expected}: ExplodingTensor (exit status 86)" in result.stderr


def test_in_a_job_the_sitecustomize_activates_it_when_the_configuration_says_launcher(tmp_path):
    autostart = MODEL_DIR / "stabilizer_sentinel" / "autostart"
    pythonpath = f"{MODEL_DIR}:{autostart}"
    launcher = job_env(tmp_path / "launcher", {"integration": "launcher"}, PYTHONPATH=pythonpath,
                       SM_USER_ENTRY_POINT=SCRIPT.name)
    result = run([SCRIPT.name, *DIVERGING], SCRIPT.parent, launcher)
    assert result.returncode == 86, result.stdout + result.stderr
    assert findings(tmp_path / "launcher")[0]["rule"] == "ExplodingTensor"

    library = job_env(tmp_path / "library", {"integration": "library"}, PYTHONPATH=pythonpath,
                      SM_USER_ENTRY_POINT=SCRIPT.name)
    untouched = run([SCRIPT.name, *DIVERGING], SCRIPT.parent, library)
    assert untouched.returncode == 0 and untouched.stdout.rstrip().endswith("done")


def test_a_bad_configuration_fails_the_job_before_the_script_runs_naming_the_field(tmp_path):
    env = job_env(tmp_path, {"integration": "launcher", "action": "halt"},
                  PYTHONPATH=f"{MODEL_DIR}:{MODEL_DIR / 'stabilizer_sentinel' / 'autostart'}",
                  SM_USER_ENTRY_POINT=SCRIPT.name)
    result = run([SCRIPT.name, *DIVERGING], SCRIPT.parent, env)
    assert result.returncode == 2
    assert "step=" not in result.stdout
    assert (tmp_path / "failure").read_text().startswith("StabilizerConfigError: sagemaker_stabilizer.action")


@pytest.mark.long
def test_the_attempts_table_counts_the_steps_of_a_script_whose_log_says_no_step(tmp_path):
    # A script run through the launcher logs in its own words (here `iter=<n> mse=<loss>`) and the
    # launcher adds nothing to its output: the attempts table counts its steps from the summary.
    from stabilizer.reports.attempts import attempt_rows
    from stabilizer.reports.records import AttemptRecord, MetricPoint, parse_log_line

    script = tmp_path / "fit.py"
    script.write_text(SCRIPT.read_text().replace('f"step={step} loss=', 'f"iter={step} mse='))
    shutil.copy(SCRIPT.parent / "problem.py", tmp_path)
    result = run(["-m", "stabilizer_sentinel.launch", str(script), "--lr", "0.05", "--steps", "12"], tmp_path,
                 job_env(tmp_path / "job"))
    assert result.returncode == 0, result.stderr
    assert "step=" not in result.stdout + result.stderr  # the script's own output is left as it wrote it
    assert "stabilizer" not in result.stderr and "sentinel" not in result.stderr

    attempt = AttemptRecord(number=1, job_name="fit-1", status="Completed")
    attempt.metrics = [p for p in map(parse_log_line, (result.stdout + result.stderr).splitlines())
                       if isinstance(p, MetricPoint)]
    assert attempt.steps_done == 0  # nothing in its log says a step
    attempt.findings = {"findings": [], "summary": summary(tmp_path / "job")}
    assert attempt.steps_done == 12
    (row,) = attempt_rows([], [attempt])
    assert row.steps == "12"


def test_a_stopped_script_under_the_launcher_still_says_how_far_it_got(tmp_path):
    job = tmp_path / "job"
    result = run(["-m", "stabilizer_sentinel.launch", str(SCRIPT), *DIVERGING], SCRIPT.parent, job_env(job))
    assert result.returncode == 86, result.stdout + result.stderr
    (finding,) = findings(job)
    written = summary(job)
    assert (written["ended"], written["last_step"], written["steps_taken"]) == ("rule_stop", finding["step"],
                                                                               finding["step"])


EXITS_EARLY = '''
import sys

import torch
from helper import STEPS  # a sibling of the script: its directory is first on the path, as with `python SCRIPT`

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(STEPS):
    loss = model(torch.ones(4, 2)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step={step} loss={loss.item():.4f}", flush=True)
sys.exit(3)
'''


def test_a_script_that_exits_with_a_failure_status_under_the_launcher_keeps_it_and_says_so(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "exits_early.py").write_text(EXITS_EARLY)
    (source / "helper.py").write_text("STEPS = 4\n")
    job = tmp_path / "job"
    # Run from another directory: only the script's own directory makes its sibling importable.
    result = run(["-m", "stabilizer_sentinel.launch", str(source / "exits_early.py")], tmp_path, job_env(job))
    assert result.returncode == 3, result.stderr
    written = summary(job)
    assert (written["integration"], written["ended"]) == ("launcher", "exception")
    assert written["exception"] == "SystemExit: 3"
    assert written["steps_taken"] == 4


ENDS_WITH = '''
import sys

import torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def main() -> int:
    for step in range(3):
        loss = model(torch.ones(4, 2)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for leave in (lambda: sys.exit(6), lambda: exit(7)):
        try:
            leave()  # caught: not how the script ends
        except SystemExit:
            pass
    try:
        raise SystemExit(5)
    except SystemExit:
        pass
    return int(sys.argv[1])


if sys.argv[2] == "bare":
    raise SystemExit(main())
if sys.argv[2] == "nested":
    main_status = main()

    def leave() -> None:
        raise SystemExit(main_status)

    leave()
sys.exit(main())
'''


THREE_STEPS = '''
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    loss = model(torch.ones(4, 2)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


def _unwatched_and_watched(tmp_path, source: str, *args: str) -> tuple:
    """``source`` run as a script with ``args``, unwatched, then under the launcher (its job in tmp_path/job)."""
    script = tmp_path / "script.py"
    script.write_text(source)
    free = run([str(script), *args], tmp_path, job_env(tmp_path / "free"))
    return free, run(["-m", "stabilizer_sentinel.launch", str(script), *args], tmp_path, job_env(tmp_path / "job"))


OWN_STREAMS = '''
import io
import sys

if sys.argv[1] == "rewrap":
    sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", line_buffering=True)
elif sys.argv[1] == "stderr to stdout":
    sys.stderr = sys.stdout
import torch

torch.manual_seed(0)
''' + THREE_STEPS + '''    print(f"step={step} loss={loss.item():.4f}")
print("to the stream underneath", file=sys.__stderr__, flush=True)
'''


@pytest.mark.parametrize("how", ["stderr to stdout", *in_make_test_all("rewrap")])
def test_a_script_that_replaces_its_streams_before_anything_holds_them_prints_as_unwatched(tmp_path, how):
    # From the fifth harm hunt: the stream the watcher put in place, let go by the script, was finalized, and
    # io's finalizer closed the process's stdout (or stderr) under it: the next print failed, exit 1.
    free, result = _unwatched_and_watched(tmp_path, OWN_STREAMS, how)
    assert (result.returncode, result.stdout, result.stderr) == (free.returncode, free.stdout, free.stderr)
    assert result.returncode == 0 and result.stdout.count("step=") == 3
    assert summary(tmp_path / "job")["steps_taken"] == 3


OWN_WAYS_OUT = '''
import _thread
import sys
import threading

import torch

''' + THREE_STEPS + '''

def leave_thread() -> None:
    try:
        _thread.exit()
    except SystemExit as error:  # the class the script names catches what _thread.exit raises
        print("thread caught", type(error).__name__, isinstance(error, SystemExit), flush=True)


worker = threading.Thread(target=leave_thread)
worker.start()
worker.join()
try:
    _thread.exit()
except SystemExit:
    print("main caught", flush=True)
if sys.argv[1] == "own hook":
    sys.excepthook = lambda kind, error, trace: print("own hook:", error, file=sys.stderr, flush=True)
    raise RuntimeError("evaluation failed")
'''


@pytest.mark.parametrize("end", ["completed", *in_make_test_all("own hook")])
def test_a_script_leaving_by_its_own_ways_ends_as_unwatched_and_its_summary_says_how(tmp_path, end):
    # _thread.exit() raises SystemExit from C, and a script's own sys.excepthook replaces the chained one:
    # the script's `except SystemExit` still catches the first, and the summary still names the exception.
    free, result = _unwatched_and_watched(tmp_path, OWN_WAYS_OUT, end)
    assert (result.returncode, result.stdout, result.stderr) == (free.returncode, free.stdout, free.stderr)
    assert result.stdout == "thread caught SystemExit True\nmain caught\n"
    written = summary(tmp_path / "job")
    assert written["steps_taken"] == 3
    if end == "own hook":
        assert result.returncode == 1 and "own hook: evaluation failed" in result.stderr
        assert (written["ended"], written["exception"]) == ("exception", "RuntimeError: evaluation failed")
    else:
        assert (result.returncode, written["ended"], written["exception"]) == (0, "completed", None)


@pytest.mark.parametrize(("how", "status"),
                         [("nested", 4), *in_make_test_all(("bare", 4), ("bare", 0), ("sys.exit", 0))])
def test_how_a_script_exits_under_the_launcher_is_how_its_summary_says_it_ended(tmp_path, how, status):
    # `raise SystemExit(n)` reaches no hook of Python's (sys.excepthook is for other exceptions):
    # a failure status is recorded as the exception that ended the script, 0 as a normal end.
    script = tmp_path / "ends.py"
    script.write_text(ENDS_WITH)
    job = tmp_path / "job"
    result = run(["-m", "stabilizer_sentinel.launch", str(script), str(status), how], tmp_path, job_env(job))
    assert result.returncode == status, result.stderr
    written = summary(job)
    assert written["steps_taken"] == 3
    if status:
        assert (written["ended"], written["exception"]) == ("exception", f"SystemExit: {status}")
    else:
        assert (written["ended"], written["exception"]) == ("completed", None)


CHILDREN_CALLED = '''
import sys

import torch
from torch import nn

torch.manual_seed(0)


class Stack(nn.Module):
    """Called through a method of its own: only its children's forward passes run."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 16), nn.Linear(16, 16), nn.Linear(16, 1)])

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return (self.layers[-1](x) - y).pow(2).mean()


net = Stack()
optimizer = torch.optim.SGD(net.parameters(), lr=float(sys.argv[1]))
x = torch.randn(64, 4)
y = x.sum(1, keepdim=True)
for step in range(60):
    loss = net.loss(x, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step={step} loss={loss.item():.6g}", flush=True)
'''


def test_a_network_called_through_its_children_is_rolled_back_whole(tmp_path):
    # From the fifth verdict hunt: a flow trained through flow.log_prob(x) called its couplings alone; the
    # guard took the first coupling for the network, and a rollback put back a sixth of the weights, so every
    # probe failed and the job stopped. The network holding all the optimizer's parameters is the one.
    script = tmp_path / "children.py"
    script.write_text(CHILDREN_CALLED)
    healthy = run([str(script), "0.05"], tmp_path, job_env(tmp_path / "free"))
    result = run(["-m", "stabilizer_sentinel.launch", str(script), "5"], tmp_path,
                 job_env(tmp_path / "job", {"recovery": "in_job"}))
    assert result.returncode == 0, result.stderr
    assert "rolled back" in result.stderr and "going on at" in result.stderr
    final = float(result.stdout.strip().splitlines()[-1].split("loss=")[1])
    assert math.isfinite(final) and final < 10 * float(healthy.stdout.strip().splitlines()[-1].split("loss=")[1])
