"""An HTTP proxy on 127.0.0.1 that counts requests and can add per-request latency.

Emulators answer in a millisecond or two, which hides what a real object
store charges per request. Tests count requests through this proxy (exact),
and benchmarks add the latency an in-region S3 GET costs (20 ms).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter

__all__ = ["RequestCounter"]


class RequestCounter:
    """A keep-alive aware HTTP/1.1 proxy on 127.0.0.1 that counts requests (method, first path segment).

    With ``latency`` (seconds) it holds each request that long before
    forwarding it, as a real object store's round trip costs (an in-region
    S3 GET: about 20 ms). Requests on different connections wait in parallel,
    so a client that issues them concurrently pays the latency once per
    round, one that issues them in series once per request.
    """

    def __init__(self, upstream_port: int, latency: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.latency = latency
        self.requests: Counter[str] = Counter()
        #: the most requests held at once (in their latency wait): > 1 means the client sent them concurrently
        self.peak_in_flight = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = int(self._server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.requests.values())

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.requests)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.peak_in_flight = 0

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = client.recv(1 << 16)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                method, target = [*lines[0].decode("latin-1").split(" "), "", ""][:2]
                headers = {}
                for line in lines[1:]:
                    key, _, value = line.partition(b":")
                    headers[key.strip().lower()] = value.strip()
                path = target.split("?", 1)[0]
                with self._lock:
                    self.requests[f"{method} {'/'.join(path.split('/')[:3])}"] += 1
                if self.latency:
                    with self._lock:
                        self._in_flight += 1
                        self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
                    time.sleep(self.latency)
                    with self._lock:
                        self._in_flight -= 1
                upstream.sendall(head + b"\r\n\r\n")
                length = int(headers.get(b"content-length", b"0") or 0)
                if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                    buf = self._chunked(client, upstream, buf)
                    continue
                while length > 0:
                    if not buf:
                        buf = client.recv(1 << 16)
                        if not buf:
                            return
                    part, buf = buf[:length], buf[length:]
                    upstream.sendall(part)
                    length -= len(part)
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                try:
                    s.close()
                except OSError:
                    pass

    @staticmethod
    def _chunked(client: socket.socket, upstream: socket.socket, buf: bytes) -> bytes:
        while True:
            while b"\r\n" not in buf:
                buf += client.recv(1 << 16)
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            need = size + 2
            while len(buf) < need:
                buf += client.recv(1 << 16)
            upstream.sendall(size_line + b"\r\n" + buf[:need])
            buf = buf[need:]
            if size == 0:
                return buf

    def close(self) -> None:
        self._server.close()
