"""Helpers for tests that run real child processes."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The bucket the moto fixture creates.
BUCKET = "launchhelm-tests"


def make_store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store URL on ``backend``, starting its emulator (a session fixture) if needed."""
    if backend == "local":
        return str(tmp_path / "store")
    if backend == "memory":
        return f"memory://lh-{secrets.token_hex(6)}"
    if backend == "gcs":
        request.getfixturevalue("gcs_endpoint")
        return f"gs://{BUCKET}/{secrets.token_hex(6)}"
    if backend == "azure":
        request.getfixturevalue("azurite_endpoint")
        return f"az://{BUCKET}/{secrets.token_hex(6)}"
    request.getfixturevalue("moto_endpoint")
    return f"s3://{BUCKET}/{secrets.token_hex(6)}"


def child_env(**extra: str) -> dict[str, str]:
    """The current environment (with any AWS_* of the moto fixture) for a child."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def proc_io(pid: int, field: str) -> int:
    """A counter of /proc/PID/task/*/io summed over the process's threads (``rchar``, ``wchar``...)."""
    total = 0
    for io in Path(f"/proc/{pid}/task").glob("*/io"):
        try:
            total += next(int(line.split()[1]) for line in io.read_text().splitlines() if line.startswith(f"{field}:"))
        except (OSError, StopIteration):
            pass
    return total


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


class FaultyS3Proxy:
    """An HTTP proxy in front of moto that answers some PUTs with an error.

    The first ``failures`` PUT requests whose path contains ``match`` get
    ``status`` with an S3 error body (``code``) instead of reaching moto, as
    S3 itself answers under load (503 SlowDown) or while a conditional write
    is in flight (409 ConditionalRequestConflict). Everything else is
    forwarded unchanged, one request per connection.
    """

    def __init__(self, upstream_port: int, *, status: int, code: str, failures: int, match: str) -> None:
        import socket
        import threading

        self.upstream_port = upstream_port
        self.status, self.code, self.match = status, code, match
        self.remaining = failures
        self.injected = 0
        #: When each injected error was answered (time.monotonic()) and to which path, in order.
        self.injected_at: list[tuple[float, str]] = []
        self.forwarded_puts = 0
        #: Every forwarded request: (method, path, its x-amz-checksum-* and x-amz-sdk-checksum-* headers,
        #: base64 CRC64NVME of its body), so a test can check the checksums sent match the bytes sent.
        self.forwarded: list[tuple[str, str, dict[str, str], str]] = []
        #: The first 1 KiB of each forwarded body (a multipart upload's JSON metadata part).
        self.body_heads: list[bytes] = []
        #: Flip one byte in the body of the next this many forwarded PUTs whose path contains ``match``
        #: (after their headers were computed): a corruption in transit.
        self.corrupt_puts = 0
        #: Hold each forwarded PUT whose path contains ``match`` this long, so parts sent at once overlap.
        self.hold_puts_s = 0.0
        #: The most PUTs whose path contains ``match`` that were in the proxy at once.
        self.most_puts_in_flight = 0
        self._puts_in_flight = 0
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    @staticmethod
    def _read_head(conn: object) -> tuple[list[bytes], bytes] | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)  # type: ignore[attr-defined]
            if not chunk:
                return None
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        return head.split(b"\r\n"), rest

    @staticmethod
    def _header(lines: list[bytes], name: bytes) -> bytes | None:
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name:
                return value.strip()
        return None

    def _record(self, method: str, path: str, lines: list[bytes], body: bytes) -> None:
        import base64

        from awscrt.checksums import crc64nvme

        sums = {}
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            name = key.strip().lower().decode()
            if name.startswith(("x-amz-checksum-", "x-amz-sdk-checksum-", "x-goog-hash")):
                sums[name] = value.strip().decode()
        body_crc = base64.b64encode(crc64nvme(body).to_bytes(8, "big")).decode()
        with self._lock:
            self.forwarded.append((method, path, sums, body_crc))
            self.body_heads.append(body[:1024])

    def _serve(self, client: object) -> None:
        import socket
        import time

        counted = False
        try:
            got = self._read_head(client)
            if got is None:
                return
            lines, body = got
            method, path = lines[0].decode().split(" ")[:2]
            inject = False
            counted = method == "PUT" and self.match in path
            if counted:
                with self._lock:
                    self._puts_in_flight += 1
                    self.most_puts_in_flight = max(self.most_puts_in_flight, self._puts_in_flight)
                time.sleep(self.hold_puts_s)
                with self._lock:
                    inject = self.remaining > 0
                    if inject:
                        self.remaining -= 1
                        self.injected += 1
                        self.injected_at.append((time.monotonic(), path))
                    else:
                        self.forwarded_puts += 1
            if inject:  # answer at once, as S3 does, even before a 100-continue body
                payload = (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{self.code}</Code>'
                    f"<Message>injected by the test</Message></Error>"
                ).encode()
                reply = (
                    f"HTTP/1.1 {self.status} Injected\r\nContent-Type: application/xml\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                ).encode()
                client.sendall(reply + payload)  # type: ignore[attr-defined]
                return
            if (self._header(lines, b"expect") or b"").lower() == b"100-continue":
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[attr-defined]
            length = int(self._header(lines, b"content-length") or 0)
            received = bytearray(body)  # not bytes +=: a part streamed in small writes made that quadratic
            while len(received) < length:
                chunk = client.recv(65536)  # type: ignore[attr-defined]
                if not chunk:
                    return
                received += chunk
            body = bytes(received)
            self._record(method, path, lines, body)
            if method == "PUT" and self.match in path and body:
                with self._lock:
                    flip = self.corrupt_puts > 0
                    self.corrupt_puts -= int(flip)
                if flip:
                    body = body[:-1] + bytes([body[-1] ^ 0x01])
            kept = [ln for ln in lines if not ln.lower().startswith((b"connection:", b"expect:"))]
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            upstream.sendall(b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n" + body)
            reply = b""
            while chunk := upstream.recv(65536):
                reply += chunk
            upstream.close()
            if counted:  # done before the client hears: it may send its next part at once
                counted = False
                with self._lock:
                    self._puts_in_flight -= 1
            client.sendall(reply)  # type: ignore[attr-defined]
        except OSError:
            pass
        finally:
            if counted:
                with self._lock:
                    self._puts_in_flight -= 1
            client.close()  # type: ignore[attr-defined]

    def close(self) -> None:
        self._server.close()


class Terminal:
    """A child process whose stdin, stdout and stderr are a real pseudo-terminal (80 x 24).

    What a person at a terminal would see is gathered by a reader thread; :meth:`output` is all of it so
    far, raw (tqdm's ``\\r`` redraws, the terminal's ``\\r\\n`` line ends).
    """

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        import fcntl
        import pty
        import struct
        import termios
        import threading

        self._master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        try:
            self.proc = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, env={"TERM": "xterm", **env}, cwd=ROOT
            )
        except BaseException:
            os.close(self._master)
            raise
        finally:
            os.close(slave)  # the child holds the terminal now: its exit ends the reads
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end is gone
                return
            if not data:
                return
            self._chunks.append(data)

    def output(self) -> bytes:
        return b"".join(self._chunks)

    def wait(self, timeout: float = 120) -> int:
        """The child's exit status, once it and the reader are done."""
        try:
            code = self.proc.wait(timeout)
        finally:
            self.close()
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        if self._master >= 0:
            os.close(self._master)
            self._master = -1


#: What a helper process's command line holds (``launchhelm._helper_boot``).
HELPER_COMMAND = "from launchhelm._helper_boot import main"


def helper_pids(pid: int) -> list[int]:
    """The helper processes (launchhelm._helper) among ``pid``'s children."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if HELPER_COMMAND in cmdline:
                found.append(child)
    return found


def kill_with_helper(proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """SIGKILL a training process and its helper together, as a node's OOM kill or ``scancel`` of the job
    does: its spool then waits for a reopen or ``launchhelm recover`` on this host.

    The helper is started by the process's background thread right after ``init``: waited for first."""
    import signal
    import time

    deadline = time.monotonic() + timeout
    helpers = helper_pids(proc.pid)
    while not helpers and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
        helpers = helper_pids(proc.pid)
    for helper in helpers:
        os.kill(helper, signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)


def wait_for_helpers(timeout: float = 60.0) -> None:
    """Wait (bounded) until the helpers of this process's ended sessions exited.

    A helper lives on briefly after ``finish()``: it adds the run to its
    project's runs index and history dataset (``launchhelm._runlog._settle``).
    A test that counts a reader's requests waits for that first."""
    from launchhelm._helper import _leaving, _leaving_lock

    with _leaving_lock:
        leaving = list(_leaving)
    for process in leaving:
        process.wait(timeout)


def store_processes(pid: int) -> list[int]:
    """The store's own processes (``LAUNCHHELM_HELPER_STORE=1``: launchhelm.storage._remote) among ``pid``'s
    children."""
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if b"launchhelm.storage._remote" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
        except OSError:
            continue
    return found
