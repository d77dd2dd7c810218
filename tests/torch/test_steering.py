"""Steering a real training process from outside: tunables, pause, resume,
stop, checkpoint on request, choosing the checkpoint a resume restores.

Each test drives ``steer_worker.py`` (a real PyTorch training loop in its own
process) through ``RunHandle`` from this process, as a notebook would.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from lhtest import child_env

import launchhelm as lh

WORKER = Path(__file__).with_name("steer_worker.py")


class Worker:
    """A steer_worker.py process whose stdout lines are read on a thread."""

    def __init__(self, store: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), store, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(OMP_NUM_THREADS="1"),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.run_id = self.wait_for("RUN")[1]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                self.lines.put(line.strip())
        except ValueError:
            pass  # the test closed the pipe at its end

    def wait_for(self, prefix: str, timeout: float = 60.0, where: object = None) -> list[str]:
        """The next line starting with ``prefix`` (and satisfying ``where``), as words."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self.lines.empty()):
                err = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
                raise AssertionError(f"no {prefix!r} line in {timeout}s; last lines {self.seen[-5:]}; {err}")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            self.seen.append(line)
            words = line.split()
            if words and words[0] == prefix and (where is None or where(words)):  # type: ignore[operator]
                return words

    def steps_seen(self) -> list[int]:
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return [int(line.split()[1]) for line in self.seen if line.startswith("STEP ")]

    def end(self, timeout: float = 60.0) -> tuple[int, str]:
        try:
            _, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return self.proc.returncode, err


def _until(check: object, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_tunables_pause_checkpoint_stop_then_resume_from_a_chosen_checkpoint(shared_store_url: str) -> None:
    worker = Worker(shared_store_url, "--save-at", "5")
    try:
        handle = lh.Api(shared_store_url).run(worker.run_id)
        _until(lambda: len(handle.checkpoints()) == 1, what="the checkpoint at step 5")
        assert handle.status == "running" and handle.tunables == {"lr": 0.1, "grad_clip": 1.0}
        early = handle.checkpoints()[0]
        assert early.step == 5 and not early.before_last_control_change

        # a tunable change reaches the optimizer at a step boundary, within a few polls
        asked_at = max(worker.steps_seen())
        seq = handle.set_tunables(lr=0.01, grad_clip=0.5)
        tuned = worker.wait_for("TUNED")
        assert json.loads(tuned[2]) == {"grad_clip": 0.5, "lr": 0.01}
        applied_step = int(tuned[1])
        assert applied_step >= asked_at
        after = worker.wait_for("STEP", where=lambda w: int(w[1]) > applied_step)
        assert float(after[2]) == pytest.approx(0.01)  # the optimizer's param group, read in the worker
        change = next(c for c in handle.control_changes() if c["seq"] == seq)
        assert change["what"] == "tunables" and change["applied_at_step"] == applied_step
        assert handle.tunables == {"lr": 0.01, "grad_clip": 0.5} and handle.pending_controls() == []
        assert handle.checkpoints()[0].before_last_control_change  # saved under the old lr

        # "checkpoint" saves one at the next step boundary, under the new settings
        handle.control("checkpoint")
        _until(lambda: len(handle.checkpoints()) == 2, what="the requested checkpoint")
        requested = handle.checkpoints()[1]
        assert requested.step > applied_step and not requested.before_last_control_change

        # pause: no steps while paused, heartbeats go on; resume: steps again
        handle.control("pause")
        _until(lambda: handle.control_state == "paused", what="the pause")
        paused_step = handle.step
        beat = handle.last_heartbeat
        time.sleep(1.5)
        assert max(worker.steps_seen()) <= paused_step + 1
        assert handle.status == "running" and handle.last_heartbeat > beat  # type: ignore[operator]
        handle.control("resume")
        worker.wait_for("STEP", where=lambda w: int(w[1]) > paused_step + 1)
        assert handle.control_state == "running"

        # stop: the session ends cleanly, the run stays resumable
        handle.control("stop")
        stopped = worker.wait_for("STOPPED")
        code, err = worker.end()
        assert code == 0, err
        assert "Traceback" not in err
        assert handle.status == "resumable"
        ended = [e for e in handle.events() if e["type"] == "session_ended"][-1]
        assert ended["close_run"] is False and ended["step"] == int(stopped[1])
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()

    # choose the early checkpoint; a fresh process restores it, with the lr in force then
    reached = handle.step
    handle.choose_for_resume(early.id)
    assert handle.resume_checkpoint().id == early.id  # type: ignore[union-attr]
    resumed = Worker(shared_store_url, "--resume", worker.run_id, "--load", "resume", "--steps", str(early.step + 3))
    loaded = resumed.wait_for("LOADED")
    assert int(loaded[1]) == early.step and float(loaded[2]) == pytest.approx(0.1) and float(loaded[3]) == 1.0
    code, err = resumed.end()
    assert code == 0, err
    rewind = handle.rewinds()[-1]
    assert (rewind.to_step, rewind.reached, rewind.checkpoint) == (early.step, reached, early.id)
    assert handle.tunables == {"lr": 0.1, "grad_clip": 1.0}  # the restore is recorded
    # the choice was consumed: "resume" means the newest again
    assert handle.resume_checkpoint().id == handle.checkpoints()[-1].id  # type: ignore[union-attr]
    history = handle.history(keys=["lr"])
    redone = history[history["step"] == early.step + 2]
    assert sorted(redone["attempt"]) == [0, 1]
    assert redone.set_index("attempt").loc[1, "lr"] == pytest.approx(0.1)
    assert bool(redone.set_index("attempt").loc[0, "abandoned"]) and not redone.set_index("attempt").loc[1, "abandoned"]


@pytest.mark.slow
def test_tunables_set_while_stopped_apply_after_the_restore_and_sigkill_reads_stopped(shared_store_url: str) -> None:
    store = shared_store_url
    worker = Worker(store, "--save-at", "3")
    handle = lh.Api(store).run(worker.run_id)
    _until(lambda: len(handle.checkpoints()) == 1 and handle.step >= 5, what="a checkpoint and a few steps")
    worker.proc.send_signal(signal.SIGKILL)
    worker.end()
    assert handle.status == "stopped"
    with pytest.raises(lh.LaunchHelmError, match="stopped: no training process"):
        handle.control("pause")  # nobody would apply it
    before = len(handle.events())
    seq = handle.set_tunables(lr=0.05)  # waits for the session that resumes the run
    assert [c["seq"] for c in handle.pending_controls()] == [seq] and len(handle.events()) == before + 1

    resumed = Worker(store, "--resume", worker.run_id, "--load", "latest", "--steps", "12")
    loaded = resumed.wait_for("LOADED")
    assert int(loaded[1]) == 3 and float(loaded[2]) == pytest.approx(0.1)  # the checkpoint's lr first...
    tuned = resumed.wait_for("TUNED")
    assert json.loads(tuned[2]) == {"lr": 0.05}  # ...then the change made while it was stopped
    assert int(resumed.wait_for("STEP", where=lambda w: int(w[1]) > int(tuned[1]))[1]) > 3
    code, err = resumed.end()
    assert code == 0, err
    assert handle.tunables["lr"] == 0.05 and handle.pending_controls() == []
    assert handle.status == "resumable"

    closing = Worker(store, "--resume", worker.run_id, "--steps", "13", "--close")
    code, err = closing.end()
    assert code == 0, err
    assert handle.status == "closed"
    with pytest.raises(lh.RunClosedError):
        lh.init("steer", resume=worker.run_id, store=store)
    with pytest.raises(lh.RunClosedError):
        handle.set_tunables(lr=0.2)
