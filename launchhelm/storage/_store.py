"""The store: every byte LaunchHelm keeps goes through this small surface.

All coordination between processes (event logs, resume, evaluation leases)
rests on one primitive, :meth:`Store.create`: put-if-absent, all-or-nothing.
Each backend gives it with the storage's own atomic operation, because
fsspec's generic fallbacks are not atomic (measured: ``pipe_file(mode="create")``
on the local file system lets two writers win).

Keys are ``/``-separated paths relative to the store's root URL.
"""

from __future__ import annotations

import builtins
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from launchhelm._exceptions import (
    AlreadyExistsError,
    CoordinationUnsupportedError,
    ObjectNotFoundError,
    StorageError,
)

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = ["LocalStore", "MemoryStore", "ObjectStore", "Store", "open_store"]

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

#: Transient answers of object stores that mean "try again": S3 409
#: ConditionalRequestConflict (a concurrent conditional write in flight) and
#: 503 SlowDown.
_TRANSIENT_MARKERS = (
    "ConditionalRequestConflict",
    "SlowDown",
    "ServiceUnavailable",
    "503",
    "409",
)

_STAGING = ".staging"


def _copy(src: BinaryIO, dst: BinaryIO, block: int = 8 * 2**20) -> None:
    """Stream ``src`` to ``dst`` in blocks (never the whole file in memory)."""
    while chunk := src.read(block):
        dst.write(chunk)


def _writing(data: bytes) -> Callable[[BinaryIO], None]:
    def write(f: BinaryIO) -> None:
        f.write(data)

    return write


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key or key.startswith("/") or key.endswith("/"):
        raise ValueError(f"invalid store key {key!r}: use a relative path like 'runs/abc/run.json'")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid store key {key!r}: empty, '.' or '..' segments are not allowed")
    return key


def _check_prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    if prefix:
        _check_key(prefix)
    return prefix


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
    """

    url: str
    protocol: str
    atomic_create: bool = True

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

    def exists(self, key: str) -> bool:
        """Whether an object is stored at ``key``."""
        return self._exists(_check_key(key))

    def list(self, prefix: str) -> list[str]:
        """Keys of every object under ``prefix``, relative to it, sorted.

        Recursive: ``list("runs/abc")`` may return ``["events/00..1.json",
        "run.json"]``. An absent prefix lists as empty.
        """
        return sorted(self._list(_check_prefix(prefix)))

    def delete(self, key: str) -> None:
        """Delete the object at ``key`` (garbage collection only); absent is fine."""
        self._delete(_check_key(key))

    def upload(self, key: str, local_path: str | os.PathLike[str]) -> None:
        """Stream a local file to ``key``, put-if-absent, never partly visible.

        Raises
        ------
        AlreadyExistsError
            ``key`` is taken; nothing was changed.
        """
        path = Path(local_path)
        if not path.is_file():
            raise FileNotFoundError(f"cannot upload {str(path)!r}: no such file")
        self._upload(_check_key(key), path)

    @contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        """Stream bytes to a new object at ``key``; it appears only if the block succeeds.

        For large artifacts written on the fly (``torch.save`` straight into
        the store): nothing is held whole in memory, a failure or crash
        inside the block leaves no object at ``key``, and ``key`` must be
        new (use unique keys: on object stores this is checked, not raced).

        Examples
        --------
        >>> with store.writer("artifacts/a1/model.pt") as f:   # doctest: +SKIP
        ...     torch.save(state, f)
        """
        _check_key(key)
        with self._writer(key) as f:
            yield f

    def download(self, key: str, local_path: str | os.PathLike[str]) -> Path:
        """Stream the object at ``key`` to a local file and return its path.

        The file appears under its final name only once complete.
        """
        target = Path(local_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.part")
        try:
            with open(tmp, "wb") as out:
                self._download(_check_key(key), out)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()
        return target

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

    # -- hooks ----------------------------------------------------------
    def _create(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def _read(self, key: str) -> bytes:
        raise NotImplementedError

    def _exists(self, key: str) -> bool:
        raise NotImplementedError

    def _list(self, prefix: str) -> builtins.list[str]:
        raise NotImplementedError

    def _delete(self, key: str) -> None:
        raise NotImplementedError

    def _upload(self, key: str, path: Path) -> None:
        raise NotImplementedError

    def _download(self, key: str, out: BinaryIO) -> None:
        raise NotImplementedError

    def _writer(self, key: str) -> Any:
        raise NotImplementedError


class LocalStore(Store):
    """A directory on a POSIX file system (the embedded default store).

    ``create`` writes a temporary file in ``<root>/.staging`` (the same file
    system), fsyncs it, then ``os.link``\\ s it to the final name, which fails
    if the name is taken, and fsyncs the directory. Readers therefore only
    ever see complete files, and exactly one of several racing writers wins.
    """

    protocol = "file"

    def __init__(self, root: str | os.PathLike[str], url: str | None = None) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = url or str(self.root)
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

    def _exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _list(self, prefix: str) -> builtins.list[str]:
        base = self._path(prefix) if prefix else self.root
        out: builtins.list[str] = []
        if not base.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(base):
            if not prefix and Path(dirpath) == self.root and _STAGING in dirnames:
                dirnames.remove(_STAGING)
            rel = os.path.relpath(dirpath, base)
            for name in filenames:
                out.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
        return out

    def _delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def _upload(self, key: str, path: Path) -> None:
        def copy(f: BinaryIO) -> None:
            with open(path, "rb") as src:
                _copy(src, f)

        self._publish(self._stage(copy), key)

    @contextmanager
    def _writer(self, key: str) -> Iterator[BinaryIO]:
        self._mkdir(self._staging)
        tmp = self._staging / f"{os.getpid()}-{os.urandom(8).hex()}.tmp"
        try:
            with open(tmp, "xb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._publish(tmp, key)

    def _download(self, key: str, out: BinaryIO) -> None:
        try:
            with open(self._path(key), "rb") as src:
                _copy(src, out)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url_for(key)} does not exist", url=self.url_for(key)) from None


class ObjectStore(Store):
    """Any other fsspec file system: S3, GCS, Azure, memory, ...

    ``create`` is ``pipe_file(mode="create")``, which s3fs, gcsfs and adlfs
    send as a conditional request (S3 ``If-None-Match: *``, GCS
    ``ifGenerationMatch=0``). Transient conflicts (S3 409, 503) are retried;
    an ambiguous retry (the first attempt may have landed) is settled by
    comparing the stored bytes with ours.
    """

    retries = 6

    def __init__(self, fs: AbstractFileSystem, root: str, url: str, protocol: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self.protocol = protocol
        self.atomic_create = protocol in _CONDITIONAL_PROTOCOLS

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _retrying(self, op: Callable[[], T], key: str) -> T:
        delay = 0.05
        for attempt in range(self.retries):
            try:
                return op()
            except (FileExistsError, FileNotFoundError, PermissionError):
                raise
            except OSError as exc:
                text = f"{exc} {getattr(exc, 'errno', '')}"
                transient = exc.errno == errno.EBUSY or any(m in text for m in _TRANSIENT_MARKERS)
                if not transient or attempt == self.retries - 1:
                    raise StorageError(
                        f"storage request for {self.url_for(key)} failed: {exc}",
                        url=self.url_for(key),
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def _create(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if not self.atomic_create:
            # best effort for single-writer use; coordination is refused
            # elsewhere through require_coordination()
            if self.fs.exists(path):
                raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key))
            self.fs.pipe_file(path, data)
            return
        tries = [0]

        def attempt() -> None:
            tries[0] += 1
            try:
                self.fs.pipe_file(path, data, mode="create")
            except FileExistsError:
                if tries[0] > 1 and self._same_bytes(path, data):
                    return  # our earlier, ambiguous attempt landed
                raise
            except OSError as exc:
                if "Precondition" in str(exc):
                    raise FileExistsError(str(exc)) from exc
                raise

        try:
            self._retrying(attempt, key)
        except FileExistsError:
            raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key)) from None

    def _same_bytes(self, path: str, data: bytes) -> bool:
        try:
            return bool(self.fs.cat_file(path) == data)
        except OSError:
            return False

    def _put(self, key: str, data: bytes) -> None:
        self._retrying(lambda: self.fs.pipe_file(self._path(key), data), key)

    def _read(self, key: str) -> bytes:
        try:
            return bytes(self._retrying(lambda: self.fs.cat_file(self._path(key)), key))
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url_for(key)} does not exist", url=self.url_for(key)) from None

    def _exists(self, key: str) -> bool:
        return bool(self._retrying(lambda: self.fs.isfile(self._path(key)), key))

    def _list(self, prefix: str) -> builtins.list[str]:
        base = self._path(prefix) if prefix else self.root
        try:
            found = self._retrying(lambda: self.fs.find(base), prefix or "/")
        except FileNotFoundError:
            return []
        strip = self.fs._strip_protocol(base).rstrip("/")
        out = []
        for p in found:
            p = self.fs._strip_protocol(p)
            if p.startswith(strip + "/"):
                out.append(p[len(strip) + 1 :])
        return out

    def _delete(self, key: str) -> None:
        try:
            self._retrying(lambda: self.fs.rm_file(self._path(key)), key)
        except FileNotFoundError:
            pass

    def _upload(self, key: str, path: Path) -> None:
        remote = self._path(key)
        if not self.atomic_create:
            if self.fs.exists(remote):
                raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key))
            self.fs.put_file(str(path), remote)
            return
        try:
            self._retrying(lambda: self.fs.put_file(str(path), remote, mode="create"), key)
        except FileExistsError:
            raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key)) from None

    @contextmanager
    def _writer(self, key: str) -> Iterator[BinaryIO]:
        path = self._path(key)
        if self._retrying(lambda: self.fs.exists(path), key):
            raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key))
        # "wb", not "xb": s3fs leaks the multipart upload of a lost "xb" race;
        # keys written here are unique, so there is no race to lose
        # 8 MiB parts: s3fs's default 50 MiB blocks held ~240 MB of RSS while
        # streaming a checkpoint, at no gain in speed (measured against moto)
        f = self.fs.open(path, "wb", block_size=8 * 2**20)
        try:
            yield f
        except BaseException:
            discard = getattr(f, "discard", None)
            if discard is not None:
                discard()  # abort the multipart upload: nothing becomes visible
            else:
                f.close()
                self.fs.rm_file(path)
            raise
        f.close()

    def _download(self, key: str, out: BinaryIO) -> None:
        try:
            with self.fs.open(self._path(key), "rb") as src:
                _copy(src, out)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.url_for(key)} does not exist", url=self.url_for(key)) from None


class MemoryStore(ObjectStore):
    """fsspec's in-process ``memory://`` file system, for tests and notebooks.

    Shared by every store in the process with the same URL, gone when the
    process ends. ``create`` is made atomic with a process-wide lock.
    """

    _lock = threading.Lock()

    def __init__(self, fs: AbstractFileSystem, root: str, url: str) -> None:
        super().__init__(fs, root, url, "memory")
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
    def _writer(self, key: str) -> Iterator[BinaryIO]:
        import io

        buffer = io.BytesIO()  # memory:// holds the object in memory anyway
        yield buffer
        self._create(key, buffer.getvalue())

    def _upload(self, key: str, path: Path) -> None:
        remote = self._path(key)
        with self._lock:
            if self.fs.isfile(remote):
                raise AlreadyExistsError(f"{self.url_for(key)} already exists", url=self.url_for(key))
            self.fs.put_file(str(path), remote)


def default_store_url() -> str:
    """``$LAUNCHHELM_STORE`` if set, else ``~/.launchhelm``."""
    return os.environ.get("LAUNCHHELM_STORE") or str(Path("~/.launchhelm").expanduser())


def open_store(
    url: str | os.PathLike[str] | Store | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Store:
    """Open the store at ``url`` (see :func:`default_store_url` for ``None``).

    Parameters
    ----------
    url:
        A local path, ``file://``, ``memory://``, ``s3://bucket/prefix``,
        ``gs://``, ``az://`` or any fsspec URL; or a :class:`Store`, returned
        as is.
    storage_options:
        Passed to the fsspec file system (credentials, ``endpoint_url``...).

    Examples
    --------
    >>> store = open_store("memory://demo")
    >>> store.create("hello.txt", b"hi")
    >>> store.read("hello.txt")
    b'hi'
    """
    if isinstance(url, Store):
        return url
    text = os.fspath(url) if url is not None else default_store_url()
    if not text:
        raise ValueError("empty store URL: pass a path or URL such as ~/.launchhelm or s3://bucket/prefix")
    if "://" not in text or text.startswith("file://") or text.startswith("local://"):
        local = text.split("://", 1)[1] if "://" in text else text
        return LocalStore(local, url=text)
    import fsspec

    options = dict(storage_options or {})
    protocol = text.split("://", 1)[0]
    if protocol in ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"):
        # listing caches hide objects other processes just wrote
        options.setdefault("use_listings_cache", False)
    try:
        fs, root = fsspec.core.url_to_fs(text, **options)
    except ImportError as exc:
        raise StorageError(
            f"cannot open store {text}: {exc}. Install the fsspec backend for "
            f"{protocol}:// (for S3: pip install 'launchhelm[s3]').",
            url=text,
        ) from exc
    except ValueError as exc:
        raise StorageError(f"cannot open store {text}: {exc}", url=text) from exc
    if protocol == "memory":
        return MemoryStore(fs, root, text)
    return ObjectStore(fs, root, text, protocol)
