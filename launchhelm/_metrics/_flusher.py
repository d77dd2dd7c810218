"""A live session's metric points on their way to the store.

``log()`` appends to the flusher's buffer; the session's background thread
cuts it into immutable chunks, writes them with ``create``, and folds them
into segments (:class:`~launchhelm._metrics._compact.Compactor`). Every point
is also in the on-disk spool until the store has it, and when logging
outruns the store, memory lets go of the points and the flushes read them
back from the spool.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from launchhelm._exceptions import AlreadyExistsError
from launchhelm._metrics._buffer import BYTES_PER_VALUE, KeyIds, PointBuffer, read_spool
from launchhelm._metrics._compact import BYTES_PER_SEGMENT, CHUNKS_PER_SEGMENT, Compactor
from launchhelm._metrics._compact import compaction_memory as compaction_memory_setting
from launchhelm._metrics._heap import TRIM_AFTER_GROWTH, give_back_free_heap, prepare_trims, process_is_ours
from launchhelm._metrics._pause import helper_flushes, pause
from launchhelm._metrics._points import chunk_key, encode_buffer
from launchhelm._metrics._spool import Spool
from launchhelm._runlog._liveness import process_identity
from launchhelm.storage import Store

__all__ = ["MetricFlusher", "encodes_here", "flush_line", "warm_up_encoder"]

_log = logging.getLogger("launchhelm")

_warmed_up = False
#: Seconds a flush() waits for the helper that is to write the chunks to start (a spawn: milliseconds).
HELPER_START_WAIT = 30.0


def prefer_returning_pool() -> None:
    """Make jemalloc pyarrow's default pool, unless the user chose one (``ARROW_DEFAULT_MEMORY_POOL``,
    or ``LAUNCHHELM_ARROW_POOL=keep``).

    The flush thread's tables come and go all run long; pyarrow's default,
    mimalloc, keeps much of what they freed resident, jemalloc hands it back
    to the system within a second (docs/long-runs.md has the figures).
    Buffers allocated before the switch are still freed to their own pool.
    Only in the helper process: a training process's pool is the user's.
    """
    if not process_is_ours():
        return
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") or os.environ.get("LAUNCHHELM_ARROW_POOL", "").lower() == "keep":
        return
    import pyarrow as pa

    if pa.default_memory_pool().backend_name != "mimalloc":
        return  # chosen already (pa.set_memory_pool), by the user or an earlier session
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without it
        return
    pa.set_memory_pool(pool)


class StoreErrorSink(Protocol):
    """Where a store failure goes: the run's outage line (``Run._store_failed``)."""

    def __call__(self, exc: BaseException, *, sent: float | None = ...) -> None: ...


def warm_up_encoder() -> None:
    """Encode one chunk now, in the caller's thread.

    pyarrow imports parts of itself (and pandas) lazily on first use. Done
    at interpreter exit that fails ("can't register atexit after shutdown"),
    and done in the flush thread it would stall ``log()`` on the import lock.
    """
    global _warmed_up
    if not _warmed_up:
        prefer_returning_pool()
        buffer = PointBuffer(KeyIds(), 1)
        buffer.append(0, 0, 0.0, {"warm-up": 0.0})
        encode_buffer(buffer)
        buffer.latest()
        # the compactor's modules too: imported by the first compaction, in the background thread,
        # loading them would hold the GIL for tens of milliseconds while the training loop runs
        import pyarrow.compute
        import pyarrow.parquet  # noqa: F401

        prepare_trims()
        _warmed_up = True


class MetricFlusher:
    """The points a session logged and has not stored yet, and the writing of them.

    ``lock`` is the run's: ``log()`` appends under it (and the control poller
    hands over requests under it). ``io_lock`` orders what is written:
    a flush and a compaction's view of the chunks written.

    ``on_chunk`` is called with each buffer once the store has it (the
    summary's latest values); ``on_store_error(exc, sent=...)`` with a
    compaction's store failure (the outage line).
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        session_id: str,
        lock: threading.Lock,
        *,
        on_chunk: Callable[[PointBuffer], None],
        on_store_error: StoreErrorSink,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.session_id = session_id
        self._on_chunk = on_chunk
        self._on_store_error = on_store_error
        # points not yet stored: the buffer log() appends to, and buffers cut from it (see cut)
        self.keys = KeyIds()
        self.chunk_values = 1 << 20  # values per buffer (and so per chunk); set_memory sets them
        self.max_held = 1 << 22  # values held in memory before log() leaves them to the spool alone
        self.buffer = PointBuffer(self.keys, self.chunk_values)
        self.sealed: list[PointBuffer] = []
        self.held = 0
        # logging outran the store: points are only in the spool, read back from there (see flush)
        self.spilled = False
        self.flushed_end: tuple[int, int] | None = None  # the spool position the store has every point before
        self.set_memory(compaction_memory_setting())  # start_run sets the one init() was given
        self.lock = lock
        self.io_lock = threading.Lock()
        self.chunk_number = 0
        self.unsealed: dict[str, bytes] = {}  # our chunks not yet in a segment
        self.unsealed_bytes = 0
        self.spool: Spool | None = None  # points on local disk until the store has them
        self.compactor: Compactor | None = None
        self.answers = 0  # chunks the store took: a flush that wrote one shows the store answers
        # the helper process writes the chunks (LAUNCHHELM_HELPER_FLUSH; see hand_over): how to reach it
        self.handing = False
        self._send: Callable[[bytes], object | None] | None = None
        self._acknowledged: Callable[[int, float, object], str] | None = None
        self._ready: Callable[[], bool] | None = None
        self.ending = False  # the session's end: its last request asks the helper for the final compaction
        self.deadline: float | None = None  # monotonic: how long the end waits for the helper
        self._requests = 0  # flush requests sent to the helper
        self.latest: dict[str, float] = {}  # while handing: each key's last value since the last request
        self.on_latest: Callable[[dict[str, float]], None] | None = None
        self.final_acknowledged = False  # the helper also did the end's compaction
        # set once the helper that is to write the chunks started, or could not: a flush() before waits
        self.helper_started: threading.Event | None = None

    def append(self, step: int, attempt: int, now: float, row: dict[str, float]) -> None:
        """``log()``'s append: to the spool, and to memory unless it let go of points."""
        with self.lock:
            if self.spool is not None:
                self.spool.append(step, attempt, now, row)
            if not self.spilled:
                if self.buffer.append(step, attempt, now, row):
                    self.cut()
            elif self.handing:
                self.latest.update(row)  # the summary's latest values: the chunks are the helper's

    def set_memory(self, compaction_memory: int) -> None:
        """Size the buffers from the ``compaction_memory`` setting (see docs/long-runs.md)."""
        self.compaction_memory = compaction_memory
        # a chunk: its bytes are kept for the compactor, and its decoded table is read by it: a few of
        # them fit the working set
        self.chunk_values = max(1024, compaction_memory // 128)
        self.max_held = max(self.chunk_values, compaction_memory // 4 // BYTES_PER_VALUE)
        self.buffer.limit = self.chunk_values

    def open_spool(self, project: str, flush_interval: float) -> None:
        """Open the session's spool, unless the store dies with the process anyway or ``LAUNCHHELM_SPOOL=off``."""
        self.spool = _open_spool(self.store, self.run_id, self.session_id, project, flush_interval)
        if self.spool is not None:
            self.flushed_end = self.spool.position()

    def cut(self) -> None:
        """Seal the buffer (under ``lock``): it becomes one chunk, ending where the spool stands now.

        Past ``max_held`` values waiting, memory lets go of them all: they are in
        the spool, and the flushes read them from there until they catch up.
        """
        buffer, spool = self.buffer, self.spool
        self.buffer = PointBuffer(self.keys, self.chunk_values)
        if not len(buffer):
            return
        buffer.end = spool.position() if spool is not None else None
        self.sealed.append(buffer)
        self.held += len(buffer)
        if spool is not None and self.held > self.max_held:
            self.spilled = True
            self.sealed, self.held = [], 0

    def flush(self, drain: bool = True) -> bool:
        """Write what is buffered; with ``drain``, also every point spooled when the buffer let go.

        Each cut buffer is one chunk. A chunk's ``create`` that fails leaves it
        (and those after it) for the next try, unless memory let go of them
        meanwhile: then the spool has them. Without ``drain``, stops once a
        segment's worth of chunk bytes waits for compaction (they are kept for
        it: memory), and returns True: more is left for the next round, after
        the compaction.
        """
        started = self.helper_started
        if started is not None and not started.is_set():
            if not drain:
                return False  # the points wait for the helper that is starting (in the spool, and memory)
            started.wait(HELPER_START_WAIT)
        if self.handing:
            return self._hand(drain)
        with self.io_lock:
            while True:
                spool = self.spool
                with self.lock:
                    spilled = self.spilled and spool is not None
                    if spilled:
                        assert spool is not None
                        end, names = spool.position(), spool.key_names()
                        work: list[PointBuffer] = []
                    else:
                        self.cut()
                        work, self.sealed, self.held = self.sealed, [], 0
                if not spilled:
                    for i, buffer in enumerate(work):
                        try:
                            self.write_chunk(buffer, buffer.end)
                        except BaseException:
                            self.put_back(work[i:])
                            raise
                        if not drain and i + 1 < len(work) and self.unsealed_bytes >= BYTES_PER_SEGMENT:
                            self.put_back(work[i + 1 :])
                            return True
                    return False
                assert spool is not None and self.flushed_end is not None
                for piece in read_spool(
                    spool.dir, self.session_id, self.flushed_end, end, names, max_bytes=self.chunk_values * 12
                ):
                    self.write_chunk(piece.buffer, piece.end)
                    if not drain and self.unsealed_bytes >= BYTES_PER_SEGMENT:
                        break
                    pause()
                with self.lock:
                    if self.flushed_end == spool.position():
                        self.spilled = False  # caught up: log() buffers again
                        return False
                if not drain:
                    return True

    # -- the helper writes the chunks (launchhelm._metrics._pickup) -------------------------------
    def hand_over(
        self,
        send: Callable[[bytes], object | None],
        acknowledged: Callable[[int, float, object], str],
        ready: Callable[[], bool] | None = None,
    ) -> None:
        """From now on the helper writes the chunks: memory lets go of the points (the spool has them all).

        ``send`` writes a line to the helper and returns a token for it (None: it is gone);
        ``acknowledged(seq, timeout, token)`` waits for the helper to have stored request ``seq``:
        ``"stored"``, ``"gone"`` (that helper died), or ``"late"``; ``ready()``: whether the helper
        loaded its encoder (a session ending before that, with no request sent, writes its points here).
        """
        if self.spool is None:
            return
        with self.io_lock, self.lock:
            for buffer in [*self.sealed, self.buffer]:
                self.latest.update(buffer.latest())
            self.sealed, self.held, self.spilled = [], 0, True
            self.buffer = PointBuffer(self.keys, self.chunk_values)
            self._send, self._acknowledged, self._ready = send, acknowledged, ready
            self.handing = True

    def take_back(self) -> None:
        """The helper is gone for good: this process writes the chunks again, from the spool's state file."""
        with self.io_lock:
            self._take_back(warm=True)

    def _take_back(self, *, warm: bool) -> None:
        """(under ``io_lock``) ``warm``: load the encoder now, as ``init`` did for a long run (and its pool)."""
        from launchhelm._metrics._spool import resume_point

        spool = self.spool
        if not self.handing or spool is None:
            return
        if warm:
            warm_up_encoder()
        next_number, flushed = resume_point(self.store, self.run_id, self.session_id, spool.state())
        self.chunk_number, self.flushed_end = next_number, flushed
        self.handing = False  # still spilled: the next flush reads the spool from ``flushed``

    def _hand(self, drain: bool) -> bool:
        """A flush request to the helper; with ``drain``, wait until it stored it (and compacted, at the end)."""
        from launchhelm._exceptions import StoreUnreachableError

        with self.io_lock:
            spool, send, acknowledged, ready = self.spool, self._send, self._acknowledged, self._ready
            handing = self.handing and spool is not None and send is not None and acknowledged is not None
            if handing and self.ending and not self._requests and ready is not None and not ready():
                # a session ending before its helper loaded the encoder, with nothing sent: the helper
                # never writes (it writes only what it is asked), and this process stores the points
                # sooner than it would wait for that import (a short script, a test)
                self._take_back(warm=False)
                handing = False
            if handing:
                assert spool is not None and send is not None
                with self.lock:
                    end, names = spool.position(), spool.key_names()
                    latest, self.latest = self.latest, {}
                if latest and self.on_latest is not None:
                    self.on_latest(latest)
                self._requests += 1
                seq = self._requests
                final = drain and self.ending
                token = send(flush_line(seq, end, names, final=final))
        if not handing:
            return self.flush(drain) if not self.handing else False  # taken back meanwhile
        assert spool is not None and acknowledged is not None
        if not drain:
            return False  # not sent: the helper is gone, and the points wait in the spool for the next one
        if self.deadline is not None:
            timeout = max(0.0, self.deadline - time.monotonic())
        else:
            timeout = float(os.environ.get("LAUNCHHELM_FINISH_TIMEOUT") or 120.0)
        outcome = acknowledged(seq, timeout, token) if token is not None else "gone"
        if outcome == "stored":
            self.flushed_end = end
            self.final_acknowledged = final
            return False
        if outcome == "late":  # alive, and the store did not take the points in time: they stay in the spool
            raise StoreUnreachableError(
                f"run {self.run_id}: its helper process did not store the points within {timeout:.0f} s; "
                f"they are in the spool at {spool.dir}"
            )
        self.take_back()  # that helper died: this process writes them (a replacement is handed over again)
        return self.flush(drain)

    def put_back(self, buffers: list[PointBuffer]) -> None:
        with self.lock:
            if self.spilled:
                return  # memory let go of them meanwhile: the spool has them
            self.sealed[:0] = buffers
            self.held += sum(map(len, buffers))
            if self.spool is not None and self.held > self.max_held:
                self.spilled = True
                self.sealed, self.held = [], 0

    def write_chunk(self, buffer: PointBuffer, end: tuple[int, int] | None) -> None:
        """One chunk with ``buffer``'s points; the spool then says the store has every point before ``end``."""
        spool = self.spool
        if len(buffer):
            data = encode_buffer(buffer)
            first, last = buffer.step_range()
            while True:
                key = chunk_key(self.run_id, self.session_id, self.chunk_number, first, last)
                self.chunk_number += 1
                if spool is not None and end is not None:
                    spool.pending(self.chunk_number - 1, end, self.chunk_number)
                try:
                    self.store.create(key, data)
                    self.answers += 1  # the store answered: an outage's end is said after a real request
                    self.unsealed[key] = data  # the compactor needs no GET for our own chunks
                    self.unsealed_bytes += len(data)
                    break
                except AlreadyExistsError:
                    continue  # a chunk number taken by an earlier, ambiguous write
        if spool is not None and end is not None:
            spool.flushed(end, self.chunk_number)
            self.flushed_end = end
        self._on_chunk(buffer)
        give_back_free_heap(grown=TRIM_AFTER_GROWTH)

    def compact(self, *, only_if_due: bool) -> None:
        """Fold sealed chunks into segments (background thread, and once at the end of the session).

        Never fatal: the chunks stay readable as they are, and the next
        session or ``launchhelm compact`` finishes the work.
        """
        if self.final_acknowledged:
            return  # the helper compacted at the session's end
        with self.io_lock:  # a consistent view of what flush has written
            known = self.unsealed
            if only_if_due and len(known) < CHUNKS_PER_SEGMENT and sum(map(len, known.values())) < BYTES_PER_SEGMENT:
                return
            self.unsealed, self.unsealed_bytes = {}, 0
        if self.compactor is None:
            self.compactor = Compactor(self.store, self.run_id, by=self.session_id, memory=self.compaction_memory)
        compactor = self.compactor
        compactor.known.update(known)
        started = time.time()
        try:
            # while live: no listing (see Compactor.compact_live); at the end: a listing covers
            # everything, evaluation scores too, and collects what aged
            if only_if_due:
                result = compactor.compact_live(only_if_due=False)
            else:
                result = compactor.compact(only_if_due=False)
            if result is not None and result.merged:
                give_back_free_heap()
        except AlreadyExistsError as exc:
            # another compaction published that object first (a racing session, or a compaction of
            # this one run from another thread): not an outage, and the next round starts from it
            _log.debug("run %s: a compaction lost a race, the next one goes on: %s", self.run_id, exc)
        except OSError as exc:  # the store: an outage is said once, by the run's _store_failed
            self._on_store_error(exc, sent=started)
        except Exception as exc:
            _log.warning("run %s: could not compact its metrics (%s); they stay readable as chunks", self.run_id, exc)
        if sum(map(len, compactor.known.values())) > min(4 * BYTES_PER_SEGMENT, compactor.memory // 4):
            compactor.forget()  # bounded: a later compaction lists and GETs them instead

    def close(self) -> None:
        """The session ended with the store: the spool's points are stored, the compactor's copies too."""
        if self.spool is not None:
            self.spool.close(remove=True, keep_media=True)  # media the store did not take in time stay
            self.spool = None

    def close_compactor(self) -> None:
        if self.compactor is not None:
            self.compactor.close()  # its local copies of segments: the store has them

    def abandon(self) -> Spool | None:
        """The session ends without the store: keep the spool on disk, drop the points held in memory.

        Returns the spool left behind (None: there was none, nothing else was done).
        """
        spool, self.spool = self.spool, None
        if spool is None:
            return None
        spool.close(remove=False)
        with self.lock:
            self.sealed, self.held, self.spilled = [], 0, False
            self.buffer = PointBuffer(self.keys, self.chunk_values)
        return spool

    def discard(self) -> None:
        """Drop every point not stored yet, spool included (a fenced session's are not the run's)."""
        spool, self.spool = self.spool, None
        if spool is not None:
            spool.close(remove=True)
        with self.lock:
            self.sealed, self.held, self.spilled = [], 0, False
            self.buffer = PointBuffer(self.keys, self.chunk_values)

    def held_points(self) -> str:
        """Where the points the store lacks are held, for the outage line."""
        with self.lock:
            held = self.held + len(self.buffer)
            spilled = self.spilled
        where = f"in the spool at {self.spool.dir}" if self.spool is not None else "in memory only"
        if spilled:
            return f"points are held {where}"
        return f"{held:,} values are held in memory" + (f" and {where}" if self.spool is not None else "")


def flush_line(seq: int, end: tuple[int, int], names: dict[int, str], final: bool) -> bytes:
    """One flush request for the helper's stdin (launchhelm._metrics._pickup reads it)."""
    message = {"flush": list(end), "keys": {str(k): v for k, v in names.items()}, "seq": seq, "final": final}
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _spooled(store: Store) -> bool:
    """Whether a session on ``store`` has a spool: not where the store dies with the process anyway, nor
    with ``LAUNCHHELM_SPOOL=off``."""
    in_process = "memory" in store.protocol.split("::")  # memory://, or chained onto one (dir::memory://)
    return not in_process and os.environ.get("LAUNCHHELM_SPOOL", "").lower() not in ("0", "off", "false")


def encodes_here(store: Store) -> bool:
    """Whether this process will encode its chunks on ``store``: it has no spool for a helper to read,
    or its helper does not flush (no ``LAUNCHHELM_HELPER_FLUSH=1``). Then ``init`` loads the encoder and
    the flush thread yields."""
    return not helper_flushes() or not _spooled(store)


def _open_spool(store: Store, run_id: str, session_id: str, project: str, flush_interval: float) -> Spool | None:
    """The session's spool, unless the store dies with the process anyway or ``LAUNCHHELM_SPOOL=off``."""
    if not _spooled(store):
        return None
    meta = {
        "run": run_id,
        "session": session_id,
        "project": project,
        "store": store.url,
        "process": process_identity(),
        "created": time.time(),
    }
    try:
        return Spool(run_id, session_id, meta)
    except OSError as exc:  # a read-only home: run on, with the flush interval as the only loss bound
        _log.warning(
            "launchhelm: no metrics spool for run %s (%s): a hard crash loses up to %.0fs of points",
            run_id,
            exc,
            flush_interval,
        )
        return None
