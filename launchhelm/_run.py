"""Writing a run: ``log``, ``flush``, ``finish`` of the live session.

``log()`` only validates and appends to an in-memory buffer (a few
microseconds); a background thread writes the buffer as immutable chunks
every ``flush_interval`` seconds and rewrites the session's heartbeat every
``heartbeat_interval`` seconds. ``flush()``, ``finish()`` and interpreter
exit write what is buffered.

:class:`Run` drives the session (its background thread, step boundaries,
checkpoints, the end) and holds collaborators for the rest: the metric
flusher (``metrics/_flusher``), the summary writer (``runlog/_summary_writer``),
the control poller (``runlog/_control_poller``), the console writer
(``console/_writer``) and the outage reporter (``runlog/_outage``). ``init`` lives in ``_start``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import signal
import subprocess
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from launchhelm._console._writer import ConsoleWriter
from launchhelm._evaluation._queue import on_checkpoint_published
from launchhelm._exceptions import (
    InvalidArgumentError,
    InvalidMetricError,
    InvalidTypeError,
    LaunchHelmError,
    PathNotFoundError,
    RunFinishedError,
    RunPreempted,
    RunStopped,
)
from launchhelm._helper import MAX_REPLACED, Helper
from launchhelm._metrics._flusher import MetricFlusher
from launchhelm._metrics._pause import helper_flushes
from launchhelm._metrics._pickup import wait_acknowledged
from launchhelm._metrics._points import coerce_value, validate_key
from launchhelm._metrics._system import SystemSampler
from launchhelm._runlog._checkpoints import artifact_prefix, new_artifact_id, upload_path
from launchhelm._runlog._control_poller import ControlPoller
from launchhelm._runlog._events import (
    CHECKPOINT,
    CONTROL_ACTION,
    CONTROL_APPLIED,
    CONTROL_TUNABLES,
    RESUME_CHOICE_CONSUMED,
    REWIND,
    SESSION_ENDED,
    EventLog,
)
from launchhelm._runlog._live_sessions import add_live, discard_live
from launchhelm._runlog._outage import OutageReporter
from launchhelm._runlog._preempt import PREEMPT_ACTION, PreemptionListener, PreemptionSettings, requeue_slurm_job
from launchhelm._runlog._sessions import env_seconds
from launchhelm._runlog._summary_writer import SummaryWriter
from launchhelm._runlog._table import mark_row
from launchhelm._runlog._watchdog import READY_SLOT, Beacon
from launchhelm._runlog._watchdog import STEP_SLOT as _STEP_SLOT
from launchhelm._types import Rewind
from launchhelm.media._handoff import seal_handed, store_handoff
from launchhelm.media._types import Prepared, prepare_media
from launchhelm.media._writer import MediaWriter
from launchhelm.storage import Store

__all__ = ["Run"]

_TunablesCallback = TypeVar("_TunablesCallback", bound=Callable[[dict[str, Any]], object])
_CheckpointCallback = TypeVar("_CheckpointCallback", bound=Callable[[], object])
_RewindCallback = TypeVar("_RewindCallback", bound=Callable[[Rewind], object])

#: Seconds between background metric flushes (``LAUNCHHELM_FLUSH_INTERVAL``).
DEFAULT_FLUSH_INTERVAL = 2.0
#: Seconds between polls for control requests (``LAUNCHHELM_CONTROL_INTERVAL``). 3.5 s, not 3 s as
#: before compaction: its 2 requests per 32 flushes are paid for, and requests per second stay level.
DEFAULT_CONTROL_INTERVAL = 3.5
#: Seconds ``finish()`` waits for an unreachable store before leaving the points in the spool
#: (``LAUNCHHELM_FINISH_TIMEOUT``).
DEFAULT_FINISH_TIMEOUT = 60.0

_log = logging.getLogger("launchhelm")


_requeue_registered = False


def _requeue_at_exit() -> None:
    """Ask SLURM to requeue this job (if it is requeueable) when the interpreter exits, once."""
    global _requeue_registered
    if not _requeue_registered:
        import atexit

        _requeue_registered = True
        atexit.register(requeue_slurm_job)


def _check_flag(name: str, value: object) -> None:
    # flags that destroy or take over something must be real bools: "no" is truthy
    if not isinstance(value, bool):
        raise InvalidTypeError(f"{name}={value!r}: pass True or False")


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not hasattr(step, "__index__"):
        raise InvalidTypeError(f"step {step!r} is a {type(step).__name__}; steps are non-negative integers")
    value = int(step.__index__())
    if value < 0:
        raise InvalidMetricError(f"step {value} is negative; steps are non-negative integers")
    return value


_F = TypeVar("_F", bound=Callable[..., Any])


def _not_step_time(method: _F) -> _F:
    """Time in ``method`` (a save, a load) does not count toward a hang."""

    @functools.wraps(method)
    def counted(self: Run, *args: Any, **kwargs: Any) -> Any:
        with self._beacon.not_counting():
            return method(self, *args, **kwargs)

    return cast("_F", counted)


class Run:
    """A run being written by this process (one session of it).

    Create it with :func:`launchhelm.init`. Use it as a context manager to
    finish it on exit (an exception ends the session but keeps the run open,
    so it can be resumed).

    Attributes
    ----------
    id, project, name:
        The run's identity; ``id`` is what ``resume=`` takes.
    config:
        Read-only mapping given at creation.
    session_id:
        This process's session of the run.
    """

    def __init__(
        self,
        *,
        store: Store,
        record: dict[str, Any],
        session_id: str,
        events: EventLog,
        global_step: int,
        attempt: int,
        resumed: bool,
        flush_interval: float,
        heartbeat_interval: float,
        control_seq: int = 0,
        control_interval: float = DEFAULT_CONTROL_INTERVAL,
        tunables: Mapping[str, Any] | None = None,
        control_cursor: int = 0,
        session_seq: int = 0,
        paused: bool = False,
    ) -> None:
        self._store = store
        self.id: str = record["id"]
        self.project: str = record["project"]
        self.name: str = record["name"]
        self.config: Mapping[str, Any] = types.MappingProxyType(dict(record.get("config") or {}))
        self._tunables = types.MappingProxyType(
            dict(record.get("tunables") or {}) if tunables is None else dict(tunables)
        )
        self.session_id = session_id
        self.resumed = resumed
        self._events = events
        # heartbeats and the run's summary (the runs table's row)
        self._summary_writer = SummaryWriter(
            store,
            events,
            self,
            created=float(record.get("created") or 0.0),
            heartbeat_interval=heartbeat_interval,
        )
        events.on_append = self._summary_writer.after_event
        if session_seq:
            events.guard(session_id, session_seq)  # a newer attempt's fence stops this session's writes
        self._fence_handled = False
        self._step = global_step
        self._reached = global_step
        # the page the helper process reads (launchhelm._helper); a plain buffer where none is planned
        self._beacon = Beacon()
        self._progress = self._beacon.slots
        self._progress[_STEP_SLOT] = global_step
        self._helper: Helper | None = None
        self._helper_plan: dict[str, Any] | None = None  # the helper the background thread starts
        self._helper_lock = threading.Lock()  # its start (background thread) against the session's end
        self._helper_over = False  # the session ended: a helper started now is stopped at once
        self._points_to_helper = False  # its helper writes the chunks (LAUNCHHELM_HELPER_FLUSH)
        self._attempt = attempt
        self._lock = threading.Lock()  # log()'s appends, the control requests handed over
        # points not yet stored: buffered, spooled, written as chunks, compacted (see MetricFlusher)
        self._flusher = MetricFlusher(
            store,
            self.id,
            session_id,
            self._lock,
            on_chunk=self._summary_writer.note_latest,
            on_store_error=self._store_failed,
        )
        # images, tables, histograms: encoded and stored by the media thread, indexed at each flush
        self._media = MediaWriter(
            store, self.id, session_id, self._flusher.compaction_memory, on_store_error=self._store_failed
        )
        self._known_keys: set[str] = set()
        self._system_interval: float | None = None  # seconds between system samples (None: no sampler)
        self._sampler: SystemSampler | None = None
        self._capture_console = False  # set by start_run: capture stdout/stderr while the session lives
        self._console = ConsoleWriter(store, self.id, session_id)
        self._finished = False
        self._flush_interval = flush_interval
        self._heartbeat_interval = heartbeat_interval
        self._stop = threading.Event()
        self._last_error: BaseException | None = None
        # one line when the store stops answering, one when it answers again
        self._outage = OutageReporter(self.id, store.url, self._flusher.held_points)
        self._control_seq = control_seq
        self._control_interval = control_interval
        self._session_seq = session_seq  # our session_started event: older actions are dropped
        # control requests found in the log, handed to the training thread at a step boundary
        self._control_poller = ControlPoller(events, self._lock, cursor=control_cursor, session_seq=session_seq)
        self._paused = paused
        self._tunables_callbacks: list[Callable[[dict[str, Any]], object]] = []
        self._checkpoint_callbacks: list[Callable[[], object]] = []
        self._rewind_callbacks: list[Callable[[Rewind], object]] = []
        self._worker = threading.Thread(target=self._work, name=f"launchhelm-{self.id}", daemon=True)
        self._preemption: PreemptionListener | None = None  # set by start_run when preemption is on
        self._preempted_by: str | None = None  # the notice's signal, once this rank acts on it

    # -- identity -------------------------------------------------------
    @property
    def store(self) -> Store:
        """The store the run lives in."""
        return self._store

    @property
    def tunables(self) -> Mapping[str, Any]:
        """Read-only mapping of the run's tunables, as in force now.

        ``RunHandle.set_tunables()`` from another process changes them at the
        next step boundary (see :meth:`on_tunables_change`); restoring a
        checkpoint brings back the values in force when it was saved.
        """
        return self._tunables

    @property
    def paused(self) -> bool:
        """Paused by ``RunHandle.control("pause")`` (only seen from callbacks: a paused loop waits)."""
        return self._paused

    @property
    def preempted(self) -> bool:
        """True from a preemption notice on (``preemption=True``, or ``auto_resume``).

        The run saves a checkpoint and exits at the next step boundary by
        itself; a loop may read this to skip work first (an evaluation, a
        long data fetch). Under DDP it is True on the rank that got the
        signal at once, and on every rank from the step boundary where they
        agree; stop in step, never on one rank alone (its peers would wait
        in the next collective).
        """
        listener = self._preemption
        return self._preempted_by is not None or (listener is not None and listener.signum is not None)

    @property
    def global_step(self) -> int:
        """The current step; ``log(step=None)`` logs here. Settable."""
        return self._step

    @global_step.setter
    def global_step(self, value: int) -> None:
        step = _check_step(value)
        self._step = step
        self._progress[_STEP_SLOT] = step  # the watchdog's sign of life: one store into shared memory
        if step > self._reached:
            self._reached = step
        if self._control_flag:
            self._step_boundary()

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Time in here is an evaluation in the training loop: it makes no step and is no hang.

        ``hang_timeout`` counts the time between steps; a validation pass of
        ten minutes between two steps would otherwise look like one. Saves,
        loads and pauses are left out the same way by themselves; the
        Lightning and Transformers integrations wrap their evaluation loops
        in this. Costs two stores into shared memory; nests.

        >>> with run.evaluating():
        ...     val_loss = evaluate(model, val_loader)
        """
        with self._beacon.not_counting():
            yield

    @property
    def attempt(self) -> int:
        """The attempt new points are logged under (one more per rewind)."""
        return self._attempt

    def __repr__(self) -> str:
        state = "finished" if self._finished else "live"
        return f"<launchhelm.Run {self.project}/{self.id} {self.name!r} step={self._step} {state}>"

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any] | None:
        """In a notebook, a run left as a cell's last expression shows its run panel."""
        from launchhelm._display import run_mimebundle

        return run_mimebundle(self)

    def _display_(self) -> Any:
        """In marimo too (it asks for ``_display_``): the run panel, its tabs live."""
        from launchhelm._display import marimo_display

        return marimo_display(self)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.finish()
        else:
            self._end_session(close_run=False, reason=f"exception: {type(exc).__name__}: {exc}", ending="crashed")

    # -- logging --------------------------------------------------------
    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Record metric values at ``step`` (default: :attr:`global_step`).

        Values must be real numbers: bool, int, float, numpy scalars or
        one-element torch tensors; NaN and infinities are stored as such.
        A value may also be a :class:`launchhelm.Image`, :class:`launchhelm.Table`
        or :class:`launchhelm.Histogram`, or a list of one kind of them: their
        content is copied here and stored in the background
        (``RunHandle.media()`` reads them). The whole call is checked before
        anything is recorded, so a bad value raises and loses nothing logged
        before.

        Raises
        ------
        InvalidTypeError
            A value is not a real number (the message names the key), a key
            is not a string, or ``step`` is not an integer (also a
            ``TypeError``).
        InvalidMediaError
            An image, table or histogram cannot be stored (its shape, NaN
            pixels, a table over 10,000 rows...); the message names the key
            (also a ``ValueError``). A missing image file raises
            ``PathNotFoundError`` (a ``FileNotFoundError``).
        InvalidMetricError
            A key is empty, has an empty, ``.`` or ``..`` segment, or control
            characters, or is one of the names history frames use for their
            own columns (``step``, ``time``, ``attempt``, ``abandoned``,
            ``run``); or ``step`` is negative (also a ``ValueError``). Nothing
            of the call is recorded.
        RunFinishedError
            ``finish()`` was already called in this process.

        Examples
        --------
        >>> run.log({"loss": 0.42, "lr": 3e-4})            # doctest: +SKIP
        >>> run.log({"eval/accuracy": 0.91}, step=1000)   # doctest: +SKIP
        """
        if self._finished:
            self._check_live()
        if step is None:
            step = self._step
        else:
            if type(step) is not int or step < 0:
                step = _check_step(step)
            self._progress[_STEP_SLOT] = step  # a loop that counts steps only in log() makes steps too
        if type(metrics) is not dict and not isinstance(metrics, Mapping):
            raise InvalidTypeError(f"log() takes a mapping of metric names to numbers, not {type(metrics).__name__}")
        row: dict[str, float] = {}
        media: list[tuple[str, list[Prepared]]] | None = None
        known = self._known_keys
        for key, value in metrics.items():
            if key not in known:
                validate_key(key)
                known.add(key)
            kind = type(value)
            if kind is float:
                row[key] = value
            elif kind is int:
                row[key] = float(value)
            else:
                items = prepare_media(key, value)  # checked and copied; None: not media
                if items is None:
                    row[key] = coerce_value(key, value)
                else:
                    media = [*(media or []), (key, items)]
        if not row and not media:
            return
        if step > self._reached:
            self._reached = step
        now = time.time()
        if row:
            self._flusher.append(step, self._attempt, now, row)
        if media:
            self._media.add(step, self._attempt, now, media)

    def _append_row(self, step: int, now: float, row: dict[str, float]) -> None:
        """``log()``'s append, for rows the background thread makes (system metrics)."""
        self._flusher.append(step, self._attempt, now, row)

    def _set_memory(self, compaction_memory: int) -> None:
        """Size the buffers from the ``compaction_memory`` setting (see docs/long-runs.md)."""
        self._flusher.set_memory(compaction_memory)
        self._media.max_bytes = compaction_memory  # media waiting in memory: the same bound

    def flush(self) -> None:
        """Write every buffered point to the store now (blocking)."""
        self._flush(drain=True)

    def _flush(self, drain: bool = True) -> bool:
        """Write what is buffered (see :meth:`MetricFlusher.flush`) and the media index; subclasses hook here.

        With ``drain``, first waits for the media thread to store every item logged.
        """
        more = self._flusher.flush(drain)
        if drain:
            timeout = env_seconds("LAUNCHHELM_FINISH_TIMEOUT", DEFAULT_FINISH_TIMEOUT)
            began = time.monotonic()
            self._media.drain(timeout)
            # the files handed to the helper: stored and indexed by it (or here, where it is gone)
            left = max(0.0, timeout - (time.monotonic() - began))
            self._media.wait_handed(left, self._helper_alive, self._store_handed_here)
        elif not self._media.handoff and self._media.handed_waiting() and not self._helper_alive():
            self._store_handed_here()  # its helper could not start, or was given up on
        self._media.write_index()
        return more

    def _store_handed_here(self) -> None:
        """The files handed to a helper that is gone: stored by this process, as the helper would."""
        directory = self._media.spool_dir
        if directory is not None:
            self._media.stored += store_handoff(self._store, self.id, self.session_id, directory)

    def _helper_pid(self) -> int | None:
        """The pid of this session's helper while it runs (the heartbeat says it: `launchhelm show`)."""
        helper = self._helper
        return helper.process.pid if helper is not None and helper.process.poll() is None else None

    def _helper_alive(self) -> bool:
        """Whether a helper stores the media handed over: it runs, or is being started or replaced."""
        helper = self._helper
        if helper is not None and helper.process.poll() is None:
            return True
        # the background thread starts the planned one and replaces a dead one, until the session ends:
        # storing the files here meanwhile would race the helper that comes
        return self._worker.is_alive() and not self._stop.is_set() and (helper is not None or bool(self._helper_plan))

    def _flush_console(self, final: bool = False) -> None:
        """Write what the process printed since the last flush as one console object (nothing: no request)."""
        self._console.flush(final)

    def _stop_console(self) -> None:
        """Put stdout and stderr back as they were (fds and ``sys`` objects), keeping what was printed."""
        self._console.stop()

    def _sample_system(self) -> None:
        """One sample of the machine, as points under ``system/`` (background thread only)."""
        if self._sampler is None:
            self._sampler = SystemSampler()
        row = self._sampler.sample()
        if not row:
            return
        self._append_row(self._step, time.time(), row)

    def _compact(self, *, only_if_due: bool) -> None:
        """Fold sealed chunks into segments (see :meth:`MetricFlusher.compact`); never fatal."""
        self._flusher.compact(only_if_due=only_if_due)

    @property
    def _latest(self) -> dict[str, float]:
        """The latest value of each metric stored, as the summary says it (a resumed session's start fills it)."""
        return self._summary_writer.latest

    @property
    def _beats(self) -> int:
        return self._summary_writer.beats

    def _one_summary(self) -> contextlib.AbstractContextManager[None]:
        """Events appended inside share one summary, put after (see :meth:`SummaryWriter.one_summary`)."""
        return self._summary_writer.one_summary()

    def _settle_summary(self, end: bool = False) -> None:
        """Wait until every summary asked for is put; ``end``: and end the thread that puts them."""
        self._summary_writer.settle(end)

    # -- checkpoints and rewinds ----------------------------------------
    @_not_step_time
    def checkpoint(self, path: str | os.PathLike[str], step: int | None = None) -> str:
        """Upload a file or folder as a checkpoint of this run; return its artifact id.

        For code that saves its own checkpoints (any framework): the payload
        is uploaded under a fresh key, verified by size and CRC64NVME, and
        published by an event only once complete, so a crash mid-upload never
        leaves a visible half checkpoint. PyTorch users call
        ``launchhelm.torch``'s ``save_checkpoint()`` instead.

        Parameters
        ----------
        path:
            A file, or a folder (uploaded whole).
        step:
            The step it restores; default :attr:`global_step`.

        Raises
        ------
        PathNotFoundError
            ``path`` does not exist (also a ``FileNotFoundError``).
        InvalidArgumentError
            ``path`` is an empty folder.
        InvalidTypeError
            ``path`` is not a path, or ``step`` is not an integer.
        """
        self._check_live()
        # checked before anything is uploaded, so a bad path leaves no orphan payload behind
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidTypeError(f"checkpoint() takes a file or folder path, not {type(path).__name__} {path!r}")
        local = Path(path)
        if not local.exists():
            raise PathNotFoundError(f"cannot checkpoint {str(path)!r}: no such file or folder", path=str(path))
        if local.is_dir() and not any(p.is_file() for p in local.rglob("*")):
            raise InvalidArgumentError(f"cannot checkpoint {str(path)!r}: the folder is empty")
        step = self._step if step is None else _check_step(step)
        artifact = new_artifact_id(step)
        prefix = artifact_prefix(self.id, artifact)
        fmt, files, checksums, size = upload_path(self._store, prefix, Path(path))
        self._publish_checkpoint(artifact, step=step, fmt=fmt, files=files, checksums=checksums, size=size)
        return artifact

    def _publish_checkpoint(
        self,
        artifact_id: str,
        *,
        step: int,
        fmt: str,
        files: list[dict[str, Any]],
        checksums: dict[str, str],
        size: int,
        world_size: int = 1,
        control_seq: int | None = None,
    ) -> dict[str, Any]:
        self.flush()  # metrics logged before the save are stored by the time it returns
        event = self._events.append(
            CHECKPOINT,
            {
                "session": self.session_id,
                "checkpoint": artifact_id,
                "prefix": artifact_prefix(self.id, artifact_id),
                "step": step,
                "format": fmt,
                "files": files,
                "checksums": checksums,
                "size": size,
                "world_size": world_size,
                "control_seq": self._control_seq if control_seq is None else control_seq,
            },
        )
        # the project's "evaluate every checkpoint" rule; never raises (workers sweep for misses)
        on_checkpoint_published(self._store, self.project, self.id, event)
        return event

    def on_rewind(self, callback: _RewindCallback) -> _RewindCallback:
        """Call ``callback(rewind)`` whenever a restore takes the run back.

        For state a checkpoint does not hold (a data position kept in
        ``extra``, a cache of the last N steps). Usable as a decorator.
        """
        if not callable(callback):
            raise InvalidTypeError(f"on_rewind() takes a callable, not {type(callback).__name__}")
        self._rewind_callbacks.append(callback)
        return callback

    def _record_rewind(self, to_step: int, checkpoint_id: str | None, cause: str, reached: int) -> Rewind | None:
        """Record a rewind if ``to_step`` is behind ``reached``; new points get a new attempt."""
        if to_step >= reached:
            return None
        self._attempt += 1
        self._events.append(
            REWIND,
            {
                "session": self.session_id,
                "to_step": to_step,
                "reached": reached,
                "checkpoint": checkpoint_id,
                "cause": cause,
                "attempt": self._attempt,
            },
        )
        return Rewind(to_step=to_step, reached=reached, cause=cause, checkpoint=checkpoint_id, attempt=self._attempt)

    def _run_rewind_callbacks(self, rewind: Rewind) -> None:
        for callback in list(self._rewind_callbacks):
            callback(rewind)

    def _consume_resume_choice(self, checkpoint_id: str) -> None:
        self._events.append(RESUME_CHOICE_CONSUMED, {"session": self.session_id, "checkpoint": checkpoint_id})

    # -- tunables and control ---------------------------------------------
    def on_tunables_change(self, callback: _TunablesCallback) -> _TunablesCallback:
        """Call ``callback(changes)`` when tunables change; usable as a decorator.

        ``changes`` maps each changed name to its new value. It runs in the
        training thread at the step boundary where a ``set_tunables()`` from
        outside takes effect, and after a checkpoint restore that brought
        back different values. :attr:`tunables` already holds the new values.
        (``launchhelm.torch`` also writes tunables named like optimizer
        hyperparameters, ``lr`` first, into the watched optimizer.)
        """
        if not callable(callback):
            raise InvalidTypeError(f"on_tunables_change() takes a callable, not {type(callback).__name__}")
        self._tunables_callbacks.append(callback)
        return callback

    def on_checkpoint_request(self, callback: _CheckpointCallback) -> _CheckpointCallback:
        """Call ``callback()`` when ``RunHandle.control("checkpoint")`` takes effect.

        For code that saves its own checkpoints (``run.checkpoint(path)``);
        ``launchhelm.torch`` runs save a checkpoint themselves. Its return
        value, if a string, is recorded as the checkpoint saved.
        """
        if not callable(callback):
            raise InvalidTypeError(f"on_checkpoint_request() takes a callable, not {type(callback).__name__}")
        self._checkpoint_callbacks.append(callback)
        return callback

    @property
    def _control_flag(self) -> bool:
        """Requests are waiting for the next step boundary (or a restore left the run paused)."""
        return self._control_poller.flag

    @_control_flag.setter
    def _control_flag(self, value: bool) -> None:
        self._control_poller.flag = value

    def _poll_controls(self) -> None:
        """Background thread: deliver new control requests to the training thread."""
        self._control_poller.poll()

    def _take_requests(self) -> list[dict[str, Any]]:
        requests = self._control_poller.take()
        # after the take: a notice whose handler cleared nothing is seen here or raises the flag again
        notice = self._preemption.take_notice() if self._preemption is not None else None
        if notice is not None:
            requests.append({"seq": 0, "type": CONTROL_ACTION, "action": PREEMPT_ACTION, "signal": notice})
        return requests

    def _step_boundary(self) -> None:
        """Apply waiting control requests; while paused, wait here (heartbeats go on)."""
        if self._finished:
            self._check_live()  # fenced: the training thread hears it at its next step
        announced = False
        while True:
            for request in self._take_requests():
                self._apply_request(request)
            if not self._paused or self._finished:
                return
            if not announced:
                announced = True
                _log.info("run %s paused at step %d; RunHandle.control('resume') continues", self.id, self._step)
            with self._beacon.not_counting():  # a pause is no hang
                self._wait_while_paused()

    def _wait_while_paused(self) -> None:
        self._control_poller.wake.wait(timeout=1.0)

    @property
    def _records_events(self) -> bool:
        return True

    def _record_applied(self, request: int | None, cause: str, **detail: object) -> None:
        if self._records_events:
            self._events.append(
                CONTROL_APPLIED,
                {
                    "session": self.session_id,
                    "request": request,
                    "cause": cause,
                    "step": self._step,
                    "tunables": dict(self._tunables),
                    "control_seq": self._control_seq,
                    "paused": self._paused,
                    **detail,
                },
            )

    def _apply_request(self, request: dict[str, Any]) -> None:
        seq = int(request["seq"])
        if request["type"] == CONTROL_TUNABLES:
            changes = {k: v for k, v in dict(request.get("changes") or {}).items() if k in self._tunables}
            self._tunables = types.MappingProxyType({**self._tunables, **changes})
            self._control_seq = seq
            self._record_applied(seq, "control", changes=changes)
            self._tunables_changed(changes, restored=False)
            return
        action = request.get("action")
        if action in ("pause", "resume"):
            self._paused = action == "pause"
            self._control_seq = seq
            self._record_applied(seq, "control", action=action)
        elif action == "checkpoint":
            saved = self._checkpoint_requested()
            self._record_applied(seq, "control", action=action, checkpoint=saved)
        elif action == PREEMPT_ACTION:
            self._preempt(seq, str(request.get("signal") or "SIGTERM"))
        elif action == "stop":
            self._paused = False
            self._record_applied(seq, "control", action=action)
            step = self._step
            self._stop_session()
            raise RunStopped(
                f"run {self.id} stopped at step {step} by RunHandle.control('stop'); the session ended and the "
                f"run is resumable: launchhelm.init({self.project!r}, resume={self.id!r})",
                run_id=self.id,
                step=step,
            )
        else:
            _log.warning("run %s: ignoring unknown control action %r (event %d)", self.id, action, seq)

    def _tunables_changed(self, changes: dict[str, Any], *, restored: bool) -> None:
        if not changes:
            return
        for callback in list(self._tunables_callbacks):
            callback(dict(changes))

    def _checkpoint_requested(self) -> str | None:
        if not self._checkpoint_callbacks:
            _log.warning(
                "run %s: a checkpoint was requested at step %d but nothing saves one: register "
                "run.on_checkpoint_request(fn), or use launchhelm.torch",
                self.id,
                self._step,
            )
            return None
        saved = None
        for callback in list(self._checkpoint_callbacks):
            result = callback()
            if isinstance(result, str):
                saved = result
        return saved

    def _stop_session(self) -> None:
        self._end_session(close_run=False, reason="stopped by control")

    # -- the helper process (see launchhelm._helper) ---------------------------------
    def _plan_helper(
        self,
        timeout: float | str | None,
        storage_options: Mapping[str, Any] | None,
        *,
        end_hung: bool,
        session: str | None = None,
        rank: int = 0,
        world: int | None = None,
    ) -> None:
        """Plan the helper process (init, before the background thread starts): the session's writer's, and
        under DDP each other rank's (``session`` being rank 0's), which only watches for hangs.

        The background thread starts it, so ``init`` does not wait for the spawn, and the child's
        imports overlap training. A ``memory://`` store has no helper: no other process sees it.
        """
        if "memory" in self._store.protocol.split("::"):  # memory://, or chained onto one (dir::memory://)
            return
        if session is None and not self._records_events:
            return
        if session is not None and timeout is None:
            return  # a rank > 0's helper only watches for hangs
        if world is None:  # torchrun's, for rank 0's helper to gather every rank's stacks
            try:
                world = max(1, int(os.environ.get("WORLD_SIZE", "1")))
            except ValueError:
                world = 1
        try:
            beacon = Beacon.create(tempfile.gettempdir())
        except OSError as exc:  # training goes on without one
            _log.warning("launchhelm: run %s has no helper process (%s)", self.id, exc)
            return
        beacon.begin(self._step, threading.get_ident())  # the training thread: whose stack names a hang
        self._beacon, self._progress = beacon, beacon.slots
        self._helper_plan = {
            "beacon": beacon,
            "timeout": timeout,
            "store_url": self._store.url,
            "storage_options": storage_options,
            "project": self.project,
            "run_id": self.id,
            "session": session or self.session_id,
            "session_seq": self._session_seq,
            "end_hung": end_hung,
            "rank": rank,
            "world": world,
        }
        if session is None:
            self._media.handoff = True  # media go to the helper through the spool (launchhelm.media._handoff)
            self._helper_plan["flush"] = helper_flushes()  # and, opted in, the points (launchhelm._metrics._pickup)
            if self._helper_plan["flush"]:
                self._flusher.helper_started = threading.Event()  # a flush() before it waits for it

    def _start_helper(self) -> None:
        """Background thread: start the planned helper."""
        try:
            self._start_planned_helper()
        finally:
            started = self._flusher.helper_started
            if started is not None:
                started.set()  # it runs and has the points, or this process writes them

    def _start_planned_helper(self) -> None:
        with self._helper_lock:
            plan, self._helper_plan = self._helper_plan, None
        if plan is None:
            return
        spool = self._flusher.spool  # opened by now (_start)
        plan["flush"] = bool(plan.get("flush")) and spool is not None
        try:
            helper = Helper.start(
                **plan, spool=str(spool.dir.parent) if spool is not None else None, process=self._early_helper()
            )
        except OSError as exc:  # training goes on without it
            _log.warning("launchhelm: run %s: could not start its helper process: %s", self.id, exc)
            self._media.handoff = False
            return
        if helper is None:
            self._media.handoff = False
            return
        with self._helper_lock:
            if not self._helper_over:
                self._helper = helper
                if plan["flush"]:
                    self._points_to_helper = True
                    self._hand_points_over()
                return
        helper.stop()  # the session ended while it started: a clean end

    def _hand_points_over(self) -> None:
        """The helper writes the session's chunks from now on (``LAUNCHHELM_HELPER_FLUSH``)."""
        self._flusher.on_latest = self._summary_writer.note_values
        self._flusher.hand_over(self._send_to_helper, self._helper_stored, self._helper_ready)

    def _helper_ready(self) -> bool:
        """Whether the helper's flush thread loaded its encoder (it says so in the shared page)."""
        return bool(self._beacon.slots[READY_SLOT])

    def _send_to_helper(self, line: bytes) -> object | None:
        """A flush request to the helper; the process it went to, or None where there is none."""
        helper = self._helper
        if helper is None or not helper.send(line):
            return None
        return helper.process

    def _helper_stored(self, seq: int, timeout: float, token: object) -> str:
        """Wait for the helper ``token`` to acknowledge request ``seq``: "stored", "gone" or "late"."""
        poll = getattr(token, "poll")  # the helper's Popen  # noqa: B009

        def alive() -> bool:
            return poll() is None

        if wait_acknowledged(self._beacon.slots, seq, alive, time.monotonic() + timeout):
            return "stored"
        return "late" if alive() else "gone"

    def _check_helper(self) -> None:
        """Background thread: a helper that died (killed, OOM) is replaced; training goes on meanwhile."""
        helper = self._helper
        if helper is None or helper.process.poll() is None:
            return
        failed = False
        with self._helper_lock:
            if self._helper_over or self._helper is not helper:
                return
            if helper.replaced >= MAX_REPLACED:
                self._helper = None
                self._media.handoff = False  # media encoded here again; files handed over: stored at the next flush
                replaced = None
            else:
                try:
                    replaced = helper.replace_if_gone()
                except OSError as exc:
                    self._helper, replaced, failed = None, None, True
                    self._media.handoff = False
                    _log.warning("launchhelm: run %s: could not start a new helper process: %s", self.id, exc)
        if self._points_to_helper:
            if self._helper is None:
                self._flusher.take_back()  # the points are written here again, from the spool's state file
            else:
                self._hand_points_over()  # the new helper goes on from the spool's state file
        if failed:
            return
        if replaced is None:
            _log.warning(
                "launchhelm: run %s: its helper process died %d times; training goes on without one (a killed "
                "process's last points wait in the spool for `launchhelm recover`)",
                self.id,
                helper.replaced + 1,
            )
            return
        pid, code = replaced
        how = f"exited with status {code}"
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        from launchhelm.storage._remote import HelperStore

        store = self._store
        served = isinstance(store, HelperStore) and store.process is not None and store.process.pid == pid
        _log.warning(
            "launchhelm: run %s: its helper process (pid %d) %s; training goes on, and a new one (pid %d) takes over%s",
            self.id,
            pid,
            how,
            helper.process.pid,
            " (this process reaches the store itself from now on)" if served else "",
        )

    def _stop_helper(self) -> None:
        """The session ends (or was fenced): the helper exits without draining."""
        started = self._flusher.helper_started
        if started is not None:
            started.set()  # none will start now
        with self._helper_lock:
            self._helper_over = True
            self._helper_plan = None
            helper, self._helper = self._helper, None
            self._media.handoff = False
        beacon = self._beacon
        self._beacon = Beacon()  # a log() racing the end writes to a buffer that outlives the page
        self._progress = self._beacon.slots
        if helper is not None:
            helper.stop()
        beacon.close()  # its done slot: a helper starting now exits at once

    # -- preemption (see launchhelm._runlog._preempt) ---------------------------------
    def _listen_for_preemption(self, settings: PreemptionSettings | None) -> None:
        """Install the notice's handlers (``init``, right after the session started); None: preemption off."""
        if settings is None:
            return
        listener = PreemptionListener(
            settings,
            raise_flag=self._raise_control_flag,
            tell_others=self._pass_notice_on,
            end_unsaved=self._end_unsaved,
            describe=lambda: str(self._step),
        )
        if listener.install():
            self._preemption = listener

    def _raise_control_flag(self) -> None:
        # from the signal handler: one attribute, read by the step hook that already reads it
        self._control_poller.flag = True

    def _pass_notice_on(self, signal_name: str) -> None:
        """The watcher thread, at the notice: make the ranks that did not get it learn of it (DDP)."""

    def _preempt(self, request_seq: int, signal_name: str) -> None:
        """At the step boundary after a notice: save, flush, end the session as preempted, exit non-zero."""
        signum = int(getattr(signal.Signals, signal_name, signal.SIGTERM))
        listener = self._preemption
        if listener is not None:
            listener.arm(signum)  # a rank that learnt it from another keeps the budget too
        self._preempted_by = signal_name
        self._paused = False
        step = self._step
        if request_seq > 0:  # a request in the log (another rank's notice): applied, not pending
            self._record_applied(request_seq, "control", action=PREEMPT_ACTION, signal=signal_name)
        try:
            saved, artifact = self._checkpoint_for_preemption()
            if not saved:
                outcome = "no checkpoint saved (nothing saves one: see run.on_checkpoint_request)"
            else:
                outcome = f"checkpoint {artifact} saved" if artifact else "checkpoint saved"
        except LaunchHelmError as exc:
            artifact = None
            outcome = f"the checkpoint failed ({exc}); the latest checkpoint is still the one before"
        detail = f"{signal_name} at step {step}, {outcome}"
        if listener is None or listener.begin_ending():
            self._end_preempted(detail)
        if self._records_events:
            # at exit, not now: SLURM's requeue signals the job's processes at once, and the script's own
            # `except RunPreempted` and `finally` blocks must run before that
            _requeue_at_exit()
        raise RunPreempted(
            f"run {self.id} was preempted by {signal_name} at step {step}: {outcome}; the session ended and "
            "the run is resumable: relaunch the same command (auto_resume=True) or "
            f"launchhelm.init({self.project!r}, resume={self.id!r})",
            run_id=self.id,
            step=step,
            signal=signal_name,
            checkpoint=artifact,
            exit_code=128 + signum,
        )

    def _checkpoint_for_preemption(self) -> tuple[bool, str | None]:
        """Save what a relaunch resumes from: ``(saved, artifact id)``; plain runs call their checkpoint callbacks."""
        if not self._checkpoint_callbacks:
            return False, None
        return True, self._checkpoint_requested()

    def _end_preempted(self, detail: str) -> None:
        self._end_session(close_run=False, reason="preempted", ending="preempted", detail=detail)

    def _end_unsaved(self, detail: str) -> None:
        """The budget's watcher thread: end the session the training thread could not end in time."""
        if self._records_events:
            Run._end_session(self, close_run=False, reason="preempted", ending="preempted", detail=detail)
            requeue_slurm_job()

    def _close_preemption(self) -> None:
        """The session is over: without a notice, the handlers go back and the watcher stops."""
        listener = self._preemption
        if listener is None:
            return
        if listener.signum is None:
            listener.close()
        else:
            listener.ended()  # the watcher stays, to make sure the process exits within the budget

    def _restore_control(self, tunables: Mapping[str, Any] | None, control_seq: int | None, paused: bool) -> None:
        """A checkpoint restore brings back the tunables and control state it saw.

        It is recorded (a ``control_applied`` event, cause ``restore``) only where it changed them:
        a restore to the state already in force would fold to the same state, and would cost the
        load that blocks training an event's two fsyncs."""
        before = _control_state(self._tunables, self._control_seq, self._paused)
        changes: dict[str, Any] = {}
        if tunables is not None:
            new = dict(tunables)
            changes = {k: v for k, v in new.items() if self._tunables.get(k, object()) != v}
            self._tunables = types.MappingProxyType(new)
        if control_seq is not None:
            self._control_seq = control_seq
        self._paused = paused
        if paused:
            self._control_flag = True  # wait at the next step boundary
        if _control_state(self._tunables, self._control_seq, self._paused) != before:
            self._record_applied(None, "restore")
        self._tunables_changed(changes, restored=True)

    @property
    def reached(self) -> int:
        """The furthest step this run has reached, over all sessions and attempts."""
        return max(self._step, self._reached)

    def _check_live(self) -> None:
        if self._events.fenced_by is not None and self._records_events:
            self._on_fenced()
            raise self._events.fenced_error()
        if self._finished:
            raise RunFinishedError(
                f"run {self.id} was finished in this process; resume it with "
                f"launchhelm.init({self.project!r}, resume={self.id!r})",
                run_id=self.id,
            )

    # -- background work ------------------------------------------------
    def _start(self) -> None:
        if self._capture_console:
            self._console.attach()
        try:
            self._flusher.open_spool(self.project, self._flush_interval)
            if self._flusher.spool is not None:
                self._media.spool_dir = self._flusher.spool.dir  # media past the memory bound wait there
            self._summary_writer.beat()
            self._summary_writer.after_event({"seq": self._session_seq})  # the summary of our session_started event
            if self.resumed:
                self._poll_controls()  # tunables changed while no session was live apply at the first step
        except BaseException:
            self._stop_console()
            raise
        add_live(self)
        self._worker.start()

    def _work(self) -> None:
        self._start_helper()
        now = time.monotonic()
        next_flush = now + self._flush_interval
        next_beat = now + self._heartbeat_interval
        next_poll = now + self._control_interval
        system_every = self._system_interval
        next_sample = now + system_every if system_every is not None else math.inf
        while not self._stop.wait(max(0.0, min(next_flush, next_beat, next_poll, next_sample) - time.monotonic())):
            now, asked = time.monotonic(), time.time()
            try:
                # a control poll that is due goes first: a process that was frozen (SIGSTOP, a node cut
                # off) and wakes with everything due learns of a fence before it writes anything
                if now >= next_poll:
                    next_poll = now + self._control_interval
                    self._poll_controls()
                if self._events.fenced_by is not None:
                    self._on_fenced()
                    return
                self._check_helper()
                if system_every is not None and now >= next_sample:
                    next_sample = now + system_every
                    self._sample_system()
                if now >= next_flush:
                    next_flush = now + self._flush_interval
                    while True:
                        answers = self._flusher.answers
                        more = self._flush(drain=False)
                        if self._flusher.answers != answers:  # a flush with nothing to write asked the store nothing
                            self._store_answered()
                        spool = self._flusher.spool
                        if spool is not None:
                            spool.prepare()
                        self._flush_console()
                        self._compact(only_if_due=True)
                        # catching up (a segment's worth at a time), within a flush interval: heartbeats
                        # and control polls must not wait on a flood
                        if not more or self._stop.is_set() or time.monotonic() >= next_flush:
                            break
                if now >= next_beat:
                    next_beat = now + self._heartbeat_interval
                    self._summary_writer.heartbeat()
                    self._store_answered()
                self._last_error = None
            except Exception as exc:  # keep going: the store may come back
                self._last_error = exc
                self._store_failed(exc, since=asked)  # a blackhole answers only after the timeouts

    def _on_fenced(self) -> None:
        """A newer attempt of the job fenced this session: write nothing more, keep nothing to upload.

        Called by whichever thread sees the fence first (the background poll, or the training thread's
        next append); the training thread raises :class:`RunFencedError` at its next log, step or save.
        """
        with self._lock:
            if self._fence_handled:
                return
            self._fence_handled = True
        self._finished = True  # log() and the step boundary check in, and raise
        self._control_flag = True
        self._stop.set()
        self._stop_helper()
        self._media.spool_dir = None  # a fenced session's media are not the run's: none to the spool
        self._media.close(timeout=0.0)
        self._flusher.discard()  # points after the fence must not reach the run, not even by `recover`
        discard_live(self)
        fence: Mapping[str, object] = self._events.fenced_by or {}
        _log.error(
            "launchhelm: run %s: a newer attempt of this job (session %s) took the run over; this session "
            "(%s) writes nothing more and raises RunFencedError at its next step",
            self.id,
            fence.get("session", "?"),
            self.session_id,
        )

    def _leave_in_spool(self, exc: BaseException) -> None:
        """The session ends without the store: what it lacks stays on disk, and the user is told where."""
        self._media.close(timeout=0.0)  # media waiting go to the spool beside the points
        spool = self._flusher.abandon()
        if spool is None:
            return
        # the session is over as a crashed one is: its points are the spool's to upload, and the exit
        # hook must not try the store again (the run stays resumable; its session never ended)
        self._finished = True
        discard_live(self)
        self._stop_helper()  # the line below tells what to do; the helper would meet the same store
        _log.warning(
            "launchhelm: run %s: the store %s did not take the last points at the end of the session (%s); "
            "they are kept in the spool at %s: `launchhelm recover` uploads them once this process has exited "
            "(so does resuming the run on this host)",
            self.id,
            self._store.url,
            " ".join(f"{type(exc).__name__}: {exc}".split())[:200],
            spool.dir,
        )

    def _store_failed(self, exc: BaseException, since: float | None = None, sent: float | None = None) -> None:
        """The first failure of an outage is said once (see :meth:`OutageReporter.failed`)."""
        self._outage.failed(exc, since, sent)

    def _store_answered(self) -> None:
        self._outage.answered()

    # -- ending ---------------------------------------------------------
    def finish(self, close_run: bool = True) -> None:
        """End this session, writing every buffered point first.

        Parameters
        ----------
        close_run:
            True (default) closes the run for good: it can no longer be
            resumed. False ends only the session and keeps the run
            resumable (``launchhelm.init(project, resume=run.id)``).

        Raises
        ------
        InvalidTypeError
            ``close_run`` is not a bool: a truthy ``"no"`` would close the
            run for good. The session goes on.
        """
        _check_flag("close_run", close_run)
        listener = self._preemption
        if listener is not None and listener.signum is not None:
            # the loop stopped on run.preempted: the attempt still ends as preempted
            if listener.begin_ending():
                name = signal.Signals(listener.signum).name
                detail = f"{name} at step {self._step}; finish() was called before the next step boundary"
                self._end_session(close_run=close_run, reason="finish", ending="preempted", detail=detail)
            return
        self._end_session(close_run=close_run, reason="finish")

    def _end_session(
        self, *, close_run: bool, reason: str, ending: str | None = None, detail: str | None = None
    ) -> None:
        """End the session; ``ending`` is what ``RunHandle.attempts()`` reports ("finished" unless said)."""
        # the end's flush may take long: that is no hang. The helper stays until the end is stored: a
        # process killed meanwhile (a preemption's grace ran out) still has its spool uploaded
        self._beacon.stop_counting()
        if self._events.fenced_by is not None and self._records_events:
            self._on_fenced()
            self._stop_console()
            self._close_preemption()  # the signal handlers are the process's again
            if reason == "finish":
                raise self._events.fenced_error()
            return
        if self._finished:
            return
        self._stop.set()
        try:
            if self._worker.is_alive() and threading.current_thread() is not self._worker:
                self._worker.join()
        finally:
            self._stop_console()  # whatever happens next, the process's streams are its own again
        try:
            self._flush_console(final=True)
        except Exception as exc:  # the console is a nicety: the session still ends
            _log.warning("run %s: could not store its last console output: %s", self.id, exc)
        # an unreachable store gets a bounded time to come back (LAUNCHHELM_FINISH_TIMEOUT)
        deadline = time.monotonic() + env_seconds("LAUNCHHELM_FINISH_TIMEOUT", DEFAULT_FINISH_TIMEOUT)
        self._flusher.ending, self._flusher.deadline = True, deadline  # a helper that flushes: its final round
        while True:
            try:
                # a segment's worth at a time, compacted between: the chunk bytes kept for the
                # compactor stay bounded however much the spool holds
                while self._flush(drain=False):
                    self._compact(only_if_due=True)
                self._flush()
                break
            except ConnectionError as exc:
                if time.monotonic() < deadline:
                    self._store_failed(exc)
                    time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                    continue
                self._leave_in_spool(exc)
                # our error says what and where; the HTTP client's chain beneath it is noise to the user
                raise exc from None
            except BaseException as exc:
                self._leave_in_spool(exc)
                raise
        # the flush above drained the media, unless the store was slower than the time given
        in_spool, dropped = self._media.close(timeout=0.0)
        try:
            self._media.write_index()  # the items stored while it closed
            self._media.seal()  # one index object for the whole session: readers' requests stay few
            if not in_spool and self._media.handed:
                # and one for what its helper stored (in turn with a storer still at work: bounded)
                seal_handed(self._store, self.id, self.session_id, self._media.spool_dir, wait=5.0)
        except Exception as exc:
            _log.warning("launchhelm: run %s: could not index its last media: %s", self.id, exc)
        if in_spool:
            _log.warning(
                "launchhelm: run %s: %d media items the store did not take in time wait in the spool at %s; "
                "`launchhelm recover %s` stores them (so do the helper, a relaunch, or opening the run on this host)",
                self.id,
                in_spool,
                self._media.spool_dir,
                self.id,
            )
        if dropped:
            _log.warning("launchhelm: run %s: the store did not take %d media items", self.id, dropped)
        self._flusher.close()
        self._compact(only_if_due=False)
        self._flusher.close_compactor()
        self._settle_summary(end=True)  # the final summary below is then the last one put
        self._events.append(
            SESSION_ENDED,
            {
                "session": self.session_id,
                "close_run": bool(close_run),
                "reason": reason,
                "step": max(self._step, self._reached),
                "ending": ending or ("crashed" if reason.startswith("exception") else "finished"),
                "detail": detail if detail is not None else reason,
            },
        )
        if self._records_events:
            mark_row(self._store, self.project, self.id, self.session_id, "ended")  # after the final summary
        self._finished = True
        discard_live(self)
        self._stop_helper()
        self._close_preemption()
        self._close_store()

    def _early_helper(self) -> subprocess.Popen[bytes] | None:
        """The helper ``init`` started to serve the store (``LAUNCHHELM_HELPER_STORE=1``), once: its session's
        configuration goes to it rather than to a new process."""
        from launchhelm.storage._remote import HelperStore

        store = self._store
        if not isinstance(store, HelperStore) or not store.session_helper or store.adopted:
            return None
        store.adopted = True
        return store.process

    def _close_store(self) -> None:
        """The store's own process (``LAUNCHHELM_HELPER_STORE=1``) ends with the session that started it."""
        from launchhelm.storage._remote import HelperStore

        if isinstance(self._store, HelperStore):
            self._store.close()


def _control_state(tunables: Mapping[str, object], control_seq: int, paused: bool) -> str:
    """Tunables and control state as the log folds them (``launchhelm._runlog._control.in_force``), exactly."""
    return json.dumps([dict(tunables), control_seq, paused], sort_keys=True)
