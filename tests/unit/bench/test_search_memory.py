"""The memory a search's trials peak at, unwatched and watched (stabilizer/bench/search_memory.py)."""

from __future__ import annotations

import pytest

from stabilizer.bench import search_memory

# Runs the fixture three times, unwatched and watched: 20 s to a minute, in the long tier.
pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_the_benchmark_runs_a_small_search_three_ways_with_the_same_output(capsys):
    assert search_memory.main(["--trials", "2", "--steps", "5", "--width", "32", "--depth", "1"]) == 0
    rows = {line[:20].strip(): line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {name for name, _ in search_memory.RUNS}
    assert rows["unwatched"][-3] == "1.00"  # name, peak MB, ratio, seconds, same output
    assert all(row[-1] == "yes" and float(row[-4]) > 0 for row in rows.values())  # same stdout, a peak read
