"""The per-run event log and the run state folded from it.

Every change to a run that more than one process could race on is an event:
``runs/<id>/events/<seq:020d>.json``, each written with ``Store.create``. A
writer that loses a sequence number re-reads the log and takes the next one,
so every backend gives one total order of events. Conditional appends
(``expect_seq``) turn the log into a compare-and-swap: resume checks the
run's state at sequence N and only succeeds if its event lands at N + 1.

Snapshots (``events/snapshot-<seq:020d>.json``) cache the state folded from
events ``1..seq`` so that opening a run reads one snapshot and the events
after it, whatever the log's length. They are deterministic (the same events
give the same bytes), created with ``create`` by whoever folds
:data:`SNAPSHOT_EVERY` events past the newest one, and verified by every
reader: one that does not check out is ignored and the log folded from the
start. The log stays the truth. See docs/storage.md.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

from launchhelm._exceptions import (
    AlreadyExistsError,
    InvalidArgumentError,
    LaunchHelmError,
    ObjectNotFoundError,
    RunFencedError,
    StorageError,
)
from launchhelm._runlog._records import (
    CHECKPOINT,
    CHECKPOINT_DELETED,
    CONTROL_ACTION,
    CONTROL_APPLIED,
    CONTROL_TUNABLES,
    DAMAGED,
    RESTART_LOOP,
    RESUME_CHOICE,
    RESUME_CHOICE_CONSUMED,
    REWIND,
    SESSION_ENDED,
    SESSION_STARTED,
    CheckpointDeletedEvent,
    CheckpointEvent,
    ControlActionEvent,
    ControlAppliedEvent,
    ControlEvent,
    ControlTunablesEvent,
    DamagedEvent,
    Event,
    RestartLoopEvent,
    RewindEvent,
)
from launchhelm.storage import Store
from launchhelm.storage._keys import (
    event_key,
    events_prefix,
    parse_event_name,
    parse_snapshot_name,
    run_prefix,
    snapshot_key,
)

#: An event type RunState keeps a copy of.
HeldT = TypeVar(
    "HeldT",
    RewindEvent,
    CheckpointEvent,
    CheckpointDeletedEvent,
    ControlTunablesEvent,
    ControlActionEvent,
    ControlAppliedEvent,
    RestartLoopEvent,
)

__all__ = [
    "CHECKPOINT",
    "CHECKPOINT_DELETED",
    "CONTROL_ACTION",
    "CONTROL_APPLIED",
    "CONTROL_TUNABLES",
    "RESTART_LOOP",
    "RESUME_CHOICE",
    "RESUME_CHOICE_CONSUMED",
    "REWIND",
    "SESSION_ENDED",
    "SESSION_STARTED",
    "SNAPSHOT_EVERY",
    "EventLog",
    "RunState",
    "SessionRecord",
    "decode_state",
    "encode_state",
    "event_key",
    "fold",
    "read_state",
    "run_prefix",
]

_log = logging.getLogger("launchhelm")

#: Actions that change settings a checkpoint holds (and restores): "stop"
#: ends a session and "checkpoint" asks for a save, neither is restored.
STATE_ACTIONS = ("pause", "resume")

RUN_FORMAT = "launchhelm.run/1"
SNAPSHOT_FORMAT = "launchhelm.snapshot/1"
#: Whoever folds this many events past the newest snapshot creates a new one.
SNAPSHOT_EVERY = 64
# matched with fullmatch: "$" alone would let a trailing newline through into store keys
_PROJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_RUN_ID_RE = re.compile(r"^[a-z0-9]{4,64}$")


def validate_project(project: object) -> str:
    if not isinstance(project, str) or not _PROJECT_RE.fullmatch(project):
        raise InvalidArgumentError(
            f"invalid project name {project!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (e.g. 'quickstart')"
        )
    return project


def validate_run_id(run_id: object) -> str:
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id):
        raise InvalidArgumentError(
            f"invalid run id {run_id!r}: run ids are lowercase letters and digits, "
            "as printed by init() or listed by Api().runs(project)"
        )
    return run_id


class SequenceTaken(LaunchHelmError):
    """A conditional append lost: the log moved past what the caller checked."""


def _parse_event(data: bytes, seq: int, where: str) -> Event:
    """An event as stored, or (damaged: not JSON, not an object, another seq) a placeholder, with a warning."""
    try:
        event = json.loads(data)
        if isinstance(event, dict) and int(event.get("seq", -1)) == seq and isinstance(event.get("type"), str):
            return cast("Event", event)  # its fields as the writer of its type wrote them
        problem = "it is not an event of this sequence number"
    except (ValueError, TypeError) as exc:
        problem = f"it is not JSON ({exc})"
    import warnings

    warnings.warn(f"skipped the damaged event {where}: {problem}; the run is read without it", stacklevel=4)
    damaged: DamagedEvent = {"seq": seq, "type": DAMAGED, "time": 0.0}
    return damaged


class EventLog:
    """Append-only, totally ordered event log of one run.

    Reads are incremental: events are immutable, so each is fetched once,
    and every fetch of several events is one :meth:`Store.read_many`.
    :meth:`state` folds the log starting from its newest snapshot;
    :meth:`read` returns every event (for ``RunHandle.events()`` and
    garbage collection).
    """

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.prefix = events_prefix(run_id)
        self._events: dict[int, Event] = {}  # fetched (or appended) events by seq
        self._top = 0  # events 1.._top are all known to exist
        self._snapshots: list[int] = []  # snapshot seqs in the last listing, oldest first
        self._state: RunState | None = None  # folded through its own last_seq
        self._trusted = 0  # seq of the newest snapshot verified (or written) here
        #: called with each event this log appended (the live session keeps its summary current)
        self.on_append: Callable[[dict[str, Any]], None] | None = None
        # the training process appends from its main thread and polls for
        # control requests from its background thread
        self._lock = threading.RLock()
        #: the live session writing through this log, and the newer attempt's event that fenced it
        self._writer: str | None = None
        self.fenced_by: Event | None = None
        self._checked = 0  # events 1.._checked were looked at for a fence of _writer

    def guard(self, session_id: str, started_seq: int) -> None:
        """Appends through this log are ``session_id``'s (started at event ``started_seq``): once a newer
        attempt's ``session_started`` names it as replaced (a fence), every later append raises
        :class:`RunFencedError`. Only events after its start can fence it."""
        with self._lock:
            self._writer = session_id
            self._checked = max(self._checked, started_seq)

    def _look_for_fence(self, upto: int) -> None:
        """Read events ``_checked+1..upto`` (those not fetched yet, in one ``read_many``) for a fence."""
        if self._writer is None or upto <= self._checked:
            return
        self._fetch(range(self._checked + 1, upto + 1))
        self._checked = upto

    def fenced_error(self) -> RunFencedError:
        fence: Mapping[str, object] = self.fenced_by or {}
        by = str(fence.get("session", "?"))
        return RunFencedError(
            f"run {self.run_id}: session {self._writer} was replaced by a newer attempt of its job "
            f"(session {by}, event {fence.get('seq')}); this process writes nothing more to the run: exit, "
            "the relaunch trains in its place",
            run_id=self.run_id,
            session_id=by,
        )

    @staticmethod
    def _key_seq(name: str) -> int | None:
        return parse_event_name(name)

    def _key(self, seq: int) -> str:
        return event_key(self.run_id, seq)

    def _list(self) -> None:
        """One listing: events and snapshots together."""
        seqs: set[int] = set()
        snapshots = []
        for name in self.store.list(self.prefix):
            seq = self._key_seq(name)
            if seq is not None:
                seqs.add(seq)
            elif (snap := parse_snapshot_name(name)) is not None:
                snapshots.append(snap)
        top = self._top
        while top + 1 in seqs:
            top += 1  # a gap is a writer mid-create: stop at the last contiguous one
        self._top = top
        self._snapshots = sorted(snapshots)

    def _fetch(self, seqs: Iterable[int], extra: Iterable[str] = ()) -> dict[str, bytes | None]:
        """Fetch the events not seen yet (and ``extra`` keys) in one ``read_many``."""
        missing = [seq for seq in seqs if seq not in self._events]
        keys = [self._key(seq) for seq in missing]
        got = self.store.read_many([*keys, *extra]) if keys or extra else {}
        for seq, key in zip(missing, keys, strict=True):
            data = got.get(key)
            if data is None:  # listed, then gone: events are never deleted while the run exists
                raise ObjectNotFoundError(f"event {seq} of run {self.run_id} vanished from {key}", url=key)
            event = self._events[seq] = _parse_event(data, seq, self.store.url_for(key))
            if self._writer is not None and self.fenced_by is None and _fences(event, self._writer):
                self.fenced_by = event
        return got

    def events(self) -> list[Event]:
        """All events, oldest first (fetching only those not yet seen)."""
        with self._lock:
            self._list()
            self._fetch(range(1, self._top + 1))
            return [self._events[seq] for seq in range(1, self._top + 1)]

    def events_since(self, seq: int) -> list[Event]:
        """The events after ``seq``, oldest first (one listing, then one ``read_many``)."""
        with self._lock:
            self._list()
            self._fetch(range(seq + 1, self._top + 1))
            return [self._events[s] for s in range(seq + 1, self._top + 1)]

    def read(self) -> list[Event]:
        """All events, oldest first (the same list as :meth:`events`)."""
        return self.events()

    # The untyped doors for callers outside the run log that hold events as plain dicts (``Run``, ``init``,
    # the importers): the same events as :meth:`events_since` and :meth:`append_event`.
    def since(self, seq: int) -> list[dict[str, Any]]:
        """The events after ``seq``, oldest first, as plain dicts (see :meth:`events_since`)."""
        return cast("list[dict[str, Any]]", self.events_since(seq))

    def state(self, *, refresh: bool = True) -> RunState:
        """The run's state folded through the newest event.

        The first call reads the newest snapshot and the events after it in
        one ``read_many`` (after one listing); later calls fold only new
        events (on a local store, a log already folded is listed again only
        if its next event exists). ``refresh=False`` skips the listing and folds what this log
        knows (what it appended or fetched), with no request unless another
        writer's events came in between: the live session's summary.
        Callers must not modify the state returned.
        """
        with self._lock:
            # a log already folded skips the listing where a probe finds no next event
            if self._top == 0 or (refresh and (self._state is None or not self._nothing_new())):
                self._list()
            state = self._state
            if state is None:
                state = self._load()
            elif state.last_seq < self._top:
                self._fetch(range(state.last_seq + 1, self._top + 1))
                state = fold([self._events[s] for s in range(state.last_seq + 1, self._top + 1)], state)
            self._state = state
            self._maybe_snapshot(state)
            return state

    def _nothing_new(self) -> bool:
        """On a store whose ``exists`` is cheap (:attr:`Store.probe_before_listing`): whether the
        next event is absent, so a listing would find the same contiguous log (a snapshot another
        reader made meanwhile is only a cache). A local log's listing walks its directory and grows
        with the log; this is one ``stat``."""
        return self.store.probe_before_listing and not self.store.exists(self._key(self._top + 1))

    @property
    def last_seq(self) -> int:
        return self._top

    def _load(self) -> RunState:
        """The first fold: from the newest snapshot that checks out, else from the start."""
        top = self._top
        if all(seq in self._events for seq in range(1, top + 1)):
            return fold([self._events[seq] for seq in range(1, top + 1)])
        snap = max((seq for seq in self._snapshots if seq <= top), default=0)
        if snap == 0:
            self._fetch(range(1, top + 1))
            return fold([self._events[seq] for seq in range(1, top + 1)])
        key = snapshot_key(self.run_id, snap)
        # the snapshot, its own last event (to check it against) and the events after it: one round trip
        got = self._fetch(range(snap, top + 1), extra=[key])
        base = decode_state(got.get(key) or b"", self.run_id, snap, self._events[snap])
        if base is None:
            _log.debug("run %s: snapshot %d does not match the log; folding from the start", self.run_id, snap)
            self._fetch(range(1, snap))
            return fold([self._events[seq] for seq in range(1, top + 1)])
        self._trusted = snap
        return fold([self._events[seq] for seq in range(snap + 1, top + 1)], base)

    def _maybe_snapshot(self, state: RunState) -> None:
        """Create a snapshot once SNAPSHOT_EVERY events are past the newest trusted one; never raises."""
        seq = state.last_seq
        newest = max(self._trusted, self._snapshots[-1] if self._snapshots else 0)
        if seq - newest < SNAPSHOT_EVERY or not self.store.atomic_create:
            return
        last = self._events.get(seq)
        if last is None:
            return
        self._trusted = seq  # one try per fold position, whatever happens
        try:
            body = encode_state(state, self.run_id, last)
        except (TypeError, ValueError) as exc:  # an event JSON cannot hold canonically (NaN written by hand)
            _log.debug("run %s: no snapshot at %d: %s", self.run_id, seq, exc)
            return
        try:
            self.store.create(snapshot_key(self.run_id, seq), body)
        except AlreadyExistsError:
            pass  # someone folded the same events: the same bytes
        except StorageError as exc:  # a read-only credential, or the store is away: only a cache
            _log.debug("run %s: could not write snapshot %d: %s", self.run_id, seq, exc)

    def append_event(self, type_: str, payload: Mapping[str, object], *, expect_seq: int | None = None) -> Event:
        """Append one event of ``type_`` (one of :data:`_records.Event`'s tags) and return it (with its ``seq``).

        With ``expect_seq`` the event must land at exactly that sequence
        number, else :class:`SequenceTaken` is raised and the caller re-checks
        the state it based its decision on.
        """
        with self._lock:
            event = self._append(type_, payload, expect_seq)
        if self.on_append is not None:
            self.on_append(cast("dict[str, Any]", event))
        return event

    def append(self, type_: str, payload: Mapping[str, object], *, expect_seq: int | None = None) -> dict[str, Any]:
        """:meth:`append_event`, the event returned as a plain dict (the untyped door, as :meth:`read`)."""
        return cast("dict[str, Any]", self.append_event(type_, payload, expect_seq=expect_seq))

    def _append(self, type_: str, payload: Mapping[str, object], expect_seq: int | None) -> Event:
        while True:
            # a fenced writer's event would land after the fence: every event before the seq it
            # takes is looked at first (already fetched, as a rule: no request)
            self._look_for_fence(self._top)
            if self.fenced_by is not None:
                raise self.fenced_error()
            seq = expect_seq if expect_seq is not None else self._top + 1
            event = {"seq": seq, "type": type_, "time": time.time(), **payload}
            body = json.dumps(event, separators=(",", ":"), allow_nan=False).encode()
            try:
                self.store.create(self._key(seq), body)
            except AlreadyExistsError:
                self._list()
                if expect_seq is not None:
                    raise SequenceTaken(f"event {seq} of run {self.run_id} was taken by another writer") from None
                if self._top < seq:  # taken but not yet listed: wait for it
                    time.sleep(0.01)
                continue
            stored = cast("Event", json.loads(body))  # exactly what readers will see (lists, not tuples)
            self._events[seq] = stored
            if seq == self._top + 1:
                self._top = seq
            return stored


def read_state(store: Store, run_id: str) -> tuple[RunState, int]:
    """The state of ``run_id`` and the last event folded: one listing and one ``read_many``.

    Reads the newest snapshot and the events after it (verifying the
    snapshot; one that does not check out is ignored and the whole log
    folded), and creates a snapshot if the log has run far past the newest.
    """
    state = EventLog(store, run_id).state()
    return state, state.last_seq


@dataclass
class SessionRecord:
    """One session (process or DDP job) attached to a run, as the log tells it."""

    id: str
    started_at: float
    process: dict[str, object]
    heartbeat_interval: float
    heartbeat_timeout: float
    resumed: bool = False
    start_step: int = 0
    ended_at: float | None = None
    end_reason: str | None = None
    end_step: int | None = None
    closed_run: bool = False
    start_seq: int = 0
    #: the scheduler's launch (``Launch.as_record``), with ``auto_resume``
    launcher: dict[str, object] | None = None
    #: how it ended: "finished" | "preempted" | "crashed" | "hung" | "fenced" (None: running, or ended
    #: before layout 3 said so)
    ending: str | None = None
    detail: str | None = None
    #: the newer attempt's session that fenced this one, the fence's seq, and its watermark
    replaced_by: str | None = None
    fence_seq: int | None = None
    watermark: dict[str, int] | None = None


@dataclass
class RunState:
    """What the event log says about a run."""

    sessions: list[SessionRecord] = field(default_factory=list)
    closed: bool = False
    closed_at: float | None = None
    #: ``rewind`` events (:class:`_records.RewindEvent`)
    rewinds: list[RewindEvent] = field(default_factory=list)
    #: ``checkpoint`` events still published (:class:`_records.CheckpointEvent`)
    checkpoints: list[CheckpointEvent] = field(default_factory=list)
    #: ``checkpoint_deleted`` events: checkpoints gc removed (no longer in ``checkpoints``;
    #: :class:`_records.CheckpointDeletedEvent`)
    deleted_checkpoints: list[CheckpointDeletedEvent] = field(default_factory=list)
    #: the unconsumed resume choice (checkpoint id), if any
    resume_choice: str | None = None
    #: the seq of the latest ``resume_choice`` event (0: none): a restart loop counts attempts after it
    resume_choice_seq: int = 0
    #: sequence number of the latest control change (0: none yet): tunables,
    #: pause or resume (stop and checkpoint requests change no saved setting)
    last_control_seq: int = 0
    #: control requests (tunables and actions), oldest first
    controls: list[ControlEvent] = field(default_factory=list)
    #: what training processes applied, oldest first (:class:`_records.ControlAppliedEvent`)
    applied: list[ControlAppliedEvent] = field(default_factory=list)
    last_seq: int = 0
    #: a relaunch refused for a restart loop, until a resume choice or a session that starts
    #: (kept last and left out of snapshots while None, so snapshots written before read byte for byte)
    restart_loop: RestartLoopEvent | None = None

    def checkpoint(self, checkpoint_id: str) -> CheckpointEvent | None:
        """The published checkpoint with that id, if any."""
        for event in self.checkpoints:
            if event["checkpoint"] == checkpoint_id:
                return event
        return None

    @property
    def latest_checkpoint(self) -> CheckpointEvent | None:
        """The newest published checkpoint: what ``"latest"`` restores."""
        return self.checkpoints[-1] if self.checkpoints else None

    @property
    def resume_checkpoint(self) -> CheckpointEvent | None:
        """What ``"resume"`` restores: the chosen checkpoint, else the newest."""
        if self.resume_choice is not None:
            chosen = self.checkpoint(self.resume_choice)
            if chosen is not None:
                return chosen
        return self.latest_checkpoint

    @property
    def last_applied_request(self) -> int:
        """Sequence number of the newest request a training process applied (0: none)."""
        return max((int(e.get("request") or 0) for e in self.applied), default=0)

    def pending_controls(self) -> list[ControlEvent]:
        """Requests not applied yet, in order.

        Actions (pause, stop...) are aimed at a live session: one asked for
        before the current session started is dropped, not carried into a
        resumed process. Tunable changes wait for the next session.
        """
        done = self.last_applied_request
        last = self.last_session
        live_since = last.start_seq if last is not None and last.ended_at is None else None
        return [
            event
            for event in self.controls
            if int(event["seq"]) > done
            and (event["type"] != CONTROL_ACTION or (live_since is not None and int(event["seq"]) > live_since))
        ]

    @property
    def last_session(self) -> SessionRecord | None:
        return self.sessions[-1] if self.sessions else None

    @property
    def restarts(self) -> int:
        """Sessions that a scheduler's relaunch started (every launched session after the first)."""
        return sum(1 for s in self.sessions[1:] if s.launcher is not None)

    @property
    def attempt(self) -> int:
        """The attempt number new points carry: one more per rewind."""
        return len(self.rewinds)


#: ``replaces.reason`` of a session that took the run over from an older attempt of its job: a fence
FENCE_REASON: Final = "relaunched"


def _fences(event: Mapping[str, object], session_id: str) -> bool:
    """Whether ``event`` is a newer attempt's start that fenced ``session_id``."""
    replaces = event.get("replaces")
    return (
        event.get("type") == SESSION_STARTED
        and isinstance(replaces, dict)
        and replaces.get("session") == session_id
        and replaces.get("reason") == FENCE_REASON
    )


def _ending_of(reason: str | None) -> str:
    """The ending of a session that ended before layout 3 recorded one, from its reason."""
    if reason is not None and reason.startswith("exception"):
        return "crashed"
    return "finished"


def _held(event: HeldT) -> HeldT:
    """A copy of ``event`` as :class:`RunState` holds it."""
    return event.copy()


def fold(events: Iterable[Mapping[str, object]], state: RunState | None = None) -> RunState:
    """Fold the log into the run's state, continuing from ``state`` (not modified) if given.

    ``fold(events[k:], fold(events[:k]))`` equals ``fold(events)``. Each
    event is taken as the :data:`_records.Event` its ``type`` tags (events
    as stored, or as an importer builds them); a type this version does not
    know changes nothing.
    """
    state = RunState() if state is None else copy.deepcopy(state)
    by_id: dict[str, SessionRecord] = {s.id: s for s in state.sessions}
    for raw in events:
        event = cast("Event", raw)
        state.last_seq = int(event["seq"])
        writer = by_id.get(str(raw.get("session", "")))
        if writer is not None and writer.fence_seq is not None and int(event["seq"]) > writer.fence_seq:
            continue  # a fenced session wrote after the fence: not part of the run (it never should)
        if event["type"] == SESSION_STARTED:
            launcher = event.get("launcher")
            rec = SessionRecord(
                id=event["session"],
                started_at=float(event["time"]),
                process=dict(event.get("process", {})),
                heartbeat_interval=float(event.get("heartbeat_interval", 5.0)),
                heartbeat_timeout=float(event.get("heartbeat_timeout", 30.0)),
                resumed=bool(event.get("resumed", False)),
                start_step=int(event.get("step", 0)),
                start_seq=int(event["seq"]),
                launcher=dict(launcher) if isinstance(launcher, dict) else None,
            )
            replaces = event.get("replaces")
            old = by_id.get(str(replaces.get("session", ""))) if isinstance(replaces, dict) else None
            if old is not None and replaces is not None and old.ended_at is None:
                # how the session it replaces ended, as the new one found it (no end time: it wrote none)
                if replaces.get("reason") == FENCE_REASON:
                    old.ending, old.replaced_by, old.fence_seq = "fenced", rec.id, rec.start_seq
                    old.watermark = dict(replaces.get("watermark") or {})
                    old.detail = f"replaced by a newer attempt of its job (session {rec.id})"
                else:
                    old.ending = "crashed"
                    old.detail = f"found gone by the next session ({replaces.get('reason')})"
            state.sessions.append(rec)
            by_id[rec.id] = rec
            state.restart_loop = None  # a launch was let through
        elif event["type"] == SESSION_ENDED:
            ended = by_id.get(event.get("session", ""))
            if ended is not None:
                ended.ended_at = float(event["time"])
                ended.end_reason = event.get("reason")
                ended.end_step = int(event.get("step", 0))
                ended.closed_run = bool(event.get("close_run", False))
                ended.ending = event.get("ending") or _ending_of(ended.end_reason)
                ended.detail = event.get("detail", ended.end_reason)
            if event.get("close_run"):
                state.closed = True
                state.closed_at = float(event["time"])
        elif event["type"] == REWIND:
            state.rewinds.append(_held(event))
        elif event["type"] == CHECKPOINT:
            state.checkpoints.append(_held(event))
        elif event["type"] == CHECKPOINT_DELETED:
            gone = event.get("checkpoint")
            state.checkpoints = [c for c in state.checkpoints if c["checkpoint"] != gone]
            state.deleted_checkpoints.append(_held(event))
            if state.resume_choice == gone:
                state.resume_choice = None
        elif event["type"] == RESUME_CHOICE:
            if not any(d.get("checkpoint") == event["checkpoint"] for d in state.deleted_checkpoints):
                state.resume_choice = event["checkpoint"]  # a choice of a deleted checkpoint is void
                state.resume_choice_seq = int(event["seq"])
                state.restart_loop = None  # a person chose where to resume: the next launch is let through
        elif event["type"] == RESUME_CHOICE_CONSUMED:
            if state.resume_choice == event.get("checkpoint"):
                state.resume_choice = None
        elif event["type"] == CONTROL_TUNABLES:
            state.controls.append(_held(event))
            state.last_control_seq = int(event["seq"])
        elif event["type"] == CONTROL_ACTION:
            state.controls.append(_held(event))
            if event.get("action") in STATE_ACTIONS:
                state.last_control_seq = int(event["seq"])
        elif event["type"] == CONTROL_APPLIED:
            state.applied.append(_held(event))
        elif event["type"] == RESTART_LOOP:
            state.restart_loop = _held(event)
    return state


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _event_digest(event: Mapping[str, object]) -> str:
    return hashlib.sha256(_canonical(event)).hexdigest()


def _state_dict(state: RunState) -> dict[str, object]:
    body = dataclasses.asdict(state)
    if body.get("restart_loop") is None:
        del body["restart_loop"]  # absent as in snapshots written before it existed
    return body


def encode_state(state: RunState, run_id: str, last_event: Event) -> bytes:
    """The snapshot of ``state`` (folded through ``last_event``): deterministic JSON.

    The same events give the same bytes, so racing writers ``create`` the
    same object. It names its run and carries a digest of its last event, so
    a reader can tell a snapshot of another log (or a damaged one) apart.
    """
    if int(last_event["seq"]) != state.last_seq:
        raise InvalidArgumentError(f"snapshot of state at {state.last_seq} with event {last_event['seq']} as its last")
    return _canonical(
        {
            "format": SNAPSHOT_FORMAT,
            "run": run_id,
            "seq": state.last_seq,
            "last_event": _event_digest(last_event),
            "state": _state_dict(state),
        }
    )


def decode_state(data: bytes, run_id: str, seq: int, last_event: Event) -> RunState | None:
    """The state in a snapshot, or None if it is not a trustworthy snapshot of this log at ``seq``.

    Checks the format, the run, the sequence number, the digest of event
    ``seq`` and that the bytes are exactly what :func:`encode_state` writes.
    """
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("format") != SNAPSHOT_FORMAT:
            return None
        if body.get("run") != run_id or body.get("seq") != seq or body.get("last_event") != _event_digest(last_event):
            return None
        raw = dict(body["state"])
        state = RunState(**{**raw, "sessions": [SessionRecord(**s) for s in raw["sessions"]]})
        if state.last_seq != seq or encode_state(state, run_id, last_event) != data:
            return None
        return state
    except Exception:  # anything malformed: not a snapshot to trust
        return None
