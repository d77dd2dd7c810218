"""A live session's console: captured while the session lives, stored at each flush."""

from __future__ import annotations

import threading

from launchhelm._console import _capture
from launchhelm._console._buffer import ConsoleBuffer
from launchhelm._exceptions import AlreadyExistsError
from launchhelm.storage import Store
from launchhelm.storage._keys import console_key

__all__ = ["ConsoleWriter"]


class ConsoleWriter:
    """Tees the process's stdout and stderr (:meth:`attach`) into console objects of one session."""

    def __init__(self, store: Store, run_id: str, session_id: str) -> None:
        self._store = store
        self._run_id = run_id
        self._session_id = session_id
        self._console: ConsoleBuffer | None = None
        self._number = 0
        self._lock = threading.Lock()

    def attach(self) -> None:
        """Start capturing what the process prints."""
        self._console = _capture.attach()

    def flush(self, final: bool = False) -> None:
        """Write what the process printed since the last flush as one console object (nothing: no request)."""
        console = self._console
        if console is None:
            return
        with self._lock:
            _capture.drain()
            data = console.take(final)
            if data is None:
                return
            try:
                while True:
                    key = console_key(self._run_id, self._session_id, self._number)
                    self._number += 1
                    try:
                        self._store.create(key, data)
                        break
                    except AlreadyExistsError:
                        continue  # a number taken by an earlier, ambiguous write
            except BaseException:
                console.put_back(data)
                raise

    def stop(self) -> None:
        """Put stdout and stderr back as they were (fds and ``sys`` objects), keeping what was printed."""
        console = self._console
        if console is not None:
            _capture.detach(console)
