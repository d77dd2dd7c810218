"""Progress bars for large transfers (tqdm; its notebook widget under Jupyter).

A bar appears once a transfer passes :data:`DEFAULT_THRESHOLD` bytes (256 MB),
so saving small checkpoints and every metric chunk stay silent. Silence them
all with ``LAUNCHHELM_PROGRESS=0``, force them with ``LAUNCHHELM_PROGRESS=1``,
or pass ``progress=False`` / ``True`` to :func:`launchhelm.storage.open_store`
or to a single ``upload`` / ``download`` / ``writer`` call.
"""

from __future__ import annotations

import os
import sys
from typing import Protocol

__all__ = ["DEFAULT_THRESHOLD", "Progress", "progress_wanted"]

#: Transfers at least this large get a bar (``LAUNCHHELM_PROGRESS_MIN_MB`` overrides).
DEFAULT_THRESHOLD = 256 * 2**20


def _threshold() -> int:
    text = os.environ.get("LAUNCHHELM_PROGRESS_MIN_MB")
    if text:
        try:
            return max(0, int(float(text) * 2**20))
        except ValueError:
            pass
    return DEFAULT_THRESHOLD


def progress_wanted(setting: bool | None) -> bool | None:
    """True: always; False: never; None: only for transfers over the threshold.

    An explicit ``setting`` wins; else ``LAUNCHHELM_PROGRESS`` (``0``/``1``).
    """
    if setting is not None:
        return bool(setting)
    env = os.environ.get("LAUNCHHELM_PROGRESS", "").strip().lower()
    if env in ("0", "false", "no", "off"):
        return False
    if env in ("1", "true", "yes", "on"):
        return True
    return None


class _Bar(Protocol):
    """What is used of a tqdm bar (tqdm ships no type hints)."""

    def update(self, n: float = 1) -> object: ...

    def close(self) -> None: ...


class Progress:
    """Counts bytes of one transfer and shows a bar when it is large enough.

    ``total`` may be unknown (a streamed checkpoint): the bar then starts once
    the threshold has passed and shows bytes and speed without a percentage.
    """

    def __init__(self, setting: bool | None, description: str, total: int | None = None) -> None:
        wanted = progress_wanted(setting)
        self._enabled = wanted is not False
        self._forced = wanted is True
        self._threshold = _threshold()
        self.description = description
        self.total = total
        self.done = 0
        self._bar: _Bar | None = None

    def _start(self) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # no tqdm: transfers still work, silently
            self._enabled = False
            return
        self._bar = tqdm(
            total=self.total,
            desc=self.description,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            mininterval=0.5,
            dynamic_ncols=True,
            leave=True,
        )
        if self.done:
            self._bar.update(self.done)

    def update(self, nbytes: int) -> None:
        self.done += nbytes
        if self._bar is not None:
            self._bar.update(nbytes)
        elif self._enabled and (self._forced or self.done >= self._threshold or (self.total or 0) >= self._threshold):
            self._start()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
