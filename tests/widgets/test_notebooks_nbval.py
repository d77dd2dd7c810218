"""The notebooks in notebooks/ run top to bottom under nbval, as a user runs
them: ``pytest -p nbval --nbval-lax notebooks/`` against a temporary store (made by
notebooks/conftest.py). Their cells assert what they show (the SIGKILL, the
restored step, the rewind, the evaluation states, the applied tunables), so a
notebook that silently stops working fails here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lhtest import ROOT, child_env

NOTEBOOKS = ("quickstart.ipynb", "evaluate.ipynb", "tunables.ipynb", "lightning.ipynb", "transformers.ipynb")


def code_cells(name: str) -> int:
    cells = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
    return sum(cell["cell_type"] == "code" for cell in cells)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_notebook_runs_top_to_bottom_under_nbval(tmp_path: Path) -> None:
    assert sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")) == sorted(NOTEBOOKS)
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "nbval", "--nbval-lax", "notebooks/", "-p", "no:cacheprovider", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=880,
        # HOME elsewhere: a notebook that wrote to ~/.launchhelm instead of the temporary store would show here
        env=child_env(HOME=str(home), JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime")),
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    expected = sum(code_cells(name) for name in NOTEBOOKS)
    assert re.search(rf"\b{expected} passed\b", done.stdout), done.stdout[-2000:]
    assert "skipped" not in done.stdout.splitlines()[-1]
    assert not (home / ".launchhelm").exists()
