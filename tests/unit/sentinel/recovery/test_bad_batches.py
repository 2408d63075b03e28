"""Attribution before acting (stabilizer_sentinel.recovery.batches, .recovery): a sudden explosion is replayed
from the restored state with the failing step's own batches first. A batch that fails again while the
next ones train is bad: skipped, named, and passed over at every later pass and by a relaunch; a step
whose batches train again was a one-off. Where the loop's batches are not known, nothing changes.

The library runs in this process (``runpy`` of tests/fixtures/recovery/too_fast.py with ``--watch 1
--loader 1``: its batches come from a ``DataLoader``, in order, 64 a pass; ``--ahead 1`` fetches each a
step ahead, as Lightning's and Accelerate's loops do), and Lightning in its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset, dataloader

from stabilizer_sentinel.recovery.batches import Batches, Fetch, corrupt_records, fingerprint, nonfinite
from tests.helpers import in_make_test_all
from tests.unit.sentinel.support import FIXTURES, job_env, run

SCRIPT = FIXTURES / "recovery" / "too_fast.py"
BAD_RECORD = "1930"  # in batch 61 of each pass (32 records a batch): steps 60, 124, ...


def train(tmp_path, monkeypatch, *args: str, config: dict | None = None, watch: bool = True, scope: dict | None = None):
    """Run the script here; (its stdout lines, its stderr, findings.json or None). ``scope``: filled with the
    script's globals (its ``guard``)."""
    monkeypatch.setenv("STABILIZER_CONFIG", json.dumps(config if config is not None else {"recovery": "in_job"}))
    monkeypatch.setenv("STABILIZER_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("STABILIZER_FAILURE_FILE", str(tmp_path / "failure"))
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--watch", str(int(watch)), "--loader", "1", "--lr", "0.01",
                                      "--steps", "150", *args])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        ran = runpy.run_path(str(SCRIPT), run_name="__main__")
        if watch:
            ran["guard"].close()  # what the interpreter's exit does for a job
    if scope is not None:
        scope.update(ran)
    path = tmp_path / "checkpoints" / "findings.json"
    document = json.loads(path.read_text()) if path.exists() else None
    return out.getvalue().splitlines(), err.getvalue(), document


def final(lines: list[str]) -> float:
    return float(lines[-1].removeprefix("final="))


@pytest.mark.slow  # trains the regression three times
def test_a_corrupt_record_is_found_bad_skipped_at_every_pass_and_by_a_relaunch(tmp_path, monkeypatch):
    lines, err, document = train(tmp_path, monkeypatch, "--bad_record", BAD_RECORD)
    assert document["findings"] == [] and document["summary"]["ended"] == "completed"
    (decision,) = document["rollbacks"]  # its second pass does not explode: the batch is passed over
    assert (decision["rule"], decision["step"], decision["outcome"]) == ("ExplodingTensor", 60, "bad_batch")
    batch = decision["batch"]
    assert (batch["epoch"], batch["index"], batch["batches"]) == (1, 61, 1)
    # The replay with the batch failed at its one step; the replay on the next batches trained.
    assert [(p["factor"], p["steps"], p["failed"] is None) for p in decision["probed"]] == [(1.0, 1, False),
                                                                                           (1.0, 5, True)]
    assert decision["learning_rate_after"] == decision["learning_rate_before"] == 0.01
    assert "came again with that step's batches (batch 61 of pass 1 over the training data)" in err
    assert "skipped batch 61 of pass 2 over the training data" in err
    assert {line.rsplit("lr=", 1)[1] for line in lines if line.startswith("step=")} == {"0.01"}
    clean, _, _ = train(tmp_path / "clean", monkeypatch, watch=False)
    assert final(lines) < 1.5 * final(clean)

    # A relaunch told of it (recovering by relaunch, even) never meets it: no finding, no rollback.
    skip = {"recovery": "relaunch", "skip_batches": batch["fingerprints"]}
    _, err, relaunched = train(tmp_path / "relaunch", monkeypatch, "--bad_record", BAD_RECORD, config=skip)
    assert relaunched["findings"] == [] and "rollbacks" not in relaunched
    assert relaunched["summary"]["ended"] == "completed"
    assert "skipped batch 61 of pass 1" in err and "skipped batch 61 of pass 2" in err


@pytest.mark.slow  # trains the regression three times
def test_a_corrupt_record_a_shuffle_moves_is_passed_over_wherever_it_lands(tmp_path, monkeypatch):
    """A shuffled loader puts the NaN record in another batch each pass: the first is found bad as before;
    its non-finite values, which the batches trained after it lack, mark the data's corrupt records, and
    every later batch that holds them is passed over. Before, each pass's batch was a new bad batch: a
    rollback a pass, and once the job's five were spent, the rate was lowered for a fault of the data."""
    lines, err, document = train(tmp_path, monkeypatch, "--bad_record", BAD_RECORD, "--shuffle", "1",
                                 "--steps", "300")
    assert document["findings"] == [] and document["summary"]["ended"] == "completed"
    (decision,) = document["rollbacks"]  # one rollback in four passes
    assert (decision["outcome"], decision["batch"]["nonfinite"]) == ("bad_batch", True)
    assert "any later batch that holds them is passed over too" in err
    skips = [line for line in err.splitlines() if "it holds non-finite values, as the bad batch" in line]
    assert [line.split(" of pass ")[1].split()[0] for line in skips] == ["2", "3", "4"]
    assert {line.rsplit("lr=", 1)[1] for line in lines if line.startswith("step=")} == {"0.01"}
    clean, _, _ = train(tmp_path / "clean", monkeypatch, "--shuffle", "1", "--steps", "300", watch=False)
    assert final(lines) < 1.5 * final(clean)

    # A relaunch told so (recovering by relaunch, even) passes over it from its first pass: no finding.
    told = {"recovery": "relaunch", "skip_nonfinite_batches": True}
    _, err, relaunched = train(tmp_path / "relaunch", monkeypatch, "--bad_record", BAD_RECORD, "--shuffle", "1",
                               "--steps", "300", config=told)
    assert relaunched["findings"] == [] and "rollbacks" not in relaunched
    skips = [line for line in err.splitlines() if "it holds non-finite values" in line]
    assert [line.split(" of pass ")[1].split()[0] for line in skips] == ["1", "2", "3", "4"]


def test_non_finite_values_mark_corrupt_records_only_where_the_batches_after_lack_them():
    def fetched(*tensors):
        return Fetch(dataset=0, batch=tensors, epoch=1, index=1)

    clean, spoiled = torch.randn(4, 3), torch.randn(4, 3)
    spoiled[2] = float("nan")
    infinite = torch.randn(4, 3)
    infinite[0, 1] = float("inf")
    assert nonfinite((spoiled, torch.arange(4))) and nonfinite({"x": [infinite]}) and not nonfinite((clean,))
    assert not nonfinite((torch.arange(4), "text", None))  # whole numbers cannot hold a NaN
    for kind in (torch.float16, torch.bfloat16, torch.float64):
        assert nonfinite(spoiled.to(kind)) and nonfinite(infinite.to(kind)) and not nonfinite(clean.to(kind))
    negative = clean.clone()
    negative[3, 0] = float("-inf")
    assert nonfinite(negative) and nonfinite(spoiled.t())  # either end; any layout
    complex_ = torch.randn(4, dtype=torch.complex64)
    assert not nonfinite(complex_) and nonfinite(complex_ * float("inf")) and not nonfinite(torch.empty(0, 3))
    assert not nonfinite(torch.full((2,), float("nan"), device="meta"))  # not read off the host: no device wait
    assert corrupt_records([fetched(spoiled)], [fetched(clean), fetched(clean)])
    # Missing values the network masks: every batch holds NaN; the bad batch's are not corrupt records.
    assert not corrupt_records([fetched(spoiled)], [fetched(clean), fetched(spoiled.clone())])
    assert not corrupt_records([fetched(clean)], [fetched(clean)])  # a bad batch of finite values
    assert not corrupt_records([fetched(spoiled)], [])  # nothing trained after it to tell by
    # A padding mask of -inf fills most rows of every batch that has padding: not a record's.
    mask = torch.zeros(4, 1, 6)
    mask[:3, :, 4:] = float("-inf")
    assert not corrupt_records([fetched(clean, mask)], [fetched(clean, torch.zeros(4, 1, 6))])
    half = torch.randn(4, 3)
    half[:2] = float("nan")
    assert corrupt_records([fetched(half)], [fetched(clean)])  # two records of four


def test_a_tensor_that_cannot_be_read_so_is_not_passed_over_and_does_not_stop_the_run():
    """A nested tensor, a sparse CSR one, a float8 one (NaN in each): counted finite, never raising into
    the script's step. A conjugate view is read as it resolves."""
    nan = float("nan")
    odd = [torch.nested.nested_tensor([torch.ones(2), torch.full((3,), nan)]),
           torch.sparse_csr_tensor(torch.tensor([0, 1, 1]), torch.tensor([0]), torch.tensor([nan]), (2, 2)),
           torch.full((2,), nan).to(torch.float8_e4m3fn)]
    for tensor in odd:
        assert not nonfinite((tensor, torch.randn(2, 2)))
    conjugate = torch.tensor([1 + 1j, complex(nan, 0.0)], dtype=torch.complex64).conj()
    assert conjugate.is_conj() and nonfinite(conjugate) and not nonfinite(torch.ones(2, dtype=torch.complex64).conj())
    assert not corrupt_records(
        [Fetch(dataset=0, batch=(odd[0],), epoch=1, index=1)], [Fetch(dataset=0, batch=(torch.ones(2),), epoch=1,
                                                                     index=2)])


def test_passing_over_non_finite_batches_stops_where_the_data_carries_them_and_keeps_to_its_data():
    """A corrupt record is in one batch of a pass; data whose batches carry non-finite values by design
    would lose many: past a quarter of the batches fetched since (and more than three), the skipping stops.
    Only the data the bad batch came from is read."""
    batches = Batches()
    batches.corrupt_records_in([7])
    clean, spoiled = (torch.ones(2),), (torch.full((2,), float("nan")),)
    seen = [batches._passed_over_nonfinite(Fetch(dataset=7, batch=spoiled if i % 10 == 0 else clean, epoch=1,
                                                 index=i + 1)) for i in range(40)]
    assert sum(seen) == 4 and batches.skip_nonfinite  # one in ten: a record, passed over each time
    assert not batches._passed_over_nonfinite(Fetch(dataset=8, batch=spoiled, epoch=1, index=1))  # other data
    often = [batches._passed_over_nonfinite(Fetch(dataset=7, batch=spoiled, epoch=2, index=i + 1)) for i in range(12)]
    assert not batches.skip_nonfinite and not often[-1]  # half and more: the data's own, no longer passed over


@pytest.mark.slow  # the job's own process
def test_the_launcher_knows_the_first_steps_batches_though_it_attaches_at_that_step(tmp_path):
    """The launcher meets the model at the first optimizer step, after that step's batch was fetched: it
    watches the loaders from the script's start, so the unchanged script's bad batch is found too."""
    result = run(["-m", "stabilizer_sentinel.launch", str(SCRIPT), "--loader", "1", "--lr", "0.01", "--steps", "150",
                  "--bad_record", BAD_RECORD], SCRIPT.parent, job_env(tmp_path, {"recovery": "in_job"}))
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    (decision,) = document["rollbacks"]
    assert (decision["step"], decision["outcome"], decision["batch"]["index"]) == (60, "bad_batch", 61)
    assert "skipped batch 61 of pass 2" in result.stderr


@pytest.mark.slow  # trains the regression
def test_a_loop_that_fetches_ahead_finds_its_bad_batch_after_the_batch_it_held(tmp_path, monkeypatch):
    """``--ahead 1``: each batch is fetched a step before the step that trains on it. The replay's first
    step trains on the batch the loop already held, its second on the failing step's, which fails."""
    _, err, document = train(tmp_path, monkeypatch, "--ahead", "1", "--bad_record", BAD_RECORD)
    assert document["findings"] == [] and document["summary"]["ended"] == "completed"
    (decision,) = document["rollbacks"]
    assert (decision["step"], decision["outcome"], decision["batch"]["index"]) == (60, "bad_batch", 61)
    assert [(p["steps"], p["failed"]) for p in decision["probed"]] == [(2, "ExplodingTensor at step 62"), (5, None)]
    assert "skipped batch 61 of pass 2" in err


@pytest.mark.slow  # trains the regression
def test_a_loop_that_fetches_ahead_replays_the_last_batch_of_a_pass_at_the_next_step(tmp_path, monkeypatch):
    """Record 2040 is in the last batch of each pass (64 of 64): the loop holds no batch ahead after it, so
    the replay's first step takes it."""
    _, err, document = train(tmp_path, monkeypatch, "--ahead", "1", "--bad_record", "2040")
    (decision,) = document["rollbacks"]
    assert (decision["step"], decision["outcome"], decision["batch"]["index"]) == (63, "bad_batch", 64)
    assert [(p["steps"], p["failed"]) for p in decision["probed"]] == [(1, "ExplodingTensor at step 64"), (5, None)]
    assert "skipped batch 64 of pass 2" in err


@pytest.mark.slow  # two Lightning processes
@pytest.mark.parametrize(("watch", "iterable"), [("callback", "1"), *in_make_test_all(("launcher", "0"))])
def test_lightning_s_bad_batch_is_found_and_skipped_at_every_later_pass(tmp_path, watch, iterable):
    """Lightning fetches a batch ahead where its data has no length (``--iterable 1``), before the callback's
    guard is made as training starts: the callback watches the loaders from ``setup``."""
    script = FIXTURES / "loops" / "lightning_fit.py"
    result = run(["-m", "stabilizer_sentinel.launch", str(script), "--callback", str(int(watch == "callback")),
                  "--records", "640", "--batch-size", "32", "--bad-record", "300", "--steps", "60",
                  "--iterable", iterable], script.parent, job_env(tmp_path, {"recovery": "in_job"}))
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert document["findings"] == [] and document["summary"]["integration"] == ("lightning" if watch == "callback"
                                                                                  else "launcher")
    (decision,) = document["rollbacks"]
    assert (decision["step"], decision["outcome"], decision["batch"]["index"]) == (9, "bad_batch", 10)
    with_batch = decision["probed"][0]
    assert with_batch["steps"] == 1 + int(iterable) and with_batch["failed"].startswith("ExplodingTensor")
    assert "skipped batch 10 of pass 2" in result.stderr and "skipped batch 10 of pass 3" in result.stderr


@pytest.mark.slow  # trains the regression twice
def test_a_run_that_ends_during_the_replay_after_its_batch_failed_again_names_the_batch_for_the_relaunch(
        tmp_path, monkeypatch):
    """64 steps: the batch of step 60 fails again at the replay's first step, and the loop ends while the
    next batches train. The finding stands (the relaunch resumes before it) and the decision names the
    batch, so the relaunch passes over it."""
    _, err, document = train(tmp_path, monkeypatch, "--bad_record", BAD_RECORD, "--steps", "64")
    (decision,) = document["rollbacks"]
    assert (decision["step"], decision["outcome"]) == (60, "ended")
    batch = decision["batch"]
    assert batch["index"] == 61 and len(batch["fingerprints"]) == 1 and len(batch["fingerprints"][0]) == 16
    assert batch["nonfinite"] is True  # its NaN record, which the two batches trained after it lack
    assert [(p["steps"], p["failed"] is None) for p in decision["probed"]] == [(1, False), (2, True)]
    (finding,) = document["findings"]
    assert finding["step"] == 60 and "the finding stands" in err
    # 62 steps: the loop ends as the batch fails again, before any next batch trained: not named.
    _, _, document = train(tmp_path / "sooner", monkeypatch, "--bad_record", BAD_RECORD, "--steps", "62")
    (decision,) = document["rollbacks"]
    assert decision["outcome"] == "ended" and "batch" not in decision


@pytest.mark.slow  # trains the regression
def test_the_steps_a_loss_scaler_skips_took_their_batches_too(tmp_path, monkeypatch):
    """A first scale of 3e38 overflows: the scaler skips the first 2 steps while it halves it, and the guard
    checks no gradient there. Each skipped step still took its batch; counted at the skip, the loop is
    known to take one a step (not read as a loop fetching ahead), and each step holds its own."""
    scope: dict = {}
    _, _, document = train(tmp_path, monkeypatch, "--scale", "3e38", "--steps", "12", scope=scope)
    assert document["summary"]["steps_skipped"] == 2
    batches = scope["guard"].batches
    assert (batches.per_step, batches.lag) == (1, 0)
    assert [f.index for f in batches.held(11)] == [12]


@pytest.mark.slow  # trains the regression
def test_a_step_whose_own_batch_trains_again_was_a_one_off(tmp_path, monkeypatch):
    """``--bad_step 60`` spoils step 60's batch in the loop, after the loader made it: the batch the
    loader handed out is sound, so the replay with it trains."""
    _, err, document = train(tmp_path, monkeypatch, "--bad_step", "60")
    (decision,) = document["rollbacks"]
    assert (decision["step"], decision["outcome"]) == (60, "transient") and "batch" not in decision
    assert [(p["factor"], p["steps"], p["failed"]) for p in decision["probed"]] == [(1.0, 5, None)]
    assert "the same rate trained from there with that step's batches, then for 5 steps: a one-off" in err


@pytest.mark.slow  # trains the regression twice
@pytest.mark.parametrize("ahead", ["0", "1"])
def test_a_healthy_run_reading_a_data_loader_is_unchanged_by_the_watch(tmp_path, monkeypatch, ahead):
    watched, _, document = train(tmp_path, monkeypatch, "--ahead", ahead)
    unwatched, _, _ = train(tmp_path / "unwatched", monkeypatch, "--ahead", ahead, watch=False)
    assert "rollbacks" not in document and watched == unwatched  # every loss, bit for bit


@pytest.fixture
def batches():
    """A ``Batches`` watching every loader for the test, taken out after it."""
    watching = Batches()
    watching.activate()
    yield watching
    watching.deactivate()


def loader(records: int = 12, batch: int = 3) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(float(records)).reshape(records, 1)), batch_size=batch)


def values(batch) -> list[float]:
    return batch[0].flatten().tolist()


def test_the_step_s_batch_is_held_and_a_replay_comes_before_the_loaders_next_one():
    original = dataloader._BaseDataLoaderIter.__next__
    batches = Batches()
    batches.activate()
    try:
        data, taken = iter(loader()), []
        for step in range(3):
            taken.append(values(next(data)))
            with torch.no_grad():  # a validation batch between steps is not the training data
                next(iter(loader(records=6)))
            batches.checked(step)
        assert batches.per_step == 1 and values(batches.held(1)[0].batch) == taken[1]
        assert (batches.held(1)[0].epoch, batches.held(1)[0].index) == (1, 2)
        batches.replay(batches.held(1))
        assert values(next(data)) == taken[1] and batches.replayed()
        assert values(next(data)) == [9.0, 10.0, 11.0]  # then the loader's own order goes on
    finally:
        batches.deactivate()
    assert dataloader._BaseDataLoaderIter.__next__ is original  # put back as torch has it


def ahead(data: DataLoader):
    """A pass over ``data`` the way Lightning's and Accelerate's loops take it: each batch is fetched a step
    before the step that trains on it (to know whether it is the last)."""
    passing = iter(data)
    following = next(passing)
    for fetched in passing:
        batch, following = following, fetched
        yield batch
    yield following


def test_a_loop_that_fetches_ahead_holds_the_batch_each_step_trained_on_and_replays_it_after_the_one_it_holds(batches):
    data, taken = ahead(loader(records=18)), []  # six batches
    for step in range(3):
        taken.append(values(next(data)))
        batches.checked(step)
    assert (batches.per_step, batches.lag) == (1, 1)
    assert [values(batches.held(step)[0].batch) for step in range(3)] == taken
    assert [(f.epoch, f.index) for f in batches.held(2)] == [(1, 3)]
    batches.replay(batches.held(2))
    assert batches.lead == 1  # the loop holds batch 4, fetched ahead
    # The loop trains on the batch it fetched ahead first, then on the replay, then on in its own order.
    assert values(next(data)) == [9.0, 10.0, 11.0] and batches.replayed()
    assert values(next(data)) == taken[2]
    assert values(next(data)) == [12.0, 13.0, 14.0]


def test_accelerate_s_prepared_loader_fetches_ahead_and_is_known_the_same_way(batches):
    """Accelerate's ``DataLoaderShard`` (the Hugging Face ``Trainer``'s loader) fetches the next batch before
    it hands out the current one. Accelerate comes with the ``hf`` extra (the public-scripts corpus)."""
    accelerate = pytest.importorskip("accelerate")
    prepared = accelerate.Accelerator(cpu=True).prepare(loader(records=30))
    data, taken = iter(prepared), []
    for step in range(4):
        taken.append(values(next(data)))
        batches.checked(step)
    assert (batches.per_step, batches.lag) == (1, 1)
    assert [values(batches.held(step)[0].batch) for step in (1, 2, 3)] == taken[1:]
    batches.replay(batches.held(3))
    assert [values(next(data)) for _ in range(3)] == [[12.0, 13.0, 14.0], taken[3], [15.0, 16.0, 17.0]]


def test_a_loop_that_fetches_ahead_and_takes_two_batches_a_step_gets_the_replay_as_one_step(batches):
    """Two micro-batches a step, fetched one ahead: the replay waits for the loop's own fetch that ends the
    step under way, so the next step after it takes the two replayed batches."""
    data = ahead(loader(records=36))  # twelve batches
    steps = []
    for step in range(3):
        steps.append([values(next(data)), values(next(data))])
        batches.checked(step)
    assert (batches.per_step, batches.lag) == (2, 1)
    assert [[values(f.batch) for f in batches.held(step)] for step in range(3)] == steps
    batches.replay(batches.held(1))
    assert [values(next(data)), values(next(data))] == [[18.0, 19.0, 20.0], [21.0, 22.0, 23.0]]
    assert [values(next(data)), values(next(data))] == steps[1] and batches.replayed()
    assert values(next(data)) == [24.0, 25.0, 26.0]


def test_a_loop_that_fetches_ahead_knows_the_batches_on_both_sides_of_a_new_pass(batches):
    """The last step of a pass fetches nothing (the loader is done); the first of the next fetches two."""
    records, taken = loader(records=9), []  # three batches a pass
    for step in range(5):
        if step % 3 == 0:
            data = ahead(records)
        taken.append(values(next(data)))
        batches.checked(step)
    assert [values(batches.held(step)[0].batch) for step in (2, 3, 4)] == taken[2:]
    assert [(f.epoch, f.index) for step in (2, 3, 4) for f in batches.held(step)] == [(1, 3), (2, 1), (2, 2)]


def test_a_peek_at_the_data_through_another_iterator_before_the_loop_is_not_the_loop_s(batches):
    """``next(iter(loader))`` for a shape, then the loop: the first step took one batch, not two."""
    data = loader()
    next(iter(data))
    passing, taken = iter(data), []
    for step in range(3):
        taken.append(values(next(passing)))
        batches.checked(step)
    assert (batches.per_step, batches.lag) == (1, 0)
    assert [values(batches.held(step)[0].batch) for step in range(3)] == taken


def test_a_loop_that_takes_fewer_batches_after_its_first_step_than_before_holds_none(batches):
    """Two batches before the first step and one after, from one iterator, but more than a step's worth
    ahead is not a loop fetching ahead: not known, none held."""
    passing = iter(loader(records=30))
    for _ in range(3):
        next(passing)
    batches.checked(0)
    next(passing)
    batches.checked(1)
    assert batches.per_step == 0 and batches.held(1) is None


def test_a_fingerprint_reads_the_values_and_the_shape_and_nothing_else():
    x = torch.randn(64, 3, 8, 8)
    same = (x.clone(), torch.arange(64))
    assert fingerprint((x, torch.arange(64))) == fingerprint(same)
    changed = x.clone()
    changed[0, 0, 0, 0] += 1  # the first value is always in the sample
    assert fingerprint((changed, torch.arange(64))) != fingerprint(same)
    assert fingerprint((x.reshape(32, 6, 8, 8), torch.arange(64))) != fingerprint(same)
    assert fingerprint({"input_ids": torch.ones(2, 5, dtype=torch.long)}) != fingerprint(
        {"labels": torch.ones(2, 5, dtype=torch.long)})
    assert len(fingerprint(same)) == 16


def test_a_batch_the_loop_wrote_into_is_not_replayed(batches):
    """The loop spoiled its own batch in place (``inputs[0] = nan``): replaying the batch would replay the
    loop's write, not what the loader made, and call the data bad."""
    data = iter(loader())
    for step in range(3):
        (inputs,) = next(data)
        if step == 2:
            inputs[0] = float("nan")
        batches.checked(step)
    assert batches.held(1) is not None and batches.held(2) is None


def test_only_the_thread_that_runs_the_steps_counts_and_is_handed_a_replay(batches):
    """A thread that fetches ahead for the loop (a background prefetcher, gradients on as in any new
    thread) takes no part: its fetches are not a step's, and a replay waits for the loop's own fetch."""
    import queue
    import threading

    data, ahead = iter(loader(records=30)), queue.Queue(maxsize=2)
    worker = threading.Thread(target=lambda: [ahead.put(b) for b in data], daemon=True)
    own = iter(loader())  # the loop's thread is the one that checks
    worker.start()
    taken = []
    for step in range(3):
        ahead.get()
        taken.append(values(next(own)))
        batches.checked(step)
    assert batches.per_step == 1 and values(batches.held(2)[0].batch) == taken[2]
    batches.replay(batches.held(2))
    ahead.get()  # the thread fetches on; the loop's next fetch is the replay
    assert values(next(own)) == taken[2] and batches.replayed()


def test_a_batch_with_no_tensor_has_no_fingerprint_so_nothing_is_skipped_for_it():
    """A batch of another kind (a custom object) reads alike for every batch of its loader: passing over
    one would pass over them all."""

    class Graph:
        pass

    assert fingerprint((Graph(), 3)) is None and fingerprint([]) is None
    tokens = torch.randint(0, 50, (1024, 8))
    other = tokens.clone()
    other[:, 3] += 1  # the same first column (a sample on one column would not see it)
    assert fingerprint(tokens) != fingerprint(other)
