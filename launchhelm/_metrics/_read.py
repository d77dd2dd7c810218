"""Reading a run's points: the newest manifest's segments plus the chunks it does not cover.

A whole read is one listing, one manifest GET and one :meth:`Store.read_many`
of segments and uncovered chunks, whatever the run's length. A live poll
(:meth:`PointReader.poll`) is one listing plus the chunks not seen yet. If an
object vanishes under a reader (collected after the grace period while the
reader was slower than that), the read starts again from a fresh listing, so
no point is ever read twice or missed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launchhelm._metrics._layout import (
    EMPTY,
    ChunkRef,
    DamagedManifestError,
    Listing,
    Manifest,
    list_metrics,
    metrics_prefix,
    read_manifest,
)
from launchhelm._metrics._segments import concat, decode_chunk, decode_segment, empty_points
from launchhelm.storage import Store

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PointReader", "read_points"]

_log = logging.getLogger("launchhelm")

#: Fresh listings a read tries before giving up on a store that keeps changing under it.
_ATTEMPTS = 5


class StaleRead(Exception):
    """An object listed a moment ago is gone: list again."""


@dataclass
class Cursor:
    """What a reader has returned so far: a manifest's coverage plus chunks read directly."""

    manifest: Manifest = EMPTY
    seen: set[str] = field(default_factory=set)  # chunk keys read directly, not covered by ``manifest``
    max_seen: dict[str, int] = field(default_factory=dict)  # per directory, highest chunk number returned
    max_step: int = 0

    def returned(self, chunk: ChunkRef) -> bool:
        return self.manifest.covers(chunk) or chunk.key in self.seen


def _decode(chunk: ChunkRef, blob: bytes | None, run_id: str) -> pa.Table:
    if blob is None:
        raise StaleRead(chunk.key)
    try:
        return decode_chunk(blob)
    except Exception as exc:  # a damaged chunk must not make the whole run unreadable
        import warnings

        warnings.warn(
            f"run {run_id}: skipped metric chunk {chunk.key}, which is damaged ({type(exc).__name__}: {exc})",
            stacklevel=4,
        )
        return empty_points()


def _decode_segment(key: str, blob: bytes, run_id: str) -> pa.Table:
    try:
        return decode_segment(blob)
    except Exception as exc:  # a damaged segment must not make the whole run unreadable
        import warnings

        warnings.warn(
            f"run {run_id}: skipped metric segment {key}, which is damaged ({type(exc).__name__}: {exc}); "
            "its points are missing from this read",
            stacklevel=4,
        )
        return empty_points()


class PointReader:
    """Reads one run's points, whole or incrementally (``read`` then ``poll``)."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.prefix = metrics_prefix(run_id)
        self.cursor = Cursor()
        self._segments: dict[str, pa.Table] = {}  # immutable: each fetched once per reader

    # -- whole reads -----------------------------------------------------------------
    def read(self) -> pa.Table:
        """Every point of the run, in arrival order; resets the cursor to what it returned."""
        for _ in range(_ATTEMPTS):
            listing = list_metrics(self.store, self.run_id)
            try:
                return self._read_all(listing)
            except StaleRead as gone:
                _log.debug("run %s: %s vanished during a read; listing again", self.run_id, gone)
        return self._read_all(list_metrics(self.store, self.run_id))

    def _read_all(self, listing: Listing) -> pa.Table:
        manifest = self._manifest(listing)
        tail = listing.uncovered(manifest)
        segment_keys = [f"{self.prefix}/{s.key}" for s in manifest.segments if s.key not in self._segments]
        blobs = self.store.read_many([*segment_keys, *(c.key for c in tail)])
        tables = []
        for seg in manifest.segments:
            if seg.key not in self._segments:
                blob = blobs.pop(f"{self.prefix}/{seg.key}", None)  # each blob freed once decoded
                if blob is None:
                    raise StaleRead(seg.key)
                self._segments[seg.key] = _decode_segment(f"{self.prefix}/{seg.key}", blob, self.run_id)
            tables.append(self._segments[seg.key])
        tables += [_decode(c, blobs.pop(c.key, None), self.run_id) for c in tail]
        self._segments = {s.key: self._segments[s.key] for s in manifest.segments}
        cursor = Cursor(manifest=manifest, max_step=manifest.max_step)
        for chunk in tail:
            self._saw(cursor, chunk)
        for dirname, number in manifest.covered.items():
            cursor.max_seen[dirname] = max(cursor.max_seen.get(dirname, -1), number)
        self.cursor = cursor
        return concat(tables)

    def _manifest(self, listing: Listing) -> Manifest:
        newest = listing.newest_manifest
        if newest == self.cursor.manifest.seq:
            return self.cursor.manifest
        try:
            return read_manifest(self.store, self.run_id, newest)
        except FileNotFoundError as exc:
            raise StaleRead(f"manifest {newest}") from exc
        except DamagedManifestError as exc:
            import warnings

            warnings.warn(
                f"run {self.run_id}: ignored its damaged metrics manifest {newest} ({exc}); reading its chunks "
                "instead (points in segments only that manifest named are missing; `launchhelm compact` rewrites it)",
                stacklevel=3,
            )
            return EMPTY

    @staticmethod
    def _saw(cursor: Cursor, chunk: ChunkRef) -> None:
        cursor.seen.add(chunk.key)
        cursor.max_seen[chunk.dir] = max(cursor.max_seen.get(chunk.dir, -1), chunk.number)
        cursor.max_step = max(cursor.max_step, chunk.last_step)

    # -- incremental reads --------------------------------------------------------------
    def poll(self) -> pa.Table | None:
        """Points that arrived since the last ``read``/``poll``, or None when a whole re-read is needed.

        One listing plus a GET per new chunk (and one for a new manifest).
        None means the run changed in a way an increment cannot express (a
        chunk this reader never saw was collected meanwhile): call
        :meth:`read` again.
        """
        listing = list_metrics(self.store, self.run_id)
        cursor = self.cursor
        newest = listing.newest_manifest
        manifest = cursor.manifest
        if newest != manifest.seq:
            try:
                manifest = read_manifest(self.store, self.run_id, newest)
            except FileNotFoundError:
                return None
        listed_dirs: dict[str, int] = {}
        for chunk in listing.chunks:
            listed_dirs[chunk.dir] = min(listed_dirs.get(chunk.dir, chunk.number), chunk.number)
        # chunks the new manifest covers that this reader never returned must still be listed
        for dirname, number in manifest.covered.items():
            seen = cursor.max_seen.get(dirname, -1)
            if number > seen and listed_dirs.get(dirname, number + 1) > seen + 1:
                return None
        new = [c for c in listing.chunks if not cursor.returned(c)]
        blobs = self.store.read_many([c.key for c in new]) if new else {}
        try:
            tables = [_decode(c, blobs.get(c.key), self.run_id) for c in new]
        except StaleRead:
            return None
        for chunk in new:
            self._saw(cursor, chunk)
        if manifest.seq != cursor.manifest.seq:
            # what the new manifest covers needs no tracking any more
            returned = {c.key for c in new} | cursor.seen
            cursor.seen = {c.key for c in listing.chunks if c.key in returned and not manifest.covers(c)}
            cursor.manifest = manifest
            cursor.max_step = max(cursor.max_step, manifest.max_step)
        return concat(tables)

    @property
    def max_step(self) -> int:
        """The furthest step among the points returned so far."""
        return self.cursor.max_step


def read_points(store: Store, run_id: str) -> pa.Table:
    """Every point of a run, once each, in arrival order."""
    return PointReader(store, run_id).read()


def furthest_logged_step(store: Store, run_id: str) -> int:
    """The furthest step any point of the run was logged at: newest manifest plus chunk names (one listing)."""
    listing = list_metrics(store, run_id)
    best = max((c.last_step for c in listing.chunks), default=0)
    if listing.newest_manifest:
        try:
            best = max(best, read_manifest(store, run_id, listing.newest_manifest).max_step)
        except FileNotFoundError:
            return furthest_logged_step(store, run_id)
    return best
