"""What every importer shares: run ids derived from the source's ids, attempts from repeated steps,
and publishing a run so that it appears only once complete.

A source's reader streams a run's points into a :class:`Recorder`, which
buffers them in flat arrays, writes them as Parquet segments under the run's
prefix, and at the end writes, in this order: the manifest naming the
segments, the event log (session started, a rewind per repeated step,
session ended and closed, with the source's times), the summary (the runs
table's row), the row marker, and last ``run.json`` with ``create``. Readers
reach a run only through ``run.json`` (``Api.run``) and the project's run
marker (``Api.runs``), created after it; until then the objects are
invisible, and a failure deletes them (and a later import of the same run
deletes what a killed import left). So a run appears complete or not at all,
and the same source run imported again is found by its derived id and
skipped. See docs/importers.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, TypedDict

from launchhelm._exceptions import (
    AlreadyExistsError,
    ImportFailedError,
    InvalidMetricError,
    InvalidTypeError,
    MissingExtraError,
    StorageError,
)
from launchhelm._metrics._layout import Manifest, SegmentRef
from launchhelm._metrics._points import RESERVED_KEYS, validate_key
from launchhelm._metrics._segments import encode_segment
from launchhelm._runlog._events import (
    REWIND,
    SESSION_ENDED,
    SESSION_STARTED,
    fold,
    validate_project,
    validate_run_id,
)
from launchhelm._runlog._sessions import DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_TIMEOUT
from launchhelm._runlog._summary import encode_summary
from launchhelm._runlog._table import mark_row
from launchhelm._types import JSONValue
from launchhelm.media._index import IndexRow, encode_index
from launchhelm.media._types import Prepared
from launchhelm.media._writer import object_name, store_items
from launchhelm.storage import Store, open_store
from launchhelm.storage._keys import (
    event_key,
    manifest_name,
    media_index_key,
    media_object_key,
    metrics_prefix,
    new_segment_name,
    project_record_key,
    project_run_marker,
    project_runs_prefix,
    row_marker_key,
    run_prefix,
    run_record_key,
    summary_key,
)
from launchhelm.storage._progress import progress_delay, stderr_interactive

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import pyarrow as pa

__all__ = [
    "ImportResult",
    "ImportedRun",
    "Recorder",
    "SourceRun",
    "derive_run_id",
    "import_runs",
    "require",
]

_log = logging.getLogger("launchhelm")

#: Points buffered before they are written as one segment (about 32 MiB of arrays).
SEGMENT_POINTS = 1 << 20
#: Runs imported at once.
WORKERS = 8
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
_ID_LENGTH = 12


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` (a source's reader), or raise :class:`MissingExtraError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = module.split(".")[0]
        raise MissingExtraError(
            f"{what} needs the {package!r} package, which is not installed ({exc}); "
            f"install it with: pip install 'launchhelm[{extra}]'",
            extra=extra,
            package=package,
        ) from None


def derive_run_id(kind: str, project: str, source_key: str) -> str:
    """The run id a source run is imported under: the same source run into the same project, the same id."""
    digest = hashlib.sha256(f"launchhelm.import/1\0{kind}\0{project}\0{source_key}".encode()).digest()
    number = int.from_bytes(digest[:16], "big")
    chars = []
    for _ in range(_ID_LENGTH):
        number, rest = divmod(number, 36)
        chars.append(_ALPHABET[rest])
    return validate_run_id("".join(chars))


@dataclass(frozen=True)
class ImportedRun:
    """One source run and the LaunchHelm run it is (or was already) imported as."""

    source: str  #: how the source names it: a folder, an MLflow run id, a W&B run id
    name: str
    run_id: str
    points: int = 0  #: points written by this import (0 when it was already imported)
    left_out: dict[str, int] = field(default_factory=dict, compare=False, hash=False)  #: what was not imported


@dataclass
class ImportResult:
    """What an import did: the runs it imported and those it found already imported."""

    project: str
    imported: list[ImportedRun] = field(default_factory=list)
    skipped: list[ImportedRun] = field(default_factory=list)

    @property
    def run_ids(self) -> list[str]:
        """Ids of every run of the source, imported now or before, in the source's order."""
        return [r.run_id for r in sorted(self.imported + self.skipped, key=self._order.__getitem__)]

    def __post_init__(self) -> None:
        self._order: dict[ImportedRun, int] = {}

    def _add(self, run: ImportedRun, skipped: bool) -> None:
        self._order[run] = len(self._order)
        (self.skipped if skipped else self.imported).append(run)

    def __repr__(self) -> str:
        return f"<ImportResult {self.project}: {len(self.imported)} imported, {len(self.skipped)} already imported>"


@dataclass
class SourceRun:
    """A run of a source, as a reader lists it before reading its points.

    ``read(recorder)`` reads the run and feeds the recorder (points, and any
    of ``name``, ``config``, ``summary``, ``imported``, ``created``,
    ``ended`` it learns while reading). It raises
    :class:`SourceReadError` for a truncated or corrupt source.
    """

    kind: str
    key: str  #: identity within the source: the run id is derived from it
    label: str  #: how messages name the run
    read: Callable[[Recorder], None]
    name: str = ""
    config: dict[str, JSONValue] = field(default_factory=dict)
    created: float | None = None
    ended: float | None = None
    imported: dict[str, object] = field(default_factory=dict)


def _fix_key(key: str) -> str | None:
    """A valid metric key for a source's ``key``: itself, or renamed (reserved names get a ``_``), or None."""
    if key in RESERVED_KEYS:
        return f"{key}_"
    try:
        return validate_key(key)
    except (InvalidMetricError, InvalidTypeError):
        pass
    cleaned = "".join(c if 32 <= ord(c) != 127 else "_" for c in key)
    parts = [p for p in cleaned.split("/") if p not in ("", ".", "..")]
    fixed = "/".join(parts)[:256]
    if fixed in RESERVED_KEYS:
        fixed += "_"
    try:
        return validate_key(fixed)
    except (InvalidMetricError, InvalidTypeError):
        return None


class _Rewind(TypedDict):
    """A rewind the import found (a key logged again at an earlier step), before it is an event."""

    to_step: int
    reached: int
    attempt: int
    time: float
    key: str


class _Bar(Protocol):
    """What is used of a tqdm bar (tqdm ships no type hints)."""

    def external_write_mode(self) -> AbstractContextManager[None]: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...

    def update(self, n: float = 1) -> object: ...

    def close(self) -> None: ...


def _json_safe(value: object) -> object:
    """Event payloads are strict JSON: NaN and infinities become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class Recorder:
    """Takes one run's points as a reader streams them, and publishes the run at the end.

    Points arrive in the source's order. A key logged again at a step at or
    before its last step (in the current attempt) starts a new attempt, as a
    rewind does: a resumed run's repeated steps keep both values. A key that
    so far only ever had one step (a metric logged without steps, all at step
    0) keeps its values in one attempt instead of one attempt per value.
    """

    def __init__(self, store: Store, project: str, run_id: str, source: SourceRun) -> None:
        self.store = store
        self.project = project
        self.run_id = run_id
        self.source = source
        self.name = source.name or source.key
        self.config: dict[str, JSONValue] = dict(source.config)
        self.created = source.created
        self.ended = source.ended
        self.imported: dict[str, object] = dict(source.imported)
        #: values the source gives as the run's summary (W&B's): they override the latest point
        self.summary: dict[str, float] = {}
        self.skipped: dict[str, int] = {}  # what was not imported, counted by description
        self.renamed: dict[str, str] = {}
        self.points = 0
        self._keys: dict[str, int] = {}  # source key -> code (-1: skipped)
        self._names: list[str] = []  # code -> metric key
        self._last_step: list[int] = []
        self._last_attempt: list[int] = []
        self._first_step: list[int] = []
        self._advanced: list[bool] = []
        self._system: list[bool] = []
        self._latest: list[float] = []
        self.attempt = 0
        self.reached = -1
        self.rewinds: list[_Rewind] = []
        self._first_time: float | None = None
        self._last_time: float | None = None
        self._new_buffers()
        self._segments: list[SegmentRef] = []
        self.written: list[str] = []  # store keys written so far (deleted if the import fails)
        self.media_rows: list[IndexRow] = []  # index rows of the media imported (one index object at the end)

    def _new_buffers(self) -> None:
        self._step = array("q")
        self._attempts = array("i")
        self._time = array("d")
        self._code = array("i")
        self._value = array("d")

    # -- taking points ---------------------------------------------------------------
    def _code_of(self, key: str) -> int:
        fixed = _fix_key(key) if isinstance(key, str) else None
        if fixed is None:
            self.skip(f"metric {key!r} (no valid metric name can be made of it)")
            code = -1
        else:
            if fixed != key:
                self.renamed[key] = fixed
            code = self._keys.get(fixed, -2) if fixed != key else -2
            if code == -2:
                code = len(self._names)
                self._names.append(fixed)
                self._last_step.append(0)
                self._last_attempt.append(-1)
                self._first_step.append(0)
                self._advanced.append(False)
                self._system.append(fixed.startswith("system/"))
                self._latest.append(math.nan)
                self._keys[fixed] = code
        self._keys[key] = code
        return code

    def point(self, key: str, step: int, wall_time: float, value: float) -> None:
        """One point: ``value`` of ``key`` at ``step``, logged at ``wall_time`` (epoch seconds)."""
        code = self._keys.get(key)
        if code is None:
            code = self._code_of(key)
        if code < 0:
            return
        if step < 0:
            self.skip(f"points at negative steps ({key!r} and others)")
            return
        if self._last_attempt[code] == self.attempt:
            last = self._last_step[code]
            if step <= last and not self._system[code] and (step < last or self._advanced[code]):
                self._rewind(code, step, wall_time)
            elif step > self._first_step[code]:
                self._advanced[code] = True
        elif self._last_attempt[code] < 0:
            self._first_step[code] = step
        elif step != self._first_step[code]:
            self._advanced[code] = True
        self._last_step[code] = step
        self._last_attempt[code] = self.attempt
        if step > self.reached:
            self.reached = step
        if self._first_time is None:
            self._first_time = wall_time
        self._last_time = wall_time
        self._latest[code] = value
        self._step.append(step)
        self._attempts.append(self.attempt)
        self._time.append(wall_time)
        self._code.append(code)
        self._value.append(value)
        self.points += 1
        if len(self._step) >= SEGMENT_POINTS:
            self._write_segment()

    def _rewind(self, code: int, step: int, wall_time: float) -> None:
        """The key went back: a new attempt from ``step`` on, as a restore to ``step - 1`` makes."""
        self.attempt += 1
        self.rewinds.append(
            {
                "to_step": max(step - 1, 0),
                "reached": self.reached,
                "attempt": self.attempt,
                "time": wall_time,
                "key": self._names[code],
            }
        )

    def media(self, key: str, step: int, wall_time: float, items: list[Prepared]) -> None:
        """Images, a table or a histogram of ``key`` at ``step``: stored now, indexed when the run is published."""
        fixed = _fix_key(key)
        if fixed is None:
            self.skip(f"media {key!r} (no valid metric name can be made of it)")
            return
        if step < 0:
            self.skip(f"media at negative steps ({key!r} and others)")
            return
        if step > self.reached:
            self.reached = step

        def put(data: bytes, extension: str) -> str:
            name = object_name(data, extension)
            try:
                self._create(media_object_key(self.run_id, name), data)
            except AlreadyExistsError:
                pass  # the same content, imported before in this run
            return name

        self.media_rows += store_items(put, fixed, step, self.attempt, wall_time, items)

    def skip(self, what: str) -> None:
        """Count something the import leaves out (an image, a text value), reported once at the end."""
        self.skipped[what] = self.skipped.get(what, 0) + 1

    # -- writing ---------------------------------------------------------------------
    def _table(self) -> pa.Table:
        import numpy as np
        import pyarrow as pa

        codes = np.frombuffer(self._code, dtype=np.int32) if len(self._code) else np.zeros(0, np.int32)
        return pa.table(
            {
                "step": pa.array(np.frombuffer(self._step, dtype=np.int64)),
                "attempt": pa.array(np.frombuffer(self._attempts, dtype=np.int32)),
                "time": pa.array(np.frombuffer(self._time, dtype=np.float64)),
                "key": pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(self._names, pa.string())),
                "value": pa.array(np.frombuffer(self._value, dtype=np.float64)),
            }
        )

    def _create(self, key: str, data: bytes) -> None:
        self.written.append(key)  # before: an ambiguous failure may still have stored it
        self.store.create(key, data)

    def _write_segment(self) -> None:
        if not len(self._step):
            return
        table = self._table()
        steps = self._step
        data = encode_segment(table)
        name = new_segment_name(0)
        self._create(f"{metrics_prefix(self.run_id)}/{name}", data)
        self._segments.append(SegmentRef(name, 0, len(steps), len(data), min(steps), max(steps)))
        self._new_buffers()

    def publish(self) -> None:
        """Write everything but the run's record, then the record: from then on the run is visible."""
        self._write_segment()
        if self._segments:
            manifest = Manifest(
                seq=1,
                covered={},
                segments=tuple(self._segments),
                max_step=max(s.last_step for s in self._segments),
                created=time.time(),
                by=f"launchhelm import {self.source.kind}",
            )
            self._create(f"{metrics_prefix(self.run_id)}/{manifest_name(1)}", manifest.encode())
        now = time.time()
        created = self.created if self.created is not None else (self._first_time or now)
        ended = self.ended if self.ended is not None else max(self._last_time or created, created)
        session = f"{int(created * 1000) & (16**12 - 1):012x}{self.run_id[:8]}"
        if self.media_rows:
            self._create(media_index_key(self.run_id, session, 0, 0), encode_index(self.media_rows))
        step = max(self.reached, 0)
        imported = {**self.imported, "source": self.source.kind, "id": self.source.key, "at": now}
        if self.skipped:
            imported["skipped"] = dict(self.skipped)
        if self.renamed:
            imported["renamed"] = dict(self.renamed)
        events: list[dict[str, object]] = [
            {
                "type": SESSION_STARTED,
                "time": created,
                "session": session,
                "process": {},
                "heartbeat_interval": DEFAULT_HEARTBEAT_INTERVAL,
                "heartbeat_timeout": DEFAULT_HEARTBEAT_TIMEOUT,
                "resumed": False,
                "step": 0,
                "imported": _json_safe(imported),
            }
        ]
        for rewind in self.rewinds:
            events.append(
                {
                    "type": REWIND,
                    "time": rewind["time"],
                    "session": session,
                    "to_step": rewind["to_step"],
                    "reached": rewind["reached"],
                    "checkpoint": None,
                    "cause": "import",
                    "attempt": rewind["attempt"],
                    "key": rewind["key"],
                }
            )
        events.append(
            {
                "type": SESSION_ENDED,
                "time": ended,
                "session": session,
                "close_run": True,
                "reason": f"imported from {self.source.kind}",
                "step": step,
            }
        )
        stored = []
        for seq, event in enumerate(events, start=1):
            event = {"seq": seq, **event}
            body = json.dumps(event, separators=(",", ":"), allow_nan=False).encode()
            self._create(event_key(self.run_id, seq), body)
            stored.append(json.loads(body))
        latest = {name: value for name, value in zip(self._names, self._latest, strict=True)}
        latest.update(self.summary)
        summary = json.loads(
            encode_summary(
                run_id=self.run_id,
                name=self.name,
                project=self.project,
                created=created,
                config=self.config,
                tunables={},
                state=fold(stored),
                session_id=session,
                step=step,
                interval=DEFAULT_HEARTBEAT_INTERVAL,
                metrics=latest,
            )
        )
        summary["time"] = ended  # the run's last sign of life is the source's, not this import's
        self.written.append(summary_key(self.run_id))
        self.store.put(summary_key(self.run_id), json.dumps(summary, separators=(",", ":")).encode())
        self.written.append(row_marker_key(self.project, self.run_id))
        mark_row(self.store, self.project, self.run_id, session, "ended")
        record = {
            "format": "launchhelm.run/1",
            "id": self.run_id,
            "project": self.project,
            "name": self.name,
            "config": self.config,
            "tunables": {},
            "created": created,
            "imported": _json_safe({k: v for k, v in imported.items() if k in ("source", "id", "uri", "at")}),
        }
        # the commit: once it exists the run is whole; a racing import of the same run loses here
        self.store.create(run_record_key(self.run_id), json.dumps(record).encode())
        _mark_project(self.store, self.project, self.run_id, created)

    def discard(self) -> None:
        """Delete what this import wrote (nothing of it is visible: ``run.json`` was never created)."""
        try:
            self.store.delete_many(list(dict.fromkeys(self.written)))
        except StorageError as exc:  # left for the next import of the same run, which deletes them first
            _log.debug("could not delete what a failed import of run %s wrote: %s", self.run_id, exc)


def _mark_project(store: Store, project: str, run_id: str, created: float) -> None:
    for key, body in (
        (project_record_key(project), {"project": project, "created": created}),
        (project_run_marker(project, run_id), {"created": created}),
    ):
        try:
            store.create(key, json.dumps(body).encode())
        except AlreadyExistsError:
            pass


def _clear_leftovers(store: Store, run_id: str) -> None:
    """What an import killed before its commit left under the run's prefix (invisible: no ``run.json``)."""
    leftovers = store.list(run_prefix(run_id))
    if leftovers:
        store.delete_many([f"{run_prefix(run_id)}/{k}" for k in leftovers])


def _progress(total: int, shown: bool, desc: str) -> _Bar:
    """The import's bar; drawn only where ``shown``, and only once the import has lasted the delay."""
    from tqdm.auto import tqdm

    bar: _Bar = tqdm(
        total=total,
        disable=not shown,
        unit="run",
        desc=desc,
        file=sys.stderr,
        dynamic_ncols=True,
        delay=progress_delay(),
    )
    return bar


def import_runs(
    kind: str,
    runs: Iterable[SourceRun],
    project: str,
    *,
    store: str | os.PathLike[str] | Store | None,
    storage_options: Mapping[str, object] | None,
    progress: bool,
    report: Callable[[str], None] | None = None,
    workers: int = WORKERS,
) -> ImportResult:
    """Import each source run not imported yet; raise :class:`ImportFailedError` at the end if any failed.

    ``report``: called with one line per run, in the source's order (the CLI prints them above the
    progress bar). ``workers`` runs are imported at once.
    """
    validate_project(project)
    st = open_store(store, storage_options)
    sources = list(runs)
    result = ImportResult(project)
    failures: dict[str, BaseException] = {}
    listed = set(st.list(project_runs_prefix(project)))
    # a bar on a terminal or in a notebook; in a log the lines below and the caller's summary say it all
    shown = progress and stderr_interactive()
    bar = _progress(len(sources), shown, f"import {kind}")
    drawn_after = time.monotonic() + progress_delay()

    def say(line: str) -> None:
        if report is None:
            return
        if shown and time.monotonic() >= drawn_after:
            with bar.external_write_mode():  # the bar is on screen: clear it, write the line, draw it below
                report(line)
        else:  # no bar on screen yet (drawing it around the line would skip the delay)
            report(line)

    def one(source: SourceRun) -> tuple[SourceRun, str, tuple[ImportedRun, bool] | BaseException]:
        run_id = derive_run_id(kind, project, source.key)
        try:
            return source, run_id, _import_one(st, project, run_id, source, listed)
        except Exception as exc:
            return source, run_id, exc

    # runs are independent: several at once, so one run's reads overlap another's writes (and fsyncs)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(sources) or 1))) as pool:
        try:
            for source, run_id, outcome in pool.map(one, sources) if workers > 1 else map(one, sources):
                bar.set_postfix_str(source.label[-48:], refresh=False)
                if isinstance(outcome, BaseException):
                    failures[source.label] = outcome
                    say(f"failed            {source.label}: {outcome}")
                else:
                    done, skipped = outcome
                    result._add(done, skipped)
                    if skipped:
                        say(f"already imported  {source.label} -> run {run_id}")
                    else:
                        left = ", ".join(f"{n:,} x {what}" for what, n in sorted(done.left_out.items()))
                        left = f"; not imported: {left}" if left else ""
                        say(f"imported          {source.label} -> run {run_id} ({done.points:,} points{left})")
                bar.update(1)
        finally:
            bar.close()
    if failures:
        lines = "; ".join(f"{label}: {exc}" for label, exc in failures.items())
        total = len(failures) + len(result.imported) + len(result.skipped)
        raise ImportFailedError(
            f"{len(failures)} of {total} {kind} runs could not be imported ({lines}). Nothing of a failed run "
            "was stored; the other runs were imported. Fix or remove the failed source and import again: "
            "runs already imported are skipped.",
            failures=failures,
            result=result,
        ) from next(iter(failures.values()))
    return result


def _import_one(
    store: Store, project: str, run_id: str, source: SourceRun, listed: set[str]
) -> tuple[ImportedRun, bool]:
    """Import one run; ``(run, True)`` if it was imported before (nothing written then)."""
    if run_id in listed or store.exists(run_record_key(run_id)):
        record = json.loads(store.read(run_record_key(run_id)))
        if run_id not in listed:  # an import killed after its commit: its project markers now
            _mark_project(store, project, run_id, float(record.get("created") or time.time()))
        return ImportedRun(source.key, str(record.get("name", "")), run_id), True
    _clear_leftovers(store, run_id)
    recorder = Recorder(store, project, run_id, source)
    try:
        source.read(recorder)
        recorder.publish()
    except AlreadyExistsError:
        if store.exists(run_record_key(run_id)):  # a racing import of the same run committed first
            return ImportedRun(source.key, recorder.name, run_id), True
        recorder.discard()
        raise
    except BaseException:
        recorder.discard()
        raise
    return ImportedRun(source.key, recorder.name, run_id, recorder.points, dict(recorder.skipped)), False
