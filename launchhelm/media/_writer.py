"""A live session's media on their way to the store, off the training thread.

``log()`` hands over checked copies (:mod:`launchhelm.media._types`) and
returns; the media thread encodes each item (PNG, JSON), writes it as a
content-addressed object with ``create`` and keeps its index row; the
session's flush writes the rows gathered as one index chunk and merges
chunks (:mod:`launchhelm.media._index`). Items waiting in memory are bounded
in bytes: past the bound a call's media go to the session's spool on local
disk (:mod:`launchhelm.media._spill`) and the thread reads them back in turn;
with no spool (a memory store), ``log()`` waits for the thread. None is
dropped: what ``finish()`` could not store in its time stays in the spool.

With a helper process (``handoff``), the thread only writes each call's
items to the spool (:mod:`launchhelm.media._handoff`): the encoding, the
uploads and the index are the helper's, outside this process's GIL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launchhelm._exceptions import AlreadyExistsError
from launchhelm._metrics._pause import pause
from launchhelm.media._index import FANOUT, IndexRow, encode_index, merge_tables
from launchhelm.media._png import encode_png
from launchhelm.media._spill import handoff_name, read_spilled, spill_name, write_spilled
from launchhelm.media._types import Prepared, PreparedHistogram, PreparedImage, PreparedTable, give_back
from launchhelm.storage import Store
from launchhelm.storage._keys import media_index_key, media_object_key

if TYPE_CHECKING:
    import numpy as np

__all__ = ["THUMBNAIL_SIDE", "MediaWriter", "encode_image", "object_name", "store_items", "thumbnail_pixels"]

_log = logging.getLogger("launchhelm")

#: The longest side of a thumbnail, in pixels (MLflow's).
THUMBNAIL_SIDE = 256
#: Object formats: a table's and a histogram's JSON say what they are.
TABLE_FORMAT = "launchhelm.table/1"
HISTOGRAM_FORMAT = "launchhelm.histogram/1"
_EXTENSIONS = {"png": "png", "jpeg": "jpg", "webp": "webp"}
#: Seconds between tries while the store does not answer.
_RETRY = 1.0


@dataclass
class _Pending:
    step: int
    attempt: int
    time: float
    key: str
    items: list[Prepared]
    nbytes: int
    path: Path | None = None  # spilled: the items are in this file, read back when their turn comes
    count: int = 0  # a spilled call's items
    seq: int | None = None  # handed to the helper: its file's number (the helper stores it)


def prepared_bytes(items: list[Prepared]) -> int:
    """What a call's media hold in memory until stored (pixels, and a rough size for cells)."""
    total = 0
    for item in items:
        if isinstance(item, PreparedImage):
            total += item.pixels.nbytes
        elif isinstance(item, PreparedTable):
            total += 64 * (len(item.rows) + 1) * max(1, len(item.columns))
            total += sum(cell.pixels.nbytes for row in item.rows for cell in row if isinstance(cell, PreparedImage))
        else:
            total += 16 * (len(item.counts) + len(item.edges))
    return total


def thumbnail_pixels(pixels: np.ndarray) -> np.ndarray:
    """``pixels`` sampled down so the longest side is at most :data:`THUMBNAIL_SIDE` (every n-th pixel)."""
    import numpy as np

    height, width = pixels.shape[:2]
    side = max(height, width)
    if side <= THUMBNAIL_SIDE:
        return pixels
    scale = THUMBNAIL_SIDE / side
    rows = (np.arange(max(1, round(height * scale))) / scale).astype(np.int64)
    cols = (np.arange(max(1, round(width * scale))) / scale).astype(np.int64)
    return np.ascontiguousarray(pixels[rows][:, cols])


def encode_image(pixels: np.ndarray, format: str = "png", quality: int | None = None) -> bytes:
    """The object's bytes: our own PNG (same pixels, same bytes on every machine), or Pillow's JPEG/WebP."""
    if format == "png":
        return encode_png(pixels)
    import io

    import PIL.Image

    image = PIL.Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
    if format == "jpeg" and image.mode in ("RGBA", "LA"):
        image = image.convert("RGB" if image.mode == "RGBA" else "L")  # JPEG has no alpha
    out = io.BytesIO()
    image.save(out, format=format.upper(), quality=quality)
    return out.getvalue()


def object_name(data: bytes, extension: str) -> str:
    return f"{hashlib.sha256(data).hexdigest()}.{extension}"


class MediaWriter:
    """The media a session logged and has not stored yet, and the writing of them.

    Parameters
    ----------
    store, run_id, session_id:
        Where the objects and index chunks go.
    max_bytes:
        Bytes of pixels (and cells) waiting to be stored before ``log()`` waits.
    on_store_error:
        Called with a store failure of the media thread (the run's outage line).
    """

    def __init__(self, store: Store, run_id: str, session_id: str, max_bytes: int, on_store_error: Any = None) -> None:
        self.store = store
        self.run_id = run_id
        self.session_id = session_id
        self.max_bytes = max_bytes
        self._on_store_error = on_store_error
        self._cond = threading.Condition()
        self._queue: deque[_Pending] = deque()
        self._waiting_bytes = 0
        self._rows: list[IndexRow] = []  # stored objects whose rows await the next index chunk
        self._thread: threading.Thread | None = None
        self._closed = False
        self._io_lock = threading.Lock()  # index chunks and merges, from the flush thread or flush()
        self._next = 0  # the next index chunk's number
        # the session's index objects not merged yet: (first, last, bytes kept or None: read back to merge)
        self._stack: list[tuple[int, int, bytes | None]] = []
        self._garbage: list[tuple[float, list[str]]] = []  # objects merged away, deleted after the grace period
        self.stored = 0  # items stored (tests, the outage line)
        self.spool_dir: Path | None = None  # where items past the bound wait (None: log() waits instead)
        self._seq = 0  # the next spilled file's number
        self._files: list[Path] = []  # spilled files stored, deleted once their rows are in an index chunk
        self.spilled = 0  # items written to the spool (tests, the benchmark)
        #: True while a helper process picks up the spool's media files (set by the run): calls are handed over
        self.handoff = False
        self._handed: dict[int, tuple[Path, int]] = {}  # files handed over: seq -> (path, items)
        self.handed = 0  # items handed to the helper (tests)

    # -- the training thread ------------------------------------------------
    def add(self, step: int, attempt: int, now: float, media: list[tuple[str, list[Prepared]]]) -> None:
        """Queue one ``log()`` call's media; waits while more than ``max_bytes`` wait already."""
        with self._cond:
            for key, items in media:
                nbytes = prepared_bytes(items)
                seq = None
                if self.handoff and self.spool_dir is not None:
                    seq, self._seq = self._seq, self._seq + 1  # numbered now: the helper stores in log() order
                over = self._waiting_bytes and self._waiting_bytes + nbytes > self.max_bytes
                if over and self.spool_dir is not None:  # the store is slower than the logging: to disk
                    self._queue.append(self._spill(_Pending(step, attempt, now, key, items, nbytes, seq=seq)))
                    continue
                while self._waiting_bytes and self._waiting_bytes + nbytes > self.max_bytes:
                    self._cond.wait()  # no spool: back-pressure
                self._queue.append(_Pending(step, attempt, now, key, items, nbytes, seq=seq))
                self._waiting_bytes += nbytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=f"launchhelm-media-{self.run_id}", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _spill(self, pending: _Pending) -> _Pending:
        """``pending`` written to the spool (the caller holds the lock): what the queue keeps instead."""
        assert self.spool_dir is not None
        if pending.seq is not None:
            path = self.spool_dir / handoff_name(self.session_id, pending.seq)
        else:
            path = self.spool_dir / spill_name(self.session_id, self._seq)
            self._seq += 1
        write_spilled(path, pending.key, pending.step, pending.attempt, pending.time, pending.items)
        self.spilled += len(pending.items)
        if pending.seq is not None:
            self._handed[pending.seq] = (path, len(pending.items))
            self.handed += len(pending.items)
        return _Pending(
            pending.step, pending.attempt, pending.time, pending.key, [], 0, path, len(pending.items), pending.seq
        )

    # -- the media thread ---------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue or self._abandoned():
                    return  # closed: what is left goes to the spool (see close)
                pending = self._queue[0]
            if pending.seq is not None:
                self._hand_over(pending)
                pause()
                continue
            if pending.path is not None and not pending.items:
                try:
                    pending.items = read_spilled(pending.path)[4]
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    _log.warning("run %s: spilled media %s could not be read back: %s", self.run_id, pending.path, exc)
                    with self._cond:
                        self._queue.popleft()
                        self._cond.notify_all()
                    continue
            try:
                rows = self._store_call(pending)
            except OSError as exc:  # the store: try again, the item stays first in line
                if self._on_store_error is not None:
                    self._on_store_error(exc)
                with self._cond:
                    if self._abandoned():
                        return
                    self._cond.wait(_RETRY)
                continue
            except Exception as exc:  # a bug must not kill the thread and block log() forever
                _log.warning("run %s: media %r at step %d not stored: %s", self.run_id, pending.key, pending.step, exc)
                rows = []
            _recycle(pending.items)
            with self._cond:
                self._queue.popleft()
                self._waiting_bytes -= pending.nbytes
                self._rows.extend(rows)
                if pending.path is not None:
                    self._files.append(pending.path)
                self.stored += len(rows)
                self._cond.notify_all()
            pause()  # the GIL back to the training thread between items

    def _hand_over(self, pending: _Pending) -> None:
        """Write ``pending`` to the spool for the helper (one large write: the GIL is free meanwhile)."""
        rows: list[IndexRow] = []
        written: tuple[Path, int] | None = None
        if pending.path is None:
            assert self.spool_dir is not None
            path = self.spool_dir / handoff_name(self.session_id, pending.seq or 0)
            try:
                write_spilled(path, pending.key, pending.step, pending.attempt, pending.time, pending.items)
                written = (path, len(pending.items))
            except OSError as exc:  # a full disk: stored here instead, as without a helper
                _log.warning("run %s: media could not be handed to the helper (%s); stored here", self.run_id, exc)
                try:
                    rows = self._store_call(pending)
                except Exception as exc2:
                    _log.warning(
                        "run %s: media %r at step %d not stored: %s", self.run_id, pending.key, pending.step, exc2
                    )
        _recycle(pending.items)
        with self._cond:
            self._queue.popleft()
            self._waiting_bytes -= pending.nbytes
            if written is not None and pending.seq is not None:
                self._handed[pending.seq] = written
                self.spilled += written[1]
                self.handed += written[1]
            self._rows.extend(rows)
            self.stored += len(rows)
            self._cond.notify_all()

    def wait_handed(self, timeout: float, helper_alive: Callable[[], bool], store_here: Callable[[], object]) -> bool:
        """Wait until the helper stored every file handed to it so far (or ``timeout`` passed); True when done.

        Where no helper lives (it died, or the session has none now), ``store_here`` stores them in this process.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            waiting = deque(path for _, (path, _) in sorted(self._handed.items()))
        while waiting:
            while waiting and not waiting[0].exists():  # the helper stores them in order: a stat a look
                waiting.popleft()
            if not waiting:
                break
            if not helper_alive():
                store_here()
                if any(path.exists() for path in waiting):
                    return False  # left in the spool: unreadable, or the store did not take them
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        with self._cond:
            self._handed = {seq: entry for seq, entry in self._handed.items() if entry[0].exists()}
        return True

    def handed_waiting(self) -> int:
        """Items in files handed to the helper that are still in the spool."""
        with self._cond:
            self._handed = {seq: entry for seq, entry in self._handed.items() if entry[0].exists()}
            return sum(count for _, count in self._handed.values())

    _abandon = False

    def _abandoned(self) -> bool:
        return self._closed and self._abandon

    def _put(self, data: bytes, extension: str) -> str:
        name = object_name(data, extension)
        try:
            self.store.create(media_object_key(self.run_id, name), data)
        except AlreadyExistsError:
            pass  # the same content, logged before
        return name

    def _store_call(self, pending: _Pending) -> list[IndexRow]:
        return store_items(self._put, pending.key, pending.step, pending.attempt, pending.time, pending.items)

    # -- the flush ----------------------------------------------------------
    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued item is stored (or ``timeout`` passed); True when none waits."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is None else min(left, 1.0))
            return True

    def waiting(self) -> int:
        with self._cond:
            return sum(p.count if p.path is not None else len(p.items) for p in self._queue)

    def write_index(self, grace: float | None = None) -> bool:
        """Write the rows of the items stored since the last call as one index chunk, then merge.

        Returns True when a chunk was written. A store failure leaves the
        rows for the next call.
        """
        with self._io_lock:
            with self._cond:
                rows, self._rows = self._rows, []
                files, self._files = self._files, []
            if rows:
                try:
                    self._write_chunk(rows)
                except BaseException:
                    with self._cond:
                        self._rows[:0] = rows
                        self._files[:0] = files
                    raise
            for path in files:  # their rows are indexed: the spool lets go of them
                path.unlink(missing_ok=True)
            self._collect(grace)
            return bool(rows)

    def _write_chunk(self, rows: list[IndexRow]) -> None:
        data = encode_index(rows)
        while True:
            number = self._next
            key = media_index_key(self.run_id, self.session_id, number, number)
            try:
                self.store.create(key, data)
            except AlreadyExistsError:
                self._next += 1
                if self.store.read(key) == data:
                    break  # an earlier try that seemed to fail did store it
                continue
            self._next += 1
            break
        self._stack.append((number, number, data))
        self._merge()

    def _merge(self) -> None:
        """Merge the newest :data:`FANOUT` index objects while they share a span."""
        while len(self._stack) >= FANOUT:
            tail = self._stack[-FANOUT:]
            span = tail[0][1] - tail[0][0]
            if any(last - first != span for first, last, _ in tail):
                return
            keys = [media_index_key(self.run_id, self.session_id, first, last) for first, last, _ in tail]
            missing = [key for key, (_, _, data) in zip(keys, tail, strict=True) if data is None]
            fetched = self.store.read_many(missing) if missing else {}
            datas = [data if data is not None else fetched[key] for key, (_, _, data) in zip(keys, tail, strict=True)]
            if any(data is None for data in datas):
                return  # one was deleted by hand: readers still find the others
            merged = encode_index(merge_tables([d for d in datas if d is not None]))
            first, last = tail[0][0], tail[-1][1]
            try:
                self.store.create(media_index_key(self.run_id, self.session_id, first, last), merged)
            except AlreadyExistsError:
                pass  # an earlier try stored it
            del self._stack[-FANOUT:]
            # merged objects are read back from the store when merged again: memory holds the small ones only
            self._stack.append((first, last, merged if last - first + 1 <= FANOUT else None))
            self._garbage.append((time.time(), keys))

    def seal(self) -> None:
        """At the session's end: its index objects merged into one, so that a reader gets one per session.

        A live session keeps up to ``FANOUT - 1`` objects per level (a day of 2 s flushes: dozens);
        the objects merged away are deleted by ``launchhelm gc`` (or the next flush, were there one).
        """
        with self._io_lock:
            if len(self._stack) < 2:
                return
            keys = [media_index_key(self.run_id, self.session_id, first, last) for first, last, _ in self._stack]
            missing = [key for key, (_, _, data) in zip(keys, self._stack, strict=True) if data is None]
            fetched = self.store.read_many(missing) if missing else {}
            datas = [
                data if data is not None else fetched[key] for key, (_, _, data) in zip(keys, self._stack, strict=True)
            ]
            if any(data is None for data in datas):
                return  # one was deleted by hand: readers still find the others
            first, last = self._stack[0][0], self._stack[-1][1]
            merged = encode_index(merge_tables([d for d in datas if d is not None]))
            try:
                self.store.create(media_index_key(self.run_id, self.session_id, first, last), merged)
            except AlreadyExistsError:
                pass  # an earlier try stored it
            self._stack = [(first, last, None)]
            self._garbage.append((time.time(), keys))
            self._collect(None)  # what is past its grace period now; the rest is `launchhelm gc`'s

    def _collect(self, grace: float | None) -> None:
        from launchhelm._metrics._compact import compaction_grace

        grace = compaction_grace() if grace is None else grace
        now = time.time()
        old = [keys for when, keys in self._garbage if now - when >= grace]
        if old:
            self.store.delete_many([key for keys in old for key in keys])
            self._garbage = [(when, keys) for when, keys in self._garbage if now - when < grace]

    def close(self, timeout: float | None = None) -> tuple[int, int]:
        """Stop the media thread once the queue is empty (or after ``timeout``).

        Returns ``(in_spool, dropped)``: the items not stored that wait in the
        spool (for the helper, ``launchhelm recover`` or a relaunch), and those
        lost (only where the session has no spool).
        """
        self.drain(timeout)
        with self._cond:
            self._closed = True
            self._abandon = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)  # it ends the item it is storing; one stuck on the store is spilled too
        in_spool = dropped = 0
        with self._cond:
            for pending in self._queue:
                if pending.seq is not None and pending.seq in self._handed:
                    continue  # a file handed to the helper: counted below
                if pending.path is None and self.spool_dir is not None:
                    try:
                        pending = self._spill(pending)
                    except OSError as exc:
                        _log.warning("run %s: media could not be spilled to %s: %s", self.run_id, self.spool_dir, exc)
                if pending.seq is not None and pending.seq in self._handed:
                    continue
                if pending.path is not None:
                    in_spool += pending.count
                else:
                    dropped += len(pending.items)
            self._queue.clear()
            self._waiting_bytes = 0
            if self.spool_dir is not None:
                in_spool += sum(count for path, count in self._handed.values() if path.exists())
        return in_spool, dropped


#: Stores an object's bytes under a name made of them and the extension given; returns the name.
ObjectSink = Callable[[bytes, str], str]


def _image_object(put: ObjectSink, image: PreparedImage) -> tuple[str, int, str]:
    data = encode_image(image.pixels, image.format, image.quality)
    name = put(data, _EXTENSIONS[image.format])
    small = thumbnail_pixels(image.pixels)
    thumb = name if small is image.pixels and image.format == "png" else put(encode_png(small), "png")
    return name, len(data), thumb


def store_items(
    put: ObjectSink, key: str, step: int, attempt: int, now: float, items: list[Prepared]
) -> list[IndexRow]:
    """Encode and store one key's items of one ``log()`` call (objects through ``put``); their index rows."""
    rows: list[IndexRow] = []
    for index, item in enumerate(items):
        thumbnail: str | None = None
        height: int | None = None
        width: int | None = None
        if isinstance(item, PreparedImage):
            name, size, thumbnail = _image_object(put, item)
            height, width = int(item.pixels.shape[0]), int(item.pixels.shape[1])
        elif isinstance(item, PreparedTable):
            data = _table_json(put, item)
            name, size = put(data, "json"), len(data)
            height, width = len(item.rows), len(item.columns)
        else:
            data = _histogram_json(item)
            name, size = put(data, "json"), len(data)
        rows.append(
            IndexRow(
                key=key,
                step=step,
                attempt=attempt,
                time=now,
                kind=item.kind,
                index=index,
                caption=item.caption,
                object=name,
                size=size,
                thumbnail=thumbnail,
                height=height,
                width=width,
            )
        )
    return rows


def _table_json(put: ObjectSink, table: PreparedTable) -> bytes:
    rows = []
    for row in table.rows:
        cells = []
        for cell in row:
            if isinstance(cell, PreparedImage):
                name, _, thumb = _image_object(put, cell)
                # a dict is never a cell a user gave (log() refuses them), so it marks an image unambiguously
                cells.append({"image": name, "thumbnail": thumb, "caption": cell.caption})
            else:
                cells.append(cell)
        rows.append(cells)
    doc = {"format": TABLE_FORMAT, "columns": table.columns, "rows": rows}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _recycle(items: list[Prepared]) -> None:
    """Hand the pixel buffers of stored items back for later ``log()`` calls (only the queue held them)."""
    for item in items:
        if isinstance(item, PreparedImage) and item.pixels.base is None and item.pixels.flags.owndata:
            give_back(item.pixels)
        elif isinstance(item, PreparedTable):
            for row in item.rows:
                for cell in row:
                    if isinstance(cell, PreparedImage) and cell.pixels.flags.owndata:
                        give_back(cell.pixels)


def _histogram_json(histogram: PreparedHistogram) -> bytes:
    doc = {"format": HISTOGRAM_FORMAT, "counts": histogram.counts, "edges": histogram.edges}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")
