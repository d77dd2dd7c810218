"""Starting a session: ``init`` and ``start_run`` create or reopen a run and hand back a live ``Run``."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from launchhelm._console import _capture as _console
from launchhelm._exceptions import (
    AlreadyExistsError,
    InvalidArgumentError,
    InvalidTypeError,
    RestartLoopError,
    RunClosedError,
    RunIdentityError,
    RunInUseError,
    StorageError,
)
from launchhelm._metrics._compact import compaction_memory as compaction_memory_setting
from launchhelm._metrics._flusher import encodes_here, warm_up_encoder
from launchhelm._metrics._spool import recover_run
from launchhelm._metrics._system import system_interval
from launchhelm._options import RUN_PARAMETERS, RunOptions, check_options
from launchhelm._run import (
    DEFAULT_CONTROL_INTERVAL,
    DEFAULT_FLUSH_INTERVAL,
    Run,
    _check_flag,
)
from launchhelm._runlog._control import check_plain, in_force
from launchhelm._runlog._events import (
    FENCE_REASON,
    RESTART_LOOP,
    SESSION_STARTED,
    EventLog,
    RunState,
    SequenceTaken,
    fold,
    validate_project,
    validate_run_id,
)
from launchhelm._runlog._launch import EXPLICIT, Launch, auto_run_id, launch_identity, launch_script, newer_attempt
from launchhelm._runlog._live_sessions import install_exit_hook
from launchhelm._runlog._liveness import process_identity
from launchhelm._runlog._names import default_name, new_run_id, new_session_id
from launchhelm._runlog._preempt import preemption_settings
from launchhelm._runlog._restarts import DEFAULT_MAX_FAILED_RESTARTS, check_restart_loop, restart_limit
from launchhelm._runlog._runinfo import furthest_step, read_run_record, session_watermark
from launchhelm._runlog._sessions import (
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HEARTBEAT_TIMEOUT,
    env_seconds,
    liveness,
    summary_key,
)
from launchhelm._runlog._summary import parse_summary
from launchhelm._runlog._table import mark_row
from launchhelm._runlog._watchdog import AUTO, hang_setting
from launchhelm.storage import Store, open_store
from launchhelm.storage._keys import (
    console_prefix,
    fence_name,
    media_index_prefix,
    metrics_prefix,
    project_record_key,
    project_run_marker,
    run_record_key,
)

if TYPE_CHECKING:
    # typing.Unpack is 3.11+; only the type checker reads these annotations
    from typing_extensions import Unpack

__all__ = ["init", "start_run"]

_log = logging.getLogger("launchhelm")


def init(
    project: str,
    name: str | None = None,
    config: Mapping[str, object] | None = None,
    tunables: Mapping[str, object] | None = None,
    resume: str | None = None,
    store: str | os.PathLike[str] | Store | None = None,
    **options: Unpack[RunOptions],
) -> Run:
    """Start a run, or reopen one with ``resume=<run id>``.

    Parameters
    ----------
    project:
        Project name (letters, digits, ``.``, ``_``, ``-``).
    name:
        Display name; a random ``adjective-noun-N`` if omitted.
    config:
        JSON-serialisable settings recorded with the run.
    tunables:
        Values that may be changed from outside while the run trains
        (``RunHandle.set_tunables(lr=1e-4)``): plain JSON values. Read them
        as ``run.tunables``; changes arrive at step boundaries.
    resume:
        Id of an open run to reopen as a new session. Refused with
        :class:`RunNotFoundError` (unknown id), :class:`RunClosedError`
        (``finish()`` closed it) or :class:`RunInUseError` (its session is
        alive). A session on this host whose process is gone counts as dead
        immediately; one on another host once its heartbeat is older than
        its timeout.
    store:
        Store URL or path; default ``$LAUNCHHELM_STORE``, else ``~/.launchhelm``.
    **options:
        Keyword options, each described in :class:`RunOptions`:
        ``storage_options``, ``takeover``, ``flush_interval``,
        ``heartbeat_interval``, ``heartbeat_timeout``, ``control_interval``,
        ``system_metrics``, ``capture_console``, ``run_id``,
        ``compaction_memory``, ``auto_resume``, ``preemption``,
        ``preemption_signals``, ``preemption_budget``, ``hang_timeout`` and
        ``max_failed_restarts``.

    Raises
    ------
    InvalidArgumentError
        A malformed project name or run id, a blank ``name``, a run of
        another project, non-finite numbers in ``config`` or ``tunables``, or
        intervals that are not positive (also a ``ValueError``). Nothing is
        stored.
    InvalidTypeError
        ``config`` or ``tunables`` not a dict (or holding values that are not
        plain), ``resume`` not a string, ``takeover`` not a bool (also a
        ``TypeError``). Nothing is stored.
    UnknownOptionError
        A keyword that is not an option (``flush_intervall=``), named with
        the closest valid name (also a ``TypeError``). Nothing is stored.
    RunNotFoundError, RunClosedError, RunInUseError
        See ``resume``.
    AlreadyExistsError
        ``run_id`` names a run that exists (also a ``FileExistsError``).

    Examples
    --------
    >>> import launchhelm as lh
    >>> run = lh.init("quickstart", config={"lr": 3e-4}, store="memory://doc")
    >>> run.global_step = 1
    >>> run.log({"loss": 0.5})
    >>> run.finish()
    """
    return start_run(Run, project, name=name, config=config, tunables=tunables, resume=resume, store=store, **options)


RunT = TypeVar("RunT", bound=Run)


def start_run(
    run_class: type[RunT],
    project: str,
    *,
    name: str | None = None,
    config: Mapping[str, object] | None = None,
    tunables: Mapping[str, object] | None = None,
    resume: str | None = None,
    store: str | os.PathLike[str] | Store | None = None,
    **options: Unpack[RunOptions],
) -> RunT:
    """:func:`init` for a given :class:`Run` subclass (``launchhelm.torch`` uses it)."""
    check_options("launchhelm.init", options, RUN_PARAMETERS)
    run_id = options.get("run_id")
    takeover = options.get("takeover", False)
    capture_console = options.get("capture_console", True)
    auto_resume = options.get("auto_resume", False)
    validate_project(project)
    _check_flag("auto_resume", auto_resume)
    launch: Launch | None = None
    if auto_resume:
        if resume is not None:
            raise InvalidArgumentError(
                f"auto_resume=True finds the run to reopen by itself; resume={resume!r} names one: pass one of them"
            )
        if run_id is not None and not isinstance(run_id, str):
            raise InvalidTypeError(f"run_id={run_id!r}: give the job's identity as a string")
        launch = launch_identity(explicit=run_id)
        if launch is None:
            _log.warning(
                "launchhelm: auto_resume found no job identity (no run_id=, LAUNCHHELM_RUN_ID or scheduler): "
                "this launch is a new run; set LAUNCHHELM_RUN_ID=<name> to make relaunches reopen it"
            )
        else:
            run_id = auto_run_id(project, launch)
    elif run_id is not None:
        validate_run_id(run_id)
        if resume is not None:
            raise InvalidArgumentError(
                f"run_id={run_id!r} names the id of a new run; to reopen a run, pass resume={run_id!r} alone"
            )
    system_s = system_interval(options.get("system_metrics"))
    compaction_bytes = compaction_memory_setting(options.get("compaction_memory"))
    _check_flag("takeover", takeover)  # a truthy "no" must not take over a live session
    _check_flag("capture_console", capture_console)
    if resume is not None and not isinstance(resume, str):
        raise InvalidTypeError(f"resume={resume!r}: pass the run id string printed by init() (run.id)")
    flush_s = _seconds(
        "flush_interval", options.get("flush_interval"), "LAUNCHHELM_FLUSH_INTERVAL", DEFAULT_FLUSH_INTERVAL
    )
    beat_s = _seconds(
        "heartbeat_interval",
        options.get("heartbeat_interval"),
        "LAUNCHHELM_HEARTBEAT_INTERVAL",
        DEFAULT_HEARTBEAT_INTERVAL,
    )
    timeout_s = _seconds(
        "heartbeat_timeout", options.get("heartbeat_timeout"), "LAUNCHHELM_HEARTBEAT_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT
    )
    control_s = _seconds(
        "control_interval", options.get("control_interval"), "LAUNCHHELM_CONTROL_INTERVAL", DEFAULT_CONTROL_INTERVAL
    )
    if timeout_s <= beat_s:
        raise InvalidArgumentError(
            f"heartbeat_timeout ({timeout_s}s) must exceed heartbeat_interval ({beat_s}s), "
            "or live sessions would look dead"
        )
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise InvalidArgumentError(f"name={name!r}: give a non-empty string or None for a generated one")
    if config is not None:
        if not isinstance(config, Mapping):
            raise InvalidTypeError(f"config is a {type(config).__name__}; pass a dict")
        check_plain(config, "config")
    if tunables is not None:
        if not isinstance(tunables, Mapping):
            raise InvalidTypeError(f"tunables is a {type(tunables).__name__}; pass a dict")
        check_plain(tunables, "tunables")
    preemption = preemption_settings(options)  # checked before any I/O; installed once the session started
    hang_timeout = hang_setting(options.get("hang_timeout", AUTO))
    max_failed = restart_limit(options.get("max_failed_restarts", DEFAULT_MAX_FAILED_RESTARTS))
    install_exit_hook()

    st = _open_for_training(store, options.get("storage_options"))
    try:
        if encodes_here(st):  # where the helper encodes the chunks (opted in), pyarrow stays out of this process
            warm_up_encoder()
        session_id = new_session_id()
        session_payload = {
            "session": session_id,
            "process": process_identity(),
            "heartbeat_interval": beat_s,
            "heartbeat_timeout": timeout_s,
        }
        if launch is not None:
            session_payload["launcher"] = launch.as_record()
            assert run_id is not None
            try:
                record, events = _create_run(st, project, name, config, tunables, run_id, job=_job_record(launch))
            except AlreadyExistsError:
                resume = run_id  # a relaunch (or a later launch) of the job: reopen the run it created
        if resume is None:
            if launch is None:
                record, events = _create_run(st, project, name, config, tunables, run_id)
            mark_row(st, project, record["id"], session_id, "started")  # before the event: see _runs_table
            started = events.append(SESSION_STARTED, {**session_payload, "resumed": False, "step": 0})
            step, attempt, state = 0, 0, None
        else:
            record, events, step, state, started = _reopen_run(
                st, project, resume, session_payload, takeover, launch=launch, max_failed=max_failed
            )
            attempt = state.attempt
        # a resumed session starts with the settings the last one had applied
        # (not paused: a pause was aimed at that session); requests it never
        # applied arrive through the poller at the first step boundary
        in_force_tunables, control_seq, _ = in_force(record.get("tunables") or {}, state or fold([]))
        run = run_class(
            store=st,
            record=record,
            session_id=session_id,
            events=events,
            global_step=step,
            attempt=attempt,
            resumed=resume is not None,
            flush_interval=flush_s,
            heartbeat_interval=beat_s,
            control_seq=control_seq,
            control_interval=control_s,
            tunables=in_force_tunables,
            control_cursor=state.last_applied_request if state is not None else 0,
            session_seq=int(started["seq"]),
        )
        if state is not None:
            # a resumed session carries on the latest metric values the run's summary had
            previous = parse_summary(_read_or_none(st, summary_key(run.id)), run.id)
            run._latest.update(dict(previous.get("metrics") or {}) if previous is not None else {})
        run._system_interval = system_s
        run._set_memory(compaction_bytes)
        run._capture_console = _console.capture_wanted(capture_console)
        # the helper process beside this one (issue 40), started by the background thread: it uploads a killed
        # process's spool and watches for hangs (issue 42); with auto_resume a hung attempt is ended
        run._plan_helper(hang_timeout, options.get("storage_options"), end_hung=launch is not None)
        run._start()
        # preemption notices (issue 41): listened for once the session exists, on the thread that called init
        run._listen_for_preemption(preemption)
        return run
    except BaseException:
        # the store's own process (LAUNCHHELM_HELPER_STORE=1) ends with the init that started it
        from launchhelm.storage._remote import HelperStore

        if isinstance(st, HelperStore) and st is not store:
            st.close()
        raise


def _seconds(name: str, given: float | None, env: str, default: float) -> float:
    if given is None:
        return env_seconds(env, default)
    if isinstance(given, bool) or not isinstance(given, (int, float)) or not given > 0:
        raise InvalidArgumentError(f"{name}={given!r}: give a positive number of seconds")
    return float(given)


def _read_or_none(store: Store, key: str) -> bytes | None:
    return store.read_many([key])[key]


def _create_run(
    store: Store,
    project: str,
    name: str | None,
    config: Mapping[str, object] | None,
    tunables: Mapping[str, object] | None,
    given_id: str | None = None,
    job: dict[str, str] | None = None,
) -> tuple[dict[str, Any], EventLog]:
    while True:
        run_id = given_id or new_run_id()
        record: dict[str, Any] = {
            "format": "launchhelm.run/1",
            "id": run_id,
            "project": project,
            "name": name or default_name(),
            "config": dict(config or {}),
            "tunables": dict(tunables or {}),
            "created": time.time(),
        }
        if job is not None:
            record["job"] = job  # what a relaunch must match to reopen it (auto_resume)
        try:
            store.create(run_record_key(run_id), json.dumps(record).encode())
            break
        except AlreadyExistsError:
            if job is not None:
                raise  # auto_resume: the job's run exists, the caller reopens it
            if given_id is not None:
                raise AlreadyExistsError(
                    f"a run with id {given_id!r} already exists in this store; resume it with "
                    f"init(project, resume={given_id!r}) or choose another id",
                    url=store.url,
                ) from None
            continue  # an id collision: draw another
    for key, body in (
        (project_record_key(project), {"project": project, "created": record["created"]}),
        (project_run_marker(project, run_id), {"created": record["created"]}),
    ):
        try:
            store.create(key, json.dumps(body).encode())
        except AlreadyExistsError:
            pass
    return record, EventLog(store, run_id)


def _job_record(launch: Launch) -> dict[str, str]:
    """What ``run.json`` records of the job that created the run: a relaunch must match it."""
    return {"scheduler": launch.scheduler, "job": launch.job, "script": launch_script()}


def _check_same_job(record: Mapping[str, Any], launch: Launch, run_id: str) -> None:
    """Refuse to reopen a run another job or script created under the same identity (never merge two)."""
    job = record.get("job")
    if not isinstance(job, dict):
        if launch.scheduler == EXPLICIT:
            return  # a run created by id (run_id=, resume=) that the user now names as the job's
        raise RunIdentityError(
            f"run {run_id} exists but was not created by a launch of {launch.scheduler} job {launch.job!r}; "
            "refusing to merge two runs: set LAUNCHHELM_RUN_ID to a new name",
            run_id=run_id,
        )
    mine = _job_record(launch)
    if job.get("scheduler") != mine["scheduler"] or job.get("job") != mine["job"]:
        raise RunIdentityError(
            f"run {run_id} belongs to {job.get('scheduler')} job {job.get('job')!r}, not to "
            f"{mine['scheduler']} job {mine['job']!r}; refusing to merge them: set LAUNCHHELM_RUN_ID to a new name",
            run_id=run_id,
        )
    if job.get("script") != mine["script"]:
        raise RunIdentityError(
            f"run {run_id} of {mine['scheduler']} job {mine['job']!r} was created by {job.get('script')!r}, and "
            f"this launch runs {mine['script']!r}: an identity reused by another script is refused, not merged; "
            "set LAUNCHHELM_RUN_ID (or run_id=) to a new name for this script",
            run_id=run_id,
        )


def _mark_fence(store: Store, run_id: str, session_id: str, watermark: Mapping[str, int]) -> None:
    """The objects' half of the fence, before its event: readers drop the fenced session's metrics chunks
    and console parts and media index chunks past its watermark (``docs/storage.md``)."""
    prefixes = (
        (metrics_prefix(run_id), "metrics"),
        (console_prefix(run_id), "console"),
        (media_index_prefix(run_id), "media"),
    )
    for prefix, kind in prefixes:
        try:
            store.create(f"{prefix}/{fence_name(session_id, int(watermark[kind]) + 1)}", b"{}")
        except AlreadyExistsError:
            pass  # another try of this relaunch marked it


def _record_restart_loop(
    store: Store,
    project: str,
    run_id: str,
    events: EventLog,
    state: RunState,
    refused: RestartLoopError,
    launch: Launch,
    limit: int | None,
) -> None:
    """Put the refusal in the log once, so that the runs table, the panel, the picker and ``launchhelm watch``
    say "restart loop" until someone chooses a checkpoint; a refusal already recorded is not repeated."""
    if state.restart_loop is not None:
        return
    payload = {"attempts": refused.attempts, "limit": limit or 0, "launcher": launch.as_record()}
    try:
        events.append(RESTART_LOOP, payload, expect_seq=state.last_seq + 1)
    except (SequenceTaken, StorageError) as exc:  # the refusal stands; only its record is lost
        _log.debug("run %s: could not record the restart loop: %s", run_id, exc)
        return
    mark_row(store, project, run_id, "refused", "restart_loop")


def _reopen_run(
    store: Store,
    project: str,
    run_id: str,
    session_payload: dict[str, Any],
    takeover: bool,
    launch: Launch | None = None,
    max_failed: int | None = None,
) -> tuple[dict[str, Any], EventLog, int, RunState, dict[str, Any]]:
    if not isinstance(run_id, str):
        raise InvalidTypeError(f"resume={run_id!r}: pass the run id string printed by init() (run.id)")
    record = read_run_record(store, run_id)
    # refused before anything is stored (the spool's recovery below uploads)
    if record["project"] != project:
        if launch is not None:
            raise RunIdentityError(
                f"run {run_id} (this job's identity) belongs to project {record['project']!r}, not {project!r}; "
                "refusing to merge two projects' runs: set LAUNCHHELM_RUN_ID (or run_id=) to a new name",
                run_id=run_id,
            )
        raise InvalidArgumentError(
            f"run {run_id} belongs to project {record['project']!r}, not {project!r}; "
            f"call init({record['project']!r}, resume={run_id!r})"
        )
    if launch is not None:
        _check_same_job(record, launch, run_id)
    # points a killed session on this host logged but never flushed go in first: they count toward
    # the furthest step reached, and so toward the rewind this session may record
    recover_run(store, run_id)
    # Concurrent resumes are settled by the log: our start event must land
    # right after the state we checked, or we check again.
    store.require_coordination("resuming a run")
    events = EventLog(store, run_id)
    while True:
        state = events.state()
        if state.closed:
            closed = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.closed_at or 0))
            raise RunClosedError(
                f"run {run_id} is closed: finish() was called at {closed}; start a new run, or "
                "next time end sessions with finish(close_run=False) to keep the run resumable",
                run_id=run_id,
            )
        if launch is not None:
            try:
                check_restart_loop(store, run_id, state, max_failed)  # refused before this attempt exists
            except RestartLoopError as refused:
                _record_restart_loop(store, project, run_id, events, state, refused, launch, max_failed)
                raise
        previous = state.last_session
        replaces: dict[str, Any] | None = None
        if previous is not None and previous.ended_at is None:
            live = liveness(store, run_id, previous)
            if launch is not None and newer_attempt(launch, previous.launcher):
                # the scheduler relaunched the job: the session before is over whatever it looks like,
                # and is fenced, so that a zombie of it (a frozen or cut-off node) writes nothing more
                watermark = session_watermark(store, run_id, previous.id)
                _mark_fence(store, run_id, previous.id, watermark)
                replaces = {"session": previous.id, "reason": FENCE_REASON, "watermark": watermark}
            elif live.alive and not takeover:
                age = time.time() - live.last_heartbeat
                where = previous.process.get("hostname", "?")
                raise RunInUseError(
                    f"run {run_id} is in use by session {previous.id} (pid {previous.process.get('pid')} "
                    f"on {where}, last heartbeat {age:.0f}s ago, {live.reason}); stop that process first, "
                    f"or wait {previous.heartbeat_timeout:.0f}s past its last heartbeat if its host is gone, "
                    "or pass takeover=True if you are sure it is dead",
                    run_id=run_id,
                    session_id=previous.id,
                )
            else:
                replaces = {"session": previous.id, "reason": "takeover" if live.alive else live.reason}
        step = furthest_step(store, run_id, state)
        mark_row(store, project, run_id, str(session_payload["session"]), "started")  # before the event
        try:
            started = events.append(
                SESSION_STARTED,
                {**session_payload, "resumed": True, "step": step, "replaces": replaces},
                expect_seq=state.last_seq + 1,
            )
        except SequenceTaken:
            continue
        return record, events, step, state, started


def _open_for_training(store: str | os.PathLike[str] | Store | None, storage_options: Any) -> Store:
    """The session's store: an object store served by the session's helper, started now, with
    ``LAUNCHHELM_HELPER_STORE=1`` (the training process then imports no store client; docs/storage.md),
    else opened here."""
    from launchhelm.storage import default_store_url
    from launchhelm.storage._remote import HelperStore, helper_store_wanted

    if not isinstance(store, (str, os.PathLike)) and store is not None:
        return open_store(store, storage_options)  # a Store as is; anything else refused there, in its words
    url = os.fspath(store) if store is not None else default_store_url()
    if isinstance(url, str) and url and helper_store_wanted(url):
        from launchhelm._helper import serve_store

        try:
            remote: HelperStore = serve_store(url, storage_options, None)
        except StorageError:
            raise  # the store's own answer (unreachable, no bucket, no access): as open_store says it
        except (OSError, TypeError, ValueError) as exc:  # no process (or options that are not JSON): here
            _log.warning("launchhelm: the store %s is opened in this process: its own could not start (%s)", url, exc)
        else:
            from launchhelm._metrics._spool import spool_root

            remote.staging = str(spool_root()) if spool_root().is_dir() else None
            return remote
    return open_store(store, storage_options)
