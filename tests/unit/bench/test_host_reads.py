"""Host reads of a watched step (stabilizer/bench/host_reads.py): on an accelerator each waits for the device."""

from __future__ import annotations

import pytest

from stabilizer.bench import host_reads

pytestmark = pytest.mark.slow  # trains a small classifier for a few steps, in this process


def test_a_watched_step_reads_the_device_once_but_where_the_state_is_copied_or_a_window_closes(tmp_path):
    steps = 12
    reads = host_reads.library_loop(steps, tmp_path)
    by_name = {where.rsplit(" ", 1)[1]: where for where in reads.by_line if "chance_level.py" not in where}
    finite = by_name.pop("_sync_scalars")
    assert reads.by_line[finite] == steps and reads.steps_of[finite] == set(range(steps))  # once, every step
    level = next(where for where in reads.by_line if "chance_level.py" in where)  # once a step at most
    assert reads.by_line[level] == len(reads.steps_of[level]) <= steps // 5 + 1
    # How far the weights moved over the first window (weight_motion): read once, as that window closes (step 4).
    thrown = by_name.pop("moved")
    assert reads.by_line[thrown] == 1 and reads.steps_of[thrown] == {4}
    copied = set().union(*(reads.steps_of[where] for where in by_name.values()))  # the rewind's copies, capture
    assert set(by_name) <= {"state_on_host", "_numpy"} and len(copied) <= steps // 5 + 2
    quiet = [step for step in range(steps) if step not in copied | reads.steps_of[level] | {4}]
    assert len(quiet) >= steps // 2 and all(reads.by_step[step] == 1 for step in quiet)
    assert "reads on" in "\n".join(host_reads.report(reads, steps))
