"""What the notebook shows of an execution: the attempts table, the status block, the policy summary."""

from __future__ import annotations

from stabilizer.client.execution_client import ExecutionView
from stabilizer.reports import attempts, executions

EXPLODED = {
    "number": 1,
    "job_name": "stabilizer-abcd1234-1",
    "run_spec": {"warmup_learning_rate": 0.1, "learning_rate": 0.1, "add_batch_norm": 0, "grad_clip": 0.0},
    "status": "Stopped",
    "steps": 4,
    "seconds": 5,
    "finding": {
        "rule": "ExplodingTensor",
        "step": 3,
        "phase": "main",
        "tensor": "gradients/stem.weight",
        "value": "nan",
    },
    "decision": {"action": "relaunch", "remedy": "add_batch_norm", "reason": "ExplodingTensor at step 3: add <BN>"},
}
HEALTHY = {
    "number": 2,
    "job_name": "stabilizer-abcd1234-2",
    "run_spec": {"warmup_learning_rate": 0.1, "learning_rate": 0.1, "add_batch_norm": 1, "grad_clip": 1.5},
    "status": "Completed",
    "steps": 8,
    "seconds": 20,
    "decision": {"action": "end", "outcome": "succeeded", "reason": "attempt 2 completed with no rule firing"},
}


def view(status: str = "SUCCEEDED", attempts: list | None = None) -> ExecutionView:
    state = {"policy": "default", "attempts": attempts if attempts is not None else [EXPLODED, HEALTHY]}
    if status == "SUCCEEDED":
        state |= {"outcome": "succeeded", "reason": "attempt 2 completed with no rule firing"}
    return ExecutionView(arn="arn:x:exec-1", name="exec-1", status=status, input={}, state=state)


def test_each_attempt_shows_its_recipe_finding_decision_and_reason():
    rows = attempts.attempt_rows(view().attempts)
    assert [r.recipe for r in rows] == ["warm-up LR 0.1, LR 0.1, no BN", "warm-up LR 0.1, LR 0.1, BN, clip 1.5"]
    assert rows[0].finding == "ExplodingTensor at step 3 (main)"
    assert (rows[0].decision, rows[0].reason) == ("add_batch_norm", "ExplodingTensor at step 3: add <BN>")
    assert (rows[1].finding, rows[1].decision) == ("-", "end")
    assert (rows[0].steps, rows[1].seconds) == ("4", "20")


def test_the_html_table_escapes_what_the_workflow_wrote():
    html = attempts.Table(attempts.attempt_rows(view().attempts), title="attempts")._repr_html_()
    assert "add &lt;BN&gt;" in html and "<BN>" not in html
    assert html.count("<tr>") == 3  # header and two attempts


def test_the_status_block_follows_the_execution_to_its_outcome():
    running = executions.status_text(view("RUNNING", [EXPLODED | {"decision": None, "status": "InProgress"}]))
    assert running.splitlines()[0] == "exec-1: RUNNING"
    assert "outcome" not in running
    done = executions.status_text(view())
    assert "-> add_batch_norm: ExplodingTensor at step 3" in done
    assert done.splitlines()[-1] == "outcome: succeeded; attempt 2 completed with no rule firing"


def test_the_policy_summary_adds_up_attempts_steps_and_seconds():
    assert executions.policy_summary(view()) == {
        "policy": "default",
        "outcome": "succeeded",
        "attempts": "2",
        "training steps": "12",
        "job seconds": "25",
        "final recipe": "warm-up LR 0.1, LR 0.1, BN, clip 1.5",
    }


def test_watch_refreshes_until_the_execution_ends():
    views = iter([view("RUNNING", [EXPLODED]), view("RUNNING"), view()])

    class Client:
        def describe(self, arn: str) -> ExecutionView:
            return next(views)

    shown: list[str] = []
    last = executions.follow(Client(), "arn:x:exec-1", poll_seconds=0, show=shown.append)
    assert last.status == "SUCCEEDED"
    assert len(shown) == 3
    assert shown[-1].endswith("attempt 2 completed with no rule firing")


def test_the_policy_summary_of_a_spot_job_says_what_was_billed_and_saved():
    # DescribeTrainingJob's BillableTimeInSeconds per attempt; savings as SageMaker documents them,
    # (1 - billable / trained) x 100 over the execution's attempts.
    spot = view(attempts=[{**EXPLODED, "billable_seconds": 2}, {**HEALTHY, "billable_seconds": 8}])
    spot.state["job"] = {"use_spot_instances": True}
    summary = executions.policy_summary(spot)
    assert (summary["job seconds"], summary["billed seconds"], summary["spot savings"]) == ("25", "10", "60%")
    assert "billed seconds" not in executions.policy_summary(view())
