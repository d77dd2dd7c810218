"""Session heartbeats and the status they imply.

Heartbeats are per-session objects (``runs/<id>/sessions/<session>.json``),
rewritten by their own session only, never events in the shared log: they
would flood it. A session is live while its process exists (same host) or
while its heartbeat is younger than its timeout (another host).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from launchhelm._events import RunState, SessionRecord, run_prefix
from launchhelm._exceptions import InvalidArgumentError, ObjectNotFoundError
from launchhelm._liveness import process_state
from launchhelm.storage import Store

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "Liveness",
    "heartbeat_key",
    "liveness",
    "run_status",
]

#: Seconds between heartbeats (``LAUNCHHELM_HEARTBEAT_INTERVAL``).
DEFAULT_HEARTBEAT_INTERVAL = 5.0
#: Seconds without a heartbeat after which a session on another host is
#: considered dead (``LAUNCHHELM_HEARTBEAT_TIMEOUT``).
DEFAULT_HEARTBEAT_TIMEOUT = 30.0

RUNNING, STOPPED, RESUMABLE, CLOSED = "running", "stopped", "resumable", "closed"


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


def heartbeat_key(run_id: str, session_id: str) -> str:
    return f"{run_prefix(run_id)}/sessions/{session_id}.json"


def encode_heartbeat(step: int, interval: float) -> bytes:
    return json.dumps({"time": time.time(), "step": step, "interval": interval}).encode()


def read_heartbeat(store: Store, run_id: str, session_id: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(store.read(heartbeat_key(run_id, session_id))))
    except (ObjectNotFoundError, ValueError):
        return None


@dataclass(frozen=True)
class Liveness:
    """What is known about a session's process."""

    alive: bool
    reason: str  # why: "process alive", "process gone", "heartbeat fresh", "heartbeat stale", "ended"
    last_heartbeat: float
    step: int


def liveness(store: Store, run_id: str, session: SessionRecord, now: float | None = None) -> Liveness:
    """Decide whether ``session`` is alive, as resume and status need it."""
    beat = read_heartbeat(store, run_id, session.id)
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
    if now - last > session.heartbeat_timeout:
        return Liveness(False, "heartbeat stale", last, step)
    return Liveness(True, "heartbeat fresh", last, step)


def run_status(state: RunState, last: Liveness | None) -> str:
    """``running``, ``stopped``, ``resumable`` or ``closed``."""
    if state.closed:
        return CLOSED
    session = state.last_session
    if session is None or last is None:
        return STOPPED
    if session.ended_at is not None:
        return RESUMABLE
    return RUNNING if last.alive else STOPPED
