"""Telling the user that the store stopped answering, and that it answers again: one line each.

A live session's flushes, heartbeats, saves and compactions may all fail at
once while the store is away; the user reads one line saying so (since when,
and where the points are held meanwhile), one when it recovers, and never a
third party's traceback.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from launchhelm.storage._backends import request_budget

__all__ = ["OutageReporter"]

_log = logging.getLogger("launchhelm")


class OutageReporter:
    """Says an outage of ``store_url`` once, for run ``run_id``; ``held()`` says where its points wait."""

    def __init__(self, run_id: str, store_url: str, held: Callable[[], str]) -> None:
        self._run_id = run_id
        self._store_url = store_url
        self._held = held
        self._since: float | None = None  # wall time the store stopped answering (said once)
        self._lock = threading.Lock()  # the flusher, a save and a compaction may all fail at once
        self._ended = -math.inf  # wall time the store last answered again

    def failed(self, exc: BaseException, since: float | None = None, sent: float | None = None) -> None:
        """The first failure of an outage: one line saying what failed, since when, and what is held where.

        ``since``: when the request that failed was sent (default: now); ``sent``: when the work that
        failed began, if not then. A request an outage swallowed can fail after the store answers
        again: that is the old outage, not a new one.
        """
        sent = sent if sent is not None else since
        with self._lock:
            if self._since is not None:
                return
            if (sent is not None and sent < self._ended) or (
                sent is None and time.time() - self._ended < request_budget()
            ):
                _log.debug("run %s: a request sent before the store answered again failed: %s", self._run_id, exc)
                return
            self._since = time.time() if since is None else since
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        _log.warning(
            "launchhelm: run %s: the store %s is not answering since %s (%s); %s, nothing is lost; retrying",
            self._run_id,
            self._store_url,
            time.strftime("%H:%M:%S", time.localtime(self._since)),
            reason,
            self._held(),
        )

    def answered(self) -> None:
        """A request succeeded: if an outage was said, say that it ended."""
        with self._lock:
            if self._since is None:
                return
            self._ended = time.time()
            lasted = self._ended - self._since
            self._since = None
        _log.warning(
            "launchhelm: run %s: the store %s answers again after %.0fs; the held points are written",
            self._run_id,
            self._store_url,
            lasted,
        )
