"""The command line a person types: ``launchhelm demo``, ``runs``, ``show``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import launchhelm as lh


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("launchhelm") or str(Path(sys.executable).with_name("launchhelm"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def test_demo_trains_a_real_model_and_prints_its_history(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    done = _cli("--store", store, "demo", "--steps", "80")
    assert done.returncode == 0, done.stderr
    assert "status: closed; 80 steps logged" in done.stdout
    run_id = lh.Api(store).run_ids("demo")[0]
    assert run_id in done.stdout
    history = lh.Api(store).run(run_id).history()
    assert history["step"].tolist() == list(range(1, 81))
    # it really learns: loss falls, accuracy rises well above chance
    assert history["train/loss"].iloc[-1] < 0.5 * history["train/loss"].iloc[0]
    assert history["train/accuracy"].iloc[-1] > 0.85

    listing = _cli("--store", store, "runs", "demo")
    assert listing.returncode == 0, listing.stderr
    assert run_id in listing.stdout and "closed" in listing.stdout

    shown = _cli("--store", store, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "status   closed" in shown.stdout
    assert "session_started" in shown.stdout and "session_ended" in shown.stdout
    assert "metrics: 80 steps, keys train/loss, train/accuracy, lr" in shown.stdout


def test_cli_errors_are_one_clear_line(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    missing = _cli("--store", store, "show", "abcdefgh")
    assert missing.returncode == 2
    assert "launchhelm: error: no run 'abcdefgh'" in missing.stderr and "Traceback" not in missing.stderr
    empty = _cli("--store", store, "runs", "nobody")
    assert empty.returncode == 0 and "no runs in project 'nobody'" in empty.stdout
    bad = _cli("--store", store, "runs", "bad/name")
    assert bad.returncode == 2 and "invalid project name" in bad.stderr
    steps = _cli("--store", store, "demo", "--steps", "0")
    assert steps.returncode == 2 and "steps=0" in steps.stderr
