"""A store on a local POSIX directory: atomic create by link from a staging file."""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from launchhelm._exceptions import (
    AlreadyExistsError,
    ObjectNotFoundError,
)
from launchhelm.storage._progress import Progress
from launchhelm.storage._store import _STAGING, ObjectInfo, Store, _copy, _CountingFile, _writing

if TYPE_CHECKING:
    from launchhelm.storage._backends import IncompleteUpload


__all__ = ["LocalStore"]


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

    def _upload(self, key: str, path: Path, progress: Progress, max_concurrency: int | None = None) -> None:
        def copy(f: BinaryIO) -> None:
            with open(path, "rb") as src:
                _copy(src, f, progress=progress)

        self._publish(self._stage(copy), key)

    @contextmanager
    def _writer(self, key: str, progress: Progress, size: int | None = None) -> Iterator[BinaryIO]:
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
