"""Delivering control requests (tunables, pause, stop, checkpoint now) to a live session.

The session's background thread polls the run's event log for requests made
from outside (``RunHandle.set_tunables()``, ``RunHandle.control()``) and
hands them over; the training thread takes them at its next step boundary
and applies them (``Run._step_boundary``).
"""

from __future__ import annotations

import threading
from typing import Any

from launchhelm._runlog._events import CONTROL_ACTION, CONTROL_TUNABLES, EventLog

__all__ = ["ControlPoller"]


class ControlPoller:
    """The requests found in the log and not yet taken by the training thread.

    ``lock`` is the run's (shared with ``log()``'s appends); ``cursor`` the
    newest request already applied; ``session_seq`` the session's own
    ``session_started`` event: actions aimed at an earlier session are dropped.
    """

    def __init__(self, events: EventLog, lock: threading.Lock, *, cursor: int, session_seq: int) -> None:
        self._events = events
        self._lock = lock
        self.cursor = cursor  # newest request seen by the poller
        self._session_seq = session_seq
        # events of the log the poller has looked at: none after the last request applied
        self._polled = cursor
        self._requests: list[dict[str, Any]] = []  # delivered by the poller, applied at a step boundary
        self.flag = False  # cheap check on the hot path: requests are waiting
        self.wake = threading.Event()

    def poll(self) -> None:
        """Background thread: deliver new control requests to the training thread."""
        fresh = self._events.since(self._polled)
        if fresh:
            self._polled = int(fresh[-1]["seq"])
        found = []
        for event in fresh:
            kind, seq = event.get("type"), int(event["seq"])
            if kind not in (CONTROL_TUNABLES, CONTROL_ACTION) or seq <= self.cursor:
                continue
            if kind == CONTROL_ACTION and seq < self._session_seq:
                continue  # aimed at an earlier session
            found.append(event)
        if found:
            with self._lock:
                self._requests.extend(found)
                self.cursor = max(self.cursor, *(int(e["seq"]) for e in found))
                self.flag = True
            self.wake.set()

    def take(self) -> list[dict[str, Any]]:
        """Training thread: the requests delivered so far, in the log's order."""
        with self._lock:
            requests, self._requests = self._requests, []
            self.flag = False
            self.wake.clear()
        return requests
