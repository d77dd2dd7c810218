"""An HTTP proxy on 127.0.0.1 that counts requests, can add per-request latency, and can fail.

Emulators answer in a millisecond or two, which hides what a real object
store charges per request. Tests count requests through this proxy (exact),
and benchmarks add the latency an in-region S3 GET costs (20 ms).

It also plays the two ways a store stops answering (:meth:`RequestCounter.refuse`,
:meth:`RequestCounter.blackhole`, then :meth:`RequestCounter.restore`): an
endpoint that refuses connections (the service is down: a client fails at
once), and one that takes connections and never answers (a partition, a hung
load balancer: a client learns of it only from its own timeouts).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter

__all__ = ["BLACKHOLE", "FORWARD", "REFUSE", "RequestCounter"]

#: What the proxy does with connections: forward them, refuse new ones, or take them and never answer.
FORWARD, REFUSE, BLACKHOLE = "forward", "refuse", "blackhole"


class _Link:
    """One client connection and its upstream; ``dead`` once a blackhole swallowed it."""

    __slots__ = ("client", "dead", "upstream")

    def __init__(self, client: socket.socket, upstream: socket.socket | None) -> None:
        self.client = client
        self.upstream = upstream
        self.dead = upstream is None


class RequestCounter:
    """A keep-alive aware HTTP/1.1 proxy on 127.0.0.1 that counts requests (method, first path segment).

    With ``latency`` (seconds) it holds each request that long before
    forwarding it, as a real object store's round trip costs (an in-region
    S3 GET: about 20 ms). Requests on different connections wait in parallel,
    so a client that issues them concurrently pays the latency once per
    round, one that issues them in series once per request.

    :meth:`refuse` closes the listening socket and every open connection (a
    connect then fails with "connection refused"); :meth:`blackhole` keeps
    taking connections but from then on forwards nothing either way, on new
    connections and on those already open, which stay silent until their
    client gives up, as after a real partition. :meth:`restore` forwards
    again, on the same port.
    """

    #: Entries kept in :attr:`trace`.
    TRACE_KEPT = 10_000

    def __init__(self, upstream_port: int, latency: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.latency = latency
        self.requests: Counter[str] = Counter()
        #: the last requests in order, (monotonic time, "METHOD target"): which ones, and which ran in series
        self.trace: list[tuple[float, str]] = []
        #: the most requests held at once (in their latency wait): > 1 means the client sent them concurrently
        self.peak_in_flight = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self.mode = FORWARD
        self._links: list[_Link] = []
        self.port = 0
        self._listen()

    def _listen(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the same port again after refuse()
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        self.port = int(server.getsockname()[1])
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    # -- failing on purpose ------------------------------------------------
    def refuse(self) -> None:
        """Refuse connections: the listening socket is closed, and every open connection with it."""
        with self._lock:
            if self.mode == REFUSE:
                return
            self.mode = REFUSE
            links, self._links = self._links, []
            _close(self._server)  # shutdown first: it wakes the thread blocked in accept()
        for link in links:
            link.dead = True
            for s in (link.client, link.upstream):
                if s is not None:
                    _close(s)

    def blackhole(self) -> None:
        """Take connections and never answer: nothing is forwarded either way from now on."""
        with self._lock:
            if self.mode == REFUSE:
                self._listen()
            self.mode = BLACKHOLE
            for link in self._links:
                link.dead = True

    def restore(self) -> None:
        """Forward again (new connections; those a blackhole swallowed stay silent)."""
        with self._lock:
            if self.mode == REFUSE:
                self._listen()
            self.mode = FORWARD

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

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = None
            if self.mode == FORWARD:
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
                except OSError:
                    client.close()
                    continue
            link = _Link(client, upstream)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            if upstream is not None:
                threading.Thread(target=self._pipe, args=(link,), daemon=True).start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            if link in self._links:
                self._links.remove(link)

    def _pipe(self, link: _Link) -> None:
        """Answers, upstream to client (dropped once the link is dead)."""
        assert link.upstream is not None
        try:
            while data := link.upstream.recv(1 << 16):
                if not link.dead:
                    link.client.sendall(data)
        except OSError:
            pass
        finally:
            if not link.dead:
                for s in (link.upstream, link.client):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def _swallow(self, link: _Link) -> None:
        """A blackholed connection: read and drop whatever the client sends, until it hangs up."""
        try:
            while link.client.recv(1 << 16):
                pass
        except OSError:
            pass
        self._forget(link)
        _close(link.client)
        if link.upstream is not None:
            _close(link.upstream)

    def _requests(self, link: _Link) -> None:
        client, upstream = link.client, link.upstream
        if upstream is None:
            self._swallow(link)
            return
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = client.recv(1 << 16)
                    if not chunk:
                        return
                    if link.dead:
                        self._swallow(link)
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
                if link.dead:
                    self._swallow(link)
                    return
                with self._lock:
                    self.requests[f"{method} {'/'.join(path.split('/')[:3])}"] += 1
                    self.trace.append((time.monotonic(), f"{method} {target}"))
                    del self.trace[: -self.TRACE_KEPT]
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
                    if link.dead:
                        self._swallow(link)
                        return
                    part, buf = buf[:length], buf[length:]
                    upstream.sendall(part)
                    length -= len(part)
        except OSError:
            pass
        finally:
            if not link.dead:
                self._forget(link)
                for s in (client, upstream):
                    _close(s)

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
        with self._lock:
            self.mode = REFUSE
            links, self._links = self._links, []
            _close(self._server)  # shutdown first: it wakes the thread blocked in accept()
        for link in links:
            for s in (link.client, link.upstream):
                if s is not None:
                    _close(s)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
