"""The device benchmark (stabilizer/bench/device.py), run small on the CPU: the GPT script it watches runs
unchanged under the launcher with the same losses, and its too-high rate is rolled back in the job."""

from __future__ import annotations

import pytest

from stabilizer.bench import device

pytestmark = pytest.mark.slow  # starts the script's processes


def test_the_watched_gpt_logs_the_losses_it_logs_plain(tmp_path, capsys):
    assert device.main(["--quick", "--rounds", "1", "--only", "time", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out.split("ms/step   ratio", 1)[1].splitlines()[1:]
    assert [row.split()[0] for row in table] == ["plain", "launcher,", "launcher,"]
    assert all(row.endswith("x  same") for row in table), table


@pytest.mark.long  # the same GPT's rollback in the job: test_in_job_recovery.py, in `make test`
def test_the_gpt_at_a_rate_ten_thousand_times_its_own_is_rolled_back_and_goes_on(tmp_path, capsys):
    assert device.main(["--quick", "--steps", "150", "--only", "rollback", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Diverging at step" in out and ": recovered," in out, out


def test_the_host_time_inside_the_watcher_is_told_by_part(tmp_path, capsys):
    assert device.main(["--quick", "--steps", "30", "--only", "hooks", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out.split("by part", 1)[1].splitlines()
    rows = {line[:46].strip(): line[46:].split() for line in table[2:]}
    assert rows["check before the update"][0] == "-"  # the script unwatched has no watcher's parts
    for watched in (1, 2):  # relaunch, in_job: the check ran each step and took time
        assert float(rows["check before the update"][watched]) > 0
        assert float(rows["gradient norm, the finite check's read"][watched]) > 0
    assert rows["rewind's copies"][1] == "-" and float(rows["rewind's copies"][2]) > 0  # copies with in_job only
