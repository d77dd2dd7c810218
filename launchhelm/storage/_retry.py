"""The one retry helper of the storage layer: capped exponential backoff.

Ours rather than stamina or tenacity: it is a dozen lines on the stdlib (the
storage layer depends on fsspec alone), and each caller's "is this worth
another try" rule needs our own error classification either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "retry"]

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """A retry schedule: at most ``attempts`` tries; the waits between them start at ``first``
    seconds and double up to ``cap``."""

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
        """The waits between tries."""
        return self.delays()


def retry(op: Callable[[], T], schedule: Backoff, retryable: Callable[[Exception], bool]) -> T:
    """Run ``op``; after an exception that ``retryable`` accepts, wait (see :class:`Backoff`) and
    run it again, at most ``schedule.attempts`` times in all. The last exception, or one that is
    not retryable, is raised as it is."""
    waits = schedule.waits()
    while True:
        try:
            return op()
        except Exception as exc:
            wait = next(waits, None)
            if wait is None or not retryable(exc):
                raise
            time.sleep(wait)
