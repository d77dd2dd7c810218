"""A project's settled runs' metrics in a few Parquet segments: project-wide reads in bounded requests.

Reading a project run by run costs about seven requests a run (record, event
log, metrics listing, manifest, segments, tail). A run whose last session
ended (or that is closed) stops changing, though: only a new session (which
first changes the run's row marker, ``projects/<p>/table/<run>.json``) or an
evaluation worker logging scores (which then creates ``logged.json`` under
``projects/<p>/evaluations/``) adds points to it. So a reader that read such
runs one by one keeps their points, merged, as a **generation** of the
project dataset under ``projects/<p>/history/``:

- segments ``segments/<gen>-<token>.parquet`` (unique keys), the columns of a
  run's segments plus ``run`` and ``abandoned``, each run's rows together and
  in the order :class:`~launchhelm._metrics._read.PointReader` returned them;
- then ``manifest-<gen:020d>.json``, created with ``create``: its segments, and
  per run where its rows are plus what they were read under (the row
  marker's version, the evaluation attempts logged), its rewinds and name.

Two builders racing both try to create the same generation: one wins, the
other deletes its segments. A reader lists the runs, the row markers, the
evaluations and the dataset (four listings, concurrently), reads the newest
generation and the segments of the runs it still vouches for: run still
listed, marker version unchanged, no evaluation logged since. Anything else
(no dataset, a manifest or segment missing, damaged or of an unknown format,
a run changed since) is read from the run itself, so a doubt costs requests,
never a wrong point. See ``docs/storage.md``.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from launchhelm._exceptions import AlreadyExistsError, LaunchHelmError, StorageError
from launchhelm._metrics._compact import compaction_grace
from launchhelm._metrics._segments import points_schema
from launchhelm.storage import Store
from launchhelm.storage._keys import (
    EVAL_CHUNK_PREFIX,
    evaluations_prefix,
    new_project_segment_name,
    parse_evaluation_tail,
    parse_manifest_name,
    parse_row_marker_name,
    parse_segment_name,
    project_history_manifest_key,
    project_history_prefix,
    project_runs_prefix,
    score_chunk_dir,
    table_prefix,
)

if TYPE_CHECKING:
    from typing import TypeAlias

    import numpy as np
    import numpy.typing as npt
    import pandas as pd
    import pyarrow as pa

    #: One run's rows as a segment holds them: its id, its points (the five columns), and which are abandoned.
    _Part: TypeAlias = tuple[str, pa.Table, npt.NDArray[np.bool_]]

__all__ = [
    "BUILD_AFTER",
    "Generation",
    "ProjectListing",
    "ProjectReader",
    "SettledRun",
    "list_project",
    "project_frame",
    "publish",
]

_log = logging.getLogger("launchhelm")

FORMAT = "launchhelm.project-history/1"
SEGMENT_FORMAT = b"launchhelm.project-segment/1"
#: Settled runs read one by one that make a reader publish a new generation.
BUILD_AFTER = 8
#: Segments a generation names before a build merges the small ones.
MAX_SEGMENTS = 8
#: Rows a segment holds at most (whole runs: a run bigger than this has a segment of its own).
SEGMENT_ROWS = 4_000_000
#: Statuses whose run only changes through a new session (its marker changes first).
SETTLED = ("resumable", "closed")


class DamagedGenerationError(LaunchHelmError, ValueError):
    """A project dataset manifest that does not parse, or of a format this version does not read."""


class SettledRewind(TypedDict):
    """A rewind as a generation records it: :class:`launchhelm.Rewind`'s fields."""

    to_step: int
    reached: int
    cause: str
    checkpoint: str | None
    attempt: int


class SettledRunRecord(TypedDict):
    """A :class:`SettledRun` as a generation's manifest stores it (under ``runs``, keyed by run id)."""

    segment: str
    offset: int
    rows: int
    marker: str
    evals: list[str]
    name: str
    created: float
    status: str
    sessions: int
    rewinds: list[SettledRewind]


@dataclass(frozen=True)
class SettledRun:
    """What a generation records of one run: where its rows are, and what they were read under."""

    run_id: str
    segment: str  # relative key, ``segments/...``
    offset: int
    rows: int
    marker: str  # the row marker's version when the run was read
    evals: tuple[str, ...]  # evaluation attempts (their chunk folders) logged or read then
    name: str
    created: float
    status: str
    sessions: int
    rewinds: tuple[SettledRewind, ...]

    def to_json(self) -> SettledRunRecord:
        return {
            "segment": self.segment,
            "offset": self.offset,
            "rows": self.rows,
            "marker": self.marker,
            "evals": list(self.evals),
            "name": self.name,
            "created": self.created,
            "status": self.status,
            "sessions": self.sessions,
            "rewinds": [r.copy() for r in self.rewinds],
        }

    @classmethod
    def from_json(cls, run_id: str, raw: SettledRunRecord) -> SettledRun:
        return cls(
            run_id=run_id,
            segment=str(raw["segment"]),
            offset=int(raw["offset"]),
            rows=int(raw["rows"]),
            marker=str(raw["marker"]),
            evals=tuple(str(e) for e in raw["evals"]),
            name=str(raw["name"]),
            created=float(raw["created"]),
            status=str(raw["status"]),
            sessions=int(raw["sessions"]),
            rewinds=tuple(
                SettledRewind(
                    to_step=int(r["to_step"]),
                    reached=int(r["reached"]),
                    cause=str(r["cause"]),
                    checkpoint=r.get("checkpoint"),
                    attempt=int(r["attempt"]),
                )
                for r in raw["rewinds"]
            ),
        )


@dataclass(frozen=True)
class Generation:
    """One published generation of a project's dataset."""

    number: int
    segments: tuple[str, ...]  # relative keys, in the order they were written
    runs: dict[str, SettledRun]
    created: float = 0.0
    by: str = ""

    def encode(self) -> bytes:
        body = {
            "format": FORMAT,
            "generation": self.number,
            "created": self.created,
            "by": self.by,
            "segments": list(self.segments),
            "runs": {r: e.to_json() for r, e in sorted(self.runs.items())},
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, number: int) -> Generation:
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise DamagedGenerationError(f"generation {number} is not JSON ({exc})") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("generation") != number:
            raise DamagedGenerationError(f"not a {FORMAT} manifest of generation {number}")
        try:
            segments = tuple(str(s) for s in raw["segments"])
            runs = {str(r): SettledRun.from_json(str(r), e) for r, e in dict(raw["runs"]).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DamagedGenerationError(f"generation {number}: {type(exc).__name__}: {exc}") from None
        if any(e.segment not in segments for e in runs.values()):
            raise DamagedGenerationError(f"generation {number} names a segment it does not list")
        return cls(number, segments, runs, float(raw.get("created", 0.0)), str(raw.get("by", "")))


@dataclass
class ProjectListing:
    """What the four listings of a project read found."""

    run_ids: list[str]
    markers: dict[str, str | None]  # run -> row marker version
    logged: dict[str, set[str]]  # run -> evaluation attempts whose scores are logged
    generations: dict[int, float | None]  # generation -> modified
    segments: dict[str, float | None] = field(default_factory=dict)  # relative key -> modified

    @property
    def newest(self) -> int:
        return max(self.generations, default=0)


def list_project(store: Store, project: str) -> ProjectListing:
    """The project's runs, row markers, logged evaluations and dataset: four listings, concurrently.

    Each is one request per 1,000 objects; the evaluations' grows with the
    evaluations kept, not with the runs.
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        listed_runs = pool.submit(store.list, project_runs_prefix(project))
        listed_table = pool.submit(store.list_info, table_prefix(project))
        listed_evaluations = pool.submit(store.list, evaluations_prefix(project))
        listed_history = pool.submit(store.list_info, project_history_prefix(project))
        runs, table = listed_runs.result(), listed_table.result()
        evaluations, history = listed_evaluations.result(), listed_history.result()
    markers: dict[str, str | None] = {}
    for info in table:
        run_id = parse_row_marker_name(info.key)
        if run_id is not None:
            markers[run_id] = info.version
    logged: dict[str, set[str]] = {}
    for name in evaluations:
        parts = name.split("/", 2)
        if len(parts) != 3:
            continue
        found = parse_evaluation_tail(parts[2])
        if found is not None and found.group("logged"):
            logged.setdefault(parts[0], set()).add(score_chunk_dir(parts[1], int(found.group("attempt"))))
    generations: dict[int, float | None] = {}
    segments: dict[str, float | None] = {}
    for info in history:
        if (number := parse_manifest_name(info.key)) is not None:
            generations[number] = info.modified
        elif parse_segment_name(info.key):
            segments[info.key] = info.modified
    return ProjectListing(sorted(r for r in runs if "/" not in r), markers, logged, generations, segments)


def _decode_segment(blob: bytes) -> pa.Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # single-threaded: see launchhelm._metrics._segments.decode_segment
    return pq.ParquetFile(pa.BufferReader(blob)).read(use_threads=False)


class ProjectReader:
    """Reads the runs a project's newest generation still vouches for; keeps what it read for the next call.

    Segments are immutable, so a reader kept by a chart pays the four
    listings per call, plus the manifest and segments of a new generation.
    """

    def __init__(self, store: Store, project: str) -> None:
        self.store = store
        self.project = project
        self.prefix = project_history_prefix(project)
        self.generation: Generation | None = None
        self._tables: dict[str, pa.Table] = {}  # decoded segments of :attr:`generation`

    def _generation(self, listing: ProjectListing) -> Generation | None:
        newest = listing.newest
        if not newest:
            self.generation, self._tables = None, {}
            return None
        if self.generation is not None and self.generation.number == newest:
            return self.generation
        self._tables = {}
        key = project_history_manifest_key(self.project, newest)
        try:
            blob = self.store.read_many([key]).get(key)
            if blob is None:
                raise DamagedGenerationError(f"generation {newest} vanished")
            self.generation = Generation.decode(blob, newest)
        except (DamagedGenerationError, StorageError) as exc:
            # the runs are read one by one instead, and the next build publishes a sound generation
            _log.debug("project %s: not reading its dataset (%s)", self.project, exc)
            self.generation = None
        return self.generation

    def vouched(self, listing: ProjectListing, recovered: Iterable[str] = ()) -> dict[str, SettledRun]:
        """The entries of the newest generation still exact now (see the module's docstring)."""
        generation = self._generation(listing)
        if generation is None:
            return {}
        listed = set(listing.run_ids)
        skip = set(recovered)
        return {
            run_id: entry
            for run_id, entry in generation.runs.items()
            if run_id in listed
            and run_id not in skip
            and listing.markers.get(run_id) == entry.marker
            and listing.logged.get(run_id, set()) <= set(entry.evals)
        }

    def read(
        self, listing: ProjectListing, wanted: Iterable[str], recovered: Iterable[str] = ()
    ) -> dict[str, tuple[SettledRun, pa.Table]]:
        """Points (the five columns, arrival order) of the ``wanted`` runs the dataset still vouches for.

        One concurrent read of the segments not read yet; a run whose segment
        is missing or damaged is left out (its caller reads it itself).
        """
        import pyarrow.compute as pc

        entries = self.vouched(listing, recovered)
        chosen = {r: entries[r] for r in dict.fromkeys(wanted) if r in entries}
        need = sorted({e.segment for e in chosen.values() if e.segment not in self._tables})
        if need:
            blobs = self.store.read_many([f"{self.prefix}/{k}" for k in need])
            for key in need:
                blob = blobs.get(f"{self.prefix}/{key}")
                if blob is None:
                    continue
                try:
                    self._tables[key] = _decode_segment(blob)
                except Exception as exc:  # a damaged segment: its runs are read one by one
                    _log.debug("project %s: segment %s is damaged (%s)", self.project, key, exc)
        names = [f.name for f in points_schema()]
        out: dict[str, tuple[SettledRun, pa.Table]] = {}
        for run_id, entry in chosen.items():
            table = self._tables.get(entry.segment)
            if table is None or entry.offset + entry.rows > table.num_rows or "run" not in table.column_names:
                continue
            rows = table.slice(entry.offset, entry.rows)
            if entry.rows and not pc.all(pc.equal(rows.column("run"), run_id)).as_py():
                continue  # a manifest that does not match its segment: read the run itself
            out[run_id] = (entry, rows.select(names))
        return out

    def tables(self) -> dict[str, pa.Table]:
        """The decoded segments of the current generation (what a build carries over)."""
        return dict(self._tables)


# -- building -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadRun:
    """A settled run as just read one by one: what a new generation records of it."""

    entry: SettledRun  # segment, offset and rows are filled in by :func:`publish`
    points: pa.Table  # the five columns, in arrival order
    abandoned: npt.NDArray[np.bool_]  # one per point


def _segment_bytes(parts: list[_Part]) -> bytes:
    """Runs' rows, each run's together: the five columns plus ``run`` and ``abandoned``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from launchhelm._metrics._segments import plain_points

    tables = []
    for run_id, points, abandoned in parts:
        plain = plain_points(points)
        tables.append(
            plain.add_column(0, "run", pa.array([run_id] * plain.num_rows, pa.string())).append_column(
                "abandoned", pa.array(abandoned, pa.bool_())
            )
        )
    table = pa.concat_tables(tables).replace_schema_metadata({b"format": SEGMENT_FORMAT})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", use_dictionary=["run", "key"], row_group_size=1 << 20)
    return sink.getvalue()


def _groups(parts: list[_Part]) -> list[list[_Part]]:
    """Runs in segments of at most :data:`SEGMENT_ROWS` rows (a bigger run alone)."""
    groups: list[list[_Part]] = []
    rows = 0
    for part in parts:
        if not groups or (rows + part[1].num_rows > SEGMENT_ROWS and groups[-1]):
            groups.append([])
            rows = 0
        groups[-1].append(part)
        rows += part[1].num_rows
    return groups


def publish(
    store: Store,
    project: str,
    reader: ProjectReader,
    listing: ProjectListing,
    added: Mapping[str, ReadRun],
    by: str,
) -> Generation | None:
    """Publish the next generation: the runs still vouched for plus ``added``. Best effort.

    Segments whose runs are all still vouched for are kept as they are; the
    vouched runs of the others (a run resumed since, or deleted), and of the
    small segments when there are more than :data:`MAX_SEGMENTS`, are
    written again beside the new runs, so every named segment holds only
    named rows. Returns None when another builder won the race, or the store
    refused the writes (a read-only credential).
    """
    import numpy as np

    base = reader.generation
    prefix = project_history_prefix(project)
    kept_entries = {r: e for r, e in reader.vouched(listing).items() if r not in added}
    segments = list(base.segments) if base is not None else []
    by_segment: dict[str, list[SettledRun]] = {}
    for entry in base.runs.values() if base is not None else ():
        by_segment.setdefault(entry.segment, []).append(entry)
    whole = [s for s in segments if s in by_segment and all(e.run_id in kept_entries for e in by_segment[s])]
    # a binary counter: the newest segments merge with what comes in once they hold no more runs than it,
    # so runs added one at a time (each by its helper) leave about log2(runs) segments, not one a run
    incoming = len(added) + sum(1 for e in kept_entries.values() if e.segment not in whole)
    while whole and _small(by_segment[whole[-1]]) and len(by_segment[whole[-1]]) <= incoming:
        incoming += len(by_segment[whole.pop()])
    if len(whole) + 1 > MAX_SEGMENTS:
        whole = [s for s in whole if not _small(by_segment[s])]
    moved = [e for e in kept_entries.values() if e.segment not in whole]
    try:
        if moved:
            reader.read(listing, [e.run_id for e in moved])  # fetch their segments if not read yet
        tables = reader.tables()
        parts: list[_Part] = []
        entries: dict[str, SettledRun] = {r: e for r, e in kept_entries.items() if e.segment in whole}
        meta: dict[str, SettledRun] = {}
        for entry in moved:
            table = tables.get(entry.segment)
            if table is None:
                continue  # its segment could not be read: the run is read one by one until rebuilt
            rows = table.slice(entry.offset, entry.rows)
            abandoned = rows.column("abandoned").to_numpy(zero_copy_only=False)
            parts.append((entry.run_id, rows.select([f.name for f in points_schema()]), abandoned))
            meta[entry.run_id] = entry
        for run_id, read in sorted(added.items()):
            parts.append((run_id, read.points, np.asarray(read.abandoned, dtype=bool)))
            meta[run_id] = read.entry
        if not parts:
            return None
        number = listing.newest + 1
        written: list[str] = []
        try:
            for group in _groups(parts):
                key = new_project_segment_name(number)
                store.create(f"{prefix}/{key}", _segment_bytes(group))
                written.append(key)
                offset = 0
                for run_id, points, _ in group:
                    entries[run_id] = _placed(meta[run_id], key, offset, points.num_rows)
                    offset += points.num_rows
            named = [s for s in segments if s in whole] + written
            generation = Generation(number, tuple(named), entries, time.time(), by)
            store.create(project_history_manifest_key(project, number), generation.encode())
        except BaseException:
            _discard(store, prefix, written)
            raise
    except AlreadyExistsError:
        _log.debug("project %s: another reader published generation %d first", project, listing.newest + 1)
        return None
    except (StorageError, LaunchHelmError, PermissionError) as exc:
        _log.debug("project %s: could not publish its dataset: %s", project, exc)
        return None
    reader.generation, reader._tables = generation, {k: v for k, v in reader.tables().items() if k in named}
    collect(store, project, listing, generation)
    return generation


def _small(entries: list[SettledRun]) -> bool:
    return sum(e.rows for e in entries) < SEGMENT_ROWS // 2


def _placed(entry: SettledRun, segment: str, offset: int, rows: int) -> SettledRun:
    from dataclasses import replace

    return replace(entry, segment=segment, offset=offset, rows=rows)


def _discard(store: Store, prefix: str, keys: list[str]) -> None:
    try:
        store.delete_many([f"{prefix}/{k}" for k in keys])
    except StorageError as exc:  # left for the next collection
        _log.debug("could not delete unpublished project segments: %s", exc)


def collect(
    store: Store,
    project: str,
    listing: ProjectListing,
    newest: Generation,
    grace: float | None = None,
    now: float | None = None,
) -> int:
    """Delete generations and segments no reader can need any more; return how many objects.

    With ``G`` the newest generation older than the grace period (a reader
    may still be fetching its segments): generations before ``G``, and
    segments older than the grace period that neither ``G``, any newer
    generation nor ``newest`` names. Best effort.
    """
    grace = compaction_grace() if grace is None else grace
    now = time.time() if now is None else now

    def old(modified: float | None) -> bool:
        return modified is not None and modified <= now - grace

    aged = [n for n, modified in listing.generations.items() if old(modified)]
    if not aged:
        return 0
    g = max(aged)
    prefix = project_history_prefix(project)
    recent = sorted(n for n in listing.generations if n >= g)
    keys = [project_history_manifest_key(project, n) for n in recent]
    try:
        blobs = store.read_many(keys)
        named = set(newest.segments)
        for n, key in zip(recent, keys, strict=True):
            blob = blobs.get(key)
            if blob is None:
                return 0  # another collector is at work
            try:
                named.update(Generation.decode(blob, n).segments)
            except DamagedGenerationError:
                continue  # names nothing a reader uses
        doomed = [project_history_manifest_key(project, n) for n in listing.generations if n < g]
        doomed += [f"{prefix}/{k}" for k, modified in listing.segments.items() if k not in named and old(modified)]
        if doomed:
            store.delete_many(doomed)
    except StorageError as exc:
        _log.debug("project %s: could not collect its old dataset generations: %s", project, exc)
        return 0
    return len(doomed)


def eval_dirs(dirs: Iterable[str]) -> set[str]:
    """The evaluation attempts among the chunk folders a run's read covered."""
    return {d for d in dirs if d.startswith(EVAL_CHUNK_PREFIX)}


# -- many runs' frames at once ---------------------------------------------------------------------
_META = ("run", "step", "attempt", "time", "abandoned")


def project_frame(
    parts: Sequence[tuple[str, pa.Table, Sequence[tuple[int, int]]]],
    keys: Sequence[str] | str | None = None,
    duplicates: str = "all",
) -> pd.DataFrame | None:
    """Many runs' history frames as one, the ``run`` column first: ``Api.history``'s answer.

    ``parts``: per run, in the order wanted, its id, its points (arrival
    order) and its rewinds as ``(attempt, to_step)``. The same frame as
    :func:`~launchhelm._metrics._points.history_frame` of each run, an
    ``abandoned`` column inserted and a ``run`` column in front, then
    ``pandas.concat``-ed, but pivoted in one pass: building a thousand small
    frames costs seconds, this a few milliseconds per hundred thousand
    points. Columns: ``run``, ``step``, ``attempt``, ``time``, ``abandoned``,
    then each metric in the order ``concat`` would give (each run's in the
    order it first logged them, a run's new ones after those of the runs
    before it).

    Returns None when a run has no points to show (an empty frame, whose
    ``concat`` has its own rules): build that answer run by run.
    """
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(keys, str):
        keys = [keys]
    tables, run_of = [], []
    for i, (_, table, _) in enumerate(parts):
        if keys is not None:
            table = table.filter(pc.is_in(table.column("key"), value_set=pa.array(list(keys), pa.string())))
        if not table.num_rows:
            return None
        tables.append(table.select(["step", "attempt", "time", "key", "value"]))
        run_of.append(np.full(table.num_rows, i, dtype=np.int64))
    if not tables:
        return None
    table = pa.concat_tables(tables)
    run = np.concatenate(run_of)
    encoded = table.column("key").combine_chunks().cast(pa.string()).dictionary_encode()
    names: list[str] = encoded.dictionary.to_pylist()
    code = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    step = table.column("step").to_numpy().astype(np.int64)
    attempt = table.column("attempt").to_numpy().astype(np.int64)
    t = table.column("time").to_numpy().astype(np.float64)
    value = table.column("value").to_numpy().astype(np.float64)
    n = len(step)
    arrival = np.arange(n, dtype=np.int64)

    # columns: each run's keys in first-logged order (or the order asked), new ones appended run by run
    nkeys = max(len(names), 1)
    pair, first = np.unique(run * nkeys + code, return_index=True)
    order = np.lexsort((first, pair // nkeys))
    if any(name in _META for name in names):
        return None  # a metric named like a column: concat's duplicate columns, run by run
    columns: dict[int, None] = {}
    if keys is None:
        for p in pair[order]:
            columns.setdefault(int(p % nkeys), None)
    else:
        index = {name: i for i, name in enumerate(names)}
        asked = [index[k] for k in keys if k in index]
        by_run: dict[int, set[int]] = {}
        for p in pair:
            by_run.setdefault(int(p // nkeys), set()).add(int(p % nkeys))
        for r in sorted(by_run):
            for c in asked:
                if c in by_run[r]:
                    columns.setdefault(c, None)

    # rows: (run, step, attempt) or (run, step), sorted
    ks: tuple[npt.NDArray[np.int64], ...]
    if duplicates == "all":
        by = np.lexsort((attempt, step, run))
        ks = (run[by], step[by], attempt[by])
    else:
        by = np.lexsort((step, run))
        ks = (run[by], step[by])
    new_row = np.ones(n, dtype=bool)
    if n:
        new_row[1:] = np.any([k[1:] != k[:-1] for k in ks], axis=0)
    starts = np.flatnonzero(new_row)
    row_sorted = np.cumsum(new_row) - 1
    row_of = np.empty(n, dtype=np.int64)
    row_of[by] = row_sorted
    row_run = run[by][starts]
    row_step = step[by][starts]
    row_attempt = (
        attempt[by][starts] if duplicates == "all" else np.maximum.reduceat(attempt[by], starts) if n else attempt[:0]
    )
    times = np.maximum.reduceat(t[by], starts) if n else t[:0]
    nrows = len(starts)

    # cells: the newest attempt's value, the latest logged within it
    cell = row_of * nkeys + code
    pick = np.lexsort((arrival, attempt, cell))
    last = np.ones(n, dtype=bool)
    if n:
        last[:-1] = cell[pick][1:] != cell[pick][:-1]
    chosen = pick[last]
    grid = np.full((nrows, nkeys), np.nan)
    grid[row_of[chosen], code[chosen]] = value[chosen]

    abandoned = np.zeros(nrows, dtype=bool)
    bounds = np.searchsorted(row_run, np.arange(len(parts) + 1))
    for i, (_, _, rewinds) in enumerate(parts):
        if rewinds:
            lo, hi = bounds[i], bounds[i + 1]
            for rewind_attempt, to_step in rewinds:
                abandoned[lo:hi] |= (row_attempt[lo:hi] < rewind_attempt) & (row_step[lo:hi] > to_step)

    ids = np.array([run_id for run_id, _, _ in parts], dtype=object)
    data: dict[str, object] = {
        "run": ids[row_run],
        "step": row_step.astype(np.int64),
        "attempt": row_attempt.astype(np.int64),
        "time": pd.to_datetime(times, unit="s", utc=True),
        "abandoned": abandoned,
    }
    for c in columns:
        data[names[c]] = grid[:, c]
    frame: pd.DataFrame = pd.DataFrame(data)
    return frame
