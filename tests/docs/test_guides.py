"""Every code block of the README, the getting-started page, the guides and the other pages that show code
(W&B and TensorBoard scripts, importers, long runs) runs, so the docs never rot.

Each page runs top to bottom in a fresh interpreter against a temporary store
(``LAUNCHHELM_STORE`` is a new folder, the spool too, the working directory a
new one): its ``python`` blocks in one namespace, in order, and its ``bash``
blocks with ``bash -euo pipefail`` in between. A ``bash`` block sees the
page's string variables as upper-case environment variables (``run_id`` in
Python is ``$RUN_ID`` in the shell). ``text`` blocks are output, not code.

A ``python`` block marked ``<!-- file: train.py -->`` right above its fence
is written to that file in the working directory instead of run, so a page
can show a whole script and then run it (and SIGKILL it) for real.

A block that cannot run here (a notebook magic, ``torchrun``, cloud
credentials, a minutes-long demo) says so right above its fence:
``<!-- skip: why -->``; the reason is required and shows in the test's output.
A block that needs a scheduler another test starts (SLURM, Ray) says which test runs
it: ``<!-- run-by: tests/torch/test_slurm.py::test_name -->``. That test takes the
block's text from the page (``docblocks.run_by``); this module checks the test exists
and names the page and the marker, so the page cannot drift from what runs.

What a user would notice if this failed: an example in the docs that raises,
or that no longer does what its page says.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from docblocks import blocks

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    ROOT / "docs" / "getting-started.md",
    *sorted((ROOT / "docs" / "guides").glob("*.md")),
    ROOT / "docs" / "compat.md",
    ROOT / "docs" / "importers.md",
    ROOT / "docs" / "long-runs.md",
]
RUN = {"python", "bash"}
NOT_CODE = {"text"}
# pages whose examples train with torch or a framework's Trainer: a few seconds each
SLOW = {
    "getting-started.md",
    "README.md",
    "checkpoints.md",
    "rewinds.md",
    "frameworks.md",
    "distributed.md",
    "steering.md",
    "evaluation.md",
    "importers.md",
    "relaunch.md",
}


RUNNER = textwrap.dedent(
    """
    import json, os, subprocess, sys
    page, blocks = sys.argv[1], json.load(open(sys.argv[2]))
    namespace = {"__name__": "__main__"}
    for language, line, source, file in blocks:
        print(f"--- {page}:{line} ({language})", flush=True)
        if file:
            open(file, "w").write(source)
        elif language == "python":
            exec(compile(source, f"{page}:{line}", "exec"), namespace)
        else:
            env = dict(os.environ)
            env.update({k.upper(): v for k, v in namespace.items() if isinstance(v, str) and k.isidentifier()})
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", source], env=env)
            if done.returncode:
                sys.exit(f"{page}:{line}: the bash block exited with status {done.returncode}")
        sys.stdout.flush()
    """
)


def _param(page: Path) -> object:
    marks = [pytest.mark.slow] if page.name in SLOW else []
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks)


def test_every_block_is_run_or_says_why_not() -> None:
    skipped = []
    for page in PAGES:
        for block in blocks(page):
            where = f"{page.relative_to(ROOT)}:{block.line}"
            if block.run_by is not None:
                _check_run_by(page, block.run_by, where)
            elif block.skip is not None:
                assert block.skip, f"{where}: <!-- skip: --> needs a reason"
                assert block.language not in NOT_CODE, f"{where}: a text block is never run; drop its skip marker"
                skipped.append(f"{where}: {block.skip}")
            else:
                assert block.language in RUN | NOT_CODE, (
                    f"{where}: a ```{block.language} block: write it as python, bash or text, "
                    "or mark it <!-- skip: why --> on the line above"
                )
    print("not run:", *skipped, sep="\n  ")
    assert len(skipped) <= 25, "most examples should run; see what the skipped ones need"


def _check_run_by(page: Path, test: str, where: str) -> None:
    """The test named by a ``run-by`` marker exists, and its module takes this block from this page."""
    path, _, name = test.partition("::")
    module = ROOT / path
    assert name and module.is_file() and path.startswith("tests/"), (
        f"{where}: <!-- run-by: {test} --> must name a test as tests/<file>.py::<test function>"
    )
    text = module.read_text()
    assert re.search(rf"^(async )?def {re.escape(name)}\(", text, re.M), f"{where}: {path} has no test {name}"
    page_path = str(page.relative_to(ROOT))
    assert page_path in text and f'"{test}"' in text, (
        f"{where}: {path} must take this block with docblocks.run_by({page_path!r}, {test!r})"
    )


def test_run_by_markers_name_tests_that_take_their_block() -> None:
    """The check above can fail: a marker naming a missing test, or a test that never reads the block."""
    page = ROOT / "docs" / "guides" / "relaunch.md"
    with pytest.raises(AssertionError, match="has no test"):
        _check_run_by(page, "tests/torch/test_slurm.py::test_not_there", "x")
    with pytest.raises(AssertionError, match="must take this block"):
        _check_run_by(
            page,
            "tests/torch/test_slurm.py::test_the_comparison_can_fail_a_requeued_job_that_skips_the_load_line_differs",
            "x",
        )
    with pytest.raises(AssertionError, match="must name a test"):
        _check_run_by(page, "tests/torch/nowhere.py::test_x", "x")
    assert [b.run_by for b in blocks(page) if b.run_by], "the relaunch guide's SLURM and Ray blocks are run by tests"


@pytest.mark.parametrize("page", [_param(p) for p in PAGES])
@pytest.mark.slow
def test_the_pages_code_blocks_run(page: Path, tmp_path: Path) -> None:
    runnable = [b for b in blocks(page) if b.skip is None and b.run_by is None and b.language in RUN]
    if not runnable:
        pytest.fail(f"{page.relative_to(ROOT)} has no code block that runs: drop it from PAGES or add one")
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([[b.language, b.line, b.source, b.file] for b in runnable]))
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "LAUNCHHELM_STORE": str(tmp_path / "store"),
        "LAUNCHHELM_SPOOL": str(tmp_path / "spool"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MPLBACKEND": "Agg",
    }
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(page.relative_to(ROOT)), str(spec)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    print(done.stdout)  # what the examples printed: compare with the page's comments (pytest -s)
    assert done.returncode == 0, f"{page.name}'s examples failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    # every block ran, the last one too
    assert f"--- {page.relative_to(ROOT)}:{runnable[-1].line} " in done.stdout
