"""The command line a person types: ``launchhelm demo``, ``runs``, ``show``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import launchhelm as lh


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("launchhelm") or str(Path(sys.executable).with_name("launchhelm"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_demo_trains_crashes_resumes_and_prints_the_rewind(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    # 23 s on a quiet machine; a CI run beside other load once took more than 120 s (it trains, is killed,
    # relaunches and evaluates, in real processes)
    done = _cli("--store", store, "demo", "--steps", "100", timeout=280)
    assert done.returncode == 0, done.stderr
    (run_id,) = lh.Api(store).run_ids("demo")
    handle = lh.Api(store).run(run_id)
    assert handle.status == "closed" and handle.step == 100
    (rewind,) = handle.rewinds()
    assert rewind.to_step == 40 and rewind.reached >= 75  # killed at step 75, checkpoints every 40
    assert f"killed by SIGKILL at step {rewind.reached}; status now 'stopped'" in done.stdout
    assert f"rewind: Resumed from step 40 after reaching {rewind.reached}" in done.stdout
    assert [c.step for c in handle.checkpoints()] == [40, 80]
    last = handle.history(duplicates="last")
    assert last["step"].tolist() == list(range(1, 101))
    # it really learns
    assert last["train/accuracy"].iloc[-1] > 0.9
    every = handle.history()
    assert (every.groupby("step")["attempt"].nunique() == 2).sum() == rewind.reached - 40
    # the project rule queued each checkpoint; the demo's worker scored them at their steps
    assert [(e.step, e.state) for e in handle.evaluations()] == [(40, "done"), (80, "done")]
    scores = every.set_index(["step", "attempt"])
    assert scores.loc[(80, 1), "eval/accuracy"] > 0.9  # saved after the rewind: attempt 1
    assert scores["eval/loss"].notna().sum() == 2
    assert "3. an evaluation worker scores each checkpoint" in done.stdout and "(step 80): done: loss=" in done.stdout

    listing = _cli("--store", store, "runs", "demo")
    assert listing.returncode == 0, listing.stderr
    assert run_id in listing.stdout and "closed" in listing.stdout

    shown = _cli("--store", store, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "status   closed" in shown.stdout and "sessions 2, rewinds 1" in shown.stdout
    assert "rewind" in shown.stdout and "checkpoint" in shown.stdout
    assert "metrics: 100 steps, keys train/loss, train/accuracy, lr" in shown.stdout
    assert "evaluations:" in shown.stdout and "step 80      done: loss=" in shown.stdout


@pytest.mark.slow
def test_cli_errors_are_one_clear_line(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    missing = _cli("--store", store, "show", "abcdefgh")
    assert missing.returncode == 2
    assert "launchhelm: error: no run 'abcdefgh'" in missing.stderr and "Traceback" not in missing.stderr
    empty = _cli("--store", store, "runs", "nobody")
    assert empty.returncode == 0 and "no runs in project 'nobody'" in empty.stdout
    bad = _cli("--store", store, "runs", "bad/name")
    assert bad.returncode == 2 and "invalid project name" in bad.stderr
    steps = _cli("--store", store, "demo", "--steps", "10")
    assert steps.returncode == 2 and "steps=10" in steps.stderr


def test_show_names_a_running_sessions_helper_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(tmp_path / "spool"))
    store = str(tmp_path / "store")
    run = lh.init("seen", store=store, heartbeat_interval=0.2, capture_console=False, system_metrics=False)
    try:
        deadline = time.monotonic() + 60
        while True:  # the helper starts beside init, and the next heartbeat names it
            pid = run._helper_pid()
            attempt = lh.Api(store).run(run.id).attempts()[-1]
            if pid is not None and attempt.helper == pid:
                break
            assert time.monotonic() < deadline, (pid, attempt)
            time.sleep(0.1)
        assert attempt.ending == "running"
        assert "launchhelm._helper" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()  # that pid is it
        shown = _cli("--store", store, "show", run.id)
        assert shown.returncode == 0, shown.stderr
        assert f"\nhelper   pid {pid} on {attempt.host}\n" in shown.stdout
        assert f"running since step 0, now at 0; its helper process is pid {pid}" in attempt.describe()
    finally:
        run.finish()
    assert lh.Api(store).run(run.id).attempts()[-1].helper is None  # an ended session has none
