"""The evaluation table: each checkpoint's state, "Try again" on a failed one,
"Evaluate this checkpoint" on one never evaluated, the project's "Evaluate
every checkpoint…" switch; the actions go through the query API and the
table follows. Evaluations are scored by a real worker."""

from __future__ import annotations

import pytest
from widget_runs import StoppedRun

import launchhelm as lh
from launchhelm.widgets import EvaluationTable


def _click(widget: EvaluationTable, name: str, **args: object) -> None:
    content = {"type": "action", "name": name, "args": args}
    widget._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})


def _score_first_checkpoint_badly(run: StoppedRun) -> lh.RunHandle:
    handle = lh.Api(run.store).run(run.id)
    first = handle.checkpoints()[0]
    handle.evaluate(first.id)

    @lh.evaluate(project="plain", store=run.store, poll_interval=0.05, name="worker-1")
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        raise RuntimeError(f"no GPU for step {ctx.step}")

    score.serve(stop_when_idle=True)
    return handle


@pytest.mark.slow
def test_states_scores_errors_and_try_again(stopped_run: StoppedRun) -> None:
    handle = _score_first_checkpoint_badly(stopped_run)
    table = EvaluationTable(stopped_run.id, store=stopped_run.store)
    rows = {r["step"]: r for r in table.rows()}
    assert rows[10]["state"] == "failed" and rows[10]["detail"] == "RuntimeError: no GPU for step 10"
    assert rows[10]["attempts"] == 1 and rows[10]["can_retry"] and not rows[10]["can_evaluate"]
    assert rows[20]["state"] == "not evaluated" and rows[20]["can_evaluate"] and not rows[20]["can_retry"]

    _click(table, "retry", evaluation_id=rows[10]["evaluation_id"])
    assert table.error == ""
    assert lh.Api(stopped_run.store).evaluation(rows[10]["evaluation_id"]).state == "queued"
    assert {r["step"]: r["state"] for r in table.rows()}[10] == "queued"
    assert "queued again" in table.state["notice"]

    @lh.evaluate(project="plain", store=stopped_run.store, poll_interval=0.05, name="worker-2")
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        return {"accuracy": 0.75}

    score.serve(stop_when_idle=True)
    table.refresh()  # what the poller does
    done = {r["step"]: r for r in table.rows()}[10]
    assert (done["state"], done["detail"], done["attempts"]) == ("done", "accuracy 0.75", 2)
    assert handle.history(keys=["eval/accuracy"])["eval/accuracy"].dropna().tolist() == [0.75]
    table.close()


@pytest.mark.slow
def test_evaluate_this_checkpoint_and_the_project_rule(stopped_run: StoppedRun) -> None:
    table = EvaluationTable("plain", store=stopped_run.store)  # a project's table
    assert table.state["scope"] == "project" and table.state["rule"] is False
    row = table.rows()[0]
    assert row["state"] == "not evaluated" and row["run_name"] == "plain-stopped"
    _click(table, "evaluate", checkpoint_id=row["checkpoint"], run_id=row["run_id"])
    assert table.rows()[0]["state"] == "queued"
    assert [e.checkpoint for e in lh.Api(stopped_run.store).run(stopped_run.id).evaluations()] == [row["checkpoint"]]

    _click(table, "set_rule", enabled=True)
    assert lh.Api(stopped_run.store).project("plain").evaluate_every_checkpoint() is True
    assert table.state["rule"] is True
    assert EvaluationTable("plain", store=stopped_run.store) is table  # the same table, not another poller
    table.close()


@pytest.mark.slow
def test_a_name_that_is_neither_project_nor_run_is_refused_clearly(stopped_run: StoppedRun) -> None:
    try:
        EvaluationTable("nope", store=stopped_run.store)
    except lh.RunNotFoundError as exc:
        assert "'nope' is neither a project nor a run id" in str(exc) and "plain" in str(exc)
    else:
        raise AssertionError("no error")
