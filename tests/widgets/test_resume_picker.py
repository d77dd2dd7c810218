"""The "Resume…" picker says how the run stopped, lists its checkpoints with
what each leaves to redo, and choosing one (as the browser's "Choose" does)
makes it the checkpoint ``load_checkpoint("resume")`` restores."""

from __future__ import annotations

import pytest
from lhtest import run_python
from widget_runs import RESUMED_FROM, STOPPED_CRASH_AT, StoppedRun, WidgetRuns

import launchhelm as lh
from launchhelm.widgets import ResumePicker


def _click(widget: ResumePicker, name: str, **args: object) -> None:
    """A button press as the front end sends it, through ipywidgets' dispatch."""
    content = {"type": "action", "name": name, "args": args}
    widget._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})


def test_the_picker_says_the_run_stopped_and_lists_its_checkpoints(stopped_run: StoppedRun) -> None:
    picker = ResumePicker(stopped_run.id, store=stopped_run.store)
    state = picker.state
    assert state["status"] == "stopped"
    assert state["sentence"].startswith("stopped without ending its session, last heartbeat 20")
    assert state["sentence"].endswith(", furthest step 30")
    rows = state["checkpoints"]
    assert [(r["step"], r["steps_to_redo"]) for r in rows] == [(20, 10), (10, 20)]  # newest first
    assert [r["latest"] for r in rows] == [True, False]
    # lr changed after the step-10 save: restoring that one brings lr back to 0.1
    assert [r["before_last_control_change"] for r in rows] == [False, True]
    assert not any(r["chosen"] for r in rows)
    assert "restores step 20 (the latest" in state["restores"]
    picker.close()


def test_choose_makes_that_checkpoint_the_one_resume_restores(stopped_run: StoppedRun) -> None:
    picker = ResumePicker(stopped_run.id, store=stopped_run.store)
    older = picker.state["checkpoints"][1]
    _click(picker, "choose", checkpoint_id=older["id"])
    assert picker.error == ""
    handle = lh.Api(stopped_run.store).run(stopped_run.id)
    chosen = handle.resume_checkpoint()
    assert chosen is not None and chosen.id == older["id"] and chosen.step == 10
    assert picker.state["confirmation"] == (
        f'Chosen: the next load_checkpoint("resume") restores step 10 (checkpoint {older["id"]}).'
    )
    assert [r["chosen"] for r in picker.state["checkpoints"]] == [False, True]
    picker.close()


def test_choosing_an_unknown_checkpoint_shows_why_and_changes_nothing(stopped_run: StoppedRun) -> None:
    picker = ResumePicker(stopped_run.id, store=stopped_run.store)
    _click(picker, "choose", checkpoint_id="ckpt-nope")
    assert "has no checkpoint 'ckpt-nope'" in picker.error
    assert lh.Api(stopped_run.store).run(stopped_run.id).resume_checkpoint().step == 20  # type: ignore[union-attr]
    picker.close()


@pytest.mark.slow
def test_a_resumed_pytorch_process_restores_the_step_chosen_in_the_picker(widget_runs: WidgetRuns) -> None:
    picker = ResumePicker(widget_runs.stopped, store=widget_runs.store)
    assert f"furthest step {STOPPED_CRASH_AT}" in picker.state["sentence"]
    target = next(r for r in picker.state["checkpoints"] if r["step"] == RESUMED_FROM)
    _click(picker, "choose", checkpoint_id=target["id"])
    picker.close()
    done = run_python(
        """
        import sys, torch
        import launchhelm.torch as lht
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        tr = lht.init("widgets", resume=sys.argv[2], store=sys.argv[1])
        tr.watch(model, torch.optim.SGD(model.parameters(), lr=0.05))
        tr.load_checkpoint("resume")
        print("restored", tr.global_step, dict(tr.tunables)["lr"])
        tr.finish(close_run=False)
        """,
        widget_runs.store,
        widget_runs.stopped,
    )
    assert done.returncode == 0, done.stderr
    # step 64 was saved before lr changed to 0.01: its tunables come back too
    assert done.stdout.split() == ["restored", str(RESUMED_FROM), "0.05"]
