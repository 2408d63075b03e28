"""A slice of the public-scripts corpus (`tests/public_scripts`) end to end, through the benchmark's own
code (`stabilizer.bench.public_scripts`).

- Transparency: karpathy/nanoGPT's train.py and pytorch/examples' word language model, the two
  fastest scripts, each run twice unwatched and once watched at the launcher level, at their healthy
  settings. A user would notice a watched run that ends differently, prints other lines or losses,
  writes other files, or adds lines of its own.
- A verdict: nanoGPT at 1000 times its learning rate, through the local workflow with the script
  unchanged, must be stopped, relaunched at a lower rate and end as its manifest says.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stabilizer.bench import calibration, public_scripts
from stabilizer.bench import transparency as bench
from stabilizer.bench.corpus import Script, load_scripts

pytestmark = pytest.mark.slow
SCRIPTS = {s.name: s for s in load_scripts()}
NANOGPT, WORD_LM = "nanogpt__train", "pytorch_examples__word_language_model"
if not (SCRIPTS[NANOGPT].present and SCRIPTS[WORD_LM].present):
    pytest.skip("the upstream files of nanoGPT and the word language model are not in this checkout "
                "(tests/public_scripts/README.md)", allow_module_level=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[bench.Observed, ...]]:
    """Each script of the slice run unwatched twice and watched once, at its healthy setting; the two
    scripts side by side (each script's three runs one after the other, at the same path)."""

    def three_runs(name: str) -> tuple[bench.Observed, ...]:
        root = tmp_path_factory.mktemp(name)
        return tuple(bench.observe(SCRIPTS[name], watched, root, keep) for watched, keep in
                     ((False, "unwatched-1"), (False, "unwatched-2"), (True, "watched")))

    with ThreadPoolExecutor(2) as pool:
        return dict(zip((NANOGPT, WORD_LM), pool.map(three_runs, (NANOGPT, WORD_LM)), strict=True))


def _differences(runs: dict[str, tuple[bench.Observed, ...]], name: str, *kinds: str) -> list[str]:
    return [d for d in bench.differences(*runs[name]) if d.startswith(kinds)]


@pytest.mark.parametrize("name", [NANOGPT, WORD_LM])
def test_watching_changes_neither_how_a_script_ends_nor_what_it_prints_nor_its_losses(runs, name: str):
    unwatched = runs[name][0]
    assert unwatched.exit_status == 0 and unwatched.losses, unwatched.stderr[-5:]
    assert _differences(runs, name, "exit", "stdout", "losses") == []


@pytest.mark.parametrize("name", [NANOGPT, WORD_LM])
def test_watching_changes_no_file_a_script_writes(runs, name: str):
    assert runs[name][0].files, "the healthy setting writes a checkpoint"
    assert _differences(runs, name, "file") == []


@pytest.mark.parametrize("name", [NANOGPT, WORD_LM])
def test_watching_adds_no_line_to_a_scripts_stderr(runs, name: str):
    assert _differences(runs, name, "stderr") == []


# Wrong until stop 48 (ended did_not_learn at the relaunch ladder's floor, a hundredth of the rate); since the
# floor is a thousandth (docs/remedies.md) it rolls back in the job, then is relaunched at 0.01, its own rate.
def test_nanogpt_at_a_thousand_times_its_rate_is_stopped_and_relaunched_lower(digits_channels: dict[str, Path],
                                                                              tmp_path: Path):
    script: Script = SCRIPTS[NANOGPT]
    [run] = [r for r in script.runs if r.name == "nanogpt-lr10"]
    result = public_scripts.verdict(script, run, "default", digits_channels["train"].parent, tmp_path)
    assert calibration.verdict(result) == "ok", result
    assert result.first_call in run.expect.first_attempt and result.detection_step is not None
    assert result.attempts > 1 and result.outcome in run.expect.outcome
    old, new = result.changes[0]["learning_rate"]
    assert new < old
