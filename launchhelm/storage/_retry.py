"""The one retry helper of the storage layer: capped exponential backoff with jitter.

Ours, not stamina or tenacity: a dozen stdlib lines keep the storage layer on fsspec alone.

Each caller's "is this worth another try" rule is its own (our error
classification), passed in as ``retryable``.

Every wait is drawn at random between half its nominal delay and the whole of
it ("equal jitter"), so ranks that failed together no longer retry together,
while a schedule's most total wait (its budget) stays what the nominal delays
add up to, and its least is half of that.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "retry"]

T = TypeVar("T")
_log = logging.getLogger("launchhelm")


@dataclass(frozen=True)
class Backoff:
    """A retry schedule: at most ``attempts`` tries; the waits between them start at ``first``
    seconds and double up to ``cap``, each jittered down by up to half."""

    attempts: int
    first: float
    cap: float

    def delays(self) -> Iterator[float]:
        """The nominal waits, one fewer than the attempts: each wait's upper bound."""
        delay = self.first
        for _ in range(self.attempts - 1):
            yield delay
            delay = min(delay * 2, self.cap)

    @property
    def budget(self) -> float:
        """The most seconds a call can spend waiting between its tries."""
        return sum(self.delays())

    def waits(self) -> Iterator[float]:
        """The jittered waits: each drawn uniformly from [delay / 2, delay]."""
        # the random module's own generator: reseeded in each forked child, so ranks differ
        return (random.uniform(delay / 2, delay) for delay in self.delays())


def retry(op: Callable[[], T], schedule: Backoff, retryable: Callable[[Exception], bool]) -> T:
    """Run ``op``; after an exception that ``retryable`` accepts, wait (see :class:`Backoff`) and
    run it again, at most ``schedule.attempts`` times in all. The last exception, or one that is
    not retryable, is raised as it is."""
    waits = schedule.waits()
    tries = 1
    while True:
        try:
            return op()
        except Exception as exc:
            wait = next(waits, None)
            if wait is None or not retryable(exc):
                raise
            _log.debug(
                "storage request failed (%s); try %d of %d in %.3f s",
                type(exc).__name__,
                tries + 1,
                schedule.attempts,
                wait,
                extra={"retry_wait": wait},
            )
            time.sleep(wait)
            tries += 1
