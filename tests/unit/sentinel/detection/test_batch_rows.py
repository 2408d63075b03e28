"""A loader's short last batch, left out of the learning check's windows (``batch_rows``)."""

from __future__ import annotations

import random

from stabilizer_sentinel.detection.batch_rows import RECENT, BatchRows
from stabilizer_sentinel.detection.learning_check import NOT_LEARNING, LearningCheck


def shorts(rows: list[int | None]) -> list[int]:
    """The steps of ``rows`` read as short batches."""
    reader = BatchRows()
    return [step for step, count in enumerate(rows) if reader.short(count)]


def epochs(count: int, full: int = 23, last: int = 8) -> list[int]:
    return ([32] * full + [last]) * count


def test_each_epochs_short_last_batch_is_short_and_no_full_one_is():
    assert shorts(epochs(5)) == [23, 47, 71, 95, 119]
    # Epochs of three and of two batches, over many more steps than the rows are counted over: every last batch
    # alike, from the first epoch to the last (the review of stop 82: a first rule let the last of three batches
    # back in once the counted steps reached RECENT, and a summed loss at rate 0 then read as a fall).
    assert shorts(epochs(60, full=2)) == [2 + 3 * epoch for epoch in range(60)]
    assert shorts(epochs(60, full=1)) == [1 + 2 * epoch for epoch in range(60)]


def test_no_batch_is_short_without_a_widest_one_common_enough_to_be_short_of():
    assert shorts([None] * 20) == []
    assert shorts([8, 32, 32]) == []  # the first step has nothing before it, and a wider batch is no short one
    assert shorts([32, 64, 128, 256] * 10) == []  # a batch wider than every one before it
    draws = random.Random(0)
    varying = shorts([draws.randint(20, 40) for _ in range(300)])  # rows that vary from step to step
    assert all(step < 4 for step in varying)  # only before a wider batch came


def test_a_batch_size_that_shrinks_for_good_is_short_until_the_wider_batches_are_under_half_the_recent_steps():
    assert shorts([64] * 200 + [16] * 200) == list(range(200, 200 + RECENT // 2))


def test_a_summed_loss_at_rate_0_is_not_learned_for_its_short_last_batches():
    # Stop 82's hunt: Pyro's VAE tutorial at rate 0 (an ELBO summed over its rows; batches of 64 and a last one of
    # 28) read as learned at its end, its last window holding the last batch. Here a full batch sums to about 290,
    # the last one to a quarter of that, and nothing is learned.
    draws = random.Random(1)
    losses = [(290.0 if rows == 32 else 72.5) * draws.uniform(0.95, 1.05) for rows in epochs(15)]

    def judged(with_rows: bool) -> tuple[str | None, bool]:
        check = LearningCheck(run_steps=len(losses))
        for step, (loss, rows) in enumerate(zip(losses, epochs(15), strict=True)):
            found = check.observe(step, loss, None, 0.0, rows if with_rows else None)
            if found is not None:
                return found.rule, check.learned
        found = check.at_end(len(losses) - 1)
        return None if found is None else found.rule, check.learned

    assert judged(with_rows=False) == (None, True)  # what it was
    assert judged(with_rows=True) == (NOT_LEARNING, False)


def test_a_summed_loss_at_rate_0_in_epochs_of_three_batches_is_not_learned():
    # The review of stop 82: the first rule left the last of three batches out for the first 64 steps only; the
    # windows after them held it, a quarter of a full batch's loss, and the run read as learned at its end.
    draws = random.Random(2)
    rows = epochs(100, full=2)
    losses = [(290.0 if count == 32 else 72.5) * draws.uniform(0.95, 1.05) for count in rows]
    check, found = LearningCheck(run_steps=len(losses)), None
    for step, (loss, count) in enumerate(zip(losses, rows, strict=True)):
        found = found or check.observe(step, loss, None, 0.0, count)
    found = found or check.at_end(len(losses) - 1)
    assert found is not None and found.rule == NOT_LEARNING and not check.learned
