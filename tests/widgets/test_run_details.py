"""The Details tab: status, config and tunables as stored; a tunable changed
there is a control change the training process will apply; control buttons
on a run with no live process say why instead of failing silently."""

from __future__ import annotations

from pathlib import Path

import pytest
from widget_runs import StoppedRun

import launchhelm as lh
from launchhelm.widgets import RunDetails


def _click(widget: RunDetails, name: str, **args: object) -> None:
    content = {"type": "action", "name": name, "args": args}
    widget._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})


@pytest.mark.slow
def test_details_show_the_run_and_change_a_tunable(stopped_run: StoppedRun) -> None:
    details = RunDetails(stopped_run.id, store=stopped_run.store)
    state = details.state
    assert state["status"] == "stopped" and state["step"] == 30
    assert state["config"] == {"batch": 8}
    assert state["tunables"] == {"lr": 0.05}  # the change applied before the crash
    assert state["can_tune"] and not state["can_control"]

    _click(details, "set_tunables", values={"lr": 0.02})
    assert details.error == ""
    pending = lh.Api(stopped_run.store).run(stopped_run.id).pending_controls()
    assert [p["changes"] for p in pending] == [{"lr": 0.02}]
    assert details.state["pending"][0]["what"] == "lr=0.02"
    assert "applies it at its next step" in details.state["notice"]
    details.close()


def test_a_wrong_tunable_or_a_control_on_a_stopped_run_is_shown_not_raised(stopped_run: StoppedRun) -> None:
    details = RunDetails(stopped_run.id, store=stopped_run.store)
    _click(details, "set_tunables", values={"lr": "fast"})
    assert "TypeError: tunable 'lr'" in details.error  # InvalidTypeError, a TypeError
    _click(details, "control", action="pause")
    assert "is stopped: no training process is attached" in details.error
    assert lh.Api(stopped_run.store).run(stopped_run.id).pending_controls() == []
    details.close()


def test_control_buttons_of_a_running_run_ask_its_process(tmp_path: Path) -> None:
    run = lh.init("plain", store=str(tmp_path / "store"), tunables={"lr": 0.1}, control_interval=3600)
    try:
        details = RunDetails(run.id, store=run.store)
        assert details.state["can_control"] and details.state["control_state"] == "running"
        _click(details, "control", action="checkpoint")
        _click(details, "control", action="pause")
        assert details.error == ""
        assert [p["what"] for p in lh.Api(run.store).run(run.id).pending_controls()] == ["checkpoint", "pause"]
        assert [p["what"] for p in details.state["pending"]] == ["checkpoint", "pause"]
        assert details.state["notice"].startswith("Asked the run to pause (request ")
        details.close()
    finally:
        run.finish()


def test_the_details_tab_and_the_picker_list_a_relaunched_runs_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SLURM job relaunched once (played in this process): the first attempt, fenced by the relaunch, and the
    second, finished; the Details tab and the Resume… picker say so, one line each, with the scheduler's job."""
    from launchhelm.widgets._details import details_state
    from launchhelm.widgets._picker import picker_state

    for name in ("LAUNCHHELM_RUN_ID", "TORCHELASTIC_RUN_ID", "SKYPILOT_TASK_ID", "LAUNCHHELM_K8S_JOB"):
        monkeypatch.delenv(name, raising=False)
    store = str(tmp_path / "store")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "lab")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    quiet = {"system_metrics": False, "capture_console": False}
    first = lh.init("jobs", store=store, auto_resume=True, **quiet)  # type: ignore[arg-type]
    first.global_step = 4
    first.log({"loss": 1.0})
    first.flush()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second = lh.init("jobs", store=store, auto_resume=True, **quiet)  # type: ignore[arg-type]
    second.global_step = 6
    second.log({"loss": 0.5})
    second.finish(close_run=False)
    with pytest.raises(lh.RunFencedError):
        first.finish()
    handle = lh.Api(store).run(second.id)
    for lines in (details_state(handle, False)["attempts"], picker_state(handle, None)["attempts"]):
        assert len(lines) == 2, lines
        assert lines[0].startswith("slurm job lab/77") and "fenced" in lines[0] and "relaunched" in lines[0], lines
        assert "restart 1" in lines[1] and "finished at step 6" in lines[1], lines
    assert picker_state(handle, None)["restart_loop"] == ""
