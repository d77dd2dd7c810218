"""The examples users copy from run as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import launchhelm as lh

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_quickstart_example_logs_resumes_and_reads_back(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), store], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "at step 100" in done.stdout and "closed, 150 steps" in done.stdout
    (run_id,) = lh.Api(store).run_ids("quickstart")
    assert len([e for e in lh.Api(store).run(run_id).events() if e["type"] == "session_started"]) == 2
