"""The helper process's first module: what must happen before the rest of it is imported.

A helper started to serve the store (``launchhelm._helper.serve_store``) says hello once the store is
open, and ``init`` waits for that hello; the session's own modules (the watchdog, the pickups) load
after it, while the training process goes on. ``import launchhelm`` itself loads a few modules only.
"""

from __future__ import annotations

import json
import os
import sys
import threading

__all__ = ["first_line", "main"]


def first_line(fd: int, data: bytes = b"") -> tuple[bytes, bytes]:
    """The config line from stdin (after ``data``, read before), and what came after it (flush requests):
    read unbuffered, so the pipe's later lines are seen by ``select`` on the descriptor, not hidden in a
    Python buffer."""
    while b"\n" not in data:
        more = os.read(fd, 65536)
        if not more:
            return data, b""
        data += more
    line, rest = data.split(b"\n", 1)
    return line, rest


def main() -> int:
    line, rest = first_line(sys.stdin.fileno())
    if not line:
        return 0
    first = json.loads(line)
    if "serve" in first:
        # started by init before the run existed: the store is served to the training process from now on,
        # and the session's configuration comes when the run exists
        from launchhelm.storage._remote import open_and_serve

        server = threading.Thread(target=open_and_serve, args=(first["serve"],), name="launchhelm-serve", daemon=True)
        server.start()
        line, rest = first_line(sys.stdin.fileno(), rest)
        if not line:  # no session (init failed, or the process is gone): serve until the socket's end
            server.join()
            return 0
        first = json.loads(line)
    from launchhelm._helper import run_session

    return run_session(first, rest)
