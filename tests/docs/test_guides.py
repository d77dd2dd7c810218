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
from dataclasses import dataclass
from pathlib import Path

import pytest

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
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.*?)\s*-->\s*$")
FILE = re.compile(r"^\s*<!--\s*file:\s*(?P<name>[\w./-]+)\s*-->\s*$")
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


@dataclass
class Block:
    language: str
    line: int  # 1-based line of the opening fence
    source: str
    skip: str | None
    file: str | None = None


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, with the skip reason written right above each (if any)."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match["indent"], match["fence"]
        language = match["info"].strip().split(" ")[0].split("{")[0] or "(none)"
        skip = SKIP.match(lines[i - 1]) if i > 0 else None
        file = FILE.match(lines[i - 1]) if i > 0 else None
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        assert j < len(lines), f"{page.name}:{i + 1}: a code block that is never closed"
        found.append(
            Block(language, i + 1, "\n".join(body) + "\n", skip["reason"] if skip else None, file and file["name"])
        )
        i = j + 1
    return found


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
            if block.skip is not None:
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


@pytest.mark.parametrize("page", [_param(p) for p in PAGES])
@pytest.mark.slow
def test_the_pages_code_blocks_run(page: Path, tmp_path: Path) -> None:
    runnable = [b for b in blocks(page) if b.skip is None and b.language in RUN]
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
