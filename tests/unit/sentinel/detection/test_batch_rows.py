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
    assert shorts(epochs(10, full=2)) == [2 + 3 * epoch for epoch in range(10)]  # an epoch of three batches


def test_no_batch_is_short_without_a_usual_one_to_be_short_of():
    assert shorts([None] * 20) == []
    assert shorts([8, 32, 32]) == []  # the first step has nothing before it
    assert shorts([32, 8, 32, 32]) == []  # one full batch is no usual yet
    assert shorts(epochs(10, full=1)) == []  # two sizes in turn: the smaller is as usual as the larger
    draws = random.Random(0)
    assert shorts([draws.randint(20, 40) for _ in range(300)]) == []  # rows that vary from step to step


def test_a_batch_size_that_shrinks_for_good_is_the_usual_again_within_a_third_of_the_recent_steps():
    left_out = shorts([64] * 200 + [16] * 200)
    assert left_out and left_out[0] == 200 and left_out[-1] < 200 + RECENT // 3 + 1
    assert left_out == list(range(200, left_out[-1] + 1))


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
