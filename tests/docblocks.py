"""The docs' fenced code blocks and their markers, for tests/docs/test_guides.py and the tests that run a block
themselves.

A block is marked on the line right above its fence:

- ``<!-- skip: why -->``: not run here; the reason shows in test_guides' output.
- ``<!-- file: train.py -->``: written to that file in the page's working directory instead of run.
- ``<!-- run-by: tests/x/test_y.py::test_name -->``: not run by the page's runner, because that test runs it
  (a block that needs a scheduler the test starts: SLURM, Ray). The test takes it with :func:`run_by`, so the
  text that runs is the page's; test_guides checks that the named test exists and names the page and the marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.*?)\s*-->\s*$")
FILE = re.compile(r"^\s*<!--\s*file:\s*(?P<name>[\w./-]+)\s*-->\s*$")
RUN_BY = re.compile(r"^\s*<!--\s*run-by:\s*(?P<test>\S+?)\s*-->\s*$")


@dataclass
class Block:
    language: str
    line: int  # 1-based line of the opening fence
    source: str
    skip: str | None
    file: str | None = None
    run_by: str | None = None  # the test id that runs it (``path::name``)


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, with the marker written right above each (if any)."""
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
        above = lines[i - 1] if i > 0 else ""
        skip, file, run_by = SKIP.match(above), FILE.match(above), RUN_BY.match(above)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        assert j < len(lines), f"{page.name}:{i + 1}: a code block that is never closed"
        found.append(
            Block(
                language,
                i + 1,
                "\n".join(body) + "\n",
                skip["reason"] if skip else None,
                file and file["name"],
                run_by and run_by["test"],
            )
        )
        i = j + 1
    return found


def run_by(page: str, test: str) -> Block:
    """The block of ``page`` (relative to the repository) marked ``<!-- run-by: test -->``: exactly one."""
    found = [b for b in blocks(ROOT / page) if b.run_by == test]
    assert len(found) == 1, f"{page} has {len(found)} blocks marked <!-- run-by: {test} -->, not 1"
    return found[0]


def file_block(page: str, name: str) -> Block:
    """The block of ``page`` marked ``<!-- file: name -->``: exactly one."""
    found = [b for b in blocks(ROOT / page) if b.file == name]
    assert len(found) == 1, f"{page} has {len(found)} blocks marked <!-- file: {name} -->, not 1"
    return found[0]


def substitute(source: str, changes: dict[str, str]) -> str:
    """``source`` with each key replaced by its value; each key must occur exactly once, so that a page
    edit that removes or repeats what a test replaces fails the test instead of running something else."""
    for old, new in changes.items():
        count = source.count(old)
        assert count == 1, f"the block has {count} occurrences of {old!r}, not 1: update the test's substitutions"
        source = source.replace(old, new)
    return source
