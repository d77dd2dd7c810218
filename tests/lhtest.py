"""Helpers for tests that run real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """The current environment (with any AWS_* of the moto fixture) for a child."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def spawn(code: str, *args: str, prefix: list[str] | None = None, **env: str) -> subprocess.Popen[str]:
    """Start ``python -c code args...`` with stdout piped, text mode."""
    return subprocess.Popen(
        [*(prefix or []), sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(**env),
        cwd=ROOT,
    )


def run_python(code: str, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code args...`` to completion and return the result."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=child_env(**env),
        cwd=ROOT,
        timeout=timeout,
    )


class CountingProxy:
    """A TCP proxy on 127.0.0.1 that counts the bytes clients send upstream.

    Lets a test act at an exact point of an upload (kill the uploader once
    1 MB of its request has gone out), which timing alone cannot hit.
    """

    def __init__(self, upstream_port: int) -> None:
        import socket
        import threading

        self.upstream_port = upstream_port
        self.sent = 0
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: object, dst: object, count: bool) -> None:
        try:
            while data := src.recv(65536):  # type: ignore[attr-defined]
                if count:
                    with self._lock:
                        self.sent += len(data)
                dst.sendall(data)  # type: ignore[attr-defined]
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()  # type: ignore[attr-defined]
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()
