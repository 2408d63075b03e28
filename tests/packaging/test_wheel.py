"""A wheel built from the checkout installs into a fresh virtualenv outside the repository and runs.

What a user gets from `pip install training-stabilizer`: the `stabilizer` command, the client and
local mode, with the workflow, the in-job library and the contract as packages of the one
distribution, and the state machine's definition and the reference job's source as its data. The
command runs from a directory outside the checkout, with nothing of the checkout on the path, and
must bring the reference job to a verdict (which one a 12-step run earns is not this test's concern).
"""

from __future__ import annotations

import json

import pytest

from stabilizer.cli.commands import EXIT_STATUS
from tests.packaging.support import build_wheel, copy_tree, fresh_environment, wheel_names

pytestmark = [pytest.mark.slow, pytest.mark.long]

# The smallest run that ends in a verdict: one attempt of a shallow network with batch norm, 12
# steps (the fewest in which the learning check can judge the loss).
SMALL_RUN = ["add_batch_norm=1", "depth=8", "warmup_epochs=0", "num_epochs=1", "batch_size=64", "max_steps=12",
                 "checkpoint_every=4", "wait_seconds=1"]


def test_the_wheel_runs_stabilizer_run_local_to_a_verdict_outside_the_checkout(tmp_path):
    source = copy_tree(["pyproject.toml", "README.md", "stabilizer", "lambdas", "model", "statemachine"],
                       tmp_path / "checkout")
    wheel = build_wheel(source, tmp_path / "wheels")
    names = set(wheel_names(wheel))
    assert {"stabilizer_workflow/handlers/train.py", "stabilizer_workflow/statemachine/stabilizer.asl.json",
            "stabilizer_sentinel/autostart/sitecustomize.py", "stabilizer_contract/catalogue.py",
            "stabilizer/reference_job/train.py", "stabilizer/cli/commands.py"} <= names

    environment = fresh_environment(tmp_path / "env", wheel)
    work = tmp_path / "work"
    work.mkdir()
    result = environment.run([str(environment.bin / "stabilizer"), "run", "--local", "--plain", "--run-dir",
                              str(work / "runs"), "--name", "from-wheel", *SMALL_RUN], cwd=work, timeout=600)
    record = json.loads((work / "runs" / "from-wheel" / "run.json").read_text())
    state = record["state"]
    # A verdict: the execution ended with an outcome, from a job that trained, and the command's
    # exit status is that outcome's.
    assert state["next_action"] == "end" and state["outcome"] in EXIT_STATUS, result.stdout[-3000:] + result.stderr
    assert state["attempts"][0]["steps"] >= 10, state["attempts"][0]
    assert result.returncode == EXIT_STATUS[state["outcome"]], result.stdout[-3000:]
