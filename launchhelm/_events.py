"""The per-run event log and the run state folded from it.

Every change to a run that more than one process could race on is an event:
``runs/<id>/events/<seq:020d>.json``, each written with ``Store.create``. A
writer that loses a sequence number re-reads the log and takes the next one,
so every backend gives one total order of events. Conditional appends
(``expect_seq``) turn the log into a compare-and-swap: resume checks the
run's state at sequence N and only succeeds if its event lands at N + 1.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from launchhelm._exceptions import AlreadyExistsError, InvalidArgumentError, LaunchHelmError
from launchhelm.storage import Store

__all__ = [
    "CHECKPOINT",
    "CHECKPOINT_DELETED",
    "CONTROL_ACTION",
    "CONTROL_APPLIED",
    "CONTROL_TUNABLES",
    "RESUME_CHOICE",
    "RESUME_CHOICE_CONSUMED",
    "REWIND",
    "SESSION_ENDED",
    "SESSION_STARTED",
    "EventLog",
    "RunState",
    "SessionRecord",
    "fold",
    "run_prefix",
]

# record types, defined once
SESSION_STARTED = "session_started"
SESSION_ENDED = "session_ended"
REWIND = "rewind"
CHECKPOINT = "checkpoint"
#: Garbage collection removed a published checkpoint (recorded before its payload is deleted).
CHECKPOINT_DELETED = "checkpoint_deleted"
RESUME_CHOICE = "resume_choice"
RESUME_CHOICE_CONSUMED = "resume_choice_consumed"
#: A request from outside the training process: new tunable values...
CONTROL_TUNABLES = "control_tunables"
#: ... or an action: pause, resume, stop, checkpoint.
CONTROL_ACTION = "control_action"
#: The training process applied requests (or restored a checkpoint's settings).
CONTROL_APPLIED = "control_applied"
#: Actions that change settings a checkpoint holds (and restores): "stop"
#: ends a session and "checkpoint" asks for a save, neither is restored.
STATE_ACTIONS = ("pause", "resume")

RUN_FORMAT = "launchhelm.run/1"
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


def run_prefix(run_id: str) -> str:
    return f"runs/{run_id}"


def project_run_marker(project: str, run_id: str) -> str:
    return f"projects/{project}/runs/{run_id}"


class SequenceTaken(LaunchHelmError):
    """A conditional append lost: the log moved past what the caller checked."""


class EventLog:
    """Append-only, totally ordered event log of one run.

    Reads are incremental: events are immutable, so each is fetched once.
    """

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.prefix = f"{run_prefix(run_id)}/events"
        self._events: list[dict[str, Any]] = []
        # the training process appends from its main thread and polls for
        # control requests from its background thread
        self._lock = threading.RLock()

    @staticmethod
    def _key_seq(name: str) -> int | None:
        stem = name.split("/")[-1]
        if not stem.endswith(".json"):
            return None
        try:
            return int(stem[:-5])
        except ValueError:
            return None

    def read(self) -> list[dict[str, Any]]:
        """All events, oldest first (fetching only those not yet seen)."""
        with self._lock:
            return self._read()

    def _read(self) -> list[dict[str, Any]]:
        seen = len(self._events)
        names = sorted(
            (seq, name)
            for name in self.store.list(self.prefix)
            if (seq := self._key_seq(name)) is not None and seq > seen
        )
        for seq, name in names:
            if seq != len(self._events) + 1:
                break  # a gap: a writer is mid-create; stop at the last contiguous one
            self._events.append(json.loads(self.store.read(f"{self.prefix}/{name}")))
        return list(self._events)

    @property
    def last_seq(self) -> int:
        return len(self._events)

    def append(self, type_: str, payload: dict[str, Any], *, expect_seq: int | None = None) -> dict[str, Any]:
        """Append one event and return it (with its ``seq``).

        With ``expect_seq`` the event must land at exactly that sequence
        number, else :class:`SequenceTaken` is raised and the caller re-checks
        the state it based its decision on.
        """
        with self._lock:
            return self._append(type_, payload, expect_seq)

    def _append(self, type_: str, payload: dict[str, Any], expect_seq: int | None) -> dict[str, Any]:
        while True:
            seq = expect_seq if expect_seq is not None else self.last_seq + 1
            event = {"seq": seq, "type": type_, "time": time.time(), **payload}
            body = json.dumps(event, separators=(",", ":"), allow_nan=False).encode()
            try:
                self.store.create(f"{self.prefix}/{seq:020d}.json", body)
            except AlreadyExistsError:
                self._read()
                if expect_seq is not None:
                    raise SequenceTaken(f"event {seq} of run {self.run_id} was taken by another writer") from None
                if self.last_seq < seq:  # taken but not yet readable: wait for it
                    time.sleep(0.01)
                continue
            if seq == self.last_seq + 1:
                self._events.append(event)
            return event


@dataclass
class SessionRecord:
    """One session (process or DDP job) attached to a run, as the log tells it."""

    id: str
    started_at: float
    process: dict[str, Any]
    heartbeat_interval: float
    heartbeat_timeout: float
    resumed: bool = False
    start_step: int = 0
    ended_at: float | None = None
    end_reason: str | None = None
    end_step: int | None = None
    closed_run: bool = False
    start_seq: int = 0


@dataclass
class RunState:
    """What the event log says about a run."""

    sessions: list[SessionRecord] = field(default_factory=list)
    closed: bool = False
    closed_at: float | None = None
    rewinds: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    #: ``checkpoint_deleted`` events: checkpoints gc removed (no longer in ``checkpoints``)
    deleted_checkpoints: list[dict[str, Any]] = field(default_factory=list)
    #: the unconsumed resume choice (checkpoint id), if any
    resume_choice: str | None = None
    #: sequence number of the latest control change (0: none yet): tunables,
    #: pause or resume (stop and checkpoint requests change no saved setting)
    last_control_seq: int = 0
    #: control requests (tunables and actions), oldest first
    controls: list[dict[str, Any]] = field(default_factory=list)
    #: what training processes applied, oldest first
    applied: list[dict[str, Any]] = field(default_factory=list)
    last_seq: int = 0

    def checkpoint(self, checkpoint_id: str) -> dict[str, Any] | None:
        for event in self.checkpoints:
            if event["checkpoint"] == checkpoint_id:
                return event
        return None

    @property
    def latest_checkpoint(self) -> dict[str, Any] | None:
        """The newest published checkpoint: what ``"latest"`` restores."""
        return self.checkpoints[-1] if self.checkpoints else None

    @property
    def resume_checkpoint(self) -> dict[str, Any] | None:
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

    def pending_controls(self) -> list[dict[str, Any]]:
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
    def attempt(self) -> int:
        """The attempt number new points carry: one more per rewind."""
        return len(self.rewinds)


def fold(events: list[dict[str, Any]]) -> RunState:
    """Fold the log into the run's state."""
    state = RunState()
    by_id: dict[str, SessionRecord] = {}
    for event in events:
        kind = event.get("type")
        state.last_seq = int(event["seq"])
        if kind == SESSION_STARTED:
            rec = SessionRecord(
                id=event["session"],
                started_at=float(event["time"]),
                process=dict(event.get("process", {})),
                heartbeat_interval=float(event.get("heartbeat_interval", 5.0)),
                heartbeat_timeout=float(event.get("heartbeat_timeout", 30.0)),
                resumed=bool(event.get("resumed", False)),
                start_step=int(event.get("step", 0)),
                start_seq=int(event["seq"]),
            )
            state.sessions.append(rec)
            by_id[rec.id] = rec
        elif kind == SESSION_ENDED:
            ended = by_id.get(event.get("session", ""))
            if ended is not None:
                ended.ended_at = float(event["time"])
                ended.end_reason = event.get("reason")
                ended.end_step = int(event.get("step", 0))
                ended.closed_run = bool(event.get("close_run", False))
            if event.get("close_run"):
                state.closed = True
                state.closed_at = float(event["time"])
        elif kind == REWIND:
            state.rewinds.append(dict(event))
        elif kind == CHECKPOINT:
            state.checkpoints.append(dict(event))
        elif kind == CHECKPOINT_DELETED:
            gone = event.get("checkpoint")
            state.checkpoints = [c for c in state.checkpoints if c["checkpoint"] != gone]
            state.deleted_checkpoints.append(dict(event))
            if state.resume_choice == gone:
                state.resume_choice = None
        elif kind == RESUME_CHOICE:
            if not any(d.get("checkpoint") == event["checkpoint"] for d in state.deleted_checkpoints):
                state.resume_choice = event["checkpoint"]  # a choice of a deleted checkpoint is void
        elif kind == RESUME_CHOICE_CONSUMED:
            if state.resume_choice == event.get("checkpoint"):
                state.resume_choice = None
        elif kind in (CONTROL_TUNABLES, CONTROL_ACTION):
            state.controls.append(dict(event))
            if kind == CONTROL_TUNABLES or event.get("action") in STATE_ACTIONS:
                state.last_control_seq = int(event["seq"])
        elif kind == CONTROL_APPLIED:
            state.applied.append(dict(event))
    return state
