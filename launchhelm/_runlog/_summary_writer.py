"""A live session's heartbeats and its run's summary (the runs table's row).

The session is the summary's single writer: it puts one after each event it
appends, and every ``SUMMARY_EVERY``-th heartbeat is the summary instead (it
carries the heartbeat). A checkpoint load, which blocks the training loop,
leaves its summary to a thread kept for that.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

from launchhelm._runlog._events import EventLog
from launchhelm._runlog._records import Json
from launchhelm._runlog._sessions import encode_heartbeat, heartbeat_key, summary_key
from launchhelm._runlog._summary import encode_summary
from launchhelm.storage import Store

if TYPE_CHECKING:
    from launchhelm._metrics._buffer import PointBuffer

__all__ = ["SUMMARY_EVERY", "SummarySubject", "SummaryWriter"]

#: Every this many heartbeats, the session puts its run's summary instead (it carries the heartbeat).
SUMMARY_EVERY = 3

_log = logging.getLogger("launchhelm")


class SummarySubject(Protocol):
    """What a summary says of the live run (``launchhelm.Run``), read when it is put."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def project(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def config(self) -> Mapping[str, Json]: ...
    @property
    def tunables(self) -> Mapping[str, Json]: ...
    @property
    def reached(self) -> int: ...
    @property
    def _records_events(self) -> bool: ...
    def _helper_pid(self) -> int | None: ...

    _last_error: BaseException | None


class SummaryWriter:
    """Puts the session's heartbeats and the run's summary, in order, never an older over a newer."""

    def __init__(
        self, store: Store, events: EventLog, run: SummarySubject, *, created: float, heartbeat_interval: float
    ) -> None:
        self._store = store
        self._events = events
        self._run = run
        self._created = created
        self._heartbeat_interval = heartbeat_interval
        # the run's summary: latest value of each metric flushed (kept by the flush, never by log())
        self.latest: dict[str, float] = {}
        self._latest_lock = threading.Lock()
        self._summary_lock = threading.Lock()  # puts in order: a newer summary is never overwritten by an older
        self.beats = 0
        self._deferred = 0  # inside one_summary(): events owe one summary at its end
        self._owed = False
        # summaries put after a load returned, by one thread kept for them (see soon)
        self._thread: threading.Thread | None = None
        self._cv = threading.Condition()
        self._asked = 0  # of that thread
        self._done = 0  # by it: a summary put (or given up) covers every ask before it began
        self._end = False

    def beat(self) -> None:
        run = self._run
        self._store.put(
            heartbeat_key(run.id, run.session_id),
            encode_heartbeat(run.reached, self._heartbeat_interval, run._helper_pid()),
        )

    def heartbeat(self) -> None:
        """The background beat: every SUMMARY_EVERY-th one is the summary (no more requests than before)."""
        self.beats += 1
        if self.beats % SUMMARY_EVERY == 0:
            self.put()
        else:
            self.beat()

    def note_latest(self, buffer: PointBuffer) -> None:
        """After a flush: the latest value of each metric stored, for the summary."""
        latest = buffer.latest()
        with self._latest_lock:
            self.latest.update(latest)

    def note_values(self, latest: dict[str, float]) -> None:
        """The latest value of each metric handed to the helper process to store (it writes the chunks)."""
        with self._latest_lock:
            self.latest.update(latest)

    def put(self) -> None:
        """Put the run's summary: the heartbeat plus its runs-table row (single writer: this session)."""
        run = self._run
        if not run._records_events:
            return  # a DDP follower: rank 0's session writes it
        with self._summary_lock:
            state = self._events.state(refresh=False)  # what this session appended and saw
            with self._latest_lock:
                metrics = dict(self.latest)
            body = encode_summary(
                run_id=run.id,
                name=run.name,
                project=run.project,
                created=self._created,
                config=run.config,
                tunables=run.tunables,
                state=state,
                session_id=run.session_id,
                step=run.reached,
                interval=self._heartbeat_interval,
                metrics=metrics,
                helper=run._helper_pid(),
            )
            self._store.put(summary_key(run.id), body)

    @contextlib.contextmanager
    def one_summary(self) -> Iterator[None]:
        """Events appended inside share one summary, put at the end from a short-lived thread
        (:meth:`soon`): a load's rewind and restore, on the path that blocks the training
        loop, wait for neither that request nor its fsync."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1
            if not self._deferred and self._owed:
                self._owed = False
                self.soon()

    def soon(self) -> None:
        """Have the summary thread put the summary, so the caller (a checkpoint load, which blocks
        the training loop) returns without waiting for that write and its fsync.

        The events themselves are durable before the caller returns; a summary a moment behind
        the log only makes a reader fold this run's last events (docs/storage.md, "Runs table").
        The thread is kept for the next load (starting one takes the GIL from the load's last
        steps); asks made while it is busy are covered by its next put.
        The session's end waits for it and ends it (:meth:`settle`)."""
        with self._cv:
            self._asked += 1
            thread = self._thread
            if thread is None or not thread.is_alive():  # the first ask, or after a fork or an idle end
                thread = threading.Thread(target=self._summaries, name="launchhelm-summary", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # no thread to be had (interpreter shutting down): put it here
                    thread = None
                self._thread = thread
                self._end = False
            self._cv.notify_all()
        if thread is None:
            self.after_event({})
            with self._cv:
                self._done = self._asked

    def _summaries(self) -> None:
        """The summary thread: put one summary for all asks so far, wait for the next; end after a
        minute idle (a later ask starts another) or when the session ends."""
        while True:
            with self._cv:
                while self._done >= self._asked and not self._end:
                    if not self._cv.wait(60) and self._done >= self._asked:
                        self._end = True
                if self._done >= self._asked:  # ended, nothing owed
                    if self._thread is threading.current_thread():
                        self._thread = None
                    self._cv.notify_all()
                    return
                asked = self._asked
            try:
                self.after_event({})
            finally:
                with self._cv:
                    self._done = max(self._done, asked)
                    self._cv.notify_all()

    def settle(self, end: bool = False) -> None:
        """Wait until every summary asked of :meth:`soon` is put; ``end``: and end its thread."""
        with self._cv:
            thread = self._thread
            if thread is None or thread is threading.current_thread():
                return
            while self._done < self._asked and thread.is_alive():
                self._cv.wait(0.5)
            if end:
                self._end = True
                self._cv.notify_all()
        if end:
            thread.join()

    def after_event(self, event: Mapping[str, object]) -> None:
        """Each event this session appends is followed by a summary that reflects it."""
        if self._deferred:
            self._owed = True
            return
        try:
            self.put()
        except Exception as exc:  # the event is in: a summary behind the log is only slower to read
            self._run._last_error = exc
            _log.debug("run %s: could not put its summary after event %s: %s", self._run.id, event.get("seq"), exc)
