"""The public-scripts corpus's manifests, and how its benchmark compares a watched run with unwatched ones
(no training here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from stabilizer.bench import public_scripts
from stabilizer.bench import transparency as bench
from stabilizer.bench.corpus import PUBLIC_SCRIPTS_DIR, ManifestError, Script, edited_files, load_script, load_scripts
from stabilizer.client.inputs import check_input

SCRIPTS = load_scripts()
PRESENT = [s for s in SCRIPTS if s.present]
ABSENT = "the upstream files are not in this checkout (tests/public_scripts/README.md)"


def test_every_script_folder_has_a_manifest_and_every_run_is_an_input_the_workflow_accepts():
    folders = {p.name for p in PUBLIC_SCRIPTS_DIR.iterdir() if p.is_dir() and "__" in p.name}
    assert folders == {s.name for s in SCRIPTS}
    for script in SCRIPTS:
        for run in script.runs:
            check_input(run.execution_input("default"))  # raises InputProblemError naming the field
            assert bench.loss_regex(run), run.name


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_every_vendored_file_is_upstreams_byte_for_byte(script: Script):
    if not script.present:
        pytest.skip(f"{script.name}: {ABSENT}")
    assert edited_files(script) == []
    assert (script.directory / "LICENSE").read_text().strip()


def test_a_hand_edit_of_a_vendored_file_is_caught(tmp_path: Path):
    if not PRESENT:
        pytest.skip(ABSENT)
    script = PRESENT[0]
    copy = tmp_path / script.name
    shutil.copytree(script.directory, copy)
    shutil.copytree(PUBLIC_SCRIPTS_DIR / "_standins", tmp_path / "_standins")
    path = script.upstream.paths[0]
    target = copy / script.upstream.local(path)
    target.write_bytes(target.read_bytes() + b"\n")
    assert edited_files(load_script(copy)) == [path]


def _folder(tmp_path: Path, **changes: object) -> Path:
    """A well-formed script folder, with top-level manifest keys replaced by `changes`."""
    folder = tmp_path / "someone__fit"
    folder.mkdir()
    (folder / "fit.py").write_text("print('loss 1.0')\n")
    (folder / "LICENSE").write_text("MIT License\n")
    (tmp_path / "_standins" / "torchvision").mkdir(parents=True)
    manifest = {
        "description": "a fit", "watch": "none", "step_regex": "^loss",
        "upstream": {"repo": "someone/project", "commit": "a" * 40, "root": "", "paths": ["fit.py"],
                     "blobs": {"fit.py": "b" * 40}, "licence": "MIT"},
        "job": {"entry_point": "fit.py", "hyperparameters": {"lr": 0.1},
                "metric_definitions": [{"Name": "loss", "Regex": "loss (\\S+)"}], "loss_metric": "loss"},
        "runs": [{"name": "fit-healthy", "healthy": True, "expect": {"outcome": "succeeded"}},
                 {"name": "fit-lr100", "healthy": False, "hyperparameters": {"lr": 100},
                  "expect": {"first_attempt": "diverged", "outcome": ["succeeded"]}}],
    }
    for key, value in changes.items():
        if value is None:
            manifest.pop(key)
        else:
            manifest[key] = value
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_a_well_formed_folder_loads(tmp_path: Path):
    script = load_script(_folder(tmp_path, standins=["torchvision"], command={"arguments": "equals"}))
    assert script.healthy.name == "fit-healthy" and script.script == "fit.py"
    assert script.command_arguments({"lr": 0.1, "compile": False}) == ["--compile=False", "--lr=0.1"]


@pytest.mark.parametrize(("changes", "message"), [
    ({"upstream": None}, r"upstream: required"),
    ({"upstream": {"repo": "someone/project", "root": "", "paths": ["fit.py"], "blobs": {}, "licence": "MIT"}},
     r"upstream\.commit: required"),
    ({"upstream": {"repo": "someone/project", "commit": "HEAD", "root": "", "paths": ["fit.py"], "blobs": {},
                   "licence": "MIT"}}, r"upstream\.commit: expected 40 lower-case hex digits, got 'HEAD'"),
    ({"upstream": {"repo": "someone/project", "commit": "a" * 40, "root": "src", "paths": ["fit.py"],
                   "blobs": {"fit.py": "b" * 40}, "licence": "MIT"}}, r"upstream\.paths\[0\]: expected a path under"),
    ({"upstream": {"repo": "someone/project", "commit": "a" * 40, "root": "", "paths": ["fit.py"], "blobs": {},
                   "licence": "MIT"}}, r"upstream\.blobs\.fit\.py: expected the file's git blob id"),
    ({"command": {"arguments": "colon"}}, r"command\.arguments: expected space or equals, got 'colon'"),
    ({"command": {"script": "missing.py"}}, r"command\.script: 'missing\.py' is not a file"),
    ({"data": {"maker": "make_data.py"}}, r"data\.maker: 'make_data\.py' is not a file"),
    ({"standins": ["tensorflow"]}, r"standins: expected a list of torchvision packages, got \['tensorflow'\]"),
    ({"watch": "library"}, r"watch: expected none"),
    ({"environment": {"pl_trainer": "4"}}, r"environment: expected an object NAME -> string value"),
    ({"environment": {"PL_TRAINER_LIMIT_TRAIN_BATCHES": 4}}, r"environment: expected an object NAME -> string value"),
    ({"runs": [{"name": "fit-healthy", "healthy": True, "expect": {"outcome": "succeeded"}}]},
     r"no_failing_run: required when runs has no failing run"),
    ({"runs": [{"name": "fit-lr100", "healthy": False, "expect": {"first_attempt": "diverged",
                                                                   "outcome": "succeeded"}}]},
     r"runs: expected exactly one healthy run, got 0"),
])
def test_a_malformed_manifest_is_refused_naming_the_field(tmp_path: Path, changes: dict, message: str):
    with pytest.raises(ManifestError, match=message):
        load_script(_folder(tmp_path, **changes))


def test_the_manifests_environment_is_in_every_run_watched_unwatched_and_through_the_workflow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Lightning's PL_TRAINER_* defaults size lightning__transformer; torch's TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD lets
    # time_sequence_prediction read the numpy array upstream's generator saves (its requirements pin torch<2.6).
    script = load_script(_folder(tmp_path, environment={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}))
    assert script.environment == {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    assert bench.environment(script, tmp_path / "sentinel")["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"
    seen = {}
    monkeypatch.setattr(public_scripts, "prepare", lambda script, source, env: source)
    monkeypatch.setattr(public_scripts.calibration, "execute",
                        lambda run, policy, data_dir, root, job_environment: seen.update(job_environment))
    public_scripts.verdict(script, script.healthy, "default", tmp_path, tmp_path / "verdicts")
    assert seen == {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    (tmp_path / "plain").mkdir()
    assert load_script(_folder(tmp_path / "plain")).environment == {}


def test_upstream_files_in_place_without_their_licence_are_refused(tmp_path: Path):
    folder = _folder(tmp_path)
    (folder / "LICENSE").unlink()
    with pytest.raises(ManifestError, match=r"upstream: LICENSE missing from"):
        load_script(folder)


def test_a_folder_holding_only_what_is_ours_loads_and_is_not_present(tmp_path: Path):
    folder = _folder(tmp_path)
    script = load_script(folder)
    assert script.present
    for name in script.upstream.missing(tmp_path / "nowhere"):
        (folder / name).unlink()
    assert load_script(folder).present is False


# ---------------------------------------------------------------------------- comparing runs
def _observed(stdout: list[str], *, status: int = 0, files: dict | None = None, losses: list | None = None,
              stderr: list[str] | None = None) -> bench.Observed:
    return bench.Observed(status, stdout, stderr or [], files or {}, losses or [], 1.0)


def test_lines_that_differ_between_unwatched_runs_are_not_compared():
    first = _observed(["epoch 1", "took 1.2 s", "loss 0.5"])
    second = _observed(["epoch 1", "took 1.4 s", "loss 0.5"])
    watched = _observed(["epoch 1", "took 3.0 s", "loss 0.5"])
    assert bench.differences(first, second, watched) == []


def test_a_timing_field_is_volatile_in_every_line_of_its_shape_even_where_two_runs_agreed_by_chance():
    # word_language_model prints "ms/batch 4.63" at batch 10 in both unwatched runs and 3.23 watched; at
    # batches 9 and 11 the unwatched runs differ there: the field is a timing, never compared.
    line = "| {:>3}/22 batches | ms/batch {:5.2f} | loss {:5.2f}"
    first = _observed([line.format(9, 4.51, 6.53), line.format(10, 4.63, 6.40), line.format(11, 4.54, 6.56)])
    second = _observed([line.format(9, 4.67, 6.53), line.format(10, 4.63, 6.40), line.format(11, 4.72, 6.56)])
    watched = [line.format(9, 3.15, 6.53), line.format(10, 3.23, 6.40), line.format(11, 3.09, 6.56)]
    assert bench.differences(first, second, _observed(watched)) == []
    # The same line with its loss changed is a difference: only the field that varied is volatile.
    watched[1] = line.format(10, 3.23, 6.41)
    assert bench.differences(first, second, _observed(watched)) == [
        f"stdout line 2: unwatched {line.format(10, 4.63, 6.40)!r}, watched {watched[1]!r}"]


def test_a_number_the_line_says_is_a_duration_is_volatile_even_printed_once_and_alike_unwatched():
    # word_language_model's end of epoch, printed once: both unwatched runs took 0.06 s, the watched 0.07 s.
    line = "| end of epoch   1 | time: {:5.2f}s | valid loss {:5.2f} | valid ppl {:8.2f}"
    first, second = _observed([line.format(0.06, 6.37, 582.82)]), _observed([line.format(0.06, 6.37, 582.82)])
    assert bench.differences(first, second, _observed([line.format(0.07, 6.37, 582.82)])) == []
    changed = line.format(0.07, 6.38, 582.82)  # the loss beside it is compared
    assert bench.differences(first, second, _observed([changed])) == [
        f"stdout line 1: unwatched {line.format(0.06, 6.37, 582.82)!r}, watched {changed!r}"]
    assert bench.differences(_observed(["10 steps"]), _observed(["10 steps"]), _observed(["11 steps"])) == [
        "stdout line 1: unwatched '10 steps', watched '11 steps'"]  # "s" inside a word is no unit


def test_a_time_per_unit_of_work_is_a_duration_and_padding_is_no_part_of_a_lines_shape():
    # word_language_model's first batch of its second epoch, printed once of its shape, "ms/batch 3.44" in
    # both unwatched runs and 50.53 watched (a loaded machine): a timing, wherever it is printed.
    line = "| epoch   2 |     1/   22 batches | lr 20.00 | ms/batch {:5.2f} | loss 11.46 | ppl 95267.61"
    first, second = _observed([line.format(3.44)]), _observed([line.format(3.44)])
    assert bench.differences(first, second, _observed([line.format(50.53)])) == []
    # Batches 9 and 10 padded to one width: one shape, so the timing that varied at 9 varies at 10 too.
    padded = "| {:>3}/22 batches | tokens {:5.2f}"
    first = _observed([padded.format(9, 4.51), padded.format(10, 4.63)])
    second = _observed([padded.format(9, 4.67), padded.format(10, 4.63)])
    assert bench.differences(first, second, _observed([padded.format(9, 3.15), padded.format(10, 3.23)])) == []
    # Spaces alone that differ are still a difference: no number varied.
    assert bench.differences(_observed(["loss  0.5"]), _observed(["loss  0.5"]), _observed(["loss 0.5"])) == [
        "stdout line 1: unwatched 'loss  0.5', watched 'loss 0.5'"]


def test_a_rate_made_of_a_steps_time_is_volatile_even_printed_alike_unwatched():
    # nanoGPT's "iter 25: loss 3.3458, time 2.23ms, mfu 0.01%": both unwatched runs printed mfu 0.01% in every
    # line, the watched run, 0.7 ms slower a step, 0.00%. Its flops over the step's time: a timing.
    line = "iter {}: loss {:.4f}, time {:.2f}ms, mfu {:.2f}%"
    first = _observed([line.format(25, 3.3458, 2.23, 0.01)])
    second = _observed([line.format(25, 3.3458, 2.23, 0.01)])
    assert bench.differences(first, second, _observed([line.format(25, 3.3458, 2.95, 0.00)])) == []
    changed = line.format(25, 3.3459, 2.95, 0.00)  # the loss beside it is compared
    assert bench.differences(first, second, _observed([changed])) == [
        f"stdout line 1: unwatched {line.format(25, 3.3458, 2.23, 0.01)!r}, watched {changed!r}"]


@pytest.mark.parametrize(("third", "found"), [
    (["loss 1.127", "train error: 0.40"], []),  # a third draw shows the line varies: noise
    (["loss 1.127", "train error: 0.46"],  # all three alike there: the difference stands
     ["stdout line 2: unwatched 'train error: 0.46', watched 'train error: 0.31'"]),
])
def test_a_script_that_is_not_deterministic_gets_a_third_unwatched_run_where_the_watched_differs(
        tmp_path, monkeypatch, third, found):
    # Stop 75: pytorch/examples' forward-forward network ends at a train error that varies run to run; its two
    # unwatched runs both ended at 0.46 and the watched at 0.31, a difference where there was none.
    runs = {"unwatched-1": ["loss 1.1268", "train error: 0.46"], "unwatched-2": ["loss 1.1267", "train error: 0.46"],
            "watched": ["loss 1.1266", "train error: 0.31"], "unwatched-3": third}
    observed = []
    monkeypatch.setattr(bench, "observe", lambda script, watched, root, keep_as: observed.append(keep_as) or
                        _observed(runs[keep_as]))
    monkeypatch.setattr(bench, "edited_files", lambda script: [])
    script = SimpleNamespace(name="a__b", healthy=SimpleNamespace(name="b-healthy"), interleaved_output=None)
    assert bench.transparency(script, tmp_path).differences == found
    assert observed == ["unwatched-1", "unwatched-2", "watched", "unwatched-3"]
    # Two unwatched runs alike (a deterministic script): no third, the difference stands.
    runs["unwatched-2"] = runs["unwatched-1"]
    observed.clear()
    assert bench.transparency(script, tmp_path).differences != []
    assert observed == ["unwatched-1", "unwatched-2", "watched"]


def test_lines_that_carry_a_process_id_are_volatile_in_whatever_order_the_processes_print():
    first = _observed(["101 loss 2.3", "102 loss 2.4", "test 0.5"])
    second = _observed(["202 loss 2.4", "201 loss 2.3", "test 0.5"])
    assert bench.differences(first, second, _observed(["302 loss 2.4", "301 loss 2.3", "test 0.5"])) == []
    assert bench.differences(first, second, _observed(["302 loss 2.4", "301 loss 2.3", "test 0.6"])) == [
        "stdout line 3: unwatched 'test 0.5', watched 'test 0.6'"]


def test_a_line_the_watched_run_adds_changes_or_drops_is_its_first_difference():
    first = second = _observed(["epoch 1", "loss 0.5"])
    assert bench.differences(first, second, _observed(["epoch 1", "watching", "loss 0.5"])) == [
        "stdout: watched printed 'watching' after line 1"]
    assert bench.differences(first, second, _observed(["epoch 1", "loss 0.7"])) == [
        "stdout line 2: unwatched 'loss 0.5', watched 'loss 0.7'"]
    assert bench.differences(first, second, _observed(["epoch 1"])) == [
        "stdout: watched did not print line 2 'loss 0.5'"]


def test_exit_status_losses_and_files_are_compared_and_the_exit_comes_first():
    first = second = _observed(["done"], files={"model.pt": "aa", "log.txt": "cc"}, losses=["0.5", "0.4"])
    watched = _observed(["done"], status=1, files={"log.txt": "cd"}, losses=["0.5", "0.41"],
                        stderr=["Traceback (most recent call last):", "  File \"main.py\", line 12, in <module>",
                                "AttributeError: Can't pickle local object"])
    found = bench.differences(first, second, watched)
    assert found[0] == "exit 1 (unwatched 0): AttributeError: Can't pickle local object"
    assert "losses: 2 watched, 2 unwatched; first differs at #2: unwatched ['0.4'], watched ['0.41']" in found
    assert "file model.pt: written unwatched, not watched" in found
    assert "file log.txt: content differs" in found


def test_a_file_whose_content_differs_between_unwatched_runs_is_compared_by_name_only():
    first = _observed([], files={"sample.png": "aa"})
    second = _observed([], files={"sample.png": "bb"})
    assert bench.differences(first, second, _observed([], files={"sample.png": "cc"})) == []


def test_files_named_by_time_or_process_are_matched_by_shape_and_counted():
    """TensorBoard names its event files by time and process id: each run writes other names."""
    def run(*names: str) -> bench.Observed:
        return _observed([], files={**{name: name for name in names}, "model.pt": "aa"})

    first = run("runs/events.out.tfevents.1764300000.host.4127.0")
    second = run("runs/events.out.tfevents.1764300009.host.4188.0")
    assert bench.differences(first, second, run("runs/events.out.tfevents.1764300020.host.4301.0")) == []
    assert bench.differences(first, second, run()) == [
        "files runs/events.out.tfevents.#.host.#.#: 0 written watched, 1 unwatched"]
    assert bench.differences(first, second, run("runs/events.out.tfevents.1.host.2.0",
                                                 "runs/events.out.tfevents.3.host.4.0")) == [
        "files runs/events.out.tfevents.#.host.#.#: 2 written watched, 1 unwatched"]


def test_a_healthy_setting_that_fails_unwatched_is_named_not_called_identical():
    failed = _observed([], status=1, stderr=["ModuleNotFoundError: No module named 'torchvision'"])
    assert bench.differences(failed, failed, failed) == [
        "the unwatched run failed (exit 1): ModuleNotFoundError: No module named 'torchvision'"]


def test_output_that_interleaves_is_left_out_of_the_comparison_only_when_the_manifest_says_so():
    first = second = _observed(["101 loss 2.3", "", "102 loss 2.4"], losses=["2.3", "2.4"])
    watched = _observed(["101 loss 2.3", "102 loss 2.4", ""], losses=["2.3", "2.4"])
    assert bench.differences(first, second, watched, ordered=False) == []
    assert bench.differences(first, second, watched) == ["stdout line 2: unwatched '', watched '102 loss 2.4'"]


def test_the_totals_count_a_script_identical_where_only_uncompared_output_could_differ():
    rows = [bench.Transparency("a__b", "b-healthy", "identical (stdout not compared: processes interleave)", [],
                               1.0, 1.0, 0, ""),
            bench.Transparency("c__d", "d-healthy", "exit 1 (unwatched 0): AttributeError: x", ["exit"],
                               1.0, 1.0, 0, "")]
    assert public_scripts.total_lines(rows, []) == [
        "transparency: 1 of 2 scripts identical watched, 1 with a difference (c__d)"]


def test_a_final_regex_reads_the_final_evaluation_the_script_prints():
    # The lines as the upstream scripts print them (docs/public-scripts.md); a script that prints none has none.
    printed = {
        "pytorch_examples__mnist": "\nTest set: Average loss: 0.9785, Accuracy: 212/297 (71%)\n",
        "pytorch_examples__gat": "Test set results: loss 1.7993 accuracy 0.8758\n",
        "pytorch_examples__word_language_model": "| End of training | test loss  6.23 | test ppl   508.93\n",
        "pytorch_examples__vae": "====> Test set loss: 194.3542\n",
        "nanogpt__train": "step 30: train loss 3.5, val loss 3.6\nstep 60: train loss 3.0406, val loss 3.3751\n",
    }
    expected = {"pytorch_examples__mnist": 0.9785, "pytorch_examples__gat": 1.7993,
                "pytorch_examples__word_language_model": 6.23, "pytorch_examples__vae": 194.3542,
                "nanogpt__train": 3.3751}
    regexes = {s.name: s.runs[0].final_regex for s in load_scripts()}
    for name, log in printed.items():
        assert public_scripts.calibration.final_evaluation(log, regexes[name]) == expected[name], name
    assert regexes["mingpt__chargpt"] == ""


def test_healthy_seeds_must_be_a_whole_number_of_at_least_one(capsys: pytest.CaptureFixture[str]):
    assert public_scripts.main(["--healthy-seeds", "0", "--no-transparency"]) == 64
    assert "--healthy-seeds: expected a whole number >= 1, got 0" in capsys.readouterr().err


@pytest.mark.slow  # a Python process with the stand-in on its path
def test_the_stand_in_torchvision_answers_the_names_torchmetrics_imports_and_refuses_their_use():
    # torchmetrics imports these at its own import wherever a torchvision imports (lightning__kfold_cv imports it):
    # the stand-in has them, and a script that called one would be told, not given a wrong answer.
    code = ("from torchvision.models import VGG16_Weights, resnet50, vgg16\n"
            "from torchvision.ops import box_area, box_convert, box_iou, complete_box_iou, distance_box_iou, "
            "generalized_box_iou\n"
            "for f in (resnet50, box_iou, VGG16_Weights):\n"
            "    try:\n"
            "        f()\n"
            "    except NotImplementedError as error:\n"
            "        print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(PUBLIC_SCRIPTS_DIR / "_standins")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "the torchvision stand-in has no torchvision.models.resnet50: no vendored script calls it",
        "the torchvision stand-in has no torchvision.ops.box_iou: no vendored script calls it",
        "the torchvision stand-in has no VGG16_Weights: no vendored script uses them",
    ]
