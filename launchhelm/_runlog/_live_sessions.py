"""The sessions live in this process, and ending them at interpreter exit.

A session that is still live when the interpreter exits (no ``finish()``)
ends there, keeping its run open: its points are flushed and a
``session_ended`` event says why (the exception that stopped the program,
or ``exit``).
"""

from __future__ import annotations

import atexit
import sys
import threading
from typing import Protocol

__all__ = ["LiveSession", "add_live", "discard_live", "install_exit_hook"]


class LiveSession(Protocol):
    """A live session of a run (``launchhelm.Run``), as the exit hook ends it."""

    @property
    def id(self) -> str: ...

    def _end_session(self, *, close_run: bool, reason: str) -> None: ...


_live_runs: set[LiveSession] = set()
_live_lock = threading.Lock()


def add_live(run: LiveSession) -> None:
    with _live_lock:
        _live_runs.add(run)


def discard_live(run: LiveSession) -> None:
    with _live_lock:
        _live_runs.discard(run)


def _at_exit() -> None:
    """End live sessions at interpreter exit, keeping their runs open."""
    last = getattr(sys, "last_value", None)
    reason = f"exception: {type(last).__name__}: {last}" if last is not None else "exit"
    with _live_lock:
        runs = list(_live_runs)
    for run in runs:
        try:
            run._end_session(close_run=False, reason=reason)
        except Exception as exc:  # the store may be gone; nothing else to do here
            print(f"launchhelm: could not end run {run.id} at exit: {exc}", file=sys.stderr)


_exit_hook_installed = False


def install_exit_hook() -> None:
    """End live sessions at exit, before the interpreter stops thread pools.

    Object-store clients (aiohttp under s3fs) resolve hosts in the event
    loop's thread pool, which refuses work once ``concurrent.futures`` has
    shut down at exit. ``threading``'s exit hooks run before that one when
    registered after it (they run in reverse order), so the final flush can
    still reach S3. ``atexit`` stays as the fallback.
    """
    global _exit_hook_installed
    if _exit_hook_installed:
        return
    import concurrent.futures.thread  # noqa: F401  registers its own hook first

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(_at_exit)
    atexit.register(_at_exit)
    _exit_hook_installed = True
