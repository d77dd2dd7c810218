"""The store: every byte LaunchHelm keeps goes through this small surface.

All coordination between processes (event logs, resume, evaluation leases)
rests on one primitive, :meth:`Store.create`: put-if-absent, all-or-nothing.
Each backend gives it with the storage's own atomic operation, because
fsspec's generic fallbacks are not atomic (measured: ``pipe_file(mode="create")``
on the local file system lets two writers win).

Keys are ``/``-separated paths relative to the store's root URL.

Errors: every failure is a :class:`~launchhelm.StorageError`. A store that
cannot be reached, a bucket that does not exist and credentials that are
refused each get their own subclass and a message naming the URL and what to
check; connections time out after a few seconds and retries are bounded, so
a misconfigured store fails fast instead of hanging.

This module holds the surface every backend shares; the backends live in
``_local.py`` (:class:`LocalStore`) and ``_object.py`` (:class:`ObjectStore`,
:class:`MemoryStore`), and ``_open.py`` picks one for a URL (:func:`open_store`).
"""

from __future__ import annotations

import builtins
import mmap
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from launchhelm._exceptions import (
    CoordinationUnsupportedError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PathNotFoundError,
)
from launchhelm.storage._keys import run_record_key
from launchhelm.storage._progress import Progress

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from _typeshed import SupportsWrite
    from typing_extensions import Buffer

    from launchhelm.storage._backends import IncompleteUpload

__all__ = ["ObjectInfo", "Store"]


#: Protocols whose fsspec implementation sends a real put-if-absent request
#: for ``pipe_file(mode="create")`` / ``put_file(mode="create")``.
_CONDITIONAL_PROTOCOLS = {
    "s3": "S3 If-None-Match: *",
    "s3a": "S3 If-None-Match: *",
    "gs": "GCS ifGenerationMatch=0",
    "gcs": "GCS ifGenerationMatch=0",
    "az": "Azure If-None-Match: *",
    "abfs": "Azure If-None-Match: *",
    "abfss": "Azure If-None-Match: *",
}

#: Requests a batched read keeps in flight on an object store: enough that
#: round trips, not the store's request rate, stay what a large read waits on.
DEFAULT_READ_CONCURRENCY = int(os.environ.get("LAUNCHHELM_READ_CONCURRENCY") or 64)
#: Local reads are page-cache copies: a few threads are all they can use.
_LOCAL_READ_THREADS = 8

_STAGING = ".staging"
#: What each fsspec backend's listing calls an object's version (S3, Azure: ETag; GCS: generation).
_VERSION_FIELDS = ("ETag", "etag", "generation", "md5Hash", "created")
_BLOCK = 8 * 2**20

#: What to check, per protocol, when the endpoint does not answer / access is denied.
_ENDPOINT_HINTS = {
    "s3": "AWS_ENDPOINT_URL or storage_options={'endpoint_url': ...} for S3-compatible stores, AWS_DEFAULT_REGION",
    "gcs": "STORAGE_EMULATOR_HOST or storage_options={'endpoint_url': ...}",
    "azure": "AZURE_STORAGE_CONNECTION_STRING (its BlobEndpoint) or storage_options={'account_name': ...}",
}
_CREDENTIAL_HINTS = {
    "s3": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE, or storage_options={'key': ..., 'secret': ...}",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS, or storage_options={'token': '/path/to/key.json'}",
    "azure": (
        "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME + AZURE_STORAGE_ACCOUNT_KEY, "
        "or storage_options={'account_name': ..., 'account_key': ...}"
    ),
}


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object, as :meth:`Store.list_info` reports it.

    Attributes
    ----------
    key:
        Relative to the prefix listed.
    size:
        Bytes.
    modified:
        When it was written (seconds since the epoch), if the backend says.
    version:
        Changes whenever the object is rewritten (ETag, generation, or the
        local file's inode, mtime and size): a reader that remembers it knows
        without a GET whether a ``put`` object changed.
    """

    key: str
    size: int
    modified: float | None
    version: str | None = None


class _ReadsInto(Protocol):
    def readinto(self, buffer: Buffer, /) -> int | None: ...


def _copy(src: _ReadsInto, dst: SupportsWrite[Buffer], block: int = _BLOCK, progress: Progress | None = None) -> None:
    """Stream ``src`` to ``dst`` in blocks (never the whole file in memory).

    The block is an anonymous map, not ``bytes``: glibc raises its mmap
    threshold to the size of each large block freed, and from then on
    allocations that size come from heaps that fragment and stay resident
    (bench_soak's day, docs/long-runs.md).
    """
    buffer = mmap.mmap(-1, block)
    view = memoryview(buffer)
    try:
        while n := src.readinto(view):
            dst.write(view[:n])
            if progress is not None:
                progress.update(n)
    finally:
        view.release()
        try:
            buffer.close()
        except BufferError:  # ``dst`` kept a view of the block: the map goes with it
            pass


def _writing(data: bytes) -> Callable[[BinaryIO], None]:
    def write(f: BinaryIO) -> None:
        f.write(data)

    return write


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key or key.startswith("/") or key.endswith("/"):
        raise InvalidArgumentError(f"invalid store key {key!r}: use a relative path like {run_record_key('abc')!r}")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidArgumentError(f"invalid store key {key!r}: empty, '.' or '..' segments are not allowed")
    return key


def _check_prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    if prefix:
        _check_key(prefix)
    return prefix


class _CountingFile:
    """A write-only file that reports each write to a :class:`Progress`."""

    def __init__(self, raw: BinaryIO, progress: Progress) -> None:
        self.raw = raw
        self.progress = progress

    def write(self, data: Buffer) -> int:
        n = self.raw.write(data)
        self.progress.update(len(memoryview(data).cast("B")))
        return n

    def flush(self) -> None:
        self.raw.flush()

    def tell(self) -> int:
        return self.progress.done

    def writable(self) -> bool:
        return True


class Store:
    """A root URL and the operations LaunchHelm needs there.

    Subclasses implement the private hooks; the public methods check keys and
    translate errors so every backend behaves the same.

    Attributes
    ----------
    url:
        The root URL, as given (``/home/me/.launchhelm``, ``memory://x``,
        ``s3://bucket/prefix``).
    atomic_create:
        True when :meth:`create` is a real put-if-absent on this backend.
        Without it runs can still be stored by a single writer, but anything
        that coordinates several writers calls :meth:`require_coordination`
        and is refused.
    progress:
        Progress bars for large uploads and downloads: None (default) shows
        them past 256 MB unless ``LAUNCHHELM_PROGRESS=0``; True always;
        False never. Each transfer call can override it.
    """

    url: str
    protocol: str
    atomic_create: bool = True
    progress: bool | None = None
    #: Requests :meth:`read_many` keeps in flight (``LAUNCHHELM_READ_CONCURRENCY``).
    read_concurrency: int = DEFAULT_READ_CONCURRENCY
    #: :meth:`exists` costs far less than a listing that grows with the objects listed (a
    #: ``stat`` against a directory walk): a reader that already knows a log asks whether its
    #: next object is there before listing it again. False on object stores, where both are one
    #: request and a listing of a changed log would then cost two.
    probe_before_listing: bool = False

    # -- public surface -------------------------------------------------
    def create(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key`` only if nothing is there: all or nothing.

        Raises
        ------
        AlreadyExistsError
            Another writer created ``key`` first; the stored object is
            unchanged.
        """
        self._create(_check_key(key), bytes(data))

    def put(self, key: str, data: bytes) -> None:
        """Replace the object at ``key`` atomically (single-writer objects only).

        Used for per-session heartbeats, which only their own session writes.
        Readers see either the old or the new object, never a mix.
        """
        self._put(_check_key(key), bytes(data))

    def read(self, key: str) -> bytes:
        """Return the whole object at ``key``.

        Raises
        ------
        ObjectNotFoundError
            Nothing is stored at ``key``.
        """
        return self._read(_check_key(key))

    def read_many(self, keys: Iterable[str], *, max_concurrency: int | None = None) -> dict[str, bytes | None]:
        """Read many objects at once, with up to ``max_concurrency`` requests in flight.

        Object stores send the requests concurrently on their file system's
        event loop (one ``GET`` per key, no listing); local folders and
        ``memory://`` read in a small thread pool. This is how every read a
        person waits for stays a bounded number of round trips.

        Returns
        -------
        dict
            ``{key: bytes}``, with ``None`` for a key where nothing is stored,
            in the order the keys were given (duplicates read once).

        Raises
        ------
        StorageError
            Every other failure, mapped exactly as :meth:`read` maps it (after
            the same retries of transient answers).

        Examples
        --------
        >>> store.read_many(["runs/a/run.json", "runs/b/run.json"])  # doctest: +SKIP
        {'runs/a/run.json': b'{...}', 'runs/b/run.json': None}
        """
        wanted = list(dict.fromkeys(_check_key(k) for k in keys))
        if not wanted:
            return {}
        limit = max(1, int(max_concurrency or self.read_concurrency))
        return self._read_many(wanted, limit)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object at ``key`` (a ranged GET on object stores).

        Fewer bytes come back where the object is shorter; the caller checks
        the length. Sharded checkpoint loads read only the ranges they need.

        Raises
        ------
        ObjectNotFoundError
            Nothing is stored at ``key``.
        """
        if not 0 <= start <= end:
            raise InvalidArgumentError(f"read_range({key!r}, {start}, {end}): need 0 <= start <= end")
        return self._read_range(_check_key(key), start, end)

    def exists(self, key: str) -> bool:
        """Whether an object is stored at ``key``."""
        return self._exists(_check_key(key))

    def list(self, prefix: str) -> list[str]:
        """Keys of every object under ``prefix``, relative to it, sorted.

        Recursive: ``list("runs/abc")`` may return ``["events/00..1.json",
        "run.json"]``. An absent prefix lists as empty.
        """
        return sorted(self._list(_check_prefix(prefix)))

    def list_info(self, prefix: str) -> builtins.list[ObjectInfo]:
        """Like :meth:`list`, with each object's size and modification time (for garbage collection)."""
        return sorted(self._list_info(_check_prefix(prefix)), key=lambda info: info.key)

    def delete(self, key: str) -> None:
        """Delete the object at ``key`` (garbage collection only); absent is fine."""
        self._delete(_check_key(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete many objects (garbage collection and compaction only); absent ones are fine.

        Object stores batch them (S3: one request per 1,000 keys).
        """
        wanted = list(dict.fromkeys(_check_key(k) for k in keys))
        if wanted:
            self._delete_many(wanted)

    def upload(
        self,
        key: str,
        local_path: str | os.PathLike[str],
        *,
        progress: bool | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        """Stream a local file to ``key``, put-if-absent, never partly visible.

        Parameters
        ----------
        progress:
            Show a progress bar: None follows :attr:`progress` (bars past 256 MB).
        max_concurrency:
            Parts in flight at most, where the store uploads in parts (memory
            holds one more part than this); None keeps the backend's own.

        Raises
        ------
        AlreadyExistsError
            ``key`` is taken; nothing was changed.
        """
        path = Path(local_path)
        if not path.is_file():
            raise PathNotFoundError(f"cannot upload {str(path)!r}: no such file", path=str(path))
        with Progress(self._progress(progress), f"upload {path.name}", path.stat().st_size) as bar:
            self._upload(_check_key(key), path, bar, max_concurrency)

    @contextmanager
    def writer(self, key: str, *, progress: bool | None = None, size: int | None = None) -> Iterator[BinaryIO]:
        """Stream bytes to a new object at ``key``; it appears only if the block succeeds.

        For large artifacts written on the fly (``torch.save`` straight into
        the store): memory holds a few 8 MiB parts at most, a failure or
        crash inside the block leaves no object at ``key``, and ``key`` must
        be new (use unique keys: on object stores this is checked, not raced).

        Examples
        --------
        ``size``, where the caller knows the object's size: a store that sends
        objects that small in one request (S3 under 50 MiB, s3fs's own
        threshold) holds the bytes and sends one PUT with their checksum
        instead of a multipart upload (four requests at least).

        >>> with store.writer("artifacts/a1/model.pt") as f:   # doctest: +SKIP
        ...     torch.save(state, f)
        """
        _check_key(key)
        name = key.rsplit("/", 1)[-1]
        with Progress(self._progress(progress), f"save {name}") as bar, self._writer(key, bar, size) as f:
            yield f

    def download(self, key: str, local_path: str | os.PathLike[str], *, progress: bool | None = None) -> Path:
        """Stream the object at ``key`` to a local file and return its path.

        The file appears under its final name only once complete.
        """
        target = Path(local_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.part")
        try:
            with Progress(self._progress(progress), f"download {target.name}") as bar:
                with open(tmp, "wb") as out:
                    self._download(_check_key(key), out, bar)
                os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()
        return target

    def incomplete_uploads(self) -> builtins.list[IncompleteUpload]:
        """Uploads under this store that were started and never finished (a killed writer's).

        S3 multipart uploads, Azure uncommitted blobs, local staging files.
        GCS resumable sessions cannot be listed (they expire after a week and
        never become objects). ``launchhelm gc`` aborts the old ones.
        """
        return self._incomplete_uploads()

    def abort_upload(self, upload: IncompleteUpload) -> None:
        """Abort one of :meth:`incomplete_uploads` (garbage collection only)."""
        self._abort_upload(upload)

    def url_for(self, key: str) -> str:
        """The full URL of ``key``, for messages."""
        return f"{self.url.rstrip('/')}/{key}"

    def require_coordination(self, purpose: str) -> None:
        """Refuse ``purpose`` unless this backend has a real put-if-absent.

        Raises
        ------
        CoordinationUnsupportedError
            The backend cannot arbitrate between concurrent writers.
        """
        if not self.atomic_create:
            raise CoordinationUnsupportedError(
                f"{purpose} needs a store with atomic put-if-absent, and {self.protocol}:// "
                f"({self.url}) has none in LaunchHelm: concurrent writers could both win. "
                "Use a local path, s3://, gs:// or az:// for this store.",
                url=self.url,
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _progress(self, given: bool | None) -> bool | None:
        return self.progress if given is None else given

    # -- hooks ----------------------------------------------------------
    def _create(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _read(self, key: str) -> bytes:
        raise NotImplementedError

    def _delete_many(self, keys: builtins.list[str]) -> None:
        for key in keys:
            self._delete(key)

    def _read_many(self, keys: builtins.list[str], limit: int) -> dict[str, bytes | None]:
        """A thread pool over :meth:`read`: what local folders and ``memory://`` need."""
        from concurrent.futures import ThreadPoolExecutor

        def one(key: str) -> bytes | None:
            try:
                return self._read(key)
            except ObjectNotFoundError:
                return None

        if len(keys) == 1:
            return {keys[0]: one(keys[0])}
        with ThreadPoolExecutor(max_workers=min(limit, len(keys), _LOCAL_READ_THREADS)) as pool:
            return dict(zip(keys, pool.map(one, keys), strict=True))

    def _read_range(self, key: str, start: int, end: int) -> bytes:
        raise NotImplementedError

    def _exists(self, key: str) -> bool:
        raise NotImplementedError

    def _list(self, prefix: str) -> builtins.list[str]:
        return [info.key for info in self._list_info(prefix)]

    def _list_info(self, prefix: str) -> builtins.list[ObjectInfo]:
        raise NotImplementedError

    def _delete(self, key: str) -> None:
        raise NotImplementedError

    def _upload(self, key: str, path: Path, progress: Progress, max_concurrency: int | None = None) -> None:
        raise NotImplementedError

    def _download(self, key: str, out: BinaryIO, progress: Progress) -> None:
        raise NotImplementedError

    def _writer(self, key: str, progress: Progress, size: int | None = None) -> AbstractContextManager[BinaryIO]:
        raise NotImplementedError

    def _incomplete_uploads(self) -> builtins.list[IncompleteUpload]:
        return []

    def _abort_upload(self, upload: IncompleteUpload) -> None:
        pass
