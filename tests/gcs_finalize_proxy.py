"""A proxy that makes fake-gcs-server check a resumable upload's precondition when it ends.

GCS checks ``ifGenerationMatch=0`` (given when a resumable upload starts)
when the last chunk arrives. fake-gcs-server ignores preconditions on
resumable uploads (and shows the partial object early), but honours them on
multipart uploads. This proxy sits in front of it and holds each resumable
session itself: it answers chunks as GCS does (308 and the ``Range`` kept),
and on the last chunk sends the whole object to fake-gcs-server as one
multipart upload carrying the session's precondition. So the emulator, not
the proxy, decides who wins; LaunchHelm's resumable-upload client, chunk by
chunk, is what is tested. Everything else is forwarded unchanged.

Only the session bookkeeping is played here (held in memory: test-sized
objects); the precondition, the object and its generation are the emulator's.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

_RANGE = re.compile(r"bytes (\*|(\d+)-(\d+))/(\*|\d+)")


class _Session:
    def __init__(self, bucket: str, name: str, precondition: str | None) -> None:
        self.bucket = bucket
        self.name = name
        self.precondition = precondition
        self.data = bytearray()


class GcsFinalizeProxy:
    """``GcsFinalizeProxy(upstream_port)``; ``.endpoint``; ``.close()``.

    ``finals`` lists the statuses fake-gcs-server gave each session's end;
    ``open_sessions()`` the sessions neither ended nor cancelled;
    ``authorizations`` the ``Authorization`` header of every request.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.sessions: dict[str, _Session] = {}
        self.started: list[tuple[str, str | None]] = []  # (object name, ifGenerationMatch) per session
        self.finals: list[int] = []
        self.cancelled = 0
        self.authorizations: list[str] = []  # the Authorization header of every request ("" if none)
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def parse_request(self) -> bool:
                parsed = super().parse_request()
                if parsed:
                    with proxy.lock:
                        proxy.authorizations.append(self.headers.get("Authorization", ""))
                return parsed

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _session_id(self) -> str | None:
                ids = parse_qs(urlsplit(self.path).query).get("upload_id")
                return ids[0] if ids else None

            def do_POST(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                if query.get("uploadType") == ["resumable"]:
                    body = self._body()
                    bucket = urlsplit(self.path).path.split("/b/", 1)[1].split("/", 1)[0]
                    name = (json.loads(body or b"{}").get("name")) or query["name"][0]
                    precondition = query.get("ifGenerationMatch", [None])[0]
                    sid = uuid.uuid4().hex
                    with proxy.lock:
                        proxy.sessions[sid] = _Session(bucket, name, precondition)
                        proxy.started.append((name, precondition))
                    location = f"http://{self.headers['Host']}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={sid}"
                    self._reply(200, headers={"Location": location})
                    return
                self._forward()

            def do_PUT(self) -> None:
                sid = self._session_id()
                if sid is None:
                    self._forward()
                    return
                body = self._body()
                with proxy.lock:
                    session = proxy.sessions.get(sid)
                if session is None:
                    self._reply(404, b'{"error": {"code": 404, "message": "No such upload"}}')
                    return
                match = _RANGE.fullmatch(self.headers.get("Content-Range", ""))
                if match is None:
                    self._reply(400, b'{"error": {"code": 400, "message": "bad Content-Range"}}')
                    return
                if match.group(2) is not None:
                    start = int(match.group(2))
                    if start != len(session.data):
                        self._reply(400, b'{"error": {"code": 400, "message": "chunk out of order"}}')
                        return
                    session.data += body
                total = match.group(4)
                if total == "*" or int(total) != len(session.data):
                    kept = {"Range": f"bytes=0-{len(session.data) - 1}"} if session.data else {}
                    self._reply(308, headers=kept)
                    return
                status, headers, answer = proxy._multipart(session)
                with proxy.lock:
                    proxy.finals.append(status)
                    if status < 500:
                        proxy.sessions.pop(sid, None)  # ended: won or lost
                self._reply(status, answer, {"Content-Type": headers.get("Content-Type", "application/json")})

            def do_DELETE(self) -> None:
                sid = self._session_id()
                if sid is None:
                    self._forward()
                    return
                with proxy.lock:
                    found = proxy.sessions.pop(sid, None)
                    proxy.cancelled += found is not None
                self._reply(499 if found else 404)

            def do_GET(self) -> None:
                self._forward()

            def do_HEAD(self) -> None:
                self._forward()

            def do_PATCH(self) -> None:
                self._forward()

            def _forward(self) -> None:
                body = self._body() if self.command not in ("GET", "HEAD") else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "content-length")}
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    answer = response.read()
                    passed = {
                        k: v
                        for k, v in response.getheaders()
                        if k.lower() not in ("connection", "content-length", "transfer-encoding", "keep-alive")
                    }
                finally:
                    conn.close()
                self.send_response(response.status)
                for key, value in passed.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _multipart(self, session: _Session) -> tuple[int, dict[str, str], bytes]:
        """The whole object as one multipart upload to fake-gcs-server, with the session's precondition."""
        boundary = uuid.uuid4().hex
        metadata = json.dumps({"name": session.name, "contentType": "application/octet-stream"})
        body = (
            (
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n"
                f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
            ).encode()
            + bytes(session.data)
            + f"\r\n--{boundary}--\r\n".encode()
        )
        query = f"uploadType=multipart&name={quote(session.name, safe='')}"
        if session.precondition is not None:
            query += f"&ifGenerationMatch={session.precondition}"
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=120)
        try:
            conn.request(
                "POST",
                f"/upload/storage/v1/b/{session.bucket}/o?{query}",
                body=body,
                headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
            )
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def open_sessions(self) -> list[str]:
        with self.lock:
            return [s.name for s in self.sessions.values()]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
