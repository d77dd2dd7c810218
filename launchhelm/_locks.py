"""An ``flock`` taken within a time limit: the spool's recoveries and media storers take turns by it."""

from __future__ import annotations

import fcntl
import time


def flock_within(fd: int, wait: float, poll: float) -> bool:
    """Take an exclusive ``flock`` on ``fd``, trying every ``poll`` s for ``wait`` s; False if it stayed held.

    The kernel releases the lock when its holder's descriptor closes or the holder dies, so a
    killed holder blocks nobody; polling (not a blocking ``flock``) keeps the wait bounded.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
