"""The log channel (stabilizer_sentinel.integration.log_channel) reads the loss out of the lines a script prints,
passing every character through unchanged."""

from __future__ import annotations

import io
import re

from stabilizer_sentinel.integration.log_channel import _LossFromLog
from stabilizer_sentinel.say import say

PATTERN = re.compile(r"loss[=:]\s*([-+0-9.eE]+|nan|inf)")


def _stream() -> tuple[_LossFromLog, io.StringIO, list[float]]:
    underneath, read = io.StringIO(), []
    return _LossFromLog(underneath, [(PATTERN, read.append)]), underneath, read


def test_a_progress_bars_line_is_read_at_its_last_update_not_its_first():
    stream, underneath, read = _stream()
    text = "epoch 1: 10%| loss=2.31\repoch 1: 50%| loss=1.20\repoch 1: 100%| loss=0.412\n"
    stream.write(text)
    assert read == [0.412]
    assert underneath.getvalue() == text


def test_a_last_update_with_no_loss_leaves_the_one_before_it():
    stream, _, read = _stream()
    stream.write("step 9 loss=0.9\r\n")  # a bar that ends by clearing its line, then a newline
    stream.write("train loss: 0.75\rdone\n")
    assert read == [0.9, 0.75]


def test_a_line_written_in_pieces_is_read_once_it_ends():
    stream, _, read = _stream()
    for piece in ("step 3 ", "loss=", "1.5", "\r", "step 4 loss=1.25", "\n"):
        stream.write(piece)
    assert read == [1.25]


def test_the_watchers_own_lines_pass_through_unread(monkeypatch):
    # Stop 80's hunt: a script that printed no loss had the log's last loss 1.739e+08, read from a finding's line.
    stream, underneath, read = _stream()
    monkeypatch.setattr("sys.stderr", stream)
    say("sentinel: Diverging at step 3: the loss=1.739e+08 has been above 23.5 for 3 steps")
    stream.write("step 4 loss=0.5\n")
    assert read == [0.5]
    assert underneath.getvalue().startswith("sentinel: Diverging at step 3: the loss=1.739e+08")


def test_the_watchers_line_after_a_progress_bars_unended_line_starts_a_line_of_its_own(monkeypatch):
    stream, underneath, read = _stream()
    monkeypatch.setattr("sys.stderr", stream)
    stream.write("epoch 1: 10%| loss=2.31\repoch 1: 20%| loss=1.66e+3")
    say("sentinel: Diverging at step 3")
    stream.write("\repoch 1: 30%| loss=0.9\n")
    say("sentinel: rolled back")
    assert underneath.getvalue() == ("epoch 1: 10%| loss=2.31\repoch 1: 20%| loss=1.66e+3\n"
                                     "sentinel: Diverging at step 3\n\repoch 1: 30%| loss=0.9\nsentinel: rolled back\n")
    assert read == [0.9]


def test_the_jobs_objective_is_read_from_the_same_lines_as_the_loss_and_the_watchers_lines_are_not(monkeypatch):
    underneath, losses, rewards = io.StringIO(), [], []
    stream = _LossFromLog(underneath, [(PATTERN, losses.append),
                                       (re.compile(r"Average reward: (\S+)"), rewards.append)])
    monkeypatch.setattr("sys.stderr", stream)
    text = "Episode 10\tLast reward: 18.00\tAverage reward: 11.57\nEpisode 20\tloss=0.5\tAverage reward: 13.10\n"
    stream.write(text)
    say("sentinel: NotLearning at step 30: Average reward: 99.0")
    assert rewards == [11.57, 13.10]
    assert losses == [0.5]
    assert underneath.getvalue().startswith(text)
