"""The background thread's pause between pieces of work, so the training thread gets the GIL."""

from __future__ import annotations

import os
import threading
import time

from launchhelm._metrics._heap import TRIM_AFTER_GROWTH, give_back_free_heap, process_is_ours

__all__ = ["HELPER_FLUSH_ENV", "PAUSE_SECONDS", "helper_flushes", "pause", "yield_on_wakeup"]

#: The helper process writes the session's chunks unless this is 0 (docs/storage.md, "Flushing in the helper").
HELPER_FLUSH_ENV = "LAUNCHHELM_HELPER_FLUSH"


def helper_flushes() -> bool:
    """Whether this process's helper writes its chunks: the default; ``LAUNCHHELM_HELPER_FLUSH=0`` keeps
    the writing in the training process (as before, with none of the process-wide tuning it had)."""
    return os.environ.get(HELPER_FLUSH_ENV, "").strip().lower() not in ("0", "off", "false", "no")


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
        # between pieces of work is also where the heaps' free pages go back (the helper's only:
        # see metrics._heap)
        give_back_free_heap(grown=TRIM_AFTER_GROWTH)


def yield_on_wakeup() -> bool:
    """Put the calling (background) thread of the helper process under Linux's ``SCHED_BATCH`` policy;
    True if it took. In any other process (the user's) it does nothing and returns False.

    A thread that wakes under the default policy may take the CPU from the
    training thread at once, and the scheduler can leave the training thread
    waiting for it even while another core is idle (bench_log: 79 times a
    minute, up to 1.5 ms). A batch thread never preempts on waking; it keeps its
    full share of CPU time, so it never falls behind a busy machine. Threads
    it starts (upload pools) inherit the policy.
    """
    if not process_is_ours():
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or a sandbox that refuses it: the default policy
        return False
    return True
