"""Session heartbeats and the status they imply.

Heartbeats are per-session objects (``runs/<id>/sessions/<session>.json``),
rewritten by their own session only, never events in the shared log: they
would flood it. A session is live while its process exists (same host) or
while its heartbeat is younger than its timeout (another host).

The live session also ``put``s the run's summary (``runs/<id>/summary.json``)
in place of every third heartbeat; the summary carries the heartbeat, so a
session's last heartbeat is the fresher of its heartbeat object and a summary
naming it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, cast

from launchhelm._exceptions import InvalidArgumentError, ObjectNotFoundError
from launchhelm._runlog._events import RunState, SessionRecord
from launchhelm._runlog._liveness import process_state
from launchhelm._runlog._records import Heartbeat, Summary
from launchhelm.storage import Store
from launchhelm.storage._keys import heartbeat_key, summary_key

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "PROCESS_DIED",
    "Liveness",
    "heartbeat_key",
    "liveness",
    "parse_object",
    "read_beats",
    "run_status",
    "settled_status",
    "summary_key",
]

#: Seconds between heartbeats (``LAUNCHHELM_HEARTBEAT_INTERVAL``).
DEFAULT_HEARTBEAT_INTERVAL = 5.0
#: Seconds without a heartbeat after which a session on another host is
#: considered dead (``LAUNCHHELM_HEARTBEAT_TIMEOUT``).
DEFAULT_HEARTBEAT_TIMEOUT = 30.0

RUNNING, STOPPED, RESUMABLE, CLOSED, HUNG = "running", "stopped", "resumable", "closed", "hung"
#: a run whose relaunch ``auto_resume`` refused (attempts in a row failed without progress)
RESTART_LOOP = "restart loop"
#: The end ``reason`` of a session its helper process ended because its process died: the session
#: ended (``RunHandle.attempts()`` says how), and the run's status stays "stopped", as for any crash.
PROCESS_DIED = "process died"


def env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgumentError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise InvalidArgumentError(f"{name}={raw!r} must be a positive number of seconds")
    return value


def parse_object(data: bytes | None) -> dict[str, object] | None:
    """A JSON object as stored, or None (absent, damaged, not an object)."""
    if data is None:
        return None
    try:
        found = json.loads(data)
    except ValueError:
        return None
    return cast("dict[str, object]", found) if isinstance(found, dict) else None


def fresher_beat(
    stored: Mapping[str, object] | None, summary_object: Mapping[str, object] | None, session_id: str
) -> Heartbeat | None:
    """The newer of a session's heartbeat object and a summary naming that session.

    Both as stored: a heartbeat and a summary, their fields as their writers wrote them.
    """
    beat = cast("Heartbeat | None", stored)
    summary = cast("Summary | None", summary_object)
    if summary is None or summary.get("session") != session_id:
        return beat
    try:
        from_summary: Heartbeat = {"time": float(summary["time"]), "step": int(summary["step"])}
        if "helper" in summary:
            from_summary["helper"] = int(summary["helper"])
    except (KeyError, TypeError, ValueError):
        return beat
    if beat is None or float(beat.get("time", 0.0)) < from_summary["time"]:
        return from_summary
    return beat


def read_beats(
    store: Store, run_id: str, session_ids: list[str], summary: Mapping[str, object] | None = None
) -> dict[str, Heartbeat | None]:
    """Each session's latest heartbeat (None: none yet), in one ``read_many``.

    Reads the run's summary too unless given, since it carries the live
    session's heartbeat every third time.
    """
    keys = [heartbeat_key(run_id, s) for s in session_ids]
    wanted = keys if summary is not None else [*keys, summary_key(run_id)]
    got = store.read_many(wanted) if wanted else {}
    if summary is None:
        summary = parse_object(got.get(summary_key(run_id)))
    return {s: fresher_beat(parse_object(got.get(k)), summary, s) for s, k in zip(session_ids, keys, strict=True)}


def encode_heartbeat(step: int, interval: float, helper: int | None = None) -> bytes:
    beat: Heartbeat = {"time": time.time(), "step": step, "interval": interval}
    if helper is not None:
        beat["helper"] = helper
    return json.dumps(beat).encode()


def read_heartbeat(store: Store, run_id: str, session_id: str) -> Heartbeat | None:
    try:
        return cast("Heartbeat", dict(json.loads(store.read(heartbeat_key(run_id, session_id)))))
    except (ObjectNotFoundError, ValueError):
        return None


@dataclass(frozen=True)
class Liveness:
    """What is known about a session's process."""

    alive: bool
    reason: str  # why: "process alive", "process gone", "heartbeat fresh", "heartbeat stale", "ended"
    last_heartbeat: float
    step: int


class _Unread:
    """The type of :data:`_UNREAD`: ``liveness`` reads the heartbeat itself."""


_UNREAD: Final = _Unread()


#: Seconds a heartbeat may be ahead of this host's clock before it is not believed.
_MAX_CLOCK_SKEW = 300.0


def liveness(
    store: Store,
    run_id: str,
    session: SessionRecord,
    now: float | None = None,
    beat: Mapping[str, object] | _Unread | None = _UNREAD,
) -> Liveness:
    """Decide whether ``session`` is alive, as resume and status need it.

    ``beat``: its latest heartbeat if already read (:func:`read_beats`), None if it has none.
    """
    if isinstance(beat, _Unread):
        beat = read_beats(store, run_id, [session.id])[session.id]
    beat = cast("Heartbeat | None", beat)
    last = float(beat["time"]) if beat else session.started_at
    step = int(beat["step"]) if beat else session.start_step
    if session.ended_at is not None:
        return Liveness(False, "ended", last, max(step, session.end_step or 0))
    proc = process_state(session.process)
    if proc == "dead":
        return Liveness(False, "process gone", last, step)
    if proc == "alive":
        return Liveness(True, "process alive", last, step)
    now = time.time() if now is None else now
    if last > now + max(session.heartbeat_timeout, _MAX_CLOCK_SKEW):
        # a damaged object or a clock far ahead: trusted, it would keep the run "running" for good
        import warnings

        warnings.warn(
            f"session {session.id} of run {run_id} has a heartbeat {last - now:.0f}s in the future "
            "(a damaged heartbeat, or its host's clock is wrong); it is not taken as a sign of life",
            stacklevel=2,
        )
        return Liveness(False, "heartbeat from the future", last, step)
    if now - last > session.heartbeat_timeout:
        return Liveness(False, "heartbeat stale", last, step)
    return Liveness(True, "heartbeat fresh", last, step)


def run_status(state: RunState, last: Liveness | None, *, hung: bool = False) -> str:
    """``running``, ``hung`` (alive, and its watchdog marked it), ``stopped``, ``resumable`` or ``closed``."""
    if state.closed:
        return CLOSED
    session = state.last_session
    if session is None or last is None:
        return STOPPED
    if session.ended_at is not None:
        return STOPPED if session.end_reason == PROCESS_DIED else RESUMABLE
    if not last.alive:
        return STOPPED
    return HUNG if hung else RUNNING


def settled_status(state: RunState) -> str | None:
    """ "closed", or "resumable" (its last session ended), else None: the statuses a run keeps until a new session.

    As :func:`run_status` says them; a session its helper ended after a crash
    (``stopped``) is None too: read afresh, as it may still be recovered.
    """
    if state.closed:
        return CLOSED
    last = state.last_session
    if last is None or last.ended_at is None or last.end_reason == PROCESS_DIED:
        return None
    return RESUMABLE
