"""glibc's heaps in a long run: the free pages they keep, handed back to the system.

glibc gives back only the free top of a heap by itself. Once a large block it
mapped is freed (a part upload, a segment's bytes), it raises its mmap
threshold to that size, and later blocks up to that size come from its heaps:
the holes they leave between live blocks stay resident (40-55 MiB in a flood on
S3, bench_soak). LaunchHelm leaves glibc's settings alone and trims instead,
from the flush thread: only in a process of its own (the helper; see
:func:`own_this_process`). A training process's heap is the user's.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

__all__ = ["TRIM_AFTER_GROWTH", "give_back_free_heap", "own_this_process", "prepare_trims", "process_is_ours"]

#: Growth of resident anonymous memory since the last trim past which the flush thread trims again.
TRIM_AFTER_GROWTH = 8 * 2**20

#: Trims asked for by growth take at most this share of the time: the next waits 100 times as long
#: as the last one took. A process whose own memory grows steadily has a big heap, which takes longer
#: to trim (its arenas are locked meanwhile): it is trimmed less often.
TRIM_TIME_SHARE = 0.01
#: And never more often than this (seconds).
MIN_TRIM_INTERVAL = 0.05

_ours = False  # set by the helper's main(): this process is LaunchHelm's, not the user's
_after_last_trim = 0  # anonymous bytes resident after the last trim
_next_trim_at = 0.0  # time.monotonic() before which growth asks for no trim


def own_this_process() -> None:
    """Say that this process is LaunchHelm's own (the helper's ``main()``): its heap, pyarrow's pool and
    its threads' scheduling policy may be tuned. In any other process (the user's training process, a
    notebook's kernel) they are left alone, whatever that costs LaunchHelm's own work there."""
    global _ours
    _ours = True


def process_is_ours() -> bool:
    """Whether :func:`own_this_process` was called in this process."""
    return _ours


@functools.cache
def _glibc() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where glibc is not the C library.

    Looked up once, at ``init`` (ctypes is not imported by ``import launchhelm``)."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):  # not glibc, or not a POSIX system
        version = ""
    if not version.startswith("glibc"):
        return None
    import ctypes

    trim: Callable[[int], int] | None = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return trim


def prepare_trims() -> None:
    """Import ctypes and find ``malloc_trim`` now (at ``init``), not in the first trim: in the flush
    thread, the import would hold the GIL for milliseconds while the training loop runs."""
    if _ours:
        _glibc()


def _anonymous_bytes() -> int | None:
    """The process's resident anonymous memory (``/proc/self/statm``: resident less shared), or None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def give_back_free_heap(grown: int = 0) -> bool:
    """Hand the heaps' free pages back to the system (``malloc_trim``); True if it was called.

    With ``grown``, only once resident anonymous memory has grown that much since the last trim
    (read from ``/proc/self/statm``: microseconds), and long enough after it that trims take at
    most 1% of the time, so it can be asked after every chunk. What the
    heaps keep resident cannot be asked of glibc: ``mallinfo2`` counts trimmed pages as free too.
    ctypes releases the GIL for the trim. Never in a process that is not LaunchHelm's own.
    """
    global _after_last_trim, _next_trim_at
    if not _ours:
        return False
    trim = _glibc()
    if trim is None:
        return False
    if grown:
        if time.monotonic() < _next_trim_at:
            return False
        now = _anonymous_bytes()
        if now is not None and now - _after_last_trim < grown:
            _after_last_trim = min(_after_last_trim, now)  # growth counts from the lowest point since
            return False
    started = time.monotonic()
    trim(0)
    ended = time.monotonic()
    _after_last_trim = _anonymous_bytes() or 0
    _next_trim_at = ended + max(MIN_TRIM_INTERVAL, (ended - started) / TRIM_TIME_SHARE)
    return True
