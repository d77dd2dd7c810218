"""What the run log stores, typed: events, the run record, summaries, heartbeats.

Records on disk are JSON objects; these TypedDicts name their fields so that
mypy catches a field renamed on one side only. Events are a union tagged by
``type``, each type's name spelled once below (the ``Literal`` and its value
are checked together by mypy). Keys a record may lack (older stores, optional
details) are ``NotRequired``. Nothing here is checked at run time: a record
read from a store is trusted as far as the reader's own checks go
(``_events._parse_event``, ``_summary.parse_summary``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict

from launchhelm._types import JSONValue

if TYPE_CHECKING:
    from typing import TypeAlias

    # typing.NotRequired is 3.11+; only the type checker reads these annotations
    from typing_extensions import NotRequired

__all__ = [
    "CHECKPOINT",
    "CHECKPOINT_DELETED",
    "CONTROL_ACTION",
    "CONTROL_APPLIED",
    "CONTROL_TUNABLES",
    "DAMAGED",
    "RESTART_LOOP",
    "RESUME_CHOICE",
    "RESUME_CHOICE_CONSUMED",
    "REWIND",
    "SESSION_ENDED",
    "SESSION_STARTED",
    "CheckpointDeletedEvent",
    "CheckpointEvent",
    "CheckpointFile",
    "ControlActionEvent",
    "ControlAppliedEvent",
    "ControlEvent",
    "ControlTunablesEvent",
    "DamagedEvent",
    "Event",
    "FailedAttempt",
    "Heartbeat",
    "IndexEntry",
    "Json",
    "RestartLoopEvent",
    "ResumeChoiceConsumedEvent",
    "ResumeChoiceEvent",
    "RewindEvent",
    "RunRecord",
    "RunRow",
    "SessionEndedEvent",
    "SessionRecordDict",
    "SessionStartedEvent",
    "Summary",
]

#: A value as JSON carries it (config, tunables, control changes).
Json: TypeAlias = JSONValue

# -- event types, spelled once ----------------------------------------------------------------
SessionStartedType = Literal["session_started"]
SessionEndedType = Literal["session_ended"]
RewindType = Literal["rewind"]
CheckpointType = Literal["checkpoint"]
CheckpointDeletedType = Literal["checkpoint_deleted"]
ResumeChoiceType = Literal["resume_choice"]
ResumeChoiceConsumedType = Literal["resume_choice_consumed"]
ControlTunablesType = Literal["control_tunables"]
ControlActionType = Literal["control_action"]
ControlAppliedType = Literal["control_applied"]
DamagedType = Literal["damaged"]
RestartLoopType = Literal["restart_loop"]

#: A session (process or DDP job) attached to the run; with ``close_run`` its end closes the run.
SESSION_STARTED: Final[SessionStartedType] = "session_started"
SESSION_ENDED: Final[SessionEndedType] = "session_ended"
#: A restore took the run back: new points get a new attempt.
REWIND: Final[RewindType] = "rewind"
#: A checkpoint was published (its payload is complete).
CHECKPOINT: Final[CheckpointType] = "checkpoint"
#: Garbage collection removed a published checkpoint (recorded before its payload is deleted).
CHECKPOINT_DELETED: Final[CheckpointDeletedType] = "checkpoint_deleted"
RESUME_CHOICE: Final[ResumeChoiceType] = "resume_choice"
RESUME_CHOICE_CONSUMED: Final[ResumeChoiceConsumedType] = "resume_choice_consumed"
#: A request from outside the training process: new tunable values...
CONTROL_TUNABLES: Final[ControlTunablesType] = "control_tunables"
#: ... or an action: pause, resume, stop, checkpoint.
CONTROL_ACTION: Final[ControlActionType] = "control_action"
#: The training process applied requests (or restored a checkpoint's settings).
CONTROL_APPLIED: Final[ControlAppliedType] = "control_applied"
#: ``auto_resume`` refused a relaunch: attempts in a row failed without progress (cleared by a resume
#: choice or by a session that starts).
RESTART_LOOP: Final[RestartLoopType] = "restart_loop"
#: What a damaged event folds as: it keeps its place in the order, and changes nothing.
DAMAGED: Final[DamagedType] = "damaged"


# -- shared pieces ----------------------------------------------------------------------------
class Requester(TypedDict):
    """Who asked for a change (``_liveness.requester``)."""

    user: str
    host: str
    pid: int


class Replaced(TypedDict):
    """The session a resume took over from, and why it was taken as gone.

    ``reason`` ``"relaunched"`` (a newer attempt of the same job) makes the
    event that carries it a fence: readers ignore what ``session`` writes
    after it (``docs/storage.md``, "Attempts, relaunches and the fence").
    """

    session: str
    reason: str
    #: with ``"relaunched"``: per object prefix of ``session``, the highest number stored contiguously
    watermark: NotRequired[dict[str, int]]


class Launcher(TypedDict):
    """Who launched a session's process (``_launch.Launch.as_record``)."""

    scheduler: str
    job: str
    restart: list[int]
    instance: str


class CheckpointFile(TypedDict):
    """One file of a checkpoint: relative name, size and its checksums (``{algorithm: hex}`` keys)."""

    name: str
    size: int
    crc64nvme: NotRequired[str]
    crc32c: NotRequired[str]
    #: what checkpoints recorded before CRC64NVME
    sha256: NotRequired[str]


# -- events ----------------------------------------------------------------------------------
class _EventBase(TypedDict):
    seq: int
    time: float


class SessionStartedEvent(_EventBase):
    type: SessionStartedType
    session: str
    #: where its process runs (``_liveness.process_identity``); imported runs have none
    process: NotRequired[dict[str, object]]
    heartbeat_interval: NotRequired[float]
    heartbeat_timeout: NotRequired[float]
    resumed: NotRequired[bool]
    #: the furthest step the run had reached when the session started
    step: NotRequired[int]
    replaces: NotRequired[Replaced | None]
    #: the scheduler's launch this session is an attempt of (``auto_resume``)
    launcher: NotRequired[Launcher | None]
    #: where an imported run came from
    imported: NotRequired[dict[str, Json]]


class SessionEndedEvent(_EventBase):
    type: SessionEndedType
    session: str
    close_run: NotRequired[bool]
    reason: NotRequired[str | None]
    step: NotRequired[int]
    #: ``"finished" | "preempted" | "crashed" | "hung" | "fenced"`` (absent before layout 3)
    ending: NotRequired[str]
    #: what ended it, in words (the signal, the exception)
    detail: NotRequired[str | None]


class RewindEvent(_EventBase):
    type: RewindType
    session: str
    to_step: int
    reached: int
    checkpoint: str | None
    cause: str
    attempt: int
    #: the importer's key for the rewind
    key: NotRequired[str]


class CheckpointEvent(_EventBase):
    type: CheckpointType
    session: str
    checkpoint: str
    prefix: str
    step: int
    format: str
    size: int
    files: NotRequired[list[CheckpointFile]]
    #: the whole payload's (a folder's: its manifest's) checksums, ``{algorithm: hex}``
    checksums: NotRequired[dict[str, str]]
    #: what checkpoints recorded before ``checksums``
    sha256: NotRequired[str]
    world_size: NotRequired[int]
    #: the control sequence number in force when it was saved
    control_seq: NotRequired[int]


class CheckpointDeletedEvent(_EventBase):
    type: CheckpointDeletedType
    checkpoint: str
    step: NotRequired[int | None]
    reason: NotRequired[str]


class ResumeChoiceEvent(_EventBase):
    type: ResumeChoiceType
    checkpoint: str


class ResumeChoiceConsumedEvent(_EventBase):
    type: ResumeChoiceConsumedType
    session: NotRequired[str]
    checkpoint: str


class ControlTunablesEvent(_EventBase):
    type: ControlTunablesType
    changes: dict[str, Json]
    by: NotRequired[Requester]


class ControlActionEvent(_EventBase):
    type: ControlActionType
    #: pause, resume, stop or checkpoint (``_control.ACTIONS``); ``preempt`` from a rank > 0 that got a notice
    action: str
    by: NotRequired[Requester]
    #: ``preempt``: the notice's signal name and the rank that got it
    signal: NotRequired[str]
    rank: NotRequired[int]


class ControlAppliedEvent(_EventBase):
    type: ControlAppliedType
    session: str
    #: the request's sequence number; None for a checkpoint's settings restored
    request: int | None
    #: ``"control"`` (a request) or ``"restore"``
    cause: str
    step: int
    tunables: dict[str, Json]
    control_seq: int
    paused: bool
    changes: NotRequired[dict[str, Json]]
    action: NotRequired[str]
    #: the checkpoint a ``checkpoint`` action saved
    checkpoint: NotRequired[str | None]


class FailedAttempt(TypedDict):
    """One attempt of a restart loop (``_restarts.failed_attempts``)."""

    session: str
    ending: str
    detail: str
    #: the step it resumed at, and the checkpoint it resumed from (None: none)
    step: int
    checkpoint: str | None


class RestartLoopEvent(_EventBase):
    type: RestartLoopType
    #: the failed attempts, oldest first, and the ``max_failed_restarts`` that refused the launch
    attempts: list[FailedAttempt]
    limit: int
    #: who was refused (``_launch.Launch.as_record``)
    launcher: NotRequired[Launcher]


class DamagedEvent(_EventBase):
    """The placeholder of an event that is not JSON, not an object or not of its sequence number."""

    type: DamagedType


#: A control request: what ``RunState.controls`` holds.
ControlEvent: TypeAlias = ControlTunablesEvent | ControlActionEvent

#: An event of the log, of any type, tagged by ``type``.
Event: TypeAlias = (
    SessionStartedEvent
    | SessionEndedEvent
    | RewindEvent
    | CheckpointEvent
    | CheckpointDeletedEvent
    | ResumeChoiceEvent
    | ResumeChoiceConsumedEvent
    | ControlTunablesEvent
    | ControlActionEvent
    | ControlAppliedEvent
    | RestartLoopEvent
    | DamagedEvent
)


#: One row of the runs table (``_summary.run_rows``): ``id``, ``name``, ``status``, ``step``,
#: ``created``, ``last_heartbeat``, ``sessions``, ``rewinds``, then flat ``config.<key>``,
#: ``tunable.<key>`` and ``metric.<key>`` columns, so its keys are open-ended (no TypedDict can name
#: them on Python 3.10); values as JSON carries them.
RunRow: TypeAlias = dict[str, Any]


# -- other records ------------------------------------------------------------------------------
class RunRecord(TypedDict):
    """``runs/<id>/run.json``: written once, when the run is created."""

    format: str
    id: str
    project: str
    name: str
    config: dict[str, Json]
    tunables: dict[str, Json]
    created: float


class Heartbeat(TypedDict):
    """``runs/<id>/sessions/<session>.json``, rewritten by its session (or the part of a summary standing in)."""

    time: float
    step: int
    interval: NotRequired[float]
    #: the pid of the session's helper process when it beat (absent: none ran, or written before this field)
    helper: NotRequired[int]


class SessionRecordDict(TypedDict):
    """``_events.SessionRecord`` as a summary (and a snapshot) stores it."""

    id: str
    started_at: float
    process: dict[str, object]
    heartbeat_interval: float
    heartbeat_timeout: float
    resumed: bool
    start_step: int
    ended_at: float | None
    end_reason: str | None
    end_step: int | None
    closed_run: bool
    start_seq: int
    launcher: NotRequired[dict[str, object] | None]
    ending: NotRequired[str | None]
    detail: NotRequired[str | None]
    replaced_by: NotRequired[str | None]
    fence_seq: NotRequired[int | None]
    watermark: NotRequired[dict[str, int] | None]


class Summary(TypedDict):
    """``runs/<id>/summary.json``: the live session's heartbeat plus the run's row."""

    format: str
    id: str
    name: str
    project: str
    created: float
    config: dict[str, Json]
    tunables: dict[str, Json]
    session: str
    time: float
    step: int
    interval: float
    last_session: SessionRecordDict | None
    closed: bool
    sessions: int
    rewinds: int
    metrics: dict[str, float]
    #: the last event it reflects
    seq: int
    #: sessions a scheduler's relaunch started (layout 3; absent before)
    restarts: NotRequired[int]
    #: the log's unresolved ``restart_loop`` event, if any
    restart_loop: NotRequired[RestartLoopEvent | None]
    #: the live session's helper process (its pid), as its heartbeat says
    helper: NotRequired[int]


class IndexEntry(TypedDict):
    """One settled row of a runs-table index (``projects/<p>/table/index-*.json``'s ``runs``).

    With the version of the row marker it was read under.
    """

    marker: str | None
    row: RunRow
