"""Flushing in the helper process (issue 40; the protocol is docs/storage.md's "Flushing in the helper").

The default (``LAUNCHHELM_HELPER_FLUSH=0`` turns it off). The training process
keeps no point in memory for the store: ``log()`` writes the spool only, and
at each flush tick the session's background thread sends the helper one line
on its stdin, ``{"flush": [file, offset], "keys": {id: name}, "seq": n,
"final": bool}``: the spool's position taken under the append lock (a pipe's
lines arrive whole and in order, so the helper never follows the writer by
scanning a record being written), and every key the spool defined so far (a
replacement helper needs them all). The helper reads the records up to that
position, writes them as chunks with the spool state file's pending-then-
flushed protocol that ``launchhelm recover`` already reads (so a helper killed
mid-chunk is taken over by the next one, or by a recovery, exactly once),
deletes spool files the store has wholly, compacts its own chunks, and then
writes ``n`` into the session's shared page (:data:`FLUSHED_SLOT`): that is
the acknowledgement ``flush()`` and ``finish()`` wait for. A message with
``final`` is acknowledged once the final compaction is done too.

The state file's writer is whoever holds its ``flock``: the helper for each
round, a recovery (the drain after the training process died, ``launchhelm
recover``) for its own, and the training process itself once it took the
work back (its helper was given up on, or died at ``finish()``).
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launchhelm._runlog._watchdog import FLUSHED_SLOT, READY_SLOT, SLOTS

if TYPE_CHECKING:
    from launchhelm._helper import HelperConfig

__all__ = ["PointPickup", "wait_acknowledged"]

_log = logging.getLogger("launchhelm")

#: Bytes of spool read per chunk: as the training process's own flushes read a spool back.
READ_BYTES = 12 * (1 << 20)


class PointPickup:
    """A thread of the helper: writes the chunks of the spool's records up to each position it is sent."""

    #: Seconds between tries while the store does not answer.
    RETRY = 1.0
    #: Seconds after its start that the thread loads the encoder, unless a request comes first.
    WARM_AFTER = 2.0

    def __init__(self, config: HelperConfig) -> None:
        self.config = config
        self.directory = Path(config.spool or ".") / config.run_id
        self._inbox: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._busy = threading.Lock()  # held for a round: stop() waits for the chunk in hand
        self._store: Any = None
        self._compactor: Any = None
        self._unsealed: dict[str, bytes] = {}
        self._removed = 0  # spool files below this number are deleted
        self._page: mmap.mmap | None = None
        self._thread = threading.Thread(target=self._run, name="launchhelm-flush", daemon=True)

    @classmethod
    def start(cls, config: HelperConfig) -> PointPickup | None:
        if not config.flush or not config.spool or config.rank != 0:
            return None
        pickup = cls(config)
        pickup._thread.start()
        return pickup

    def offer(self, message: dict[str, Any]) -> None:
        """A line from the training process (ParentWatch reads the pipe)."""
        if "flush" in message:
            self._inbox.put(message)

    def stop(self, timeout: float) -> None:
        """Stop after the chunk in hand: what is left is a drain's (it takes the state file's lock in turn)."""
        self._stop.set()
        self._inbox.put({})
        self._thread.join(timeout)

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        from launchhelm._metrics._pause import yield_on_wakeup

        yield_on_wakeup()  # this thread only, in the helper: on waking it never takes a core at once
        from launchhelm._metrics._flusher import warm_up_encoder

        # the encoder's and compactor's imports, once asked or after WARM_AFTER: a session that ends sooner
        # (a short script, a test) writes its points itself (MetricFlusher._hand) and costs no second import
        try:
            early: dict[str, Any] | None = self._inbox.get(timeout=self.WARM_AFTER)
        except queue.Empty:
            early = None
        if self._stop.is_set():
            return
        warm_up_encoder()
        self._mark(READY_SLOT, 1)
        want: dict[str, Any] | None = None
        failing = False
        while not self._stop.is_set():
            if early is not None:
                got, early = early, None
            else:
                try:
                    got = self._inbox.get(timeout=None if want is None else self.RETRY)
                except queue.Empty:
                    got = None
            # positions are absolute: the newest request covers the ones before it (a final one stays final)
            while got is not None:
                if got:
                    final = bool(got.get("final")) or bool(want and want.get("final"))
                    want = {**got, "final": final}
                try:
                    got = self._inbox.get_nowait()
                except queue.Empty:
                    got = None
            if self._stop.is_set() or want is None:
                continue
            try:
                with self._busy:
                    self._round(want)
            except Exception as exc:  # the store: the points wait in the spool, the next round tries again
                if not failing:
                    from launchhelm._exceptions import StoreUnreachableError

                    quiet = isinstance(exc, (StoreUnreachableError, ConnectionError)) or not self.directory.is_dir()
                    _log.log(
                        logging.DEBUG if quiet else logging.WARNING,
                        "launchhelm: run %s: its helper could not store points yet: %s",
                        self.config.run_id,
                        exc,
                    )
                failing = True
                self._stop.wait(self.RETRY)
                continue
            failing = False
            self._mark(FLUSHED_SLOT, int(want.get("seq", 0)))
            want = None

    def _mark(self, slot: int, value: int) -> None:
        """Write a slot of the session's shared page: an acknowledgement, or that this thread is ready."""
        if self._page is None:
            try:
                with open(self.config.beacon, "r+b") as file:
                    self._page = mmap.mmap(file.fileno(), 8 * SLOTS)
            except (FileNotFoundError, ValueError, OSError):
                return  # the session ended: nobody waits
        memoryview(self._page).cast("q")[slot] = value

    def _round(self, want: dict[str, Any]) -> None:
        """Chunks of the records up to ``want``'s position, under the state file's lock."""
        from launchhelm._locks import flock_within

        config = self.config
        state_path = self.directory / f"{config.session}.state"
        try:
            fd = os.open(state_path, os.O_RDWR)
        except FileNotFoundError:
            return  # the session's spool is gone (its end removed it, or a fence): nothing to write
        try:
            if not flock_within(fd, 10.0, 0.05):
                raise TimeoutError(f"the spool's state {state_path} is held by another writer")
            if os.fstat(fd).st_nlink == 0:
                return  # recovered meanwhile
            with mmap.mmap(fd, 0) as page:
                self._write(page, want)
        finally:
            os.close(fd)  # releases the lock
        self._compact(final=bool(want.get("final")))

    def _write(self, page: mmap.mmap, want: dict[str, Any]) -> None:
        from launchhelm._exceptions import AlreadyExistsError
        from launchhelm._metrics._buffer import read_spool
        from launchhelm._metrics._points import chunk_key, encode_buffer
        from launchhelm._metrics._spool import STATE, resume_point, state_of

        config = self.config
        store = self._open()
        next_number, flushed = resume_point(store, config.run_id, config.session, state_of(page))
        end = (int(want["flush"][0]), int(want["flush"][1]))
        names = {int(k): str(v) for k, v in dict(want.get("keys") or {}).items()}
        if flushed >= end:
            return
        for piece in read_spool(self.directory, config.session, flushed, end, names, max_bytes=READ_BYTES):
            buffer = piece.buffer
            if len(buffer):
                data = encode_buffer(buffer)
                first, last = buffer.step_range()
                while True:
                    key = chunk_key(config.run_id, config.session, next_number, first, last)
                    next_number += 1
                    STATE.pack_into(page, 0, next_number, next_number - 1, *piece.end, *flushed)
                    try:
                        store.create(key, data)
                    except AlreadyExistsError:
                        continue  # a number an earlier, ambiguous write took
                    self._unsealed[key] = data  # the compactor needs no GET for these
                    break
            flushed = piece.end
            STATE.pack_into(page, 0, next_number, -1, 0, 0, *flushed)
            for k in range(self._removed, flushed[0]):  # files the store has wholly
                (self.directory / f"{config.session}-{k:06d}.log").unlink(missing_ok=True)
            self._removed = max(self._removed, flushed[0])

    def _open(self) -> Any:
        if self._store is None:
            from launchhelm.storage import open_store

            self._store = open_store(self.config.store, self.config.storage_options)
        return self._store

    def _compact(self, *, final: bool) -> None:
        """Fold this helper's chunks into segments: when due, and all of them at the end (as a session does)."""
        from launchhelm._exceptions import AlreadyExistsError
        from launchhelm._metrics._compact import BYTES_PER_SEGMENT, CHUNKS_PER_SEGMENT, Compactor

        known = self._unsealed
        due = len(known) >= CHUNKS_PER_SEGMENT or sum(map(len, known.values())) >= BYTES_PER_SEGMENT
        if not final and not due:
            return
        if self._compactor is None:
            self._compactor = Compactor(self._open(), self.config.run_id, by=self.config.session)
        self._compactor.known.update(known)
        self._unsealed = {}
        try:
            if final:
                self._compactor.compact(only_if_due=False)
                self._compactor.close()
                self._compactor = None
            else:
                self._compactor.compact_live(only_if_due=False)
        except AlreadyExistsError as exc:  # another compaction published first: the next one goes on
            _log.debug("run %s: a compaction lost a race: %s", self.config.run_id, exc)


def wait_acknowledged(slots: Any, seq: int, alive: Any, deadline: float) -> bool:
    """Wait until the helper acknowledged ``seq`` (True), it is gone, or ``deadline`` (False)."""
    pause = 0.002
    while True:
        if int(slots[FLUSHED_SLOT]) >= seq:
            return True
        if not alive() or time.monotonic() >= deadline:
            return int(slots[FLUSHED_SLOT]) >= seq
        time.sleep(pause)
        pause = min(0.005, pause * 2)  # a memory read: polling often costs nothing, and finish() waits less
