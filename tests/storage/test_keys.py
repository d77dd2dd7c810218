"""The store layout has one owner: ``launchhelm/storage/_keys.py`` builds every key.

If this fails, a layout change would have to be hunted through the code, or
``docs/storage.md`` (what users and other tools read) no longer says where
things are.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from launchhelm.storage import _keys

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "storage.md"

#: Path-like fragments of the layout: a folder name between slashes, or a file name part.
FRAGMENT = re.compile(
    r"(?:^|/)(?:runs|projects|events|sessions|metrics|table|console|artifacts|rules|evaluations|segments|compat)/"
    r"|/(?:runs|events|sessions|metrics|table|console|artifacts|rules|evaluations|segments|compat)(?:$|/)"
    r"|(?:run|project|summary|request|retry|logged)\.json|manifest-|snapshot-|index-|-renew-|\.arrow\b|\.parquet\b"
)


def _doc_rows() -> list[str]:
    """The key patterns of the layout table (the first table under "## Layout")."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        rows += re.findall(r"`([^`]+)`", line.split("|")[1])
    return rows


def _pattern(row: str) -> re.Pattern[str]:
    out = ""
    for part in re.split(r"(<[^>]+>|\.\.\.)", row):
        if part == "...":
            out += r".+"
        elif part.startswith("<"):
            width = re.search(r":0(\d+)d>$", part)
            out += rf"\d{{{width.group(1)}}}" if width else r"[^/]+"
        else:
            out += re.escape(part)
    return re.compile(out)


def test_the_layout_table_and_the_keys_module_list_the_same_keys() -> None:
    documented = _doc_rows()
    assert len(documented) == len(set(documented)), "a row is listed twice in docs/storage.md"
    assert sorted(documented) == sorted(_keys.ROWS), (
        "docs/storage.md's layout table and launchhelm/storage/_keys.py's ROWS differ: "
        f"only in the doc {sorted(set(documented) - set(_keys.ROWS))}, "
        f"only in the code {sorted(set(_keys.ROWS) - set(documented))}"
    )


def test_every_key_builder_builds_the_key_its_row_documents() -> None:
    for row, build in _keys.ROWS.items():
        key = build()
        assert _pattern(row).fullmatch(key), f"{row!r} documents keys like that, but the code built {key!r}"


def test_parsers_read_back_what_the_builders_wrote() -> None:
    prefix = _keys.metrics_prefix("run") + "/"
    assert _keys.parse_chunk_name(_keys.chunk_key("run", "s1", 3, 10, 20)[len(prefix) :]) == ("s1", 3, 10, 20)
    assert _keys.parse_manifest_name(_keys.manifest_name(42)) == 42
    assert _keys.parse_segment_name(_keys.new_segment_name(1))
    assert _keys.parse_chunk_name(_keys.new_segment_name(1)) is None
    events = _keys.events_prefix("run") + "/"
    assert _keys.parse_event_name(_keys.event_key("run", 9)[len(events) :]) == 9
    assert _keys.parse_snapshot_name(_keys.snapshot_key("run", 9)[len(events) :]) == 9
    assert _keys.parse_event_name(_keys.snapshot_key("run", 9)[len(events) :]) is None
    table = _keys.table_prefix("p") + "/"
    assert _keys.parse_row_marker_name(_keys.row_marker_key("p", "abcd")[len(table) :]) == "abcd"
    assert _keys.parse_index_name(_keys.new_index_name())
    assert _keys.parse_row_marker_name(_keys.new_index_name()) is None
    assert _keys.parse_console_name(_keys.console_key("run", "s1", 5)[len(_keys.console_prefix("run")) + 1 :]) == (
        "s1",
        5,
    )
    assert _keys.parse_project_listing(_keys.project_record_key("p")[len(_keys.PROJECTS) + 1 :]) == ("project", "p")
    assert _keys.parse_project_listing(_keys.project_run_marker("p", "r1")[len(_keys.PROJECTS) + 1 :]) == ("run", "r1")
    base = _keys.attempt_prefix(_keys.evaluation_prefix("p", "r", "c"), 2)
    tail = _keys.renewal_key(base, 3, 4)[len(_keys.evaluation_prefix("p", "r", "c")) + 1 :]
    m = _keys.parse_evaluation_tail(tail)
    assert m is not None and (m["attempt"], m["epoch"], m["renewal"]) == ("0002", "000003", "000004")
    assert _keys.is_renewal_name(tail.split("/")[1], 3) and not _keys.is_renewal_name(tail.split("/")[1], 4)


def _code_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants in code (f-string parts included), docstrings left out."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


#: Strings that look like keys but are not store keys.
NOT_KEYS = {("launchhelm/_evaluation/_policies.py", "projects/_/buckets/")}  # a GCS IAM resource name
#: Modules that name files of other tools (an importer's source), never store keys.
NOT_STORE_MODULES = {"launchhelm/importers/_neptune.py"}


@pytest.mark.slow
def test_no_other_module_spells_a_key_fragment() -> None:
    owner = ROOT / "launchhelm" / "storage" / "_keys.py"
    found = []
    for path in sorted((ROOT / "launchhelm").rglob("*.py")):
        if path == owner:
            continue
        if str(path.relative_to(ROOT)) in NOT_STORE_MODULES:
            continue
        for line, value in _code_strings(ast.parse(path.read_text(encoding="utf-8"))):
            if FRAGMENT.search(value) and (str(path.relative_to(ROOT)), value) not in NOT_KEYS:
                found.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert not found, "store key fragments outside launchhelm/storage/_keys.py:\n" + "\n".join(found)
