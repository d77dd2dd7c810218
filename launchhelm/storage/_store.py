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
"""

from __future__ import annotations

import builtins
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from launchhelm._exceptions import (
    AlreadyExistsError,
    BucketNotFoundError,
    CoordinationUnsupportedError,
    InvalidArgumentError,
    InvalidTypeError,
    ObjectNotFoundError,
    PathNotFoundError,
    StorageError,
    StoreAccessDeniedError,
    StoreUnreachableError,
)
from launchhelm.storage._errors import (
    DENIED,
    EXISTS,
    MISSING,
    NO_BUCKET,
    TRANSIENT,
    UNREACHABLE,
    Problem,
    classify,
    no_answer,
)
from launchhelm.storage._keys import run_record_key
from launchhelm.storage._progress import Progress

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from launchhelm.storage._backends import IncompleteUpload

__all__ = ["LocalStore", "MemoryStore", "ObjectInfo", "ObjectStore", "Store", "open_store"]

_log = logging.getLogger("launchhelm")

T = TypeVar("T")

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


def _copy(src: BinaryIO, dst: Any, block: int = _BLOCK, progress: Progress | None = None) -> None:
    """Stream ``src`` to ``dst`` in blocks (never the whole file in memory)."""
    while chunk := src.read(block):
        dst.write(chunk)
        if progress is not None:
            progress.update(len(chunk))


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

    def write(self, data: Any) -> int:
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
            Any other failure, mapped exactly as :meth:`read` maps it (after
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

    def upload(self, key: str, local_path: str | os.PathLike[str], *, progress: bool | None = None) -> None:
        """Stream a local file to ``key``, put-if-absent, never partly visible.

        Parameters
        ----------
        progress:
            Show a progress bar: None follows :attr:`progress` (bars past 256 MB).

        Raises
        ------
        AlreadyExistsError
            ``key`` is taken; nothing was changed.
        """
        path = Path(local_path)
        if not path.is_file():
            raise PathNotFoundError(f"cannot upload {str(path)!r}: no such file", path=str(path))
        bar = Progress(self._progress(progress), f"upload {path.name}", path.stat().st_size)
        try:
            self._upload(_check_key(key), path, bar)
        finally:
            bar.close()

    @contextmanager
    def writer(self, key: str, *, progress: bool | None = None) -> Iterator[BinaryIO]:
        """Stream bytes to a new object at ``key``; it appears only if the block succeeds.

        For large artifacts written on the fly (``torch.save`` straight into
        the store): memory holds a few 8 MiB parts at most, a failure or
        crash inside the block leaves no object at ``key``, and ``key`` must
        be new (use unique keys: on object stores this is checked, not raced).

        Examples
        --------
        >>> with store.writer("artifacts/a1/model.pt") as f:   # doctest: +SKIP
        ...     torch.save(state, f)
        """
        _check_key(key)
        bar = Progress(self._progress(progress), f"save {key.rsplit('/', 1)[-1]}")
        try:
            with self._writer(key, bar) as f:
                yield f
        finally:
            bar.close()

    def download(self, key: str, local_path: str | os.PathLike[str], *, progress: bool | None = None) -> Path:
        """Stream the object at ``key`` to a local file and return its path.

        The file appears under its final name only once complete.
        """
        target = Path(local_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.part")
        bar = Progress(self._progress(progress), f"download {target.name}")
        try:
            with open(tmp, "wb") as out:
                self._download(_check_key(key), out, bar)
            os.replace(tmp, target)
        finally:
            bar.close()
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

    def _upload(self, key: str, path: Path, progress: Progress) -> None:
        raise NotImplementedError

    def _download(self, key: str, out: BinaryIO, progress: Progress) -> None:
        raise NotImplementedError

    def _writer(self, key: str, progress: Progress) -> Any:
        raise NotImplementedError

    def _incomplete_uploads(self) -> builtins.list[IncompleteUpload]:
        return []

    def _abort_upload(self, upload: IncompleteUpload) -> None:
        pass


_quieted_loops: set[int] = set()


def _quiet_event_loop(loop: Any) -> None:
    """Keep the HTTP client's orphaned connection errors off the user's stderr.

    While a store refuses connections, aiohttp leaves tasks whose exception
    nobody retrieves, and asyncio prints each as a traceback ("Task exception
    was never retrieved"). The request that failed has already raised to our
    caller, which retries and says so in one line; these go to the debug log.
    """
    import asyncio

    if not isinstance(loop, asyncio.AbstractEventLoop) or id(loop) in _quieted_loops or loop.is_closed():
        return
    _quieted_loops.add(id(loop))

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        module = type(exc).__module__.split(".")[0] if exc is not None else ""
        if exc is not None and (isinstance(exc, OSError) or module in ("aiohttp", "aiobotocore", "botocore")):
            _log.debug("store client: %s: %r", context.get("message"), exc)
            return
        loop.default_exception_handler(context)

    loop.call_soon_threadsafe(loop.set_exception_handler, handler)


class LocalStore(Store):
    """A directory on a POSIX file system (the embedded default store).

    ``create`` writes a temporary file in ``<root>/.staging`` (the same file
    system), fsyncs it, then ``os.link``\\ s it to the final name, which fails
    if the name is taken, and fsyncs the directory. Readers therefore only
    ever see complete files, and exactly one of several racing writers wins.
    """

    protocol = "file"
    probe_before_listing = True

    def __init__(self, root: str | os.PathLike[str], url: str | None = None, progress: bool | None = None) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = url or str(self.root)
        self.progress = progress
        self._staging = self.root / _STAGING
        self._made_dirs: set[Path] = set()

    def _path(self, key: str) -> Path:
        return self.root / key

    def _mkdir(self, path: Path) -> None:
        if path not in self._made_dirs:
            path.mkdir(parents=True, exist_ok=True)
            self._made_dirs.add(path)

    def _stage(self, write: Callable[[BinaryIO], None]) -> Path:
        self._mkdir(self._staging)
        tmp = self._staging / f"{os.getpid()}-{os.urandom(8).hex()}.tmp"
        try:
            with open(tmp, "xb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _publish(self, tmp: Path, key: str) -> None:
        final = self._path(key)
        try:
            self._mkdir(final.parent)
            try:
                os.link(tmp, final)
            except FileNotFoundError:
                # the directory was removed under us (gc); make it again once
                self._made_dirs.discard(final.parent)
                self._mkdir(final.parent)
                os.link(tmp, final)
        except FileExistsError:
            raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key)) from None
        finally:
            tmp.unlink(missing_ok=True)
        self._fsync_dir(final.parent)

    def _create(self, key: str, data: bytes) -> None:
        self._publish(self._stage(_writing(data)), key)

    def _put(self, key: str, data: bytes) -> None:
        tmp = self._stage(_writing(data))
        final = self._path(key)
        try:
            self._mkdir(final.parent)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)

    def _read(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFoundError(f"{self.url_for(key)} does not exist", url=self.url_for(key)) from None

    def _read_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                return os.pread(f.fileno(), end - start, start) if end > start else b""
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFoundError(f"{self.url_for(key)} does not exist", url=self.url_for(key)) from None

    def _exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _walk(self, prefix: str) -> Iterator[tuple[str, Path]]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(base):
            if not prefix and Path(dirpath) == self.root and _STAGING in dirnames:
                dirnames.remove(_STAGING)
            rel = os.path.relpath(dirpath, base)
            for name in filenames:
                yield (name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")), Path(dirpath) / name

    def _list(self, prefix: str) -> builtins.list[str]:
        return [key for key, _ in self._walk(prefix)]

    def _list_info(self, prefix: str) -> builtins.list[ObjectInfo]:
        out = []
        for key, path in self._walk(prefix):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # deleted while listing
            out.append(ObjectInfo(key, st.st_size, st.st_mtime, f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"))
        return out

    def _delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # drop folders left empty (an artifact's), never the root
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            self._made_dirs.discard(parent)
            parent = parent.parent

    def _upload(self, key: str, path: Path, progress: Progress) -> None:
        def copy(f: BinaryIO) -> None:
            with open(path, "rb") as src:
                _copy(src, f, progress=progress)

        self._publish(self._stage(copy), key)

    @contextmanager
    def _writer(self, key: str, progress: Progress) -> Iterator[BinaryIO]:
        self._mkdir(self._staging)
        tmp = self._staging / f"{os.getpid()}-{os.urandom(8).hex()}.tmp"
        try:
            with open(tmp, "xb") as f:
                yield _CountingFile(f, progress)  # type: ignore[misc]
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._publish(tmp, key)

    def _download(self, key: str, out: BinaryIO, progress: Progress) -> None:
        path = self._path(key)
        try:
            progress.total = path.stat().st_size
            with open(path, "rb") as src:
                _copy(src, out, progress=progress)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url_for(key)} does not exist", url=self.url_for(key)) from None

    def _incomplete_uploads(self) -> builtins.list[IncompleteUpload]:
        from launchhelm.storage._backends import IncompleteUpload

        found = []
        if self._staging.is_dir():
            for item in self._staging.iterdir():
                try:
                    started = item.stat().st_mtime
                except FileNotFoundError:
                    continue
                found.append(IncompleteUpload(f"{_STAGING}/{item.name}", started, item.name))
        return found

    def _abort_upload(self, upload: IncompleteUpload) -> None:
        (self._staging / Path(upload.upload_id).name).unlink(missing_ok=True)


class ObjectStore(Store):
    """Any other fsspec file system: S3, GCS, Azure, memory, ...

    ``create`` is one conditional request: S3 and Azure ``If-None-Match: *``,
    GCS ``ifGenerationMatch=0`` on a multipart upload. Large objects
    (``writer``, ``upload``) go in parts that stay invisible until committed
    with the same condition (see ``_backends.py``), and come back by ranged
    reads in parallel. Transient answers (S3 409 ConditionalRequestConflict,
    429, 5xx) are retried with backoff; an ambiguous retry (the first attempt
    may have landed) is settled by comparing the stored bytes with ours.
    """

    retries = 6

    def __init__(
        self, fs: AbstractFileSystem, root: str, url: str, protocol: str, progress: bool | None = None
    ) -> None:
        from launchhelm.storage._backends import kind_of, tune_client

        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self.protocol = protocol
        self.progress = progress
        self.atomic_create = protocol in _CONDITIONAL_PROTOCOLS
        _quiet_event_loop(getattr(fs, "loop", None))
        tune_client(fs, protocol)
        self._kind = kind_of(protocol)
        self._bucket_checked = False
        # s3fs sends a HEAD before every GET to decide on a concurrent ranged
        # read unless max_concurrency is 1: small objects need one GET, and
        # large ones come back through _download's own ranged reads
        self._cat_options: dict[str, Any] = {"max_concurrency": 1} if self._kind == "s3" else {}

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    # -- errors ----------------------------------------------------------
    def _error(self, problem: Problem, key: str | None, action: str) -> StorageError:
        """The one StorageError a user sees for a failed request."""
        where = self.url_for(key) if key else self.url
        kind = self._kind or ""
        # no answer at all (timed out, or every connection broke): the store is not answering
        silent = problem.kind == TRANSIENT and problem.status is None and problem.code is None
        if problem.kind == UNREACHABLE or silent:
            return self._unreachable(problem.detail)
        if problem.kind == DENIED:
            hint = _CREDENTIAL_HINTS.get(kind, "the credentials in storage_options")
            return StoreAccessDeniedError(
                f"{action} {where} was denied ({problem.detail}). Check the credentials ({hint}) and that "
                f"they allow reading, writing, listing and deleting under {self.url}.",
                url=where,
            )
        if problem.kind == NO_BUCKET:
            return self._no_bucket()
        if problem.kind == EXISTS:
            return AlreadyExistsError(f"{where} already exists", url=where)
        if problem.kind == MISSING:
            return ObjectNotFoundError(f"{where} does not exist", url=where)
        return StorageError(f"storage request for {where} failed: {problem.detail}", url=where)

    def _unreachable(self, detail: str) -> StoreUnreachableError:
        from launchhelm.storage._backends import endpoint_of

        endpoint = endpoint_of(self.fs, self.protocol) or "its default endpoint"
        hint = _ENDPOINT_HINTS.get(self._kind or "", "storage_options")
        return StoreUnreachableError(
            f"cannot reach the store {self.url} at {endpoint} ({detail}). Check the endpoint ({hint}), "
            "your network or proxy, and that the service is running.",
            url=self.url,
        )

    def _no_bucket(self) -> BucketNotFoundError:
        bucket = self.root.split("/", 1)[0]
        what = "container" if self._kind == "azure" else "bucket"
        return BucketNotFoundError(
            f"the {what} {bucket!r} of store {self.url} does not exist: create it first, or check the URL "
            "(and the account, project or region the credentials belong to).",
            url=self.url,
        )

    def _check_bucket(self) -> None:
        """Once per store: a miss on a bucket that does not exist is that, not a missing object."""
        if self._bucket_checked or self._kind is None:
            return
        from launchhelm.storage._backends import bucket_exists

        found = bucket_exists(self.fs, self.protocol, self.root)
        if found is False:
            raise self._no_bucket()
        self._bucket_checked = True

    def _retrying(self, op: Callable[[], T], key: str | None, action: str = "access to") -> T:
        """Run one request, retrying transient failures with backoff; raise a StorageError otherwise.

        A request that timed out is not tried again here: the client library
        already tried it, each time for the whole timeout (see ``_backends``).
        """
        delay = 0.05
        for attempt in range(self.retries):
            try:
                return op()
            except StorageError:
                raise
            except Exception as exc:
                problem = classify(exc)
                if problem.kind == TRANSIENT and attempt < self.retries - 1 and not no_answer(exc):
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                error = self._error(problem, key, action)
                if problem.kind == MISSING and action == "writing":
                    # a write never misses an object: is the bucket gone?
                    self._bucket_checked = False
                    self._check_bucket()
                raise error from exc
        raise AssertionError("unreachable")

    # -- small objects -------------------------------------------------------
    def _create(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if not self.atomic_create:
            # best effort for single-writer use; coordination is refused
            # elsewhere through require_coordination()
            if self.fs.exists(path):
                raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key))
            self._retrying(lambda: self.fs.pipe_file(path, data), key, "writing")
            return
        tries = [0]

        def attempt() -> None:
            tries[0] += 1
            try:
                if self._kind == "gcs":
                    from launchhelm.storage._backends import gcs_create

                    gcs_create(self.fs, path, data)
                else:
                    self.fs.pipe_file(path, data, mode="create")
            except Exception as exc:
                if classify(exc).kind != EXISTS:
                    raise
                if tries[0] > 1 and self._same_bytes(path, data):
                    return  # our earlier, ambiguous attempt landed
                raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key)) from None

        self._retrying(attempt, key, "writing")

    def _same_bytes(self, path: str, data: bytes) -> bool:
        try:
            return bool(self.fs.cat_file(path) == data)
        except Exception:
            return False

    def _put(self, key: str, data: bytes) -> None:
        self._retrying(lambda: self.fs.pipe_file(self._path(key), data), key, "writing")

    def _read(self, key: str) -> bytes:
        try:
            return bytes(self._retrying(lambda: self.fs.cat_file(self._path(key), **self._cat_options), key, "reading"))
        except ObjectNotFoundError:
            self._check_bucket()
            raise

    def _read_range(self, key: str, start: int, end: int) -> bytes:
        if end == start:
            return b""
        path = self._path(key)
        try:
            return bytes(self._retrying(lambda: self.fs.cat_file(path, start=start, end=end), key, "reading"))
        except ObjectNotFoundError:
            self._check_bucket()
            raise

    def _read_many(self, keys: builtins.list[str], limit: int) -> dict[str, bytes | None]:
        if self._kind is None or not getattr(self.fs, "async_impl", False) or len(keys) == 1:
            # other file systems (and wrappers such as dir::) may not have the coroutines: a thread pool
            return super()._read_many(keys, limit)
        import asyncio

        from fsspec.asyn import sync

        fs = self.fs

        async def gather() -> builtins.list[Any]:
            gate = asyncio.Semaphore(limit)

            async def one(path: str) -> Any:
                async with gate:
                    try:
                        return await fs._cat_file(path, **self._cat_options)
                    except Exception as exc:  # sorted out below, per key
                        return exc

            return await asyncio.gather(*(one(self._path(k)) for k in keys))

        try:
            answers = sync(fs.loop, gather)
        except Exception as exc:  # the loop itself failed: one clear error
            raise self._error(classify(exc), None, "reading") from exc
        out: dict[str, bytes | None] = {}
        missing = False
        for key, answer in zip(keys, answers, strict=True):
            if not isinstance(answer, BaseException):
                out[key] = bytes(answer)
                continue
            problem = classify(answer)
            if problem.kind == MISSING:
                out[key] = None
                missing = True
            elif problem.kind == TRANSIENT:
                try:  # the one-at-a-time path retries with backoff
                    out[key] = self._read(key)
                except ObjectNotFoundError:
                    out[key] = None
            else:
                raise self._error(problem, key, "reading") from answer
        if missing:
            self._check_bucket()  # a missing bucket is that, not missing objects
        return out

    def _exists(self, key: str) -> bool:
        found = bool(self._retrying(lambda: self.fs.isfile(self._path(key)), key, "reading"))
        if not found:
            self._check_bucket()
        return found

    def _list_info(self, prefix: str) -> builtins.list[ObjectInfo]:
        from launchhelm.storage._backends import to_epoch

        base = self._path(prefix) if prefix else self.root
        try:
            found = self._retrying(lambda: self.fs.find(base, detail=True), prefix or None, "listing")
        except ObjectNotFoundError:
            found = {}
        strip = self.fs._strip_protocol(base).rstrip("/")
        out = []
        for p, info in found.items():
            p = self.fs._strip_protocol(p)
            if not p.startswith(strip + "/") or info.get("type") == "directory":
                continue
            modified = None
            for field in ("LastModified", "last_modified", "updated", "mtime", "created"):
                modified = to_epoch(info.get(field))
                if modified is not None:
                    break
            size = int(info.get("size") or 0)
            version = next((str(info[f]) for f in _VERSION_FIELDS if info.get(f)), f"{modified}-{size}")
            out.append(ObjectInfo(p[len(strip) + 1 :], size, modified, version))
        if not out:
            self._check_bucket()
        return out

    def _delete(self, key: str) -> None:
        try:
            self._retrying(lambda: self.fs.rm_file(self._path(key)), key, "deleting")
        except ObjectNotFoundError:
            pass

    def _delete_many(self, keys: builtins.list[str]) -> None:
        if self._kind != "s3" or len(keys) == 1:
            # gcsfs and adlfs raise on a missing key inside a batch: one at a time keeps "absent is fine"
            super()._delete_many(keys)
            return
        paths = [self._path(k) for k in keys]
        for start in range(0, len(paths), 1000):  # DeleteObjects takes 1,000 keys
            batch = paths[start : start + 1000]
            self._retrying(lambda batch=batch: self.fs.rm(batch), None, "deleting")  # type: ignore[misc]

    # -- large objects -----------------------------------------------------------
    def _part_upload(self, key: str) -> Any:
        from launchhelm.storage._backends import part_upload_for

        return part_upload_for(self.fs, self.protocol, self._path(key))

    def _refuse_taken(self, key: str) -> None:
        # cheap early answer before streaming GBs; the commit checks it again, atomically
        path = self._path(key)

        def taken() -> bool:
            # not fs.isfile: s3fs's answers False on any error, so a store that does not answer
            # cost the whole timeout twice (here, then at the commit)
            try:
                return bool(self.fs.info(path).get("type") == "file")
            except FileNotFoundError:
                return False

        if self._retrying(taken, key, "reading"):
            raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key))

    @contextmanager
    def _streaming(self, key: str, progress: Progress) -> Iterator[Any]:
        from launchhelm.storage._transfer import PartWriter

        upload = self._part_upload(key)
        writer = PartWriter(upload, progress)
        try:
            yield writer
        except BaseException:
            writer.discard()  # abort the upload: nothing becomes visible
            raise
        try:
            writer.close()
        except Exception as exc:
            if isinstance(exc, StorageError):
                raise
            raise self._error(classify(exc), key, "writing") from exc

    @contextmanager
    def _writer(self, key: str, progress: Progress) -> Iterator[BinaryIO]:
        self._refuse_taken(key)
        if self._part_upload(key) is None:
            with self._fallback_writer(key, progress) as f:
                yield f
            return
        with self._streaming(key, progress) as f:
            yield f

    @contextmanager
    def _fallback_writer(self, key: str, progress: Progress) -> Iterator[BinaryIO]:
        path = self._path(key)
        f = self.fs.open(path, "wb", block_size=_BLOCK)
        try:
            yield _CountingFile(f, progress)  # type: ignore[misc]
        except BaseException:
            discard = getattr(f, "discard", None)
            if discard is not None:
                discard()
            else:
                f.close()
                self.fs.rm_file(path)
            raise
        f.close()

    def _upload(self, key: str, path: Path, progress: Progress) -> None:
        remote = self._path(key)
        if not self.atomic_create:
            if self.fs.exists(remote):
                raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key))
            self._retrying(lambda: self.fs.put_file(str(path), remote), key, "writing")
            return
        self._refuse_taken(key)
        if self._part_upload(key) is None:
            self._retrying(lambda: self.fs.put_file(str(path), remote, mode="create"), key, "writing")
            return
        with self._streaming(key, progress) as f, open(path, "rb") as src:
            while block := src.read(_BLOCK):
                f.write(block)

    def _download(self, key: str, out: BinaryIO, progress: Progress) -> None:
        from launchhelm.storage._transfer import download_parts

        path = self._path(key)
        try:
            info = self._retrying(lambda: self.fs.info(path), key, "reading")
        except ObjectNotFoundError:
            self._check_bucket()
            raise
        size = int(info.get("size") or 0)
        progress.total = size

        def fetch(start: int, end: int) -> bytes:
            return bytes(self.fs.cat_file(path, start=start, end=end))

        try:
            download_parts(fetch, size, out, progress)
        except StorageError:
            raise
        except Exception as exc:
            raise self._error(classify(exc), key, "reading") from exc

    # -- leftovers -----------------------------------------------------------------
    def _incomplete_uploads(self) -> builtins.list[IncompleteUpload]:
        from launchhelm.storage._backends import incomplete_uploads

        return self._retrying(lambda: incomplete_uploads(self.fs, self.protocol, self.root), None, "listing uploads in")

    def _abort_upload(self, upload: IncompleteUpload) -> None:
        from launchhelm.storage._backends import abort_incomplete

        self._retrying(
            lambda: abort_incomplete(self.fs, self.protocol, self.root, upload), upload.key, "aborting the upload of"
        )


class MemoryStore(ObjectStore):
    """fsspec's in-process ``memory://`` file system, for tests and notebooks.

    Shared by every store in the process with the same URL, gone when the
    process ends. ``create`` is made atomic with a process-wide lock.
    """

    _lock = threading.Lock()

    def __init__(self, fs: AbstractFileSystem, root: str, url: str, progress: bool | None = None) -> None:
        super().__init__(fs, root, url, "memory", progress)
        self.atomic_create = True

    def _create(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._lock:
            if self.fs.isfile(path):
                raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key))
            self.fs.pipe_file(path, data)

    def _put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.fs.pipe_file(self._path(key), data)

    @contextmanager
    def _writer(self, key: str, progress: Progress) -> Iterator[BinaryIO]:
        import io

        buffer = io.BytesIO()  # memory:// holds the object in memory anyway
        yield _CountingFile(buffer, progress)  # type: ignore[misc]
        self._create(key, buffer.getvalue())

    def _upload(self, key: str, path: Path, progress: Progress) -> None:
        remote = self._path(key)
        with self._lock:
            if self.fs.isfile(remote):
                raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key))
            self.fs.put_file(str(path), remote)
        progress.update(path.stat().st_size)

    def _download(self, key: str, out: BinaryIO, progress: Progress) -> None:
        try:
            with self.fs.open(self._path(key), "rb") as src:
                _copy(src, out, progress=progress)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url_for(key)} does not exist", url=self.url_for(key)) from None


def default_store_url() -> str:
    """``$LAUNCHHELM_STORE`` if set, else ``~/.launchhelm``."""
    return os.environ.get("LAUNCHHELM_STORE") or str(Path("~/.launchhelm").expanduser())


def _connect_timeout() -> float:
    from launchhelm.storage._backends import connect_timeout

    return connect_timeout()


def _with_defaults(kind: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """Bounded timeouts and retries for each cloud, unless the caller chose their own."""
    from launchhelm.storage._backends import client_options

    return client_options(kind, options)


_reachable: set[tuple[str, int]] = set()
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _probe(store: ObjectStore) -> None:
    """Refuse at once a store whose endpoint takes no TCP connection.

    Client libraries retry a refused connection for a long time (gcsfs about
    35 s, azure-core about 85 s, measured), which looks like a hang. One TCP
    connect with a short timeout (no request, nothing billed) tells the
    truth in milliseconds; it is skipped behind an HTTP proxy, and done once
    per endpoint and process.
    """
    from launchhelm.storage._backends import endpoint_of

    if store._kind is None or any(os.environ.get(v) for v in _PROXY_VARIABLES):
        return
    endpoint = endpoint_of(store.fs, store.protocol)
    if not endpoint:
        return
    parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    host = parts.hostname
    if not host:
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return
    if (host, port) in _reachable:
        return
    try:
        socket.create_connection((host, port), timeout=_connect_timeout()).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, socket.timeout):
            reason = f"no answer within {_connect_timeout():g}s"
        raise store._unreachable(f"{host}:{port}: {reason}") from exc
    _reachable.add((host, port))


def open_store(
    url: str | os.PathLike[str] | Store | None = None,
    storage_options: dict[str, Any] | None = None,
    *,
    progress: bool | None = None,
) -> Store:
    """Open the store at ``url`` (see :func:`default_store_url` for ``None``).

    Parameters
    ----------
    url:
        A local path, ``file://``, ``memory://``, ``s3://bucket/prefix``,
        ``gs://bucket/prefix``, ``az://container/prefix`` or any fsspec URL;
        or a :class:`Store`, returned as is.
    storage_options:
        Passed to the fsspec file system (credentials, ``endpoint_url``...).
        Without them each cloud's usual environment variables apply:
        ``AWS_*``; ``GOOGLE_APPLICATION_CREDENTIALS`` (and
        ``STORAGE_EMULATOR_HOST``); ``AZURE_STORAGE_CONNECTION_STRING`` or
        ``AZURE_STORAGE_ACCOUNT_NAME`` + ``AZURE_STORAGE_ACCOUNT_KEY``.
    progress:
        Progress bars for large uploads and downloads: None (default) past
        256 MB unless ``LAUNCHHELM_PROGRESS=0``; True always; False never.

    Raises
    ------
    StoreUnreachableError
        The endpoint takes no connection (checked once, in milliseconds).
    InvalidTypeError, InvalidArgumentError
        ``url`` is not a path or URL, or is empty.

    Examples
    --------
    >>> store = open_store("memory://demo")
    >>> store.create("hello.txt", b"hi")
    >>> store.read("hello.txt")
    b'hi'
    """
    if isinstance(url, Store):
        return url
    if url is not None and not isinstance(url, (str, os.PathLike)):
        raise InvalidTypeError(
            f"store={url!r} is a {type(url).__name__}: give a path or URL such as ~/.launchhelm or s3://bucket/prefix"
        )
    text = os.fspath(url) if url is not None else default_store_url()
    if not text:
        raise InvalidArgumentError("empty store URL: pass a path or URL such as ~/.launchhelm or s3://bucket/prefix")
    if "://" not in text or text.startswith("file://") or text.startswith("local://"):
        local = text.split("://", 1)[1] if "://" in text else text
        return LocalStore(local, url=text, progress=progress)
    import sys

    from launchhelm.storage._backends import kind_of

    protocol = text.split("://", 1)[0]
    kind = kind_of(protocol)
    options = dict(storage_options or {})
    if (
        kind == "gcs"
        and "gcsfs" not in sys.modules
        and (os.environ.get("STORAGE_EMULATOR_HOST") or options.get("endpoint_url"))
    ):
        # gcsfs's zonal-bucket extension asks a control API that emulators lack
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import fsspec

    try:
        options = _with_defaults(kind, options)
        fs, root = fsspec.core.url_to_fs(text, **options)
    except ImportError as exc:
        extra = {"s3": "s3", "gcs": "gcs", "azure": "azure"}.get(kind or "", "")
        how = f" (pip install 'launchhelm[{extra}]')" if extra else ""
        raise StorageError(
            f"cannot open store {text}: {exc}. Install the fsspec backend for {protocol}://{how}.",
            url=text,
        ) from exc
    except ValueError as exc:
        raise StorageError(f"cannot open store {text}: {exc}", url=text) from exc
    if protocol == "memory":
        return MemoryStore(fs, root, text, progress)
    if kind == "azure":
        _shorten_azure_backoff(fs)
        _quiet_azure_request_log()
    store = ObjectStore(fs, root, text, protocol, progress)
    _probe(store)
    return store


#: azure-core logs every HTTP request and response at INFO: with heartbeats, metrics and
#: control polling, a script that turns on INFO logging would print a dozen lines a second.
_AZURE_REQUEST_LOGGER = "azure.core.pipeline.policies.http_logging_policy"


def _quiet_azure_request_log() -> None:
    """Raise azure-core's per-request logger to WARNING, unless the user set its level already."""
    import logging

    logger = logging.getLogger(_AZURE_REQUEST_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


def _shorten_azure_backoff(fs: Any) -> None:
    """azure-storage-blob waits 15 s, 18 s, 24 s between its 3 retries (85 s for a dead endpoint,
    measured); adlfs cannot pass a retry policy, so shorten the one its client holds: 0.5, 2.5, 4.5 s."""
    policy = getattr(getattr(getattr(fs, "service_client", None), "_config", None), "retry_policy", None)
    if policy is not None and hasattr(policy, "initial_backoff") and hasattr(policy, "increment_base"):
        policy.initial_backoff = 0.5
        policy.increment_base = 2
