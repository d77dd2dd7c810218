"""Progress bars for the transfers a person waits on (tqdm; its notebook widget under Jupyter).

A transfer gets a bar only where someone watches and only once they have
waited: stderr is a terminal (also behind the console capture, which points
fd 2 at its pipe) or a Jupyter kernel's stream, the transfer is large
(:data:`DEFAULT_THRESHOLD`, 256 MB) and it has lasted :data:`DEFAULT_DELAY`
(2 s). Elsewhere (a file, a pipe, a batch job's log) no bar is drawn: a bar's
``\\r`` states would pile up in the log. A large transfer that lasted that
long writes one line there when it ends, and nothing if it failed (the error
says that); a short one writes nothing.

``LAUNCHHELM_PROGRESS=0`` (or ``progress=False`` to
:func:`launchhelm.storage.open_store` or a single ``upload`` / ``download`` /
``writer`` call) silences them; ``LAUNCHHELM_PROGRESS=1`` (``progress=True``)
shows every transfer at once, whatever its size, still as one line in a log.
``LAUNCHHELM_PROGRESS_MIN_MB`` and ``LAUNCHHELM_PROGRESS_DELAY`` (seconds)
change the size and the wait.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Protocol

__all__ = [
    "DEFAULT_DELAY",
    "DEFAULT_THRESHOLD",
    "Progress",
    "note_stderr_captured",
    "progress_delay",
    "progress_wanted",
    "stderr_interactive",
]

#: Transfers at least this large get a bar (``LAUNCHHELM_PROGRESS_MIN_MB`` overrides).
DEFAULT_THRESHOLD = 256 * 2**20
#: Seconds a transfer lasts before its bar shows (``LAUNCHHELM_PROGRESS_DELAY`` overrides): a
#: transfer that ends sooner is one nobody waited on.
DEFAULT_DELAY = 2.0

#: While the console capture points fd 2 at its pipe, whether what it forwards to is a terminal.
_stderr_terminal_behind_capture: bool | None = None


def _env_number(name: str) -> float | None:
    text = os.environ.get(name)
    if text:
        try:
            return max(0.0, float(text))
        except ValueError:
            pass
    return None


def _threshold() -> int:
    mb = _env_number("LAUNCHHELM_PROGRESS_MIN_MB")
    return DEFAULT_THRESHOLD if mb is None else int(mb * 2**20)


def progress_delay() -> float:
    """Seconds a transfer (or an import) lasts before its bar shows."""
    seconds = _env_number("LAUNCHHELM_PROGRESS_DELAY")
    return DEFAULT_DELAY if seconds is None else seconds


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


def note_stderr_captured(terminal: bool | None) -> None:
    """The console capture's word on fd 2: it now forwards to a terminal (True) or not; None: released."""
    global _stderr_terminal_behind_capture
    _stderr_terminal_behind_capture = terminal


def stderr_interactive() -> bool:
    """Whether a person sees ``sys.stderr`` as it is written: a terminal, or a Jupyter kernel's stream."""
    stream = sys.stderr
    if stream is None:
        return False
    if type(stream).__name__ == "OutStream":  # ipykernel's: the notebook shows a widget bar
        return True
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both of the first two
        fd = None
    if fd == 2 and _stderr_terminal_behind_capture is not None:
        return _stderr_terminal_behind_capture
    try:
        return bool(stream.isatty())
    except (OSError, ValueError, AttributeError):
        return False


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class _Bar(Protocol):
    """What is used of a tqdm bar (tqdm ships no type hints)."""

    def update(self, n: float = 1) -> object: ...

    def close(self) -> None: ...


class Progress:
    """Counts bytes of one transfer; a bar on a terminal or in a notebook, one line in a log.

    ``total`` may be unknown (a streamed checkpoint): the bar then starts once
    the threshold has passed and shows bytes and speed without a percentage.
    Parts may report from several threads. :meth:`close` is idempotent; the
    store calls it once the transfer is committed (or failed).
    """

    def __init__(self, setting: bool | None, description: str, total: int | None = None) -> None:
        wanted = progress_wanted(setting)
        self._enabled = wanted is not False
        self._forced = wanted is True
        self._threshold = _threshold()
        self._delay = 0.0 if self._forced else progress_delay()
        # decided once: where stderr goes does not change in the middle of a transfer
        self._interactive = self._enabled and stderr_interactive()
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._closed = False
        self.description = description
        self.total = total
        self.done = 0
        self._bar: _Bar | None = None

    def _large(self) -> bool:
        return self._forced or self.done >= self._threshold or (self.total or 0) >= self._threshold

    def _start(self) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # no tqdm: transfers still work, silently
            self._interactive = False
            return
        self._bar = tqdm(
            total=self.total,
            initial=self.done,  # what passed before the bar was due: its first state is not "0 B"
            desc=self.description,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            mininterval=0.5,
            # the wait counts from the transfer's start, not from the bar's: nothing is drawn
            # (not even on close) for a transfer that ends before it
            delay=max(0.0, self._delay - (time.monotonic() - self._started)),
            dynamic_ncols=True,
            leave=True,
        )

    def update(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            if self._bar is not None:
                self._bar.update(nbytes)
            elif self._interactive and not self._closed and self._large():
                self._start()

    def close(self, failed: bool = False) -> None:
        """End the bar; in a log, write the one line a long transfer gets (none when ``failed``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            bar, self._bar = self._bar, None
            elapsed = time.monotonic() - self._started
        if bar is not None:
            bar.close()
            return
        if not self._enabled or self._interactive or failed or not self._large() or elapsed < self._delay:
            return
        rate = f", {_size(self.done / elapsed)}/s" if elapsed > 0 else ""
        try:
            print(f"launchhelm: {self.description}: {_size(self.done)} in {elapsed:.1f} s{rate}", file=sys.stderr)
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):  # stderr closed or gone: the transfer itself worked
            pass

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.close(failed=exc is not None)
