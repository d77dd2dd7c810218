"""Tunables and control requests on plain runs: validation, application at
step boundaries, pause/stop/checkpoint, and the command line."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import launchhelm as lh
from launchhelm._cli import main as cli

FAST = {"control_interval": 0.05, "flush_interval": 0.05}


def _poll(run: lh.Run) -> None:
    """Wait until the run's poller has delivered what was asked (or give up)."""
    deadline = time.monotonic() + 10
    while not run._control_flag and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run._control_flag, "the control request never reached the training process"


@pytest.mark.parametrize(
    ("changes", "error", "needle"),
    [
        ({"momentum": 0.9}, KeyError, "no tunable 'momentum'"),
        ({"lr": "fast"}, TypeError, "'lr' is a number"),
        ({"warmup": 1.5}, TypeError, "'warmup' is a bool"),
        ({"lr": np.float64(0.1)}, TypeError, "numpy.float64"),
        ({"schedule": Path("/tmp")}, TypeError, "plain values"),
        ({"lr": math.nan}, ValueError, "finite"),
        ({}, ValueError, "at least one change"),
    ],
)
def test_bad_tunable_changes_are_refused_and_store_nothing(
    store_url: str, changes: dict[str, Any], error: type, needle: str
) -> None:
    run = lh.init("ctl", tunables={"lr": 0.1, "warmup": True, "schedule": "cosine"}, store=store_url)
    handle = lh.Api(store_url).run(run.id)
    before = handle.events()
    with pytest.raises(error, match=needle):
        handle.set_tunables(**changes)
    assert handle.events() == before
    run.finish()


def test_bad_control_requests_are_refused_and_store_nothing(store_url: str) -> None:
    run = lh.init("ctl", tunables={"lr": 0.1}, store=store_url)
    handle = lh.Api(store_url).run(run.id)
    before = len(handle.events())
    with pytest.raises(ValueError, match="'pause', 'resume', 'stop', 'checkpoint'"):
        handle.control("jump")
    assert len(handle.events()) == before
    run.finish(close_run=False)
    with pytest.raises(lh.LaunchHelmError, match="resumable: no training process"):
        handle.control("pause")
    ended = len(handle.events())
    resumed = lh.init("ctl", resume=run.id, store=store_url)
    resumed.finish()
    closed = len(handle.events())
    assert closed == ended + 2
    with pytest.raises(lh.RunClosedError, match="closed"):
        handle.set_tunables(lr=0.2)
    with pytest.raises(lh.RunClosedError, match="closed"):
        handle.control("stop")
    assert len(handle.events()) == closed


def test_a_change_applies_at_the_next_step_boundary_and_is_recorded(store_url: str) -> None:
    run = lh.init("ctl", tunables={"lr": 0.1, "layers": 2}, store=store_url, **FAST)  # type: ignore[arg-type]
    seen: list[dict[str, Any]] = []
    run.on_tunables_change(seen.append)
    with pytest.raises(TypeError):
        run.tunables["lr"] = 1.0  # type: ignore[index]
    run.global_step = 3
    handle = lh.Api(store_url).run(run.id)
    seq = handle.set_tunables(lr=1, layers=4)  # an int for a float tunable is fine
    assert [c["seq"] for c in handle.pending_controls()] == [seq]
    _poll(run)
    assert run.tunables["lr"] == 0.1  # nothing changes between step boundaries
    run.global_step = 4
    assert dict(run.tunables) == {"lr": 1.0, "layers": 4} and seen == [{"lr": 1.0, "layers": 4}]
    assert isinstance(run.tunables["lr"], float)
    assert handle.tunables == {"lr": 1.0, "layers": 4} and handle.pending_controls() == []
    (change,) = handle.control_changes()
    assert change["applied_at_step"] == 4 and change["what"] == "tunables" and change["by"]["user"]
    # a checkpoint saved under the old settings is marked as such
    run.finish()


def test_checkpoints_saved_before_a_change_are_marked(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"weights")
    run = lh.init("ctl", tunables={"lr": 0.1}, store=store_url, **FAST)  # type: ignore[arg-type]
    run.global_step = 1
    first = run.checkpoint(tmp_path / "w.bin")
    handle = lh.Api(store_url).run(run.id)
    handle.set_tunables(lr=0.01)
    _poll(run)
    run.global_step = 2
    second = run.checkpoint(tmp_path / "w.bin")
    marks = {c.id: c.before_last_control_change for c in handle.checkpoints()}
    assert marks == {first: True, second: False}
    run.finish()


def test_pause_waits_at_the_boundary_with_heartbeats_until_resume(tmp_path: Path) -> None:
    store = str(tmp_path)
    run = lh.init("ctl", store=store, heartbeat_interval=0.1, **FAST)  # type: ignore[arg-type]
    handle = lh.Api(store).run(run.id)
    run.global_step = 1
    handle.control("pause")
    _poll(run)
    beat = handle.last_heartbeat

    def resume_later() -> None:
        time.sleep(1.0)
        assert handle.control_state == "paused" and handle.status == "running"
        handle.control("resume")

    helper = threading.Thread(target=resume_later)
    helper.start()
    started = time.monotonic()
    run.global_step = 2  # blocks here while paused
    waited = time.monotonic() - started
    helper.join()
    assert waited >= 0.9
    assert handle.last_heartbeat > beat  # type: ignore[operator]
    assert handle.control_state == "running" and run.global_step == 2
    assert [c["what"] for c in handle.control_changes()] == ["pause", "resume"]
    assert [c["applied_at_step"] for c in handle.control_changes()] == [2, 2]
    run.finish()


def test_stop_ends_the_session_resumable_and_raises_run_stopped(tmp_path: Path) -> None:
    store = str(tmp_path)
    run = lh.init("ctl", store=store, **FAST)  # type: ignore[arg-type]
    run.global_step = 5
    run.log({"loss": 1.0})
    handle = lh.Api(store).run(run.id)
    handle.control("stop")
    _poll(run)
    with pytest.raises(lh.RunStopped) as stopped:
        run.global_step = 6
    assert not isinstance(stopped.value, Exception) and stopped.value.code == 0  # not swallowed by except Exception
    assert stopped.value.step == 6 and "resume=" in str(stopped.value)
    assert handle.status == "resumable"
    assert handle.history()["loss"].tolist() == [1.0]
    with pytest.raises(lh.RunFinishedError):
        run.log({"loss": 2.0})


def test_checkpoint_requests_call_the_registered_saver(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    (tmp_path / "w.bin").write_bytes(b"weights")
    run = lh.init("ctl", store=store, **FAST)  # type: ignore[arg-type]
    run.on_checkpoint_request(lambda: run.checkpoint(tmp_path / "w.bin"))
    handle = lh.Api(store).run(run.id)
    run.global_step = 7
    handle.control("checkpoint")
    _poll(run)
    run.global_step = 8
    (saved,) = handle.checkpoints()
    assert saved.step == 8
    applied = [e for e in handle.events() if e["type"] == "control_applied"]
    assert applied[-1]["checkpoint"] == saved.id and applied[-1]["step"] == 8
    run.finish()


def test_actions_aimed_at_a_dead_session_are_dropped_but_tunables_carry_over(tmp_path: Path) -> None:
    store = str(tmp_path)
    first = lh.init("ctl", tunables={"lr": 0.1}, store=store, control_interval=3600)
    handle = lh.Api(store).run(first.id)
    handle.control("stop")  # the session never applies it...
    handle.set_tunables(lr=0.5)
    # ...because another session takes the run over (as after a vanished node)
    second = lh.init("ctl", resume=first.id, store=store, takeover=True, **FAST)  # type: ignore[arg-type]
    assert [c["what"] for c in handle.pending_controls()] == ["tunables"]
    assert second.tunables["lr"] == 0.1
    second.global_step = 1  # the first step boundary: the tunable applies, the stop does not
    assert second.tunables["lr"] == 0.5 and handle.pending_controls() == []
    second.global_step = 2
    second.finish()
    first._stop.set()


def test_command_line_tune_control_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path)
    run = lh.init("ctl", tunables={"lr": 0.1, "betas": [0.9, 0.99]}, store=store, **FAST)  # type: ignore[arg-type]
    run.global_step = 1
    assert cli(["--store", store, "tune", run.id, "lr=1e-4", "betas=[0.8, 0.9]"]) == 0
    assert cli(["--store", store, "control", run.id, "pause"]) == 0
    assert "control change" in capsys.readouterr().out
    assert cli(["--store", store, "tune", run.id, "lr=fast"]) == 2
    assert "'lr' is a number" in capsys.readouterr().err
    assert cli(["--store", store, "tune", run.id, "momentum=0.9"]) == 2
    assert "no tunable 'momentum'" in capsys.readouterr().err
    assert cli(["--store", store, "show", run.id]) == 0
    out = capsys.readouterr().out
    assert "status   running" in out and "tunables lr=0.1" in out
    assert "set lr=0.0001, betas=[0.8, 0.9]" in out and "pending" in out
    _poll(run)
    run._paused = False  # let this thread pass the pause...
    lh.Api(store).run(run.id).control("resume")  # ...and make sure it is lifted
    run.global_step = 2
    assert dict(run.tunables) == {"lr": 1e-4, "betas": [0.8, 0.9]}
    assert cli(["--store", store, "show", run.id]) == 0
    assert "applied at step 2" in capsys.readouterr().out
    run.finish()
