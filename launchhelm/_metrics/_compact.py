"""Compaction: a run's sealed chunks merged into Parquet segments, published by a manifest.

Every step writes a new object with ``create``, so a compactor killed at any
moment leaves either nothing visible (segments no manifest names, collected
later as garbage) or a whole new manifest. Two compactors racing both try to
create manifest ``N+1``: one wins, the other deletes its own unnamed segments
and starts again from the winner's. Readers read the newest manifest, its
segments and the chunks it does not cover, so every point is read exactly
once at every instant. See ``docs/storage.md``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launchhelm._exceptions import AlreadyExistsError, InvalidArgumentError, ObjectNotFoundError, StorageError
from launchhelm._metrics._heap import TRIM_AFTER_GROWTH, give_back_free_heap
from launchhelm._metrics._layout import (
    EMPTY,
    ChunkRef,
    Listing,
    Manifest,
    SegmentRef,
    list_metrics,
    metrics_prefix,
    parse_chunk,
    read_manifest,
)
from launchhelm._metrics._pause import pause
from launchhelm._metrics._segments import SEGMENT_FORMAT, decode_chunk, plain_points, points_schema
from launchhelm.storage import LocalStore, Store
from launchhelm.storage._keys import manifest_name, new_segment_name

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["CompactionResult", "Compactor", "compaction_grace", "compaction_memory"]

_log = logging.getLogger("launchhelm")

#: Uncovered chunks that make the live session compact (about a minute of flushes).
CHUNKS_PER_SEGMENT = 32
#: ... or this many bytes of them, whichever comes first.
BYTES_PER_SEGMENT = 8 * 2**20
#: Segments of one level merged into one of the next: at most FANOUT - 1 per level remain.
FANOUT = 8
#: Segments are not merged past this size (bigger ones would only make reads of a window slower).
MAX_SEGMENT_BYTES = 256 * 2**20
#: Seconds a covered chunk or dropped segment stays readable (``LAUNCHHELM_COMPACTION_GRACE``).
DEFAULT_GRACE = 600.0
#: Bytes a compaction may hold at once (``LAUNCHHELM_COMPACTION_MEMORY``, ``init(compaction_memory=)``).
DEFAULT_COMPACTION_MEMORY = 64 * 2**20
#: The smallest working set accepted: below it a batch would be a handful of rows.
MIN_COMPACTION_MEMORY = 4 * 2**20
#: Bytes a decoded point takes in Arrow (step, attempt, time, key offset and text, value) with headroom
#: for the Parquet reader's and writer's own buffers: a batch of ``memory // BYTES_PER_ROW_HELD`` rows.
#: Half the setting's worth: the allocators keep some of what a batch freed (bench_soak's flood).
BYTES_PER_ROW_HELD = 512
#: Segments at most this size are sent with one ``create`` of their bytes; bigger ones stream from disk.
INLINE_UPLOAD_BYTES = 8 * 2**20
#: Parts of a segment's upload sent at once: memory holds one more, 8 MiB each.
UPLOAD_PARTS_IN_FLIGHT = 2


def compaction_grace() -> float:
    raw = os.environ.get("LAUNCHHELM_COMPACTION_GRACE")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_GRACE
    except ValueError:
        return DEFAULT_GRACE


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20}
_UNITS.update({"g": 2**30, "gb": 2**30, "gib": 2**30})


def compaction_memory(given: int | str | None = None) -> int:
    """The compaction working set in bytes: ``given``, else ``LAUNCHHELM_COMPACTION_MEMORY``, else 64 MiB.

    Accepts an int of bytes or a string such as ``"64MiB"`` or ``"256m"``.

    Raises
    ------
    InvalidArgumentError
        Not a size, or under 4 MiB (also a ``ValueError``).
    """
    source = "compaction_memory"
    if given is None:
        raw = os.environ.get("LAUNCHHELM_COMPACTION_MEMORY")
        if not raw:
            return DEFAULT_COMPACTION_MEMORY
        given, source = raw, "LAUNCHHELM_COMPACTION_MEMORY"
    value: int | None = None
    if isinstance(given, int) and not isinstance(given, bool):
        value = given
    elif isinstance(given, str):
        text = given.strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = _UNITS.get(text[len(digits) :])
        try:
            value = int(float(digits) * unit) if unit is not None and digits else None
        except ValueError:
            value = None
    if value is None or value < MIN_COMPACTION_MEMORY:
        raise InvalidArgumentError(
            f"{source}={given!r}: give a size of at least 4 MiB, as bytes (67108864) or a string such as '64MiB'"
        )
    return value


@dataclass(frozen=True)
class CompactionResult:
    """What one :meth:`Compactor.compact` did."""

    manifest: Manifest
    chunks: int  # chunks newly covered
    merged: int  # merges into a higher level
    deleted: int  # garbage objects deleted


class Compactor:
    """Compacts one run; keeps the newest manifest in memory and its segments on local disk between calls.

    Memory does not grow with the run: points stream through in batches of
    a bounded number of rows (from chunks, or from segments on local disk),
    straight into a Parquet file on local disk, which is then uploaded. The
    segments this compactor wrote stay on local disk while a manifest names
    them, so a merge reads them without a ``GET``.

    Parameters
    ----------
    store, run_id:
        The run.
    by:
        Who compacts (a session id, ``"compact"``, ``"gc"``), recorded in the manifest.
    memory:
        Bytes the compaction may hold at once (see :func:`compaction_memory`).
    """

    def __init__(self, store: Store, run_id: str, by: str, memory: int | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.by = by
        self.prefix = metrics_prefix(run_id)
        self.memory = compaction_memory(memory)
        #: rows decoded at once: a batch read, written as one Parquet row group
        self.batch_rows = max(4096, self.memory // BYTES_PER_ROW_HELD)
        self._manifest: Manifest = EMPTY
        self._local: dict[str, Path] = {}  # segments on local disk (written or fetched here), by relative key
        self._workdir: Path | None = None
        #: chunk bytes the caller already has (the live session's own chunks): no GET needed
        self.known: dict[str, bytes] = {}
        # The live session's view (see compact_live): every manifest from _base on is ours, in order.
        self._live = False
        self._published: list[tuple[float, Manifest, list[str]]] = []  # (time, manifest, chunk keys covered)
        self._base: Manifest = EMPTY  # the manifest the live view started from

    # -- deciding --------------------------------------------------------------------
    def due(self, listing: Listing | None = None) -> bool:
        """Whether enough uncovered chunks wait (against the manifest last seen)."""
        listing = listing or list_metrics(self.store, self.run_id)
        tail = listing.uncovered(self._current(listing))
        return len(tail) >= CHUNKS_PER_SEGMENT or sum(c.size for c in tail) >= BYTES_PER_SEGMENT

    def _current(self, listing: Listing) -> Manifest:
        newest = listing.newest_manifest
        if newest != self._manifest.seq:
            self._manifest = read_manifest(self.store, self.run_id, newest)
            self._keep_local(self._manifest)
        return self._manifest

    # -- compacting -----------------------------------------------------------------
    def compact(
        self,
        *,
        only_if_due: bool = False,
        collect: bool = True,
        attempts: int = 5,
        max_chunks: int | None = None,
    ) -> CompactionResult | None:
        """Cover every chunk listed now with segments and publish a manifest; then collect garbage.

        Returns None when there was nothing to do (or, with ``only_if_due``,
        not enough). A lost race is retried from the winner's manifest up to
        ``attempts`` times. ``max_chunks`` covers only the oldest chunks (a
        prefix in arrival order, so the watermarks stay exact), bounding the
        memory one compaction of a huge old run takes.
        """
        for _ in range(attempts):
            listing = list_metrics(self.store, self.run_id)
            manifest = self._current(listing)
            tail = listing.uncovered(manifest)
            if max_chunks is not None:
                tail = tail[:max_chunks]
            due = len(tail) >= CHUNKS_PER_SEGMENT or sum(c.size for c in tail) >= BYTES_PER_SEGMENT
            if not tail or (only_if_due and not due):
                deleted = self.collect(listing) if collect else 0
                return None if not deleted else CompactionResult(manifest, 0, 0, deleted)
            try:
                published, merged = self._publish(manifest, tail)
            except AlreadyExistsError:
                continue  # another compactor published N+1: start from its manifest
            self._manifest = published
            self._keep_local(published)
            for chunk in tail:
                self.known.pop(chunk.key, None)
            deleted = self.collect(list_metrics(self.store, self.run_id)) if collect else 0
            return CompactionResult(published, len(tail), merged, deleted)
        return None

    def compact_live(self, *, only_if_due: bool = True) -> CompactionResult | None:
        """The live session's compaction: cover its own chunks (:attr:`known`) without listing.

        The first call lists and compacts as :meth:`compact` does; from then on,
        while every newer manifest is this compactor's own, the session knows
        its chunks and manifests, so one compaction costs a ``PUT`` of the
        segment and the ``create`` of the manifest, plus one batched delete of
        what aged past the grace period. Another compactor's manifest (a
        ``launchhelm compact`` run meanwhile) makes the ``create`` fail: the
        next call lists again. Evaluation scores written by other processes
        are covered by the listing path (the session's last compaction).
        """
        if not self._live:
            before = set(self.known)
            result = self.compact(only_if_due=only_if_due)
            self._live = True
            self._base, self._published = self._manifest, []
            if result is not None and result.chunks:
                # what came before it is collected by a later listing (the session's last compaction)
                self._base = EMPTY
                self._published = [(time.time(), self._manifest, sorted(before - set(self.known)))]
            return result
        prefix = self.prefix + "/"
        tail = sorted(
            chunk
            for key, blob in self.known.items()
            if key.startswith(prefix)
            and (chunk := parse_chunk(self.prefix, key[len(prefix) :], len(blob))) is not None
            and not self._manifest.covers(chunk)
        )
        due = len(tail) >= CHUNKS_PER_SEGMENT or sum(c.size for c in tail) >= BYTES_PER_SEGMENT
        if not tail or (only_if_due and not due):
            return None
        try:
            published, merged = self._publish(self._manifest, tail)
        except BaseException:
            self.forget()  # someone else published, or the store failed: list next time
            raise
        self._manifest = published
        self._keep_local(published)
        self._published.append((time.time(), published, [c.key for c in tail]))
        for chunk in tail:
            self.known.pop(chunk.key, None)
        return CompactionResult(published, len(tail), merged, self._collect_live())

    def _keep_local(self, manifest: Manifest) -> None:
        # only what the next merge can read: local disk holds the named segments, memory none
        named = {s.key for s in manifest.segments}
        for key in [k for k in self._local if k not in named]:
            self._local.pop(key).unlink(missing_ok=True)

    def close(self) -> None:
        """Delete the local copies of segments (the store keeps them)."""
        self._local.clear()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _work_path(self, key: str) -> Path:
        if self._workdir is None or not self._workdir.is_dir():
            self._workdir = Path(tempfile.mkdtemp(prefix=f"launchhelm-compact-{self.run_id}-"))
            # a compactor dropped without close() still takes its files back
            weakref.finalize(self, shutil.rmtree, str(self._workdir), True)
        return self._workdir / key.replace("/", "-")

    def forget(self) -> None:
        """Drop the live view (and the chunk bytes held): the next compaction lists."""
        self._live = False
        self._published = []
        self.known.clear()

    def _collect_live(self, grace: float | None = None, now: float | None = None) -> int:
        """:meth:`collect` from what this compactor published, without a listing.

        With ``G`` the newest of our manifests older than the grace period:
        the manifests before ``G`` back to where the live view began, the
        chunks they and ``G`` covered, and the segments only they named.
        """
        grace = compaction_grace() if grace is None else grace
        now = time.time() if now is None else now
        aged = [i for i, (when, _, _) in enumerate(self._published) if when <= now - grace]
        if not aged:
            return 0
        g = aged[-1]
        base = self._published[g][1]
        named = {s.key for _, m, _ in self._published[g:] for s in m.segments}
        older = [self._base] + [m for _, m, _ in self._published[:g]]
        doomed = [f"{self.prefix}/{manifest_name(m.seq)}" for m in older if m.seq]
        doomed += [key for _, _, keys in self._published[: g + 1] for key in keys]
        doomed += sorted({f"{self.prefix}/{s.key}" for m in older for s in m.segments if s.key not in named})
        self.store.delete_many(doomed)
        self._base = base
        self._published = self._published[g + 1 :]
        # G's own chunks are gone; what it names stays: the view restarts at G
        return len(doomed)

    def _chunk_batches(self, tail: list[ChunkRef]) -> Iterator[pa.Table]:
        """The chunks' points in arrival order, fetching at most a quarter of the working set at once."""
        i = 0
        while i < len(tail):
            group: list[ChunkRef] = []
            size = 0
            while i < len(tail) and (not group or size + tail[i].size <= self.memory // 4):
                group.append(tail[i])
                size += tail[i].size
                i += 1
            need = [c.key for c in group if c.key not in self.known]
            fetched = self.store.read_many(need) if need else {}
            for chunk in group:
                blob = self.known.get(chunk.key) or fetched.pop(chunk.key, None)
                if blob is None:
                    # listed a moment ago, gone now: another compactor covered and collected it
                    raise AlreadyExistsError(f"{chunk.key} was compacted by another process", url=chunk.key)
                yield decode_chunk(blob)
            del fetched

    def _segment_files(self, segments: list[SegmentRef]) -> list[Path]:
        """Local files of ``segments``: ours are on disk already, others are fetched (streamed when big)."""
        need = [s for s in segments if s.key not in self._local or not self._local[s.key].is_file()]
        small = [s for s in need if s.bytes <= self.memory // 8]
        # small ones in one concurrent read (as many round trips as one), a bounded number of bytes each time
        while small:
            group: list[SegmentRef] = []
            size = 0
            while small and (not group or size + small[0].bytes <= self.memory // 4):
                size += small[0].bytes
                group.append(small.pop(0))
            fetched = self.store.read_many([f"{self.prefix}/{s.key}" for s in group])
            for ref in group:
                blob = fetched.pop(f"{self.prefix}/{ref.key}", None)
                if blob is None:
                    raise AlreadyExistsError(f"segment {ref.key} is gone: another compactor moved on", url=ref.key)
                path = self._work_path(ref.key)
                path.write_bytes(blob)
                self._local[ref.key] = path
        for ref in need:
            if ref.key in self._local and self._local[ref.key].is_file():
                continue
            try:
                self._local[ref.key] = self.store.download(
                    f"{self.prefix}/{ref.key}", self._work_path(ref.key), progress=False
                )
            except ObjectNotFoundError:
                raise AlreadyExistsError(
                    f"segment {ref.key} is gone: another compactor moved on", url=ref.key
                ) from None
        return [self._local[s.key] for s in segments]

    def _segment_batches(self, segments: list[SegmentRef]) -> Iterator[pa.Table]:
        """The segments' points in order, a batch of at most :attr:`batch_rows` rows at a time."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        for path in self._segment_files(segments):
            # single-threaded: see launchhelm._metrics._segments.decode_segment
            with pq.ParquetFile(path) as reader:
                for batch in reader.iter_batches(batch_size=self.batch_rows, use_threads=False):
                    yield pa.Table.from_batches([batch])

    def _write_segment(self, batches: Iterator[pa.Table], level: int, pending: dict[str, Path]) -> SegmentRef:
        """Stream ``batches`` into a new segment on local disk, held in ``pending`` until the manifest's
        shape is known; row groups of at most :attr:`batch_rows` rows."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        key = new_segment_name(level)
        path = self._work_path(key)
        pending[key] = path
        rows, first, last = 0, None, None
        held: list[pa.Table] = []
        held_rows = 0
        schema = points_schema().with_metadata({b"format": SEGMENT_FORMAT})
        with pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=["key"]) as writer:

            def write(tables: list[pa.Table]) -> None:
                table = pa.concat_tables(tables).replace_schema_metadata(schema.metadata)
                writer.write_table(table, row_group_size=self.batch_rows)

            for batch in batches:
                if not batch.num_rows:
                    continue
                table = plain_points(batch)
                low, high = pc.min_max(table.column("step")).values()
                first = low.as_py() if first is None else min(first, low.as_py())
                last = high.as_py() if last is None else max(last, high.as_py())
                rows += table.num_rows
                held.append(table)
                held_rows += table.num_rows
                if held_rows >= self.batch_rows:
                    write(held)
                    held, held_rows = [], 0
                pause()  # between batches, the training thread gets the GIL
            if held:
                write(held)
        return SegmentRef(key, level, rows, path.stat().st_size, int(first or 0), int(last or 0))

    def _upload(self, key: str, path: Path) -> None:
        # a local store copies the file through one reused block: the segment's bytes read whole would be a
        # large malloc freed at once (see launchhelm.storage._store._copy); a remote one is sent in one request
        if path.stat().st_size <= INLINE_UPLOAD_BYTES and not isinstance(self.store, LocalStore):
            self.store.create(f"{self.prefix}/{key}", path.read_bytes())
        else:
            # two parts in flight, not the backend's four: parts are 8 MiB each and outside the Arrow budget
            self.store.upload(f"{self.prefix}/{key}", path, max_concurrency=UPLOAD_PARTS_IN_FLIGHT, progress=False)

    def _publish(self, manifest: Manifest, tail: list[ChunkRef]) -> tuple[Manifest, int]:
        written: list[str] = []
        pending: dict[str, Path] = {}
        try:
            segments = list(manifest.segments)
            segments.append(self._write_segment(self._chunk_batches(tail), 0, pending))
            merged = 0
            while len(segments) >= FANOUT:
                run = segments[-FANOUT:]
                level = run[-1].level
                if any(s.level != level for s in run) or sum(s.bytes for s in run) > MAX_SEGMENT_BYTES:
                    break
                for ref in run:  # their files are read once more, by the merge
                    if ref.key in pending:
                        self._local[ref.key] = pending.pop(ref.key)
                segments[-FANOUT:] = [self._write_segment(self._segment_batches(run), level + 1, pending)]
                for ref in run:  # merged at once: never named by a manifest, never uploaded
                    if ref.key not in {s.key for s in manifest.segments}:
                        self._local.pop(ref.key).unlink(missing_ok=True)
                merged += 1
            # the merges' garbage goes back before the uploads' parts are made (see metrics._heap)
            give_back_free_heap(grown=TRIM_AFTER_GROWTH)
            # only what the manifest names is written: a new L0 merged at once never reaches the store
            for ref in segments:
                if ref.key in pending:
                    self._upload(ref.key, pending[ref.key])
                    written.append(ref.key)
            covered = dict(manifest.covered)
            for chunk in tail:
                covered[chunk.dir] = max(covered.get(chunk.dir, -1), chunk.number)
            published = Manifest(
                seq=manifest.seq + 1,
                covered=covered,
                segments=tuple(segments),
                max_step=max([manifest.max_step, *(c.last_step for c in tail)]),
                created=time.time(),
                by=self.by,
            )
            self.store.create(f"{self.prefix}/{manifest_name(published.seq)}", published.encode())
        except BaseException:
            # nobody can know segments no manifest names: take ours back now
            for path in pending.values():
                path.unlink(missing_ok=True)
            self._discard(written)
            raise
        self._local.update(pending)
        return published, merged

    def _discard(self, keys: list[str]) -> None:
        for key in keys:
            path = self._local.pop(key, None)
            if path is not None:
                path.unlink(missing_ok=True)
        try:
            self.store.delete_many([f"{self.prefix}/{k}" for k in keys])
        except StorageError as exc:  # left for garbage collection
            _log.debug("could not delete unpublished segments of run %s: %s", self.run_id, exc)

    # -- garbage ------------------------------------------------------------------------
    def collect(self, listing: Listing, grace: float | None = None, now: float | None = None) -> int:
        """Delete what no reader can need any more; return how many objects.

        With ``G`` the newest manifest older than the grace period: manifests
        before ``G``, chunks ``G`` covers, and segments older than the grace
        period that neither ``G`` nor any newer manifest names.
        """
        grace = compaction_grace() if grace is None else grace
        now = time.time() if now is None else now

        def old(modified: float | None) -> bool:
            return modified is not None and modified <= now - grace

        aged = [seq for seq, modified in listing.manifests.items() if old(modified)]
        if not aged:
            return 0
        g = max(aged)
        recent = sorted(seq for seq in listing.manifests if seq >= g)
        blobs = self.store.read_many([f"{self.prefix}/{manifest_name(seq)}" for seq in recent])
        named: set[str] = set()
        base: Manifest | None = None
        for seq in recent:
            blob = blobs.get(f"{self.prefix}/{manifest_name(seq)}")
            if blob is None:
                return 0  # another collector is at work: leave it to them
            found = Manifest.decode(blob, seq)
            named.update(s.key for s in found.segments)
            if seq == g:
                base = found
        assert base is not None
        doomed = [f"{self.prefix}/{manifest_name(seq)}" for seq in listing.manifests if seq < g]
        doomed += [c.key for c in listing.chunks if base.covers(c)]
        doomed += [f"{self.prefix}/{k}" for k, modified in listing.segments.items() if k not in named and old(modified)]
        if doomed:
            self.store.delete_many(doomed)
        return len(doomed)


def compact_run(
    store: Store, run_id: str, by: str = "compact", known: Mapping[str, bytes] | None = None
) -> CompactionResult | None:
    """Compact every chunk of a run now (``launchhelm compact RUN``) and collect its garbage."""
    compactor = Compactor(store, run_id, by)
    if known:
        compactor.known.update(known)
    try:
        return compactor.compact()
    finally:
        compactor.close()
