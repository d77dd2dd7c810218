"""A run as stored, read from any process: :class:`RunHandle` and what its :meth:`~RunHandle.poll` returns."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, TypeVar

from launchhelm._console._read import ConsoleFollower, list_console, read_console, sessions_of
from launchhelm._evaluation._queue import queue_for, queue_manual
from launchhelm._exceptions import (
    CheckpointError,
    InvalidArgumentError,
    InvalidTypeError,
    LaunchHelmError,
    RunClosedError,
)
from launchhelm._metrics._points import abandoned_mask, history_frame
from launchhelm._metrics._read import PointReader
from launchhelm._metrics._segments import concat as concat_points
from launchhelm._metrics._spool import recover_run, spool_root
from launchhelm._metrics._system import STREAMS, default_points, system_frame
from launchhelm._runlog._checkpoints import checkpoint_record
from launchhelm._runlog._control import ACTIONS, check_tunable_changes, in_force
from launchhelm._runlog._events import (
    CONTROL_ACTION,
    CONTROL_TUNABLES,
    RESUME_CHOICE,
    EventLog,
    RunState,
    SequenceTaken,
)
from launchhelm._runlog._liveness import requester
from launchhelm._runlog._records import Event, Json, Requester, RunRow
from launchhelm._runlog._restarts import DEFAULT_MAX_FAILED_RESTARTS, failed_attempts
from launchhelm._runlog._runinfo import furthest_step, run_record
from launchhelm._runlog._sessions import Liveness, liveness, read_beats, run_status
from launchhelm._runlog._summary import run_rows
from launchhelm._runlog._table import mark_row
from launchhelm._types import Attempt, Checkpoint, Evaluation, Rewind
from launchhelm.media._read import MediaItem
from launchhelm.storage import Store

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

T = TypeVar("T")


class ControlChange(TypedDict):
    """One row of :meth:`RunHandle.control_changes`: a control request and what became of it."""

    seq: int
    time: float
    #: ``"tunables"`` or the action
    what: str
    #: the new tunable values (empty for an action)
    changes: dict[str, Json]
    by: Requester | None
    #: None while pending, or if it was dropped
    applied_at_step: int | None
    applied_time: float | None


@dataclass(frozen=True)
class RunView:
    """What :meth:`RunHandle.poll` read: a run's summary, rewinds and history at one moment."""

    summary: dict[str, object]
    rewinds: list[Rewind]
    history: pd.DataFrame


def check_history_keys(keys: object) -> None:
    """Refuse a ``keys=`` argument that is not None, a string or strings (before any read)."""
    if keys is None or isinstance(keys, str):
        return
    if (
        not isinstance(keys, Collection)
        or isinstance(keys, (bytes, Mapping))
        or not all(isinstance(k, str) for k in keys)
    ):
        raise InvalidTypeError(
            f"keys={keys!r}: give a metric name, a list of metric names such as ['loss', 'lr'], or None for all"
        )


class RunHandle:
    """A run as stored, read from any process (a notebook, the CLI, a widget).

    Properties are read fresh from the store on each access, so a notebook
    that keeps a handle sees the run progress.
    """

    def __init__(self, store: Store, run_id: str) -> None:
        self._store = store
        self._record = run_record(store, run_id)
        self._recover()
        self._events = EventLog(store, run_id)
        self._points = PointReader(store, run_id)
        self._points_table: pa.Table | None = None
        self._older_steps: dict[str, int] = {}

    # identity (immutable)
    @property
    def id(self) -> str:
        return str(self._record["id"])

    @property
    def project(self) -> str:
        return str(self._record["project"])

    @property
    def name(self) -> str:
        return str(self._record["name"])

    @property
    def config(self) -> Mapping[str, Json]:
        return dict(self._record.get("config") or {})

    @property
    def created(self) -> float:
        """Creation time, seconds since the epoch."""
        return float(self._record["created"])

    @property
    def store(self) -> Store:
        """The store the run lives in (``Api(handle.store)`` reads the same store)."""
        return self._store

    def __repr__(self) -> str:
        return f"<launchhelm.RunHandle {self.project}/{self.id} {self.name!r}>"

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, object] | None:
        """In a notebook, a handle left as a cell's last expression shows its run panel."""
        from launchhelm._display import run_mimebundle

        return run_mimebundle(self)

    def _display_(self) -> object:
        """In marimo too (it asks for ``_display_``): the run panel, its tabs live."""
        from launchhelm._display import marimo_display

        return marimo_display(self)

    # state
    def _recover(self) -> None:
        """Upload what a session killed on this host spooled but never flushed, before anything is read.

        Checked on every read of the run (a directory lookup when there is
        nothing), so a handle made while the run trained sees the points its
        process logged in its last seconds once that process is gone.
        """
        recover_points(self._store, self.project, [self.id])

    def _state(self) -> RunState:
        self._recover()
        return self._events.state()

    def _last_liveness(self, state: RunState) -> Liveness | None:
        last = state.last_session
        return liveness(self._store, self.id, last) if last is not None else None

    @property
    def status(self) -> str:
        """``"running"``, ``"hung"`` (alive, but no step for its ``hang_timeout``; the
        summary's ``hang`` says where), ``"stopped"`` (its last session neither ended nor
        heartbeats any more: crashed or killed), ``"resumable"`` (ended with
        ``finish(close_run=False)`` or at interpreter exit) or ``"closed"``."""
        self._recover()
        return str(run_rows(self._store, [self.id], exact_step=False)[0]["status"])

    @property
    def step(self) -> int:
        """The furthest step reached, across sessions and attempts."""
        self._recover()
        return int(run_rows(self._store, [self.id])[0]["step"])

    @property
    def last_heartbeat(self) -> float | None:
        """Time of the last session's latest heartbeat (epoch seconds)."""
        live = self._last_liveness(self._state())
        return live.last_heartbeat if live else None

    def events(self) -> list[Event]:
        """The run's event log, oldest first (session starts and ends, ...)."""
        return self._events.events()

    def summary(self) -> RunRow:
        """One row of :meth:`Api.runs`: id, name, status, step, created, ..., ``config.<k>``, ``metric.<k>``.

        Read from the run's summary object when it is current, else from its
        event log (see :meth:`Api.runs`).
        """
        self._recover()
        return _timestamps(run_rows(self._store, [self.id])[0])

    def attempts(self) -> list[Attempt]:
        """Every session of the run, oldest first: who launched it, where, which steps, how it ended.

        A session that stopped heartbeating without ending ended ``"crashed"``
        (its ``ended_at`` is its last heartbeat); one a newer attempt of its
        job took over ended ``"fenced"``. One read of the log and one of the
        sessions' heartbeats.
        """
        self._recover()
        state = self._state()
        beats = read_beats(self._store, self.id, [s.id for s in state.sessions])
        out: list[Attempt] = []
        for i, session in enumerate(state.sessions):
            live = liveness(self._store, self.id, session, beat=beats.get(session.id))
            last = max(session.start_step, session.end_step or 0, live.step)
            ending, detail, ended_at = session.ending, session.detail, session.ended_at
            helper = None
            if session.ended_at is None and ending is None:
                if i == len(state.sessions) - 1 and live.alive:
                    ending, detail = "running", None
                    beat = beats.get(session.id)
                    helper = beat.get("helper") if beat is not None else None
                else:
                    ending, detail = "crashed", detail or f"died without a notice ({live.reason})"
            if ended_at is None and ending != "running":
                ended_at = live.last_heartbeat or None
            host = session.process.get("hostname")
            out.append(
                Attempt(
                    session=session.id,
                    launcher=dict(session.launcher) if session.launcher is not None else None,
                    host=str(host) if host is not None else None,
                    started_at=session.started_at,
                    ended_at=ended_at,
                    first_step=session.start_step,
                    last_step=last,
                    ending=ending or "finished",
                    detail=detail,
                    helper=int(helper) if helper is not None else None,
                )
            )
        return out

    def _restart_loop(self) -> list[dict[str, object]]:
        """The attempts in a row that failed without progress, when there are enough that an ``auto_resume``
        launch with the default ``max_failed_restarts`` is refused (else [])."""
        state = self._state()
        last = state.last_session
        if state.closed or last is None or last.launcher is None:
            return []
        if last.ended_at is None and liveness(self._store, self.id, last).alive:
            return []
        failed = failed_attempts(self._store, self.id, state)
        return failed if len(failed) >= DEFAULT_MAX_FAILED_RESTARTS else []

    def rewinds(self) -> list[Rewind]:
        """Every time history went back, oldest first."""
        return self._rewinds_of(self._state())

    @staticmethod
    def _rewinds_of(state: RunState) -> list[Rewind]:
        return [
            Rewind(
                to_step=int(e["to_step"]),
                reached=int(e["reached"]),
                cause=str(e.get("cause", "load_checkpoint")),
                checkpoint=e.get("checkpoint"),
                attempt=int(e.get("attempt", i + 1)),
            )
            for i, e in enumerate(state.rewinds)
        ]

    def checkpoints(self) -> list[Checkpoint]:
        """The run's published checkpoints, oldest first, as "Resume…" lists them.

        Each carries ``steps_to_redo`` (the furthest step reached minus its
        step), ``before_last_control_change`` and ``chosen_for_resume``.
        """
        state = self._state()
        reached = furthest_step(self._store, self.id, state)
        return [checkpoint_record(self.id, state, event, reached) for event in state.checkpoints]

    def latest_checkpoint(self) -> Checkpoint | None:
        """What ``load_checkpoint("latest")`` would restore now."""
        found = self.checkpoints()
        return found[-1] if found else None

    def resume_checkpoint(self) -> Checkpoint | None:
        """What ``load_checkpoint("resume")`` would restore now: the choice, else the newest."""
        found = self.checkpoints()
        chosen = [c for c in found if c.chosen_for_resume]
        return chosen[0] if chosen else (found[-1] if found else None)

    # evaluations
    def evaluations(self) -> list[Evaluation]:
        """The evaluations of this run's checkpoints, by step.

        Each has the checkpoint id, step, state (``"queued"``, ``"running"``,
        ``"done"``, ``"failed"``), scores, error and attempts. One listing
        plus a read per evaluation not yet finished: cheap to refresh.
        """
        return queue_for(self._store, self.project).evaluations(run_id=self.id)

    def evaluate(self, checkpoint_id: str) -> Evaluation:
        """Queue one evaluation of a checkpoint for a worker ("Evaluate this checkpoint").

        For checkpoints saved before the project's rule was on. Idempotent: a
        checkpoint has at most one evaluation, so asking again returns the
        existing one, whatever its state (use ``Api.evaluation(id).retry()``
        for a failed one).

        Raises
        ------
        CheckpointError
            The run has no published checkpoint with that id.
        """
        return queue_manual(self._store, self.project, self.id, self._state(), checkpoint_id)

    def choose_for_resume(self, checkpoint_id: str) -> Checkpoint:
        """Make ``checkpoint_id`` the one the next ``load_checkpoint("resume")`` restores, once.

        A new choice replaces an unconsumed one. The choice is an event in
        the run's log, so two people choosing at once still leave one answer
        (the later event).

        Raises
        ------
        CheckpointError
            No published checkpoint of this run has that id.
        """
        self._store.require_coordination("choosing a checkpoint for resume")
        while True:
            state = self._state()
            if state.checkpoint(checkpoint_id) is None:
                known = ", ".join(e["checkpoint"] for e in state.checkpoints[-5:]) or "none yet"
                raise CheckpointError(
                    f"run {self.id} has no checkpoint {checkpoint_id!r} (its latest: {known}); "
                    "pick one from RunHandle.checkpoints()",
                    run_id=self.id,
                )
            try:
                # only onto the state just checked: garbage collection may be deleting it
                self._events.append_event(RESUME_CHOICE, {"checkpoint": checkpoint_id}, expect_seq=state.last_seq + 1)
                break
            except SequenceTaken:
                continue
        if state.restart_loop is not None:  # the choice clears it: the runs table's index must read the row again
            mark_row(self._store, self.project, self.id, "chosen", "resume_choice")
        chosen = [c for c in self.checkpoints() if c.id == checkpoint_id]
        return chosen[0]

    # tunables and control
    @property
    def tunables(self) -> dict[str, Json]:
        """The tunables in force in the training process (as it last applied them).

        Requests it has not applied yet are in :meth:`pending_controls`.
        """
        return in_force(self._record.get("tunables") or {}, self._state())[0]

    @property
    def control_state(self) -> str:
        """``"paused"`` if the training process applied a pause (and no resume since), else ``"running"``.

        Only meaningful while :attr:`status` is ``"running"``.
        """
        return "paused" if in_force({}, self._state())[2] else "running"

    def pending_controls(self) -> list[ControlChange]:
        """Control requests the training process has not applied yet, oldest first.

        Rows as in :meth:`control_changes`. An action asked for before the
        current session started is not listed: it was aimed at a session
        that is gone, and is dropped.
        """
        pending = {int(e["seq"]) for e in self._state().pending_controls()}
        return [row for row in self.control_changes() if row["seq"] in pending]

    def control_changes(self) -> list[ControlChange]:
        """Every control request and what became of it, oldest first.

        Each row: ``seq``, ``time``, ``what`` (``"tunables"`` or the action),
        ``changes`` (new tunable values), ``by`` (user, host, pid), and
        ``applied_at_step`` / ``applied_time`` (None while pending, or if it
        was dropped).
        """
        state = self._state()
        applied = {int(request): e for e in state.applied if (request := e.get("request"))}
        rows: list[ControlChange] = []
        for event in state.controls:
            done = applied.get(int(event["seq"]))
            rows.append(
                {
                    "seq": int(event["seq"]),
                    "time": float(event["time"]),
                    "what": "tunables" if event["type"] == CONTROL_TUNABLES else str(event.get("action")),
                    "changes": dict(event.get("changes") or {}) if event["type"] == CONTROL_TUNABLES else {},
                    "by": event.get("by"),
                    "applied_at_step": int(done["step"]) if done else None,
                    "applied_time": float(done["time"]) if done else None,
                }
            )
        return rows

    def _require_open(self, what: str, state: RunState) -> None:
        if state.closed:
            raise RunClosedError(
                f"run {self.id} is closed (finish() was called), so it cannot be {what}; "
                "only open runs take control changes",
                run_id=self.id,
            )

    def set_tunables(self, **values: object) -> int:
        """Change tunables of the run; the training process applies them at its next step boundary.

        Recorded as a control change (an event); returns its sequence number.
        While the run is stopped or resumable, the change waits for the
        session that resumes it (applied at its first step boundary, after
        any ``load_checkpoint``).

        Raises
        ------
        TunableNotFoundError
            A name the run was not started with (``lh.init(tunables=...)``);
            also a ``KeyError``.
        InvalidTypeError
            A value of another kind than the tunable's (a string for a
            number...), or one a ``weights_only`` checkpoint could not hold
            (numpy scalars, paths, objects: give plain values); also a
            ``TypeError``.
        InvalidArgumentError
            No changes, or NaN / infinity; also a ``ValueError``.
        RunClosedError
            The run is closed.

        Examples
        --------
        >>> lh.Api().run(run_id).set_tunables(lr=1e-4)   # doctest: +SKIP
        """
        state = self._state()
        self._require_open("tuned", state)
        current = {**(self._record.get("tunables") or {}), **in_force({}, state)[0]}
        changes = check_tunable_changes(current, values)
        self._store.require_coordination("changing tunables")
        event = self._events.append_event(CONTROL_TUNABLES, {"changes": changes, "by": requester()})
        return int(event["seq"])

    def control(self, action: str) -> int:
        """Ask the training process to ``"pause"``, ``"resume"``, ``"stop"`` or ``"checkpoint"``.

        Applied at its next step boundary: ``pause`` waits there (heartbeats
        go on) until ``resume``; ``stop`` ends the session with
        ``finish(close_run=False)`` (the run stays resumable) and raises
        :class:`launchhelm.RunStopped` in the training loop; ``checkpoint``
        saves one (``launchhelm.torch``) or calls ``run.on_checkpoint_request``
        callbacks. Returns the request's sequence number.

        Raises
        ------
        InvalidArgumentError
            An unknown action (also a ``ValueError``).
        RunClosedError
            The run is closed.
        LaunchHelmError
            The run has no live session to apply it (stopped or resumable):
            resume the run first.
        """
        if action not in ACTIONS:
            raise InvalidArgumentError(f"control({action!r}): use one of {', '.join(repr(a) for a in ACTIONS)}")
        state = self._state()
        self._require_open(f"sent {action!r}", state)
        status = run_status(state, self._last_liveness(state))
        if status != "running":
            raise LaunchHelmError(
                f"run {self.id} is {status}: no training process is attached to apply {action!r}; "
                f"resume it first (launchhelm.init({self.project!r}, resume={self.id!r}))"
            )
        self._store.require_coordination("controlling a run")
        event = self._events.append_event(CONTROL_ACTION, {"action": action, "by": requester()})
        return int(event["seq"])

    def history(
        self, keys: Sequence[str] | str | None = None, duplicates: str = "all", stream: str = "default"
    ) -> pd.DataFrame:
        """The run's metrics as a DataFrame.

        Parameters
        ----------
        keys:
            Metric names to return (default: all).
        duplicates:
            ``"all"``: one row per ``(step, attempt)``: a step redone after a
            rewind appears once per attempt. ``"last"``: one row per step,
            each metric's value from the newest attempt that logged it there.
        stream:
            ``"default"``: the run's own metrics (everything but ``system/``).
            ``"system"``: the system metrics the session sampled
            (``init(system_metrics=...)``), one row per sample by wall time:
            columns ``time`` (UTC), ``step`` (the step training was at), then
            one per ``system/...`` key.

        Returns
        -------
        pandas.DataFrame
            Columns ``step``, ``attempt``, ``time`` (UTC), ``abandoned``, then
            one column per metric key; sorted by step then attempt.
            ``abandoned`` is True for values of an attempt that a later rewind
            went back before: the dimmed line of a chart. However often a run
            was rewound, each row's ``attempt`` and ``abandoned`` say which
            line it belongs to (:meth:`rewinds` has each rewind's attempt).

        Raises
        ------
        InvalidTypeError
            ``keys`` is not a string or a sequence of strings.
        InvalidArgumentError
            ``duplicates`` is neither ``"all"`` nor ``"last"``.
        """
        check_history_keys(keys)
        if duplicates not in ("all", "last"):
            raise InvalidArgumentError(
                f"duplicates={duplicates!r}: use 'all' (every attempt) or 'last' (newest attempt per step)"
            )
        if stream not in STREAMS:
            raise InvalidArgumentError(
                f"stream={stream!r}: use 'default' (the run's metrics) or 'system' (CPU, memory, GPU samples)"
            )
        if stream == "system":
            samples: pd.DataFrame = system_frame(self._read_points(), keys)
            return samples
        state = self._state()
        frame = history_frame(default_points(self._read_points()), keys=keys, duplicates=duplicates)
        frame.insert(3, "abandoned", abandoned_mask(frame["step"].to_numpy(), frame["attempt"].to_numpy(), state))
        return frame

    def media(self, key: Sequence[str] | str | None = None, duplicates: str = "all") -> list[MediaItem]:
        """The images, tables and histograms the run logged, without their content.

        Reads the run's media index (one listing and one round of concurrent
        GETs, whatever the run's length); each item's :meth:`MediaItem.load`
        then reads its object.

        Parameters
        ----------
        key:
            A key or keys to return (default: all).
        duplicates:
            ``"all"``: every attempt's items; at a step redone after a rewind
            the abandoned attempt's are marked ``abandoned``. ``"last"``: per
            key and step, the newest attempt's items only.

        Returns
        -------
        list of MediaItem
            Sorted by key, step, attempt and index in the list logged.

        Raises
        ------
        InvalidTypeError
            ``key`` is not a string or a sequence of strings.
        InvalidArgumentError
            ``duplicates`` is neither ``"all"`` nor ``"last"``.

        Examples
        --------
        >>> items = lh.Api().run(run_id).media("val/samples", duplicates="last")  # doctest: +SKIP
        >>> pixels = items[-1].load()                                           # doctest: +SKIP
        """
        check_history_keys(key)
        if duplicates not in ("all", "last"):
            raise InvalidArgumentError(
                f"duplicates={duplicates!r}: use 'all' (every attempt) or 'last' (newest attempt per step)"
            )
        from launchhelm.media._read import media_items, read_media_index

        table = read_media_index(self._store, self.id)
        keys = list(key) if key is not None and not isinstance(key, str) else key
        return media_items(self._store, self.id, table, self._state(), keys, duplicates)

    def console(self, session: str | int | None = None, tail: int | None = None) -> str:
        """What the run's process printed to stdout and stderr (``lh.init(capture_console=True)``).

        Kept by each session as it ran, written with its metric flushes: a
        live run's output is here within ``flush_interval`` seconds, and a
        process killed with SIGKILL keeps what its last flush wrote. Lines
        past 64 KiB and floods beyond what the store took are cut, with a
        ``[launchhelm: ...]`` line saying how much.

        Parameters
        ----------
        session:
            None: every session, oldest first. A session id (as in
            :meth:`events`), or an index into the sessions that printed
            something (``0`` the first, ``-1`` the latest).
        tail:
            Only the last ``tail`` lines (reads only the objects that hold
            them).

        Returns
        -------
        str
            The text as written ("" when nothing was printed).

        Raises
        ------
        InvalidTypeError
            ``session`` is not a string or an int, or ``tail`` not an int.
        InvalidArgumentError
            ``tail`` is negative, or the run has no such session.

        Examples
        --------
        >>> print(lh.Api().run(run_id).console(tail=20))   # doctest: +SKIP
        """
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int)):
            raise InvalidTypeError(f"tail={tail!r}: give a number of lines, or None for the whole log")
        if tail is not None and tail < 0:
            raise InvalidArgumentError(f"tail={tail}: give a number of lines >= 0, or None for the whole log")
        if session is None:
            return read_console(self._store, self.id, tail=tail)
        if isinstance(session, bool) or not isinstance(session, (str, int)):
            raise InvalidTypeError(
                f"session={session!r}: give a session id (a string), an index such as -1 for the latest, or None"
            )
        if isinstance(session, int):
            printed = sessions_of(list_console(self._store, self.id))
            if not -len(printed) <= session < len(printed):
                raise InvalidArgumentError(
                    f"session={session}: run {self.id} has {len(printed)} session(s) with console output"
                )
            session = printed[session]
        elif not any(p.session == session for p in list_console(self._store, self.id)):
            known = [s.id for s in self._state().sessions]
            if session not in known:
                raise InvalidArgumentError(
                    f"run {self.id} has no session {session!r}; its sessions: {', '.join(known) or 'none'}"
                )
            return ""  # a session that printed nothing
        return read_console(self._store, self.id, session=session, tail=tail)

    def console_follower(self, tail: int | None = 1000) -> ConsoleFollower:
        """Follow :meth:`console` as it grows: ``follower.poll()`` returns only what is new.

        The first poll returns the last ``tail`` lines (None: everything);
        each later one costs one listing plus one concurrent read of the
        objects written since (none when nothing was printed). What
        ``launchhelm logs --follow`` and the panel's Logs tab use.
        """
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
            raise InvalidArgumentError(f"tail={tail!r}: give a number of lines >= 0, or None for everything")
        return ConsoleFollower(self._store, self.id, tail=tail)

    def poll(self, keys: Sequence[str] | str | None = None, duplicates: str = "all") -> RunView:
        """Everything a live view of the run shows, read in one go: state, rewinds and history.

        What a chart or a notebook loop calls every few seconds. After the
        first call it costs a handful of requests whatever the run's length:
        one listing of the event log (plus events not seen yet), the last
        session's heartbeat, one listing of the metrics and the chunks not
        read yet (``docs/storage.md``).

        Returns
        -------
        RunView
            ``summary`` (as :meth:`summary`), ``rewinds`` (as :meth:`rewinds`)
            and ``history`` (as :meth:`history`).
        """
        import pandas as pd

        check_history_keys(keys)
        if duplicates not in ("all", "last"):
            raise InvalidArgumentError(
                f"duplicates={duplicates!r}: use 'all' (every attempt) or 'last' (newest attempt per step)"
            )
        state, live, points, step = self._poll_parts()
        table = default_points(points)
        frame = history_frame(table, keys=keys, duplicates=duplicates)
        frame.insert(3, "abandoned", abandoned_mask(frame["step"].to_numpy(), frame["attempt"].to_numpy(), state))
        summary = {
            "id": self.id,
            "name": self.name,
            "status": run_status(state, live),
            "step": step,
            "created": pd.Timestamp(self.created, unit="s", tz="UTC"),
            "last_heartbeat": pd.Timestamp(live.last_heartbeat, unit="s", tz="UTC") if live else pd.NaT,
            "sessions": len(state.sessions),
            "rewinds": len(state.rewinds),
        }
        return RunView(summary=summary, rewinds=self._rewinds_of(state), history=frame)

    def _poll_parts(self) -> tuple[RunState, Liveness | None, pa.Table, int]:
        """What one :meth:`poll` reads, before any frame: the state, the last session's liveness (or
        None), every point so far as an Arrow table (only new chunks read), and the furthest step.
        The chart reads the same through this and turns the table into numpy arrays itself."""
        state = self._state()
        live = self._last_liveness(state)
        table = self._read_points()
        step = max([self._points.max_step, live.step if live else 0, *self._older_session_steps(state)])
        return state, live, table, step

    def _older_session_steps(self, state: RunState) -> list[int]:
        """The furthest step of each session before the last: they are over, so read once."""
        steps = []
        for session in state.sessions[:-1]:
            if session.id not in self._older_steps:
                self._older_steps[session.id] = max(
                    session.start_step, session.end_step or 0, liveness(self._store, self.id, session).step
                )
            steps.append(self._older_steps[session.id])
        return steps

    def _read_points(self) -> pa.Table:
        """Every point, once: a whole read the first time, then only what arrived since.

        Segments and chunks are immutable, so a handle kept in a notebook
        pays one listing plus the new chunks per call, whatever the run's
        length (``docs/storage.md``).
        """
        if self._points_table is not None:
            new = self._points.poll()
            if new is not None:
                if new.num_rows:
                    self._points_table = concat_points([self._points_table, new])
                return self._points_table
        self._points_table = self._points.read()
        return self._points_table


def _in_parallel(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run independent reads concurrently (each already batches its own requests); results in order."""
    if len(calls) <= 1:
        return [call() for call in calls]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(calls))) as pool:
        return list(pool.map(lambda call: call(), calls))


def recover_points(store: Store, project: str, run_ids: Sequence[str]) -> set[str]:
    """Upload what sessions killed on this host spooled for ``run_ids``; return the runs that got points.

    Such a run changed without a session: its row marker is touched, so the
    runs table's index and the project's history dataset (which both trust
    a run only while its marker is unchanged) read it afresh, on any host.
    """
    root = spool_root()
    if not root.is_dir():
        return set()
    changed = {r for r in run_ids if (root / r).is_dir() and recover_run(store, r, root)}
    for run_id in changed:
        mark_row(store, project, run_id, "recovered", "recovered")
    return changed


def _timestamps(row: RunRow) -> RunRow:
    """A raw row with its times as UTC pandas timestamps, as the runs table shows them."""
    import pandas as pd

    beat = row["last_heartbeat"]
    return {
        **row,
        "created": pd.Timestamp(row["created"], unit="s", tz="UTC"),
        "last_heartbeat": pd.Timestamp(beat, unit="s", tz="UTC") if beat is not None else pd.NaT,
    }
