"""Do no harm: a script watched by the launcher behaves as unwatched, and its loss is known however it is written.

The script (tests/fixtures/loops/loss_forms.py) trains a small classifier with its loss written in
each way scripts write it, then pickles, deep-copies, saves, scripts, traces, compiles and exports
its model. Watched and unwatched runs are compared on everything the script can observe.
"""

from __future__ import annotations

import hashlib
import math

import pytest

from tests.helpers import in_make_test_all
from tests.unit.sentinel.support import FIXTURES, findings, job_env, logged, run, summary

pytestmark = pytest.mark.slow  # every test runs a script as its own process

SCRIPT = FIXTURES / "loops" / "loss_forms.py"
FORMS = ["module", "accumulated", *in_make_test_all("functional", "inside", "scaled", "summed", "terms", "mse")]


def _files(root) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


@pytest.mark.parametrize("form", ["functional", "scaled"])
def test_a_watched_script_prints_writes_and_exits_as_it_does_unwatched(tmp_path, form):
    args = ["--form", form, "--steps", "12", "--afterwards"]
    free = run([str(SCRIPT), *args, "--out", str(tmp_path / "free-out")], SCRIPT.parent, job_env(tmp_path / "free"))
    watched = run(["-m", "stabilizer_sentinel.launch", str(SCRIPT), *args, "--out", str(tmp_path / "watched-out")],
                  SCRIPT.parent, job_env(tmp_path / "watched", {"integration": "auto"}))
    assert free.returncode == 0, free.stderr
    assert watched.returncode == free.returncode, watched.stderr
    assert watched.stdout == free.stdout  # the same losses bit for bit, and every use of the model alike
    uses = dict(line.split(": ", 1) for line in free.stdout.splitlines() if not line.startswith("step="))
    assert not [name for name, result in uses.items() if "Error" in result], uses
    assert uses["optimizer keys"] == "['param_groups', 'state']"
    assert set(uses["hooks"].strip("[]").split(", ")) == {"0"}  # nothing registered on any module
    assert _files(tmp_path / "watched-out") == _files(tmp_path / "free-out")
    assert summary(tmp_path / "watched")["steps_observed"] == 12  # and it was watched


@pytest.mark.parametrize("form", FORMS)
def test_the_loss_is_known_at_every_step_however_the_script_writes_it(tmp_path, form):
    result = run(["-m", "stabilizer_sentinel.launch", str(SCRIPT), "--form", form, "--steps", "12"],
                 SCRIPT.parent, job_env(tmp_path, {"integration": "auto"}))
    assert result.returncode == 0, result.stderr
    printed = [loss for _, loss in logged(result.stdout, "xent")]
    seen = summary(tmp_path)
    assert seen["steps_observed"] == 12
    # The step's loss as the script means it: unscaled, the mean over its micro-batches.
    assert seen["last_loss"] == pytest.approx(printed[-1], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("form", ["inside", *in_make_test_all("functional", "accumulated")])
def test_a_loss_leaving_its_band_is_seen_while_the_run_goes_on_whatever_its_form(tmp_path, form):
    boost = ["--boost-at", "15", "--boost-lr", "40"]
    result = run(["-m", "stabilizer_sentinel.launch", str(SCRIPT), "--form", form, "--steps", "60", *boost],
                 SCRIPT.parent, job_env(tmp_path, {"integration": "auto", "action": "stop"}))
    printed = logged(result.stdout, "xent")
    (finding,) = findings(tmp_path)
    assert result.returncode == 86, result.stderr
    assert finding["rule"] in ("ExplodingTensor", "Diverging")
    left = next(step for step, loss in printed if loss > 10 * printed[0][1])  # out of its band: ten times its start
    assert 15 <= left <= finding["step"] <= left + 3  # while the run goes on: within a few steps, not at its end
    assert printed[-1][0] == finding["step"] - 1  # stopped at that step, before its update


@pytest.mark.parametrize("form", ["accumulated", *in_make_test_all("summed", "scaled")])
def test_a_scaled_loss_that_only_learns_the_labels_prior_is_not_called_learned(tmp_path, form):
    result = run(["-m", "stabilizer_sentinel.launch", str(SCRIPT), "--form", form, "--labels-only", "--steps", "80"],
                 SCRIPT.parent, job_env(tmp_path, {"integration": "auto"}))
    assert result.returncode == 0, result.stderr
    seen = summary(tmp_path)
    assert seen["learned"] is False
    (finding,) = findings(tmp_path)
    assert finding["rule"] == "NotLearning"
    assert "a prediction that ignores the inputs" in finding["message"]


def test_the_same_script_that_does_learn_is_called_learned_from_its_first_step(tmp_path):
    result = run(["-m", "stabilizer_sentinel.launch", str(SCRIPT), "--form", "accumulated", "--steps", "80"],
                 SCRIPT.parent, job_env(tmp_path, {"integration": "auto"}))
    assert result.returncode == 0, result.stderr
    seen = summary(tmp_path)
    printed = [loss for _, loss in logged(result.stdout, "xent")]
    assert seen["learned"] is True and not findings(tmp_path)
    assert math.isclose(seen["first_loss"], sum(printed[:5]) / 5, rel_tol=1e-4)  # the first window, from step 0


@pytest.mark.parametrize("end", ["raise", *in_make_test_all("hard3", "exit3", "return")])
def test_what_the_watcher_still_replaces_looks_and_ends_as_before(tmp_path, end):
    script = FIXTURES / "loops" / "looks_around.py"
    free = run([str(script), "--end", end], script.parent, job_env(tmp_path / "free"))
    watched = run(["-m", "stabilizer_sentinel.launch", str(script), "--end", end], script.parent,
                  job_env(tmp_path / "watched", {"integration": "auto", "recovery": "in_job"}))
    assert watched.stdout == free.stdout and "backward name: backward" in free.stdout
    assert "loader next name: _BaseDataLoaderIter.__next__" in free.stdout
    assert watched.returncode == free.returncode == {"return": 0, "exit3": 3, "raise": 1, "hard3": 3}[end]
    assert watched.stderr == free.stderr  # the traceback as it was, and no line of the watcher's
    written = summary(tmp_path / "watched")
    assert written["steps_observed"] == 4  # three steps and the disabled scaler's
    # os._exit runs no atexit handler: the summary is written before it ends the process, saying how.
    assert (written["ended"], written["exception"]) == {
        "return": ("completed", None), "exit3": ("exception", "SystemExit: 3"),
        "raise": ("exception", "ValueError: the script's own error"), "hard3": ("exception", "os._exit(3)")}[end]


def test_a_lazy_module_sized_by_a_dry_run_and_a_traced_module_train_as_unwatched(tmp_path):
    # Both raised in the watched script before stop 63: a lazy parameter's size read before the dry run set it
    # (ValueError), and a copy taken inside ``torch.jit.trace``'s two calls (TracingCheckError).
    script = FIXTURES / "loops" / "built_before_training.py"
    free = run([str(script)], script.parent, job_env(tmp_path / "free"))
    watched = run(["-m", "stabilizer_sentinel.launch", str(script)], script.parent,
                  job_env(tmp_path / "watched", {"integration": "auto", "recovery": "in_job"}))
    assert free.returncode == 0 and "step=11" in free.stdout, free.stderr
    assert (watched.returncode, watched.stdout) == (0, free.stdout), watched.stderr
    assert summary(tmp_path / "watched")["steps_observed"] == 12
