"""The suite's xdist groups hold: tests marked ``xdist_group("name")`` run on one worker.

If this fails, ``--dist loadgroup`` (scripts/test.sh) no longer groups: every browser test starts
its own JupyterLab and Chromium on whichever worker it lands, and a module's module-scoped
fixtures (a torchrun job, a store of killed runs) are built once per worker instead of once. It
happened silently with pytest 9.2 and pytest-xdist 3.8 (tests/xdist_groups.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from lhtest import child_env

TESTS = Path(__file__).resolve().parents[1]

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("together")

@pytest.mark.parametrize("n", range(4))
def test_grouped(request, n):
    with open(os.environ["SEEN"], "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']} {request.node.nodeid}\\n")
"""

ALONE = """
import pytest

@pytest.mark.parametrize("n", range(8))
def test_alone(n):
    pass
"""


@pytest.mark.slow  # a pytest with two xdist workers of its own
def test_a_group_runs_on_one_worker_under_loadgroup(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (project / "test_a_grouped.py").write_text(GROUPED, encoding="utf-8")
    (project / "test_b_grouped.py").write_text(GROUPED, encoding="utf-8")
    (project / "test_c_alone.py").write_text(ALONE, encoding="utf-8")
    seen = tmp_path / "seen.txt"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "xdist_groups",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=project,
        env=child_env(PYTHONPATH=str(TESTS), SEEN=str(seen)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line.split(" ", 1) for line in seen.read_text().splitlines()]
    assert len(lines) == 8
    # the scheduler groups by this suffix of the test's id, so it must be there while the test runs
    assert all(nodeid.endswith("@together") for _, nodeid in lines), lines
    assert len({worker for worker, _ in lines}) == 1, lines
