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
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launchhelm._exceptions import AlreadyExistsError, StorageError
from launchhelm.metrics._layout import (
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
from launchhelm.metrics._segments import concat, decode_chunk, decode_segment, encode_segment
from launchhelm.storage import Store
from launchhelm.storage._keys import manifest_name, new_segment_name

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["CompactionResult", "Compactor", "compaction_grace"]

_log = logging.getLogger("launchhelm")

#: Uncovered chunks that make the live session compact (about a minute of flushes).
CHUNKS_PER_SEGMENT = 32
#: ... or this many bytes of them, whichever comes first.
BYTES_PER_SEGMENT = 8 * 2**20
#: Segments of one level merged into one of the next: at most FANOUT - 1 per level remain.
FANOUT = 8
#: Segments are not merged past this size (a merge holds its inputs in memory).
MAX_SEGMENT_BYTES = 256 * 2**20
#: Seconds a covered chunk or dropped segment stays readable (``LAUNCHHELM_COMPACTION_GRACE``).
DEFAULT_GRACE = 600.0


def compaction_grace() -> float:
    raw = os.environ.get("LAUNCHHELM_COMPACTION_GRACE")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_GRACE
    except ValueError:
        return DEFAULT_GRACE


@dataclass(frozen=True)
class CompactionResult:
    """What one :meth:`Compactor.compact` did."""

    manifest: Manifest
    chunks: int  # chunks newly covered
    merged: int  # merges into a higher level
    deleted: int  # garbage objects deleted


class Compactor:
    """Compacts one run; keeps the newest manifest and recent segments in memory between calls.

    Parameters
    ----------
    store, run_id:
        The run.
    by:
        Who compacts (a session id, ``"compact"``, ``"gc"``), recorded in the manifest.
    """

    def __init__(self, store: Store, run_id: str, by: str) -> None:
        self.store = store
        self.run_id = run_id
        self.by = by
        self.prefix = metrics_prefix(run_id)
        self._manifest: Manifest = EMPTY
        self._tables: dict[str, pa.Table] = {}  # segments this process wrote or read, by relative key
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
            self._tables = {k: t for k, t in self._tables.items() if k in {s.key for s in self._manifest.segments}}
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
            self._keep_tables(published)
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
        self._keep_tables(published)
        self._published.append((time.time(), published, [c.key for c in tail]))
        for chunk in tail:
            self.known.pop(chunk.key, None)
        return CompactionResult(published, len(tail), merged, self._collect_live())

    def _keep_tables(self, manifest: Manifest) -> None:
        # only what the next merge can read: memory stays bounded by the live segments
        named = {s.key for s in manifest.segments}
        self._tables = {k: t for k, t in self._tables.items() if k in named}

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

    def _chunk_tables(self, tail: list[ChunkRef]) -> list[pa.Table]:
        need = [c.key for c in tail if c.key not in self.known]
        fetched = self.store.read_many(need) if need else {}
        tables = []
        for chunk in tail:
            blob = self.known.get(chunk.key) or fetched.get(chunk.key)
            if blob is None:
                # listed a moment ago, gone now: another compactor covered and collected it
                raise AlreadyExistsError(f"{chunk.key} was compacted by another process", url=chunk.key)
            tables.append(decode_chunk(blob))
        return tables

    def _segment_tables(self, segments: list[SegmentRef]) -> list[pa.Table]:
        need = [s.key for s in segments if s.key not in self._tables]
        fetched = self.store.read_many([f"{self.prefix}/{k}" for k in need]) if need else {}
        for key in need:
            blob = fetched.get(f"{self.prefix}/{key}")
            if blob is None:
                raise AlreadyExistsError(f"segment {key} is gone: another compactor moved on", url=key)
            self._tables[key] = decode_segment(blob)
        return [self._tables[s.key] for s in segments]

    def _encode_segment(self, table: pa.Table, level: int, pending: dict[str, bytes]) -> SegmentRef:
        """A segment ready to write: held in ``pending`` until the manifest's shape is known."""
        import pyarrow.compute as pc

        data = encode_segment(table)
        key = new_segment_name(level)
        pending[key] = data
        steps = table.column("step")
        first = int(pc.min(steps).as_py() or 0) if table.num_rows else 0
        last = int(pc.max(steps).as_py() or 0) if table.num_rows else 0
        self._tables[key] = table
        return SegmentRef(key, level, table.num_rows, len(data), first, last)

    def _publish(self, manifest: Manifest, tail: list[ChunkRef]) -> tuple[Manifest, int]:
        written: list[str] = []
        pending: dict[str, bytes] = {}
        try:
            segments = list(manifest.segments)
            segments.append(self._encode_segment(concat(self._chunk_tables(tail)), 0, pending))
            merged = 0
            while len(segments) >= FANOUT:
                run = segments[-FANOUT:]
                level = run[-1].level
                if any(s.level != level for s in run) or sum(s.bytes for s in run) > MAX_SEGMENT_BYTES:
                    break
                table = concat(self._segment_tables(run))
                segments[-FANOUT:] = [self._encode_segment(table, level + 1, pending)]
                merged += 1
            # only what the manifest names is written: a new L0 merged at once never reaches the store
            for ref in segments:
                if ref.key in pending:
                    self.store.create(f"{self.prefix}/{ref.key}", pending[ref.key])
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
            for key in pending:
                self._tables.pop(key, None)
            self._discard(written)
            raise
        return published, merged

    def _discard(self, keys: list[str]) -> None:
        for key in keys:
            self._tables.pop(key, None)
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
    return compactor.compact()
