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

``Api.runs`` lists ``projects/<p>/table/`` (markers with their versions, and
the indexes: one request per 1,000 runs), reads the newest index, and takes
an index row as it is while its run's marker is unchanged: no session
started since. Every other run (marker changed, started, or missing: a store
written before markers) gets its row from its summary and the log
(``_summary.run_rows``), exactly as without an index. A session killed after
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

__all__ = ["mark_row", "project_rows", "read_index", "row_marker_key"]

_log = logging.getLogger("launchhelm")

INDEX_FORMAT = "launchhelm.runs-index/1"
#: Rows read fresh that make a reader write a new index.
INDEX_AFTER = 32


def mark_row(store: Store, project: str, run_id: str, session_id: str, state: str) -> None:
    """The session's row marker: ``"started"`` before its start event, ``"ended"`` after its end."""
    body: dict[str, object] = {"session": session_id, "state": state, "time": time.time()}
    try:
        store.put(row_marker_key(project, run_id), json.dumps(body).encode())
    except StorageError as exc:  # without it the run is read from its summary and log: slower, as right
        _log.debug("run %s: could not put its row marker: %s", run_id, exc)


def _listing(store: Store, project: str) -> tuple[dict[str, str | None], list[str]]:
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
    data = store.read_many([f"{table_prefix(project)}/{name}"]).get(f"{table_prefix(project)}/{name}")
    if data is None:
        return {}
    try:
        body = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(body, dict) or body.get("format") != INDEX_FORMAT or not isinstance(body.get("runs"), dict):
        return {}
    return cast("dict[str, IndexEntry]", dict(body["runs"]))  # as _write_index wrote them


def _settled(row: Mapping[str, object]) -> bool:
    return row.get("status") in ("resumable", "closed")


def project_rows(store: Store, project: str, run_ids: list[str]) -> list[RunRow]:
    """The rows of ``run_ids`` (in order): index rows where still exact, the rest from summaries and logs."""
    from launchhelm._runlog._summary import run_rows

    markers, indexes = _listing(store, project)
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
    name = new_index_name()
    body = json.dumps({"format": INDEX_FORMAT, "created": time.time(), "runs": runs}, separators=(",", ":"))
    try:
        store.create(f"{table_prefix(project)}/{name}", body.encode())
    except (AlreadyExistsError, StorageError) as exc:  # a read-only credential: the next reader tries again
        _log.debug("could not write the runs index of project %s: %s", project, exc)
        return
    # keep the one before (a reader may be fetching it); older ones are garbage
    doomed = [f"{table_prefix(project)}/{n}" for n in older[:-1]]
    if doomed:
        try:
            store.delete_many(doomed)
        except StorageError as exc:
            _log.debug("could not delete old runs indexes of project %s: %s", project, exc)
