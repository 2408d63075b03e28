"""A slice of the calibration corpus, end to end in local mode through the benchmark's own code
path (`stabilizer.bench.calibration.execute`), each run judged against its manifest: no false positive,
no false negative, no misdiagnosis, and an outcome the manifest allows.

The slice: a healthy character RNN that clips its gradients, and a regression with gradient
accumulation whose rate is far too high (it must be answered at a lower rate, inside the job or by a
relaunch, and end `succeeded`), both through the library's three lines, under the `default` policy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stabilizer.bench import calibration as bench_corpus
from stabilizer.bench.corpus import load, select
from tests.helpers import in_make_test_all

pytestmark = pytest.mark.slow
# Long: the calibration corpus is a benchmark (python -m stabilizer.bench --corpus); its parts have fast tests.
SLICE = in_make_test_all("rnn-lr0.5-clip1", "accum-lr1.5")


@pytest.mark.parametrize("name", SLICE)
def test_corpus_run_ends_as_its_manifest_says(name: str, digits_channels: dict[str, Path], tmp_path: Path):
    [run] = select(load(), names=[name])
    result = bench_corpus.execute(run, "default", digits_channels["train"].parent, tmp_path)
    assert bench_corpus.verdict(result) == "ok", result
    assert result.outcome in run.expect.outcome
    if run.healthy:
        assert result.attempts == 1 and result.wasted_steps == 0
    else:
        # Remedied: relaunched, or rolled back inside the job (job.recovery in_job, the default).
        assert (result.attempts > 1 or result.rollbacks) and result.first_call in run.expect.first_attempt
        for moved in result.changes:
            for hyperparameter, direction in run.expect.remedy.items():
                if hyperparameter in moved:
                    old, new = moved[hyperparameter]
                    expected = {"down": new < old, "up": new > old, "keep": new == old}[direction]
                    assert expected, moved
    assert result.steps_computed > 0
