"""Stores on fsspec object stores (S3, GCS, Azure, memory): one conditional request per create."""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar, cast

from launchhelm._exceptions import (
    AlreadyExistsError,
    BucketNotFoundError,
    ObjectNotFoundError,
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
from launchhelm.storage._progress import Progress
from launchhelm.storage._retry import Backoff, retry
from launchhelm.storage._store import (
    _BLOCK,
    _CONDITIONAL_PROTOCOLS,
    _CREDENTIAL_HINTS,
    _ENDPOINT_HINTS,
    _VERSION_FIELDS,
    ObjectInfo,
    Store,
    _copy,
    _CountingFile,
)

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from launchhelm.storage._backends import IncompleteUpload
    from launchhelm.storage._transfer import PartUpload


__all__ = ["MemoryStore", "ObjectStore"]

_log = logging.getLogger("launchhelm")
T = TypeVar("T")


_quieted_loops: set[int] = set()


def _quiet_event_loop(loop: object) -> None:
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

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        module = type(exc).__module__.split(".")[0] if exc is not None else ""
        if exc is not None and (isinstance(exc, OSError) or module in ("aiohttp", "aiobotocore", "botocore")):
            _log.debug("store client: %s: %r", context.get("message"), exc)
            return
        loop.default_exception_handler(context)

    loop.call_soon_threadsafe(loop.set_exception_handler, handler)


def _request_retryable(exc: Exception) -> bool:
    return not isinstance(exc, StorageError) and classify(exc).kind == TRANSIENT and not no_answer(exc)


class ObjectStore(Store):
    """Every other fsspec file system: S3, GCS, Azure, memory, ...

    ``create`` is one conditional request: S3 and Azure ``If-None-Match: *``,
    GCS ``ifGenerationMatch=0`` on a multipart upload. Large objects
    (``writer``, ``upload``) go in parts that stay invisible until committed
    with the same condition (see ``_backends.py``), and come back by ranged
    reads in parallel. Transient answers (S3 409 ConditionalRequestConflict,
    429, 5xx) are retried with backoff; an ambiguous retry (the first attempt
    may have landed) is settled by comparing the stored bytes with ours.
    """

    #: Attempts per request; the waits between them start at 0.05 s and double, at most 1 s each, jittered.
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
        self._cat_options: dict[str, object] = {"max_concurrency": 1} if self._kind == "s3" else {}

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
        try:
            return retry(op, Backoff(self.retries, first=0.05, cap=1.0), _request_retryable)
        except StorageError:
            raise
        except Exception as exc:
            problem = classify(exc)
            error = self._error(problem, key, action)
            if problem.kind == MISSING and action == "writing":
                # a write never misses an object: is the bucket gone?
                self._bucket_checked = False
                self._check_bucket()
            raise error from exc

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

        async def gather() -> builtins.list[object]:
            gate = asyncio.Semaphore(limit)

            async def one(path: str) -> object:
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

        def find() -> dict[str, dict[str, Any]]:
            if prefix and self.protocol in ("s3", "s3a"):
                # one listing: asked for "<base>" alone, s3fs follows an empty answer with a HEAD and a
                # second listing (is it a file? a folder?); asked for "<parent>" with the prefix "<leaf>/",
                # it lists only. An empty prefix is the common answer (no rule set, no evaluation yet).
                parent, _, leaf = base.rpartition("/")
                return cast("dict[str, dict[str, Any]]", self.fs.find(parent, detail=True, prefix=leaf + "/"))
            return cast("dict[str, dict[str, Any]]", self.fs.find(base, detail=True))

        try:
            found = self._retrying(find, prefix or None, "listing")
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
    def _part_upload(self, key: str) -> PartUpload | None:
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
    def _streaming(
        self, key: str, progress: Progress, max_concurrency: int | None = None, size: int | None = None
    ) -> Iterator[BinaryIO]:
        from launchhelm.storage._transfer import PartWriter

        upload = self._part_upload(key)
        if upload is None:  # callers stream only where _part_upload has one
            raise AssertionError(f"{self.protocol} stores take no part uploads")
        writer = PartWriter(upload, progress, max_concurrency, size)
        try:
            yield cast(BinaryIO, writer)  # a write-only binary file: all a writer's caller uses
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
    def _writer(self, key: str, progress: Progress, size: int | None = None) -> Iterator[BinaryIO]:
        upload = self._part_upload(key)
        if not (upload is not None and size is not None and size <= upload.whole_bytes):
            # an object sent whole is its own check (one conditional PUT): asking first would cost a
            # sharded save two round trips per rank (s3fs's info: a HEAD, then a listing) for nothing
            self._refuse_taken(key)
        if upload is None:
            with self._fallback_writer(key, progress) as f:
                yield f
            return
        with self._streaming(key, progress, size=size) as f:
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

    def _upload(self, key: str, path: Path, progress: Progress, max_concurrency: int | None = None) -> None:
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
        with self._streaming(key, progress, max_concurrency) as f, open(path, "rb") as src:
            _copy(src, f)  # through one reused block, not a new 8 MiB bytes each time

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
    def _writer(self, key: str, progress: Progress, size: int | None = None) -> Iterator[BinaryIO]:
        import io

        buffer = io.BytesIO()  # memory:// holds the object in memory anyway
        yield _CountingFile(buffer, progress)  # type: ignore[misc]
        self._create(key, buffer.getvalue())

    def _upload(self, key: str, path: Path, progress: Progress, max_concurrency: int | None = None) -> None:
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
