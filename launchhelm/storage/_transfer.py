"""Large objects in parts: bounded memory, retried parts, all-or-nothing.

:class:`PartWriter` is the file object ``Store.writer`` hands out on object
stores. It cuts the stream into parts (8 MiB, 64 MiB after the first 1000 so
an object can reach hundreds of GB within S3's 10,000 parts; 32 MiB on GCS,
whose resumable uploads take one chunk at a time), uploads them
from a few background threads while the caller keeps writing, and holds at
most ``concurrency + 1`` parts in memory. A part that fails for a transient
reason (5xx, 429, a reset connection) is sent again; one that keeps failing,
or an exception in the caller's block, aborts the whole upload: nothing
becomes visible, and on S3 the multipart upload is aborted rather than left
behind. An object that fits in one part never starts a multipart upload: it
is one conditional PUT.

The backend side is a :class:`PartUpload` (see ``_backends.py``): begin, put
a part, finish (upload the last part and commit with put-if-absent), abort.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, BinaryIO, Protocol, TypeVar

from launchhelm.storage._errors import TRANSIENT, UNREACHABLE, classify, no_answer
from launchhelm.storage._progress import Progress
from launchhelm.storage._retry import Backoff, retry

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "PART_BACKOFF",
    "PART_SIZE",
    "BufferReader",
    "PartUpload",
    "PartWriter",
    "download_parts",
    "part_size",
    "with_retries",
]

T = TypeVar("T")

#: The first 1000 parts; S3 allows 10,000 parts per upload.
PART_SIZE = 8 * 2**20
_LARGE_PART_SIZE = 64 * 2**20
_PARTS_AT_SMALL_SIZE = 1000
#: Attempts per part (or per request of a transfer) before giving up.
PART_ATTEMPTS = 5
#: A part's waits between attempts: 0.2 s doubling, at most 2 s each, jittered (see ``_retry``).
PART_BACKOFF = Backoff(PART_ATTEMPTS, first=0.2, cap=2.0)


def part_size(number: int, first: int = PART_SIZE) -> int:
    """Size of part ``number`` (1-based): every part but the last has exactly this size.

    ``first`` is the size of the first 1000 parts (the upload's ``part_bytes``).
    """
    return first if number <= _PARTS_AT_SMALL_SIZE else max(first, _LARGE_PART_SIZE)


def with_retries(op: Callable[[], T], backoff: Backoff = PART_BACKOFF) -> T:
    """Run ``op``, again after a transient failure (with jittered backoff), at most ``backoff.attempts`` times.

    A connection that breaks mid-transfer is transient; an endpoint that
    refuses connections is retried too, since a part upload already had a
    working connection moments before. A request that timed out is not: the
    client library already tried it, each time for the whole timeout.
    """
    return retry(op, backoff, _part_retryable)


def _part_retryable(exc: Exception) -> bool:
    return classify(exc).kind in (TRANSIENT, UNREACHABLE) and not no_answer(exc)


class BufferReader(io.RawIOBase):
    """A part's bytes as a read-only, seekable file, so an HTTP client streams them in small reads.

    Given ``bytes`` or a ``bytearray``, aiohttp (which s3fs's requests go
    through) copies the body twice more: a ``bytearray`` slice, then the join
    with the request's headers. Each copy is as large as the part, so an 8 MiB
    part held 32 MiB while in flight. Read as a file, it is sent in 64 KiB
    reads with nothing else held. botocore rewinds it with ``seek`` to retry.
    """

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._view = memoryview(data).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        chunk = bytes(self._view[self._pos : end])
        self._pos = max(self._pos, end)
        return chunk

    def readinto(self, buffer: Buffer) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def __len__(self) -> int:
        return len(self._view)


class PartUpload(Protocol):
    """One object's upload in parts, as a backend does it."""

    #: Parts in flight at once (GCS resumable uploads take their chunks in order: 1).
    concurrency: int
    #: Size of each of the first 1000 parts; memory holds at most ``concurrency + 1`` parts.
    part_bytes: int
    #: Objects of a size known to be at most this go as one request (0: only those under a part).
    whole_bytes: int

    def create_small(self, data: bytes | bytearray) -> None:
        """The whole object in one conditional request (FileExistsError if taken)."""

    def begin(self) -> None:
        """Start a multipart upload (called before the first part)."""

    def put_part(self, number: int, offset: int, data: bytes | bytearray) -> object:
        """Upload part ``number`` (not the last); return what ``finish`` needs to commit it."""

    def finish(self, tokens: list[object], number: int, offset: int, data: bytes | bytearray, size: int) -> None:
        """Upload the last part and commit the object, put-if-absent (FileExistsError if taken)."""

    def abort(self) -> None:
        """Discard the parts uploaded so far (best effort, never raises)."""


class PartWriter:
    """A write-only binary file that streams into a :class:`PartUpload`.

    ``close()`` commits; ``discard()`` aborts. Either may be called once.
    ``max_concurrency`` lowers the backend's parts in flight, never raises it.
    """

    def __init__(
        self, upload: PartUpload, progress: Progress, max_concurrency: int | None = None, size: int | None = None
    ) -> None:
        self._upload = upload
        self._progress = progress
        self._buffer = bytearray()
        # the caller said how big the object is, and the backend sends that size in one request: the
        # writer holds it whole (the caller's bytes are in memory anyway) and sends one PUT at close
        self._whole = size is not None and size <= getattr(upload, "whole_bytes", 0)
        if self._whole:
            assert size is not None
            self._buffer = bytearray(size)  # filled in place: no regrowth copies
        self._filled = 0
        self._number = 1  # the part the buffer fills
        self._offset = 0  # where the buffer starts in the object
        self._written = 0
        self._begun = False
        self._tokens: dict[int, object] = {}
        self._futures: list[Future[None]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._concurrency = max(1, min(upload.concurrency, max_concurrency or upload.concurrency))
        self._slots = threading.BoundedSemaphore(self._concurrency)
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.closed = False

    # -- file protocol ------------------------------------------------------
    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        self._raise_failure()

    def write(self, data: Buffer) -> int:
        if self.closed:
            raise ValueError("write to a closed store writer")
        self._raise_failure()
        view = memoryview(data).cast("B")
        n = len(view)
        if self._whole:
            if self._filled + n <= len(self._buffer):
                self._buffer[self._filled : self._filled + n] = view
                self._filled += n
                self._written += n
                return n
            # more than the caller said: parts after all, from the bytes held so far
            self._whole = False
            held, self._buffer = memoryview(self._buffer)[: self._filled], bytearray()
            self._written -= self._filled
            self.write(held)
        pos = 0
        while pos < n:
            size = part_size(self._number, self._upload.part_bytes)
            if len(self._buffer) == size:
                # dispatch a full part only once more bytes arrive: the part
                # that is still in the buffer at close() is the last one
                self._dispatch()
                size = part_size(self._number, self._upload.part_bytes)
            take = min(size - len(self._buffer), n - pos)
            self._buffer += view[pos : pos + take]
            pos += take
        self._written += n
        return n

    # -- parts ----------------------------------------------------------------
    def _raise_failure(self) -> None:
        with self._lock:
            error = self._error
        if error is not None:
            raise error

    def _dispatch(self) -> None:
        if not self._begun:
            self._upload.begin()
            self._begun = True
            self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="launchhelm-upload")
        # the buffer itself, not a bytes copy: a part is up to 64 MiB, and each copy is a large block freed
        data, self._buffer = self._buffer, bytearray()
        number, offset = self._number, self._offset
        self._number += 1
        self._offset += len(data)
        self._slots.acquire()  # backpressure: at most `concurrency` parts in flight
        assert self._pool is not None
        self._futures.append(self._pool.submit(self._send, number, offset, data))
        self._raise_failure()

    def _send(self, number: int, offset: int, data: bytearray) -> None:
        try:
            with self._lock:
                if self._error is not None:
                    return
            token = with_retries(lambda: self._upload.put_part(number, offset, data))
            with self._lock:
                self._tokens[number] = token
            self._progress.update(len(data))
        except BaseException as exc:
            with self._lock:
                if self._error is None:
                    self._error = exc
        finally:
            self._slots.release()

    def _wait(self) -> None:
        for future in self._futures:
            future.result()
        self._futures.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- ending -----------------------------------------------------------------
    def close(self) -> None:
        """Commit: the object appears whole, or not at all (and the error is raised)."""
        if self.closed:
            return
        self.closed = True
        try:
            if not self._begun:
                data: bytes | bytearray
                if self._whole and self._filled == len(self._buffer):
                    data = self._buffer  # as the caller said: sent as it is, no second copy
                else:
                    data = bytes(memoryview(self._buffer)[: self._filled] if self._whole else self._buffer)
                self._buffer = bytearray()
                with_retries(lambda: self._upload.create_small(data))
                self._progress.update(len(data))
                return
            self._wait()
            self._raise_failure()
            last, self._buffer = self._buffer, bytearray()
            tokens = [self._tokens[n] for n in sorted(self._tokens)]
            self._upload.finish(tokens, self._number, self._offset, last, self._offset + len(last))
            self._progress.update(len(last))
        except BaseException:
            self._abort()
            raise

    def discard(self) -> None:
        """Abort: nothing becomes visible and the parts are discarded."""
        if self.closed:
            return
        self.closed = True
        self._abort()

    def _abort(self) -> None:
        with self._lock:
            if self._error is None:
                self._error = RuntimeError("upload aborted")
        self._buffer = bytearray()
        try:
            self._wait()
        except BaseException:
            pass
        if self._begun:
            self._upload.abort()


def download_parts(
    fetch: Callable[[int, int], bytes],
    size: int,
    out: BinaryIO,
    progress: Progress,
    concurrency: int = 4,
) -> None:
    """Write ``size`` bytes to ``out`` from ranged reads ``fetch(start, end)``, in order.

    Up to ``concurrency`` ranges are fetched at once, each retried on
    transient failures; memory holds at most ``concurrency`` parts.
    """
    if size <= PART_SIZE:
        data = with_retries(lambda: fetch(0, size)) if size else b""
        if len(data) != size:
            raise OSError(f"read {len(data)} bytes where {size} were stored")
        out.write(data)
        progress.update(len(data))
        return

    def get(start: int, end: int) -> bytes:
        data = with_retries(lambda: fetch(start, end))
        if len(data) != end - start:
            raise OSError(f"range {start}-{end} returned {len(data)} bytes")
        return data

    ranges = [(start, min(start + PART_SIZE, size)) for start in range(0, size, PART_SIZE)]
    with ThreadPoolExecutor(concurrency, thread_name_prefix="launchhelm-download") as pool:
        pending: list[Future[bytes]] = []
        it = iter(ranges)
        for start, end in it:
            pending.append(pool.submit(get, start, end))
            if len(pending) >= concurrency:
                break
        while pending:
            data = pending.pop(0).result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(pool.submit(get, *nxt))
            out.write(data)
            progress.update(len(data))
            del data
