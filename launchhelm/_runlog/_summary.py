"""Run summaries: each run's row of the runs table, in one object.

The live session ``put``s ``runs/<id>/summary.json`` (it is the single
writer: at most one live session per run) in place of every third heartbeat
and after each event it appends. A summary names the last event it reflects
(``seq``); a reader checks that event ``seq + 1`` does not exist, else the
summary is behind the log (a session SIGKILLed between an event and its
summary) and the run is folded from its snapshot and log instead. The log
decides whenever the two disagree, and liveness decides "running" versus
"stopped" exactly as for a folded log. See docs/storage.md.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from launchhelm._runlog._control import in_force
from launchhelm._runlog._events import RunState, SessionRecord, event_key, read_state
from launchhelm._runlog._records import Heartbeat, Json, RunRecord, RunRow, SessionRecordDict, Summary
from launchhelm._runlog._runinfo import metrics_last_step, run_record
from launchhelm._runlog._sessions import (
    HUNG,
    RESTART_LOOP,
    RESUMABLE,
    STOPPED,
    fresher_beat,
    heartbeat_key,
    liveness,
    parse_object,
    read_beats,
    run_status,
    summary_key,
)
from launchhelm.storage import Store
from launchhelm.storage._keys import hang_key

__all__ = ["SUMMARY_FORMAT", "encode_summary", "parse_summary", "restart_loop_text", "run_rows"]

SUMMARY_FORMAT = "launchhelm.summary/1"
#: Runs folded at once when their summaries are missing or behind.
_FOLD_THREADS = 16


def encode_summary(
    *,
    run_id: str,
    name: str,
    project: str,
    created: float,
    config: Mapping[str, Json],
    tunables: Mapping[str, Json],
    state: RunState,
    session_id: str,
    step: int,
    interval: float,
    metrics: Mapping[str, float],
    helper: int | None = None,
) -> bytes:
    """The summary the live session ``session_id`` puts: its heartbeat plus the run's row."""
    last = state.last_session
    body: Summary = {
        "format": SUMMARY_FORMAT,
        "id": run_id,
        "name": name,
        "project": project,
        "created": created,
        "config": dict(config),
        "tunables": dict(tunables),
        # the heartbeat it stands in for
        "session": session_id,
        "time": time.time(),
        "step": step,
        "interval": interval,
        # status fields, as the log says at `seq`
        "last_session": cast("SessionRecordDict", dataclasses.asdict(last)) if last is not None else None,
        "closed": state.closed,
        "sessions": len(state.sessions),
        "rewinds": len(state.rewinds),
        "metrics": dict(metrics),
        "seq": state.last_seq,
        "restarts": state.restarts,
    }
    if state.restart_loop is not None:
        body["restart_loop"] = state.restart_loop
    if helper is not None:
        body["helper"] = helper
    return json.dumps(body, separators=(",", ":")).encode()  # NaN metrics stay NaN


def parse_summary(data: bytes | None, run_id: str) -> Summary | None:
    """A summary of ``run_id`` to use, or None (absent, damaged, another format)."""
    if data is None:
        return None
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.get("format") != SUMMARY_FORMAT or body.get("id") != run_id:
            return None
        int(body["seq"])
        if body.get("last_session") is not None:
            SessionRecord(**body["last_session"])
        return cast("Summary", body)
    except Exception:  # a damaged summary is no summary: the log answers
        return None


@dataclasses.dataclass
class _View:
    """What one row needs, from a current summary or from the log."""

    id: str
    name: str
    created: float
    config: dict[str, Json]
    tunables: dict[str, Json]
    metrics: dict[str, float]
    last: SessionRecord | None
    closed: bool
    sessions: int
    rewinds: int
    step: int  # furthest step known before the last session's heartbeat
    summary: Summary | None
    beat: Heartbeat | None = None  # the last session's heartbeat, once read
    beat_read: bool = False
    hang: dict[str, object] | None = None  # the watchdog's marker of a live session that is hung
    restarts: int | None = None  # None: a summary written before layout 3 counted them
    restart_loop: dict[str, object] | None = None  # the log's unresolved restart_loop event


def _from_summary(run_id: str, summary: Summary) -> _View:
    raw = summary.get("last_session")
    last = SessionRecord(**raw) if raw is not None else None
    step = int(summary.get("step") or 0)
    if last is not None:
        step = max(step, last.start_step, last.end_step or 0)
    return _View(
        id=run_id,
        name=str(summary.get("name")),
        created=float(summary.get("created") or 0.0),
        config=dict(summary.get("config") or {}),
        tunables=dict(summary.get("tunables") or {}),
        metrics=dict(summary.get("metrics") or {}),
        last=last,
        closed=bool(summary.get("closed")),
        sessions=int(summary.get("sessions") or 0),
        rewinds=int(summary.get("rewinds") or 0),
        step=step,
        summary=summary,
        restarts=int(summary["restarts"]) if "restarts" in summary else None,
        restart_loop=dict(summary.get("restart_loop") or {}) or None,
    )


def _from_log(store: Store, run_id: str, summary: Summary | None) -> _View:
    """A run whose summary is missing (an older store) or behind the log: fold it."""
    state, _ = read_state(store, run_id)
    record: Summary | RunRecord = summary if summary is not None else run_record(store, run_id)
    beats = read_beats(store, run_id, [s.id for s in state.sessions], summary=summary or {})
    step = 0
    for session in state.sessions:
        beat = beats.get(session.id)
        step = max(step, session.start_step, session.end_step or 0, int(beat["step"]) if beat else 0)
    last = state.last_session
    return _View(
        id=run_id,
        name=str(record.get("name")),
        created=float(record.get("created") or 0.0),
        config=dict(record.get("config") or {}),
        # in force as the log says (a change applied since the summary was put is in it)
        tunables=in_force(dict(record.get("tunables") or {}), state)[0],
        metrics=dict(summary.get("metrics") or {}) if summary is not None else {},
        last=last,
        closed=state.closed,
        sessions=len(state.sessions),
        rewinds=len(state.rewinds),
        step=step,
        summary=summary,
        beat=beats.get(last.id) if last is not None else None,
        beat_read=True,
        restarts=state.restarts,
        restart_loop=dict(state.restart_loop) if state.restart_loop is not None else None,
    )


def restart_loop_text(event: Mapping[str, object]) -> str:
    """One line for a recorded restart loop: how many attempts, how they ended, where they resumed."""
    attempts = [a for a in event.get("attempts") or [] if isinstance(a, Mapping)]  # type: ignore[attr-defined]
    endings = ", ".join(str(a.get("ending")) for a in attempts)
    last = attempts[-1] if attempts else {}
    start = f"; the last resumed at step {last.get('step')}" if last else ""
    if last.get("checkpoint"):
        start += f" from checkpoint {last.get('checkpoint')}"
    return f"relaunch refused: {len(attempts)} attempts in a row ended without progress ({endings}){start}"


def _flatten(prefix: str, values: Mapping[str, object], out: dict[str, object]) -> None:
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            _flatten(f"{prefix}{key}.", value, out)
        else:
            out[f"{prefix}{key}"] = value


def run_rows(store: Store, run_ids: list[str], *, exact_step: bool = True) -> list[RunRow]:
    """One row per run (in ``run_ids``' order), in a bounded number of rounds of concurrent requests.

    1. every summary, in one ``read_many``;
    2. for each not closed, whether event ``seq + 1`` exists, in a second one;
    3. runs whose summary is missing or behind: folded from snapshot and log, concurrently;
    4. the heartbeats of last sessions that did not end, in one ``read_many``,
       and (``exact_step``) their metrics' highest step, concurrently.

    Rows: ``id``, ``name``, ``status``, ``step``, ``created`` and
    ``last_heartbeat`` (epoch seconds, None: never), ``sessions``,
    ``rewinds``, then ``config.<key>`` (nested dicts flattened with ``.``),
    ``tunable.<key>`` (the tunables in force) and ``metric.<key>`` (the
    latest value of each metric, as of the last summary). ``exact_step``: for a last session that did not end (running,
    or killed), also take the highest step of the stored metric points (a
    listing per such run): a session killed after a flush and before its
    next heartbeat stored points further than any heartbeat says.
    """
    if not run_ids:
        return []
    keys = {run_id: summary_key(run_id) for run_id in run_ids}
    got = store.read_many(list(keys.values()))
    summaries = {run_id: parse_summary(got.get(key), run_id) for run_id, key in keys.items()}
    # A closed run's summary is final for its row: after the closing event the log takes no session,
    # rewind or control change (only gc's deletions and resume choices, which no column shows).
    probes = {
        run_id: event_key(run_id, int(s["seq"]) + 1)
        for run_id, s in summaries.items()
        if s is not None and not s.get("closed")
    }
    ahead = store.read_many(list(probes.values())) if probes else {}
    views: dict[str, _View] = {}
    stale = []
    for run_id in run_ids:
        summary = summaries[run_id]
        if summary is not None and (run_id not in probes or ahead.get(probes[run_id]) is None):
            views[run_id] = _from_summary(run_id, summary)
        else:
            stale.append(run_id)
    if len(stale) == 1:
        views[stale[0]] = _from_log(store, stale[0], summaries[stale[0]])
    elif stale:
        with ThreadPoolExecutor(max_workers=min(_FOLD_THREADS, len(stale))) as pool:
            for run_id, view in zip(stale, pool.map(lambda r: _from_log(store, r, summaries[r]), stale), strict=True):
                views[run_id] = view
    # liveness of sessions that did not end: their heartbeat objects, all in one read_many
    unended = [v for v in views.values() if v.last is not None and v.last.ended_at is None and not v.closed]
    unread = [v for v in unended if not v.beat_read]
    if unended:
        # in the same round: each such session's hang marker (issue 42), which the watchdog puts while it is hung
        wanted = [heartbeat_key(v.id, v.last.id) for v in unread if v.last is not None]
        wanted += [hang_key(v.id, v.last.id) for v in unended if v.last is not None]
        got = store.read_many(wanted)
        for v in unread:
            assert v.last is not None
            v.beat = fresher_beat(parse_object(got.get(heartbeat_key(v.id, v.last.id))), v.summary, v.last.id)
            v.beat_read = True
        for v in unended:
            assert v.last is not None
            v.hang = parse_object(got.get(hang_key(v.id, v.last.id)))
    if exact_step and unended:

        def last_step(v: _View) -> int:
            return metrics_last_step(store, v.id, RunState(sessions=[v.last] if v.last else []))

        if len(unended) == 1:
            unended[0].step = max(unended[0].step, last_step(unended[0]))
        else:
            with ThreadPoolExecutor(max_workers=min(_FOLD_THREADS, len(unended))) as pool:
                for v, step in zip(unended, pool.map(last_step, unended), strict=True):
                    v.step = max(v.step, step)
    return [_row(store, views[run_id]) for run_id in run_ids]


def _row(store: Store, view: _View) -> RunRow:
    live = None
    if view.last is not None:
        # an ended session's last sign of life: the summary put after its end event
        beat = view.beat if view.beat_read else fresher_beat(None, view.summary, view.last.id)
        live = liveness(store, view.id, view.last, beat=beat)
    state = RunState(sessions=[view.last] if view.last is not None else [], closed=view.closed)
    row: RunRow = {
        "id": view.id,
        "name": view.name,
        "status": run_status(state, live, hung=view.hang is not None),
        "step": max(view.step, live.step if live is not None else 0),
        "created": view.created,
        "last_heartbeat": live.last_heartbeat if live is not None else None,
        "sessions": view.sessions,
        "rewinds": view.rewinds,
    }
    if row["status"] == HUNG and view.hang is not None:
        row["hang"] = str(view.hang.get("detail") or "")
        since = view.hang.get("since")
        row["hang_since"] = float(since) if isinstance(since, (int, float)) else None
    if view.restart_loop is not None and row["status"] in (RESUMABLE, STOPPED):
        row["status"] = RESTART_LOOP
        row["restart_loop"] = restart_loop_text(view.restart_loop)
    elif view.last is not None and view.last.ending in ("hung", "crashed", "preempted", "fenced"):
        row["last_ending"] = view.last.ending
        row["last_detail"] = str(view.last.detail or "")
    row["restarts"] = view.restarts
    _flatten("config.", view.config, row)
    for key, value in view.tunables.items():
        row[f"tunable.{key}"] = value
    for key, value in view.metrics.items():
        row[f"metric.{key}"] = value
    return row
