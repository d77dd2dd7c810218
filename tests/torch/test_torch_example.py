"""The product page's PyTorch example runs as written: train, crash, resume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import launchhelm as lh

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_checkpoint.py"


@pytest.mark.slow
def test_torch_checkpoint_example_restores_step_64_after_a_real_crash(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    done = subprocess.run([sys.executable, str(EXAMPLE), store], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "ended by signal 9 (SIGKILL)" in done.stdout
    assert "restored at step: 64" in done.stdout
    assert "extra payload: {'epoch': 1, 'note': 'saved at step 64'}" in done.stdout
    assert "Resumed from step 64 after reaching 80" in done.stdout
    (run_id,) = lh.Api(store).run_ids("quickstart")
    assert lh.Api(store).run(run_id).status == "closed"
