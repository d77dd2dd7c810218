"""The runs table of a big project in a few requests: row markers and an index of settled rows.

A run's row changes only while a session is attached to it: every column
(status, step, sessions, rewinds, latest metrics) comes from events and
points a session writes; what others append (control requests, resume
choices, gc's deletions) shows in no column. So:

- each session ``put``s a **row marker** ``projects/<p>/table/<run>.json``
  before its ``session_started`` event (``{"state": "started"}``) and again
  after its ``session_ended`` event and final summary (``{"state": "ended"}``);
- a reader that built rows writes an **index** of settled rows (their last
  session ended, or the run is closed), ``projects/<p>/table/index-<ms>-<token>.json``,
  created with ``create``, each row with the version of the marker it saw.

- the helper of a session that ended (``launchhelm._settle``) adds its run's
  row the same way right after: a new index of the newest ones' rows still
  exact plus its own, so the first reader after a run settles finds it there.

``Api.runs`` lists ``projects/<p>/table/`` (markers with their versions, and
the indexes: one request per 1,000 runs), reads the newest index, and takes
an index row as it is while its run's marker is unchanged: no session
started since. Every other
run (marker changed, started, or missing: a store written before markers)
gets its row from its summary and the log (``_summary.run_rows``), exactly
as without an index. A session killed after
its marker and before its start event leaves a marker that says "started":
the run is read from its log, which decides.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import cast

from launchhelm._exceptions import AlreadyExistsError, StorageError
from launchhelm._runlog._records import IndexEntry, RunRow
from launchhelm.storage import Store
from launchhelm.storage._keys import (
    new_index_name,
    parse_index_name,
    parse_row_marker_name,
    row_marker_key,
    table_prefix,
)

__all__ = ["add_row", "mark_row", "project_rows", "read_index", "read_indexes", "row_marker_key", "table_listing"]

_log = logging.getLogger("launchhelm")

INDEX_FORMAT = "launchhelm.runs-index/1"
#: Rows read fresh that make a reader write a new index.
INDEX_AFTER = 32
#: The newest indexes a helper adding its row unions (helpers racing each create one from the same base).
INDEX_MERGE = 4
#: Indexes kept: a reader may be fetching one that is no longer the newest.
INDEX_KEEP = 2
#: Rounds a helper adding its row takes to fold in the indexes created beside its own.
ADD_ROUNDS = 3


def mark_row(store: Store, project: str, run_id: str, session_id: str, state: str) -> None:
    """The session's row marker: ``"started"`` before its start event, ``"ended"`` after its end."""
    body: dict[str, object] = {"session": session_id, "state": state, "time": time.time()}
    try:
        store.put(row_marker_key(project, run_id), json.dumps(body).encode())
    except StorageError as exc:  # without it the run is read from its summary and log: slower, as right
        _log.debug("run %s: could not put its row marker: %s", run_id, exc)


def table_listing(store: Store, project: str) -> tuple[dict[str, str | None], list[str]]:
    """The row markers (run -> version) and the indexes (oldest first) under the project's table."""
    markers: dict[str, str | None] = {}
    indexes = []
    for info in store.list_info(table_prefix(project)):
        name = info.key
        if parse_index_name(name):
            indexes.append(name)
        elif (run_id := parse_row_marker_name(name)) is not None:
            markers[run_id] = info.version
    return markers, sorted(indexes)


def read_index(store: Store, project: str, name: str | None) -> dict[str, IndexEntry]:
    """The rows of index ``name`` (as listed under the table), or {} when absent, damaged or of another format."""
    if name is None:
        return {}
    return _decode_index(store.read_many([f"{table_prefix(project)}/{name}"]).get(f"{table_prefix(project)}/{name}"))


def _decode_index(data: bytes | None) -> dict[str, IndexEntry]:
    if data is None:
        return {}
    try:
        body = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(body, dict) or body.get("format") != INDEX_FORMAT or not isinstance(body.get("runs"), dict):
        return {}
    return cast("dict[str, IndexEntry]", dict(body["runs"]))  # as _write_index wrote them


def read_indexes(store: Store, project: str, names: list[str]) -> dict[str, IndexEntry]:
    """The union of indexes ``names`` (oldest first; one concurrent read), a newer index's row first."""
    prefix = table_prefix(project)
    blobs = store.read_many([f"{prefix}/{n}" for n in names]) if names else {}
    runs: dict[str, IndexEntry] = {}
    for name in names:
        runs.update(_decode_index(blobs.get(f"{prefix}/{name}")))
    return runs


def _settled(row: Mapping[str, object]) -> bool:
    return row.get("status") in ("resumable", "closed")


def project_rows(store: Store, project: str, run_ids: list[str]) -> list[RunRow]:
    """The rows of ``run_ids`` (in order): index rows where still exact, the rest from summaries and logs."""
    from launchhelm._runlog._summary import run_rows

    markers, indexes = table_listing(store, project)
    index = read_index(store, project, indexes[-1] if indexes else None)
    rows: dict[str, RunRow] = {}
    fresh = []
    for run_id in run_ids:
        entry = index.get(run_id)
        version = markers.get(run_id)
        if entry is not None and version is not None and entry.get("marker") == version:
            rows[run_id] = dict(entry["row"])
        else:
            fresh.append(run_id)
    if fresh:
        for run_id, row in zip(fresh, run_rows(store, fresh), strict=True):
            rows[run_id] = row
    settled_fresh = [r for r in fresh if markers.get(r) is not None and _settled(rows[r])]
    if len(settled_fresh) >= INDEX_AFTER:
        _write_index(store, project, indexes, index, markers, {r: rows[r] for r in settled_fresh})
    return [rows[run_id] for run_id in run_ids]


def _write_index(
    store: Store,
    project: str,
    older: list[str],
    index: dict[str, IndexEntry],
    markers: dict[str, str | None],
    new_rows: dict[str, RunRow],
) -> None:
    """A new index: the old one's rows still exact, plus the settled rows just read. Best effort."""
    runs = {r: e for r, e in index.items() if markers.get(r) is not None and e.get("marker") == markers.get(r)}
    for run_id, row in new_rows.items():
        runs[run_id] = IndexEntry(marker=markers[run_id], row=row)
    if _create_index(store, project, runs) is not None:
        # keep the ones a reader unions (it may be fetching them); older ones are garbage
        _delete_indexes(store, project, older[: -INDEX_KEEP + 1])


def _create_index(store: Store, project: str, runs: Mapping[str, IndexEntry]) -> str | None:
    """Create a new index of ``runs``; its name, or None where the store refused it."""
    name = new_index_name()
    body = json.dumps({"format": INDEX_FORMAT, "created": time.time(), "runs": runs}, separators=(",", ":"))
    try:
        store.create(f"{table_prefix(project)}/{name}", body.encode())
    except (AlreadyExistsError, StorageError) as exc:  # a read-only credential: the next reader tries again
        _log.debug("could not write the runs index of project %s: %s", project, exc)
        return None
    return name


def _delete_indexes(store: Store, project: str, names: list[str]) -> None:
    doomed = [f"{table_prefix(project)}/{n}" for n in names]
    if doomed:
        try:
            store.delete_many(doomed)
        except StorageError as exc:
            _log.debug("could not delete old runs indexes of project %s: %s", project, exc)


def add_row(store: Store, project: str, run_id: str) -> bool:
    """Add a settled run's row to the project's runs index (its helper, once its session ended).

    A new index: the rows of the newest :data:`INDEX_MERGE` indexes still
    exact, plus this run's row under the marker version just listed. Helpers
    finishing at once each create one from the same base, and readers read
    only the newest; so each looks again after its create and, where indexes
    it has not folded appeared and its own is not the newest, or they hold
    rows its own lacks, creates one more with them (at most
    :data:`ADD_ROUNDS` in all). A row still missed is read from the run by
    the reader, as without an index. Returns whether the row is in
    an index this call created; False for a run not settled (nothing to add).
    """
    from launchhelm._runlog._summary import run_rows

    markers, indexes = table_listing(store, project)
    version = markers.get(run_id)
    if version is None:
        return False  # no marker: its row could not be vouched for
    row = run_rows(store, [run_id])[0]
    if not _settled(row):
        return False  # a new session started meanwhile: its own end adds it
    runs = read_indexes(store, project, indexes[-INDEX_MERGE:])
    merged = set(indexes[-INDEX_MERGE:])
    base = indexes[-1] if indexes else ""  # indexes named after it were created beside this one
    runs[run_id] = IndexEntry(marker=version, row=row)
    mine: str | None = None
    for _ in range(ADD_ROUNDS):
        exact = {r: e for r, e in runs.items() if markers.get(r) is not None and e.get("marker") == markers.get(r)}
        mine = _create_index(store, project, exact)
        if mine is None:
            return False
        merged.add(mine)
        markers, indexes = table_listing(store, project)
        beside = [n for n in indexes if n not in merged and n > base]
        if not beside:
            break
        merged.update(beside)
        lacking = False
        for r, e in read_indexes(store, project, beside).items():
            current = markers.get(r) is not None and e.get("marker") == markers.get(r)
            if current and (r not in runs or runs[r].get("marker") != markers.get(r)):
                runs[r] = e
                lacking = True
        if indexes[-1] == mine and not lacking:
            break
    # the newest few stay (a reader may be fetching one, a racing helper folding it); older ones are garbage
    _delete_indexes(store, project, indexes[:-INDEX_MERGE])
    return mine is not None
