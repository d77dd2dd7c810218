"""The background thread's pause between pieces of work, so the training thread gets the GIL."""

from __future__ import annotations

import threading
import time

__all__ = ["PAUSE_SECONDS", "pause"]

#: Seconds of a pause: long enough for a training thread waiting for the GIL to wake and take it.
PAUSE_SECONDS = 0.0002


def pause() -> None:
    """Let the training thread have the GIL, when called from a background thread.

    Python hands the GIL to a waiting thread only after 5 ms of another's
    bytecode, and ``sleep(0)`` gives it back before a waiting thread wakes: a
    short real sleep between pieces of work is what keeps ``log()`` from
    stalling behind them. The training thread itself never waits here.
    """
    if threading.current_thread() is not threading.main_thread():
        time.sleep(PAUSE_SECONDS)
