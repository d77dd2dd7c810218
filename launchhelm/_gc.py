"""Garbage collection and retention: ``launchhelm gc``.

What a store accumulates that nothing reads:

- **orphaned uploads**: checkpoint payloads under ``runs/<id>/artifacts/<aid>/``
  that no ``checkpoint`` event publishes (a process killed between upload
  and publish, or mid-upload on a backend that shows partial uploads);
- **incomplete uploads**: S3 multipart uploads and Azure uncommitted blobs a
  killed writer left open (billed, never visible), local staging files;
- **leftovers**: payload files of checkpoints gc already deleted (a gc that
  was itself interrupted);
- **compacted metrics**: metric chunks and segments that a newer manifest
  replaced, once past the compaction grace period. gc also compacts what a
  dead session left uncovered (``docs/storage.md``);
- **unreferenced media**: image, table and histogram objects (and
  thumbnails) under ``runs/<id>/media/objects/`` that no index row of the run
  names (a session killed between storing an object and its index flush),
  once older than ``older_than``, and only while no session of the run is
  alive (see :meth:`_Collector.media_objects`).

Both kinds of upload are only removed once older than a safety window
(``older_than``, 24 hours by default): a younger one may be a save still in
progress, about to be published.

Retention (``keep_last=N``) deletes published checkpoints beyond the newest N
of each run, but never the latest one, the one a resume choice points to,
or one with a queued or running evaluation; nor, unless
``include_evaluated=True`` (``--include-evaluated``), one with any evaluation
in the table (done or failed): its scores are charted beside it, and "Try
again" needs the file. A deletion is first recorded as a
``checkpoint_deleted`` event, appended only if the run's log has not moved
since gc read it (so a resume choice made meanwhile is seen, and the
decision is taken again); only then is the payload deleted. Readers fold the
event: the checkpoint leaves ``RunHandle.checkpoints()`` at once, and a crash
between the event and the deletion leaves a leftover for the next gc, never
a listed checkpoint without its payload.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError
from launchhelm._runlog._events import (
    CHECKPOINT,
    CHECKPOINT_DELETED,
    EventLog,
    RunState,
    SequenceTaken,
    fold,
)
from launchhelm.storage import ObjectInfo, Store, open_store
from launchhelm.storage._keys import (
    PROJECTS,
    artifacts_prefix,
    media_index_prefix,
    media_object_key,
    media_objects_prefix,
    parse_project_listing,
)

if TYPE_CHECKING:
    from launchhelm._runlog._records import CheckpointEvent

__all__ = ["DEFAULT_OLDER_THAN", "GcAction", "GcReport", "add_commands", "collect_garbage", "parse_duration"]

#: Seconds an unpublished upload must have been left alone before gc removes it.
DEFAULT_OLDER_THAN = 24 * 3600.0

ORPHAN = "orphan"
LEFTOVER = "leftover"
RETENTION = "retention"
UPLOAD = "incomplete upload"
MEDIA = "unreferenced media"

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``"24h"`` -> 86400.0; also ``s``, ``m``, ``d``, ``w``; a bare number is seconds."""
    match = _DURATION_RE.match(str(text))
    if not match:
        raise InvalidArgumentError(f"invalid duration {text!r}: write e.g. 30m, 24h, 7d or a number of seconds")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass
class GcAction:
    """One thing gc deleted (or would delete, in a dry run).

    Attributes
    ----------
    kind:
        ``"orphan"``, ``"leftover"``, ``"retention"``, ``"incomplete upload"`` or
        ``"unreferenced media"``.
    keys:
        Store keys removed (for an incomplete upload: the key it was meant for).
    size:
        Bytes freed, where known.
    """

    kind: str
    run_id: str | None
    checkpoint: str | None
    keys: list[str]
    size: int
    reason: str


@dataclass
class GcReport:
    """What :func:`collect_garbage` did."""

    dry_run: bool
    actions: list[GcAction] = field(default_factory=list)
    #: (run id, checkpoint id, why it was kept) for checkpoints retention spared
    kept: list[tuple[str, str, str]] = field(default_factory=list)
    #: orphans and uploads spared because they are younger than the window
    too_young: list[str] = field(default_factory=list)
    #: (run id, metric chunks compacted, objects compaction left that were deleted) per run
    compacted: list[tuple[str, int, int]] = field(default_factory=list)
    runs: int = 0

    @property
    def freed(self) -> int:
        return sum(a.size for a in self.actions)

    def lines(self) -> list[str]:
        """Human-readable lines, one per action, then a summary."""
        verb = "would delete" if self.dry_run else "deleted"
        out = []
        for a in self.actions:
            what = f"checkpoint {a.checkpoint} of run {a.run_id}" if a.checkpoint else (a.keys[0] if a.keys else "?")
            out.append(f"{verb} {a.kind}: {what} ({_size(a.size)}, {len(a.keys)} object(s)): {a.reason}")
        for run_id, checkpoint, why in self.kept:
            out.append(f"kept checkpoint {checkpoint} of run {run_id}: {why}")
        for item in self.too_young:
            out.append(f"kept {item}: younger than the safety window (--older-than)")
        for run_id, chunks, deleted in self.compacted:
            compact = "would compact" if self.dry_run else "compacted"
            out.append(
                f"{compact} {chunks} metric chunk(s) of run {run_id} into segments"
                + (f"; deleted {deleted} object(s) compaction replaced" if deleted else "")
            )
        out.append(
            f"{verb} {len(self.actions)} item(s), {_size(self.freed)} in {self.runs} run(s)"
            + (" (dry run: nothing was changed)" if self.dry_run else "")
        )
        return out


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return f"{n} B"


def _run_ids(store: Store, project: str | None) -> list[str]:
    found: set[str] = set()
    for name in store.list(f"{PROJECTS}/{project}" if project else PROJECTS):
        parsed = parse_project_listing(name, project)
        if parsed is not None and parsed[0] == "run":
            found.add(parsed[1])
    return sorted(found)


def _evaluations_of(store: Store, project: str, run_id: str) -> dict[str, str]:
    """``{checkpoint id: evaluation state}`` of every evaluation of ``run_id`` in the table."""
    from launchhelm._evaluation._queue import queue_for

    records = queue_for(store, project).evaluations(run_id)
    return {r.checkpoint: r.state for r in records}


def _project_of(store: Store, run_id: str) -> str | None:
    from launchhelm._runlog._runinfo import read_run_record

    try:
        return str(read_run_record(store, run_id)["project"])
    except Exception:
        return None


def _protections(
    state: RunState, keep_last: int, evaluations: dict[str, str], include_evaluated: bool = False
) -> tuple[list[CheckpointEvent], dict[str, str]]:
    """(checkpoints to delete, {kept id: why}) under ``keep_last``."""
    live = state.checkpoints
    why: dict[str, str] = {}
    for event in live[len(live) - keep_last :] if keep_last > 0 else []:
        why[event["checkpoint"]] = f"one of the newest {keep_last}"
    if live:
        why.setdefault(live[-1]["checkpoint"], "the latest")
    if state.resume_choice is not None:
        why[state.resume_choice] = "chosen for resume"
    for checkpoint, evaluation in evaluations.items():
        if evaluation in ("queued", "running"):  # a worker is about to read it, or reading it now
            why.setdefault(checkpoint, "its evaluation is queued or running")
        elif not include_evaluated:
            why.setdefault(checkpoint, f"it has a {evaluation} evaluation (--include-evaluated deletes it)")
    doomed = [e for e in live if e["checkpoint"] not in why]
    return doomed, why


class _Collector:
    def __init__(
        self,
        store: Store,
        older_than: float,
        dry_run: bool,
        now: float,
        log: Callable[[str], None],
        include_evaluated: bool = False,
    ) -> None:
        self.store = store
        self.include_evaluated = include_evaluated
        self.older_than = older_than
        self.dry_run = dry_run
        self.now = now
        self.log = log
        self.report = GcReport(dry_run=dry_run)

    def _delete(self, keys: list[str]) -> None:
        if self.dry_run:
            return
        for key in keys:
            self.store.delete(key)

    def old_enough(self, when: float | None) -> bool:
        if self.older_than <= 0:
            return True
        return when is not None and self.now - when >= self.older_than

    def run(self, run_id: str, keep_last: int | None) -> None:
        log = EventLog(self.store, run_id)
        events = log.read()
        state = fold(events)
        published = {e["checkpoint"] for e in events if e["type"] == CHECKPOINT}
        deleted = {d["checkpoint"] for d in state.deleted_checkpoints}
        live = {e["checkpoint"] for e in state.checkpoints}
        base = artifacts_prefix(run_id)
        groups: dict[str, list[ObjectInfo]] = {}
        for info in self.store.list_info(base):
            groups.setdefault(info.key.split("/", 1)[0], []).append(info)
        for artifact, infos in sorted(groups.items()):
            if artifact in live:
                continue
            keys = [f"{base}/{i.key}" for i in infos]
            size = sum(i.size for i in infos)
            if artifact in deleted:
                reason = "payload of a checkpoint gc already deleted"
                self.report.actions.append(GcAction(LEFTOVER, run_id, artifact, keys, size, reason))
            elif artifact in published:
                continue  # published after our read of the log: not ours to judge
            else:
                newest = max((i.modified for i in infos if i.modified is not None), default=None)
                if any(i.modified is None for i in infos):
                    newest = None if self.older_than > 0 else newest
                if not self.old_enough(newest):
                    self.report.too_young.append(f"unpublished upload {base}/{artifact}")
                    continue
                reason = "no checkpoint event publishes it (the save never finished)"
                self.report.actions.append(GcAction(ORPHAN, run_id, None, keys, size, reason))
            self._delete(keys)
        if keep_last is not None:
            self.retain(run_id, log, keep_last, groups)
        self.metrics(run_id)
        self.media_objects(run_id)

    def metrics(self, run_id: str) -> None:
        """Compact the chunks a run's sessions left uncovered and delete what compaction made garbage."""
        from launchhelm._metrics._compact import compact_run
        from launchhelm._metrics._layout import list_metrics, read_manifest

        if self.dry_run:
            listing = list_metrics(self.store, run_id)
            waiting = len(listing.uncovered(read_manifest(self.store, run_id, listing.newest_manifest)))
            if waiting:
                self.report.compacted.append((run_id, waiting, 0))
            return
        result = compact_run(self.store, run_id, by="launchhelm gc")
        if result is not None and (result.chunks or result.deleted):
            self.report.compacted.append((run_id, result.chunks, result.deleted))
        self.media_index(run_id)

    def media_index(self, run_id: str) -> None:
        """Delete the media index objects a session merged into wider ones and ended before it could."""
        from launchhelm._metrics._compact import compaction_grace
        from launchhelm.media._index import merged_away

        prefix = media_index_prefix(run_id)
        doomed = merged_away(self.store.list_info(prefix), compaction_grace(), self.now)
        if doomed:
            self.store.delete_many(f"{prefix}/{name}" for name in doomed)

    def media_objects(self, run_id: str) -> None:
        """Delete the media objects no index row of the run references, once older than ``older_than``.

        Rows past a fence are not the run's, so they reference nothing. A run
        with a live session is left alone whatever the age: objects are named
        by their content, so a live session that logs the bytes of an old
        orphan again gets ``AlreadyExists`` (the old object, old timestamp)
        and indexes it at its next flush, which gc cannot see coming.
        """
        objects = media_objects_prefix(run_id)
        infos = self.store.list_info(objects)
        if not infos:
            return  # no media (or a store written before them): one listing, nothing read
        from launchhelm.media._read import read_media_index

        try:
            index = read_media_index(self.store, run_id)
        except Exception as exc:  # unreadable index: deleting on a guess could lose a referenced picture
            self.log(f"run {run_id}: media objects skipped, its media index could not be read: {exc}")
            return
        referenced = set(index.column("object").to_pylist())
        referenced.update(name for name in index.column("thumbnail").to_pylist() if name)
        unreferenced = [i for i in infos if i.key not in referenced]
        if not unreferenced:
            return
        kinds = zip(index.column("object").to_pylist(), index.column("kind").to_pylist(), strict=True)
        tables = sorted({name for name, kind in kinds if kind == "table"})
        try:
            referenced |= _table_cells(self.store, run_id, tables)
        except Exception as exc:
            self.log(f"run {run_id}: media objects skipped, a table's image cells could not be read: {exc}")
            return
        unreferenced = [i for i in unreferenced if i.key not in referenced]
        old = [i for i in unreferenced if self.old_enough(i.modified)]
        if len(old) < len(unreferenced):
            young = len(unreferenced) - len(old)
            self.report.too_young.append(f"{young} unreferenced media object(s) of run {run_id}")
        if not old:
            return
        if _live_session(self.store, run_id, fold(EventLog(self.store, run_id).read())):  # read now: the latest
            self.report.too_young.append(
                f"{len(old)} unreferenced media object(s) of run {run_id}: a session of the run is alive"
            )
            return
        for info in old:
            reason = "no media index row of the run references it (stored, never indexed)"
            key = f"{objects}/{info.key}"
            self.report.actions.append(GcAction(MEDIA, run_id, None, [key], info.size, reason))
        if not self.dry_run:
            self.store.delete_many(f"{objects}/{info.key}" for info in old)

    def retain(self, run_id: str, log: EventLog, keep_last: int, groups: dict[str, list[ObjectInfo]]) -> None:
        project = _project_of(self.store, run_id)
        base = artifacts_prefix(run_id)
        lost = 0
        while True:
            state = fold(log.read())
            try:
                evaluations = _evaluations_of(self.store, project, run_id) if project else {}
            except Exception as exc:
                self.log(f"run {run_id}: retention skipped, its evaluations could not be read: {exc}")
                return
            doomed, why = _protections(state, keep_last, evaluations, self.include_evaluated)
            if self.dry_run or not doomed:
                for event in doomed:  # a dry run records nothing: list them all at once
                    self._record_retention(run_id, event, groups, base, keep_last)
                self.report.kept += [
                    (run_id, c, reason) for c, reason in why.items() if not reason.startswith("one of the newest")
                ]
                return
            event = doomed[0]
            try:
                log.append(
                    CHECKPOINT_DELETED,
                    {"checkpoint": event["checkpoint"], "step": event.get("step"), "reason": f"keep_last={keep_last}"},
                    expect_seq=state.last_seq + 1,
                )
            except SequenceTaken:
                lost += 1  # the run moved (a resume choice, a new checkpoint): decide again
                if lost > 50:
                    self.log(f"run {run_id}: retention gave up, its event log keeps moving")
                    return
                continue
            self._delete(self._record_retention(run_id, event, groups, base, keep_last))

    def _record_retention(
        self, run_id: str, event: CheckpointEvent, groups: dict[str, list[ObjectInfo]], base: str, keep_last: int
    ) -> list[str]:
        checkpoint = str(event["checkpoint"])
        infos = groups.get(checkpoint, [])
        keys = [f"{base}/{i.key}" for i in infos]
        size = sum(i.size for i in infos) or int(event.get("size") or 0)
        reason = f"beyond the newest {keep_last} (step {event.get('step')})"
        self.report.actions.append(GcAction(RETENTION, run_id, checkpoint, keys, size, reason))
        return keys

    def uploads(self) -> None:
        for upload in self.store.incomplete_uploads():
            if not self.old_enough(upload.started):
                self.report.too_young.append(f"incomplete upload of {upload.key}")
                continue
            self.report.actions.append(
                GcAction(UPLOAD, None, None, [upload.key], 0, "started and never finished (a killed writer)")
            )
            if not self.dry_run:
                self.store.abort_upload(upload)


def _table_cells(store: Store, run_id: str, tables: list[str]) -> set[str]:
    """The image and thumbnail objects the image cells of ``tables`` (object names) reference."""
    import json

    if not tables:
        return set()
    got = store.read_many([media_object_key(run_id, name) for name in tables])
    cells: set[str] = set()
    for name in tables:
        data = got.get(media_object_key(run_id, name))
        if data is None:
            raise InvalidArgumentError(f"table object {name} is missing")
        for row in json.loads(data)["rows"]:
            for cell in row:
                if isinstance(cell, dict):  # an image cell: {"image", "thumbnail", "caption"}
                    cells.update(str(cell[k]) for k in ("image", "thumbnail") if cell.get(k))
    return cells


def _live_session(store: Store, run_id: str, state: RunState) -> bool:
    """Whether a session of the run that has not ended is alive (its process, or a fresh heartbeat)."""
    from launchhelm._runlog._sessions import liveness

    return any(liveness(store, run_id, s).alive for s in state.sessions if s.ended_at is None)


def collect_garbage(
    store: str | Store | None = None,
    *,
    older_than: float = DEFAULT_OLDER_THAN,
    keep_last: int | None = None,
    dry_run: bool = False,
    project: str | None = None,
    storage_options: Mapping[str, object] | None = None,
    now: float | None = None,
    log: Callable[[str], None] | None = None,
    include_evaluated: bool = False,
) -> GcReport:
    """Delete orphaned and incomplete uploads and unreferenced media, and apply an optional retention policy.

    Parameters
    ----------
    store:
        The store (URL or :class:`~launchhelm.storage.Store`); default as for ``init``.
    older_than:
        Seconds an unpublished or incomplete upload must be old before it is
        removed (default 24 h): younger ones may be saves still in progress.
    keep_last:
        Keep only the newest N published checkpoints of each run (plus the
        latest, a resume choice's, and any with an evaluation in the table);
        None (default) deletes no published checkpoint.
    dry_run:
        Report what would be deleted; change nothing.
    project:
        Only this project's runs (incomplete uploads are store-wide either way).
    include_evaluated:
        With ``keep_last``: also delete old checkpoints whose evaluation is
        done or failed (their scores stay logged; "Try again" then has no
        file). One with a queued or running evaluation is always kept.

    Raises
    ------
    InvalidArgumentError
        ``keep_last`` or ``older_than`` is negative or not a number.
    InvalidTypeError
        ``include_evaluated`` is not a bool.

    Examples
    --------
    >>> from launchhelm._gc import collect_garbage
    >>> report = collect_garbage("memory://gc-doc", keep_last=3, dry_run=True)
    >>> report.actions
    []
    """
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0):
        raise InvalidArgumentError(f"keep_last={keep_last!r}: give a number of checkpoints >= 0")
    if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) or not older_than >= 0:
        raise InvalidArgumentError(f"older_than={older_than!r}: give a number of seconds >= 0")
    if not isinstance(include_evaluated, bool):
        raise InvalidTypeError(f"include_evaluated={include_evaluated!r}: pass True or False")
    st = open_store(store, storage_options)
    collector = _Collector(
        st, float(older_than), dry_run, time.time() if now is None else now, log or (lambda _: None), include_evaluated
    )
    run_ids = _run_ids(st, project)
    collector.report.runs = len(run_ids)
    for run_id in run_ids:
        collector.run(run_id, keep_last)
    collector.uploads()
    return collector.report


# -- command line -------------------------------------------------------------------
def _cmd_gc(args: argparse.Namespace) -> int:
    import sys

    report = collect_garbage(
        args.store,
        older_than=parse_duration(args.older_than),
        keep_last=args.keep_last,
        dry_run=args.dry_run,
        project=args.project,
        include_evaluated=args.include_evaluated,
        log=lambda line: print(f"launchhelm gc: {line}", file=sys.stderr),
    )
    for line in report.lines():
        print(line)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gc`` to the ``launchhelm`` command's subparsers."""
    gc = sub.add_parser(
        "gc",
        help="delete orphaned and incomplete uploads; --keep-last N deletes old checkpoints",
        description=(
            "Delete checkpoint uploads no event publishes, multipart uploads left open and media objects no index "
            "row of their run names (all only once older than --older-than; media never while the run's session "
            "is alive), and with --keep-last N the published checkpoints of each run beyond its newest N "
            "(never the latest, one chosen for resume, or one with an evaluation in the table, unless "
            "--include-evaluated: then only a queued or running evaluation keeps one)."
        ),
    )
    gc.add_argument("--older-than", default="24h", help="safety window for unpublished uploads (default 24h)")
    gc.add_argument("--keep-last", type=int, default=None, metavar="N", help="keep the newest N checkpoints per run")
    gc.add_argument("--dry-run", action="store_true", help="list what would be deleted; change nothing")
    gc.add_argument("--project", default=None, help="only this project's runs")
    gc.add_argument(
        "--include-evaluated",
        action="store_true",
        help="with --keep-last: also delete old checkpoints whose evaluation is done or failed",
    )
    gc.set_defaults(func=_cmd_gc)
