"""An object store reached through another process: the training process keeps no store client.

:class:`HelperStore` is a :class:`~launchhelm.storage.Store` whose hooks are
requests over a Unix socket to a process that runs :func:`serve` with the real
store (s3fs, gcsfs or adlfs, their event loop and connection pools live there).
Every protocol built on the store is unchanged; only who holds the connection
changes. docs/storage.md, "The store's client in the helper", has the design.

A frame is ``!I`` header length, the JSON header, ``!Q`` payload length, the
payload. Bytes go as the payload; listings, flags and errors in the header.
Large payloads never cross: uploads and downloads name a local file.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from launchhelm._exceptions import (
    AlreadyExistsError,
    BucketNotFoundError,
    CoordinationUnsupportedError,
    ObjectNotFoundError,
    StorageError,
    StoreAccessDeniedError,
    StoreUnreachableError,
)
from launchhelm.storage._store import ObjectInfo, Store

if TYPE_CHECKING:
    from launchhelm.storage._backends import IncompleteUpload
    from launchhelm.storage._progress import Progress

__all__ = ["HELPER_STORE_ENV", "HelperStore", "helper_store_wanted", "open_and_serve", "serve"]

#: ``1`` makes ``init`` reach an object store through a process of its own (slice 1 of the design).
HELPER_STORE_ENV = "LAUNCHHELM_HELPER_STORE"

_HEAD = struct.Struct("!I")
_BODY = struct.Struct("!Q")
#: The store errors an answer may name: raised again by the client as the same class.
_ERRORS: dict[str, type[StorageError]] = {
    cls.__name__: cls
    for cls in (
        AlreadyExistsError,
        BucketNotFoundError,
        CoordinationUnsupportedError,
        ObjectNotFoundError,
        StorageError,
        StoreAccessDeniedError,
        StoreUnreachableError,
    )
}
#: Signals the store's process ignores (as the session's helper does): it ends at its socket's end.
NOTICES = "INT TERM USR1 USR2 HUP"
#: Requests the server runs at once: a flush, a heartbeat and a checkpoint's upload never wait in line.
SERVER_THREADS = 16

_log = logging.getLogger("launchhelm")


def helper_store_wanted(url: str) -> bool:
    """Whether ``init`` should reach the store at ``url`` through a process of its own.

    Only object stores, and only when ``LAUNCHHELM_HELPER_STORE=1``: a local write costs less than
    the hop and imports nothing, and ``memory://`` is this process's own."""
    if os.environ.get(HELPER_STORE_ENV, "").strip().lower() not in ("1", "on", "true", "yes"):
        return False
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    return protocol not in ("file", "local", "memory")


# -- frames ---------------------------------------------------------------------------------
def _send(sock: socket.socket, lock: threading.Lock, header: dict[str, Any], payload: bytes = b"") -> None:
    head = json.dumps(header, separators=(",", ":")).encode()
    with lock:
        sock.sendall(b"".join((_HEAD.pack(len(head)), head, _BODY.pack(len(payload)))))
        if payload:
            sock.sendall(payload)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None  # the other side closed
        got += n
    return bytes(buffer)


def _recv(sock: socket.socket) -> tuple[dict[str, Any], bytes] | None:
    raw = _recv_exactly(sock, _HEAD.size)
    if raw is None:
        return None
    head = _recv_exactly(sock, _HEAD.unpack(raw)[0])
    raw = _recv_exactly(sock, _BODY.size) if head is not None else None
    if head is None or raw is None:
        return None
    size = _BODY.unpack(raw)[0]
    payload = _recv_exactly(sock, size) if size else b""
    if payload is None:
        return None
    header: dict[str, Any] = json.loads(head)
    return header, payload


# -- the server -----------------------------------------------------------------------------
def _answer(store: Store, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    """Run one request against the real store: the answer's header and payload."""
    op, key = header["op"], header.get("key", "")
    if op == "create":
        store.create(key, payload)
    elif op == "put":
        store.put(key, payload)
    elif op == "read":
        return {}, store.read(key)
    elif op == "read_range":
        return {}, store.read_range(key, int(header["start"]), int(header["end"]))
    elif op == "read_many":
        found = store.read_many(header["keys"], max_concurrency=header.get("limit"))
        keys = list(found)
        sizes = [-1 if found[k] is None else len(found[k] or b"") for k in keys]
        return {"keys": keys, "sizes": sizes}, b"".join(found[k] or b"" for k in keys)
    elif op == "exists":
        return {"result": store.exists(key)}, b""
    elif op == "list_info":
        return {"result": [asdict(info) for info in store.list_info(key)]}, b""
    elif op == "delete":
        store.delete(key)
    elif op == "delete_many":
        store.delete_many(header["keys"])
    elif op == "upload":
        store.upload(key, header["path"], progress=header.get("progress"), max_concurrency=header.get("concurrency"))
    elif op == "download":
        store.download(key, header["path"], progress=header.get("progress"))
    elif op == "incomplete_uploads":
        return {"result": [asdict(upload) for upload in store.incomplete_uploads()]}, b""
    elif op == "abort_upload":
        from launchhelm.storage._backends import IncompleteUpload

        store.abort_upload(IncompleteUpload(**header["upload"]))
    else:
        raise StorageError(f"the store's process does not know the request {op!r}: a LaunchHelm of another version?")
    return {}, b""


def _failure(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, StorageError):
        name = (
            type(exc).__name__
            if type(exc).__name__ in _ERRORS
            else next(c.__name__ for c in type(exc).__mro__ if c.__name__ in _ERRORS)
        )
        return {"error": name, "message": str(exc), "url": exc.url}
    return {"error": "StorageError", "message": f"the store's process failed: {type(exc).__name__}: {exc}"}


def serve(store: Store, sock: socket.socket) -> None:
    """Answer requests from ``sock`` with ``store`` until the other side closes it."""
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()

    def one(header: dict[str, Any], payload: bytes) -> None:
        try:
            answer, body = _answer(store, header, payload)
        except Exception as exc:  # every failure goes back to the caller, whose except decides
            answer, body = _failure(exc), b""
        answer["id"] = header["id"]
        with contextlib.suppress(OSError):  # the client is gone: nobody to answer
            _send(sock, lock, answer, body)

    with ThreadPoolExecutor(max_workers=SERVER_THREADS, thread_name_prefix="launchhelm-store") as pool:
        while True:
            try:
                frame = _recv(sock)
            except OSError:
                frame = None
            if frame is None:
                return
            pool.submit(one, *frame)


def main() -> int:
    """The store's process: open the store named on stdin, say hello on its socket, serve until EOF."""
    return open_and_serve(json.loads(sys.stdin.readline()))


def open_and_serve(config: dict[str, Any]) -> int:
    """Open the store ``config`` names (``url``, ``options``, ``progress``), say hello on the socket ``fd``,
    and serve until its EOF; 1 where the store could not be opened (the hello said why)."""
    sock = socket.socket(fileno=int(config["fd"]))
    lock = threading.Lock()
    from launchhelm.storage._open import open_store

    try:
        store = open_store(config["url"], config.get("options") or None, progress=config.get("progress"))
    except Exception as exc:
        _send(sock, lock, {"id": 0, **_failure(exc)})
        sock.close()
        return 1
    hello = {
        "id": 0,
        "url": store.url,
        "protocol": store.protocol,
        "atomic_create": store.atomic_create,
        "probe_before_listing": store.probe_before_listing,
        "read_concurrency": store.read_concurrency,
    }
    _send(sock, lock, hello)
    serve(store, sock)
    return 0


# -- the client -----------------------------------------------------------------------------
class _Pending:
    __slots__ = ("event", "header", "payload")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.header: dict[str, Any] | None = None
        self.payload = b""


class HelperStore(Store):
    """A store whose requests another process makes (see the module's docstring).

    Raises what the real store raises, as the same classes. Once that process
    is gone (killed, OOM), this process opens the store itself and makes the
    requests from then on, those in flight included (one line says so): a
    request is never lost, and a ``create`` whose first try landed before the
    answer was lost is found to be ours, as a store's own retries find it.
    """

    def __init__(self, sock: socket.socket, hello: dict[str, Any], process: subprocess.Popen[bytes] | None) -> None:
        self.url = str(hello["url"])
        self.protocol = str(hello["protocol"])
        self.atomic_create = bool(hello["atomic_create"])
        self.probe_before_listing = bool(hello["probe_before_listing"])
        self.read_concurrency = int(hello["read_concurrency"])
        self.progress = None
        self.process = process
        #: Where :meth:`writer` stages its bytes (None: the system's temporary folder; ``init`` gives the spool's,
        #: on disk where /tmp may be memory)
        self.staging: str | None = None
        self._sock = sock
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next = 1
        self._closed = False
        #: True where the process is the session's helper (``launchhelm._helper.serve_store``): once given its
        #: session (``adopted``), it ends on its own at the session's end (after settling the run, where that
        #: is on), not at this socket's.
        self.session_helper = False
        self.adopted = False  # the session's helper was given its configuration (it is ours no more to start)
        #: How to open the store here once the process is gone (url, storage options, progress).
        self.reopen: tuple[str, dict[str, object], bool | None] = (self.url, {}, None)
        self._here: Store | None = None
        self._here_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_answers, name="launchhelm-store-client", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls, url: str, storage_options: dict[str, object] | None = None, *, progress: bool | None = None
    ) -> HelperStore:
        """Start the store's process for ``url`` and wait for its hello (its imports and one probe)."""
        ours, theirs = socket.socketpair()
        config = {"url": url, "options": storage_options or {}, "progress": progress, "fd": theirs.fileno()}
        code = "from launchhelm.storage._remote import main; raise SystemExit(main())"
        try:
            process = subprocess.Popen(
                # a Ctrl-C's and the schedulers' notices (SLURM signals every process of a job step) are the
                # training process's, whose last requests (a preemption's checkpoint) this process makes: they
                # are ignored from the exec on (an ignored signal stays so across exec), before any import
                ["/bin/sh", "-c", f'trap "" {NOTICES}; exec "$0" -c "$1"', sys.executable, code],
                stdin=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
                start_new_session=True,  # a Ctrl-C to the training process's group is not its to take
            )
        finally:
            theirs.close()
        assert process.stdin is not None
        try:
            process.stdin.write(json.dumps(config).encode() + b"\n")
            process.stdin.close()  # its EOF is not its end: the socket's is
        except OSError:
            pass  # it died at once: the hello below says so
        return cls.connect(ours, process, url, storage_options, progress)

    @classmethod
    def connect(
        cls,
        sock: socket.socket,
        process: subprocess.Popen[bytes],
        url: str,
        storage_options: dict[str, object] | None = None,
        progress: bool | None = None,
    ) -> HelperStore:
        """Wait for the hello of ``process`` serving the store on ``sock`` (or its error, raised here)."""
        try:
            frame = _recv(sock)
        except OSError:
            frame = None
        if frame is None or "error" in frame[0]:
            sock.close()
            if frame is None:
                code = process.wait()
                raise StoreUnreachableError(f"cannot open store {url}: its process exited with {code}")
            _raise(frame[0])
        store = cls(sock, frame[0], process)
        store.reopen = (url, dict(storage_options or {}), progress)
        return store

    # -- requests -----------------------------------------------------------------------
    def _request(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        waiting = _Pending()
        with self._lock:
            closed = self._closed
            if not closed:
                rid = self._next
                self._next += 1
                self._pending[rid] = waiting
        if closed:
            return self._elsewhere(header, payload, ambiguous=False)
        try:
            _send(self._sock, self._send_lock, {**header, "id": rid}, payload)
        except OSError:
            with self._lock:
                self._pending.pop(rid, None)
            return self._elsewhere(header, payload, ambiguous=True)  # part of it may have gone out
        waiting.event.wait()
        answer = waiting.header
        if answer is None:  # the process died with the request in hand: it may have been done
            return self._elsewhere(header, payload, ambiguous=True)
        if "error" in answer:
            _raise(answer)
        return answer, waiting.payload

    def _elsewhere(self, header: dict[str, Any], payload: bytes, *, ambiguous: bool) -> tuple[dict[str, Any], bytes]:
        """The request made by this process, on the store opened here (once, at the first need)."""
        here = self._open_here()
        try:
            return _answer(here, header, payload)
        except AlreadyExistsError:
            if ambiguous and self._landed(here, header, payload):
                return {}, b""  # the dead process's try landed: it was this request's
            raise

    def _open_here(self) -> Store:
        with self._here_lock:
            if self._here is None:
                from launchhelm.storage._open import open_store

                url, options, progress = self.reopen
                code = self.process.poll() if self.process is not None else None
                # the session's helper: the run's own line says it died and that this process goes on here
                _log.log(
                    logging.INFO if self.session_helper else logging.WARNING,
                    "launchhelm: the store's process for %s is gone (exit status %s); this process reaches the "
                    "store itself from now on",
                    self.url,
                    code,
                )
                self._here = open_store(url, options or None, progress=progress)
            return self._here

    @staticmethod
    def _landed(store: Store, header: dict[str, Any], payload: bytes) -> bool:
        """Whether the object at the key of an ambiguous ``create`` or ``upload`` is the one it sent."""
        try:
            if header["op"] == "create":
                return store.read(header["key"]) == payload
            if header["op"] == "upload":  # keys of uploads are new (ids): its size says it is this one
                name = header["key"].rsplit("/", 1)[-1]
                parent = header["key"][: -len(name)].rstrip("/")
                sizes = {info.key: info.size for info in store.list_info(parent)}
                return sizes.get(name) == os.path.getsize(header["path"])
        except (StorageError, OSError):
            return False
        return False

    def _read_answers(self) -> None:
        while True:
            try:
                frame = _recv(self._sock)
            except OSError:
                frame = None
            if frame is None:
                break
            with self._lock:
                waiting = self._pending.pop(int(frame[0]["id"]), None)
            if waiting is not None:
                waiting.header, waiting.payload = frame
                waiting.event.set()
        with self._lock:  # the process is gone: every caller still waiting gets an answer
            self._closed = True
            left, self._pending = list(self._pending.values()), {}
        for waiting in left:
            waiting.event.set()

    def close(self) -> None:
        """End the store's process (its socket's EOF) and wait for it."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(10)
        self._sock.close()
        if self.process is not None and not self.adopted:  # an adopted helper is its session's to end and reap
            if self.process.stdin is not None:  # a session's helper never given its session waits on it
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    # -- hooks --------------------------------------------------------------------------
    def _create(self, key: str, data: bytes) -> None:
        self._request({"op": "create", "key": key}, data)

    def _put(self, key: str, data: bytes) -> None:
        self._request({"op": "put", "key": key}, data)

    def _read(self, key: str) -> bytes:
        return self._request({"op": "read", "key": key})[1]

    def _read_range(self, key: str, start: int, end: int) -> bytes:
        return self._request({"op": "read_range", "key": key, "start": start, "end": end})[1]

    def _read_many(self, keys: builtins.list[str], limit: int) -> dict[str, bytes | None]:
        answer, payload = self._request({"op": "read_many", "keys": keys, "limit": limit})
        found: dict[str, bytes | None] = {}
        at = 0
        for key, size in zip(answer["keys"], answer["sizes"], strict=True):
            if size < 0:
                found[key] = None
            else:
                found[key] = payload[at : at + size]
                at += size
        return found

    def _exists(self, key: str) -> bool:
        return bool(self._request({"op": "exists", "key": key})[0]["result"])

    def _list_info(self, prefix: str) -> builtins.list[ObjectInfo]:
        return [ObjectInfo(**info) for info in self._request({"op": "list_info", "key": prefix})[0]["result"]]

    def _delete(self, key: str) -> None:
        self._request({"op": "delete", "key": key})

    def _delete_many(self, keys: builtins.list[str]) -> None:
        self._request({"op": "delete_many", "keys": keys})

    def _incomplete_uploads(self) -> builtins.list[IncompleteUpload]:
        from launchhelm.storage._backends import IncompleteUpload

        return [IncompleteUpload(**u) for u in self._request({"op": "incomplete_uploads"})[0]["result"]]

    def _abort_upload(self, upload: IncompleteUpload) -> None:
        self._request({"op": "abort_upload", "upload": asdict(upload)})

    # -- transfers: a path crosses, never the bytes ---------------------------------------
    def upload(
        self,
        key: str,
        local_path: str | os.PathLike[str],
        *,
        progress: bool | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        from launchhelm._exceptions import PathNotFoundError
        from launchhelm.storage._store import _check_key

        path = Path(local_path).absolute()
        if not path.is_file():
            raise PathNotFoundError(f"cannot upload {str(path)!r}: no such file", path=str(path))
        header = {"op": "upload", "key": _check_key(key), "path": str(path), "progress": self._progress(progress)}
        self._request({**header, "concurrency": max_concurrency})

    def download(self, key: str, local_path: str | os.PathLike[str], *, progress: bool | None = None) -> Path:
        from launchhelm.storage._store import _check_key

        target = Path(local_path).absolute()
        header = {"op": "download", "key": _check_key(key), "path": str(target), "progress": self._progress(progress)}
        self._request(header)
        return target

    def _download(self, key: str, out: BinaryIO, progress: Progress) -> None:
        # Store.download is overridden; this is for a caller of the hook itself: through a file
        with tempfile.TemporaryDirectory(prefix="launchhelm-get-") as folder:
            path = Path(folder) / "object"
            self._request({"op": "download", "key": key, "path": str(path), "progress": False})
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    out.write(block)

    @contextmanager
    def writer(self, key: str, *, progress: bool | None = None, size: int | None = None) -> Iterator[BinaryIO]:
        """Written into a local file first (once, by the caller), uploaded from it at the block's end."""
        from launchhelm.storage._store import _check_key

        _check_key(key)
        fd, name = tempfile.mkstemp(prefix=".launchhelm-put-", suffix=".part", dir=self.staging)
        try:
            with open(fd, "wb") as f:
                yield f
            self.upload(key, name, progress=progress)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)

    def _upload(self, key: str, path: Path, progress: Progress, max_concurrency: int | None = None) -> None:
        self.upload(key, path, max_concurrency=max_concurrency)


def _raise(answer: dict[str, Any]) -> None:
    cls = _ERRORS.get(str(answer.get("error")), StorageError)
    raise cls(str(answer.get("message", "")), url=answer.get("url"))
