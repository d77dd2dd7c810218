"""The checkpoint registry: opaque payload files plus a ``checkpoint`` event.

A checkpoint exists only once its event does. The payload is uploaded first
under a fresh, unique key (invisible to readers until complete), its size and
whole-file CRC64NVME are recorded (see ``launchhelm.storage._checksum``), and only
then is the event appended. A crash mid-upload
leaves an orphan for garbage collection, never a half checkpoint. The core
does not know what is inside a payload; ``launchhelm.torch`` does.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from launchhelm._exceptions import InvalidArgumentError, PathNotFoundError
from launchhelm._runlog._events import RunState
from launchhelm._runlog._records import CheckpointEvent
from launchhelm._types import Checkpoint
from launchhelm.storage import Store
from launchhelm.storage._checksum import CRC32C, CRC64NVME, SHA256, Checksum, file_checksums, recorded
from launchhelm.storage._keys import artifact_prefix

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "ChecksumWriter",
    "artifact_prefix",
    "checkpoint_record",
    "checksum_algorithms",
    "new_artifact_id",
    "sha256_file",
    "upload_path",
]

FILE_FORMAT = "file"
DIRECTORY_FORMAT = "directory"


def new_artifact_id(step: int) -> str:
    """A unique, sortable-by-step artifact id such as ``ckpt-00000064-3fa2b1c9``."""
    return f"ckpt-{step:08d}-{os.urandom(4).hex()}"


_SyncFileRange = Callable[[int, int, int, int], int]


def _sync_file_range() -> _SyncFileRange | None:
    """libc's ``sync_file_range`` (Linux), or None: Python's ``os`` has no binding for it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range  # a CDLL call releases the GIL
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int
    return cast("_SyncFileRange", func)


_SYNC_FILE_RANGE_WRITE = 2  # start writing the range's dirty pages out; do not wait for them
_sync_range: _SyncFileRange | None = None
_sync_range_looked_up = False


def _file_descriptor(raw: object) -> int | None:
    """The OS file under ``raw`` (a local store's file, through its wrappers), or None (an upload)."""
    for _ in range(4):
        fileno = getattr(raw, "fileno", None)
        if callable(fileno):
            try:
                return int(fileno())
            except (OSError, ValueError, io.UnsupportedOperation):
                return None
        raw = getattr(raw, "raw", None)
        if raw is None:
            return None
    return None


class _Writeback:
    """Starts the disk writing a local file's bytes while later bytes are still being written.

    Left alone, Linux writes a new file's dirty pages out only at the final
    fsync (a 1 GB file stays far below ``dirty_background_ratio``), so a
    write+fsync costs the copy into the page cache plus the whole write-out,
    one after the other. Every :data:`WINDOW` bytes this asks the kernel to
    start writing the window just completed (``sync_file_range`` with
    ``SYNC_FILE_RANGE_WRITE``, what RocksDB's ``bytes_per_sync`` does), so
    the write-out overlaps the copy and the fsync finds little left to do.
    Durability is unchanged: the store's fsync still decides it. Off Linux,
    or when the call fails, nothing happens.
    """

    WINDOW = 32 * 2**20

    def __init__(self, raw: BinaryIO) -> None:
        global _sync_range, _sync_range_looked_up
        if not _sync_range_looked_up:
            _sync_range, _sync_range_looked_up = _sync_file_range(), True
        self._raw = raw
        self._fd = _file_descriptor(raw) if _sync_range is not None else None
        self._start = 0  # the first byte not yet handed to the kernel's write-out

    @property
    def active(self) -> bool:
        return self._fd is not None

    def wrote(self, end: int) -> None:
        """``end`` bytes of the file have been written (some may still sit in a user-space buffer)."""
        sync = _sync_range
        if self._fd is None or sync is None or end - self._start < self.WINDOW:
            return
        self._raw.flush()  # the bytes up to `end` must be the kernel's before it can write them out
        if sync(self._fd, self._start, end - self._start, _SYNC_FILE_RANGE_WRITE) != 0:
            self._fd = None  # e.g. a file system that refuses it: the fsync does all the work, as before
            return
        self._start = end


_crc_pool: tuple[int, ThreadPoolExecutor] | None = None
_crc_pool_lock = threading.Lock()


def _crc_thread() -> ThreadPoolExecutor:
    """The one thread that checksums large writes, started once per process (not once per save)."""
    global _crc_pool
    with _crc_pool_lock:
        if _crc_pool is None or _crc_pool[0] != os.getpid():  # a forked child cannot use its parent's
            _crc_pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="launchhelm-crc"))
        return _crc_pool[1]


class ChecksumWriter:
    """A write-only file that checksums and counts what passes through it.

    The CRCs cover the bytes as they are written, never in a second pass.
    For a large buffer they run on a second thread while this thread writes
    the same buffer out (awscrt and file writes both release the GIL), and
    ``write`` returns once both are done: the buffer may be a view that
    ``torch.save`` reuses after the call, so it is never kept beyond it. At
    26 GB/s the CRC alone would add a few percent to a disk-speed save; this
    way it adds nothing. On a local file the disk starts writing each 32 MiB
    as soon as it is written (:class:`_Writeback`), so the final fsync does
    not wait for the whole file.
    """

    _MIN_THREADED = 1 << 20

    def __init__(self, raw: BinaryIO, algorithms: tuple[str, ...] = (CRC64NVME,)) -> None:
        self.raw = raw
        self.checksum = Checksum(algorithms)
        self._writeback = _Writeback(raw)
        self._written = 0

    @property
    def size(self) -> int:
        return self.checksum.size

    def _write_all(self, view: memoryview) -> None:
        if not self._writeback.active:
            self.raw.write(view)
            self._written += len(view)
            return
        step = _Writeback.WINDOW
        for start in range(0, len(view), step):
            piece = view[start : start + step]
            self.raw.write(piece)
            self._written += len(piece)
            self._writeback.wrote(self._written)

    def write(self, data: Buffer) -> int:
        view = memoryview(data).cast("B")
        if len(view) < self._MIN_THREADED:
            self.checksum.update(view)
            self._write_all(view)
            return len(view)
        pending = _crc_thread().submit(self.checksum.update, view)
        try:
            self._write_all(view)
        finally:
            pending.result()  # in order, and the view is not used after this call returns
        return len(view)

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        """Nothing left to do: every write waited for its checksum (kept for callers that close)."""


def checksum_algorithms(store: object) -> tuple[str, ...]:
    """What a new checkpoint on ``store`` records: CRC64NVME, plus CRC32C on GCS (what GCS stores)."""
    from launchhelm.storage._backends import GCS, kind_of

    return (CRC64NVME, CRC32C) if kind_of(str(getattr(store, "protocol", ""))) == GCS else (CRC64NVME,)


def sha256_file(path: Path) -> str:
    """The sha256 of a file (what checkpoints recorded before CRC64NVME)."""
    return file_checksums(path, (SHA256,))[SHA256]


def upload_path(store: Store, prefix: str, path: Path) -> tuple[str, list[dict[str, Any]], dict[str, str], int]:
    """Upload a file or a folder under ``prefix``: (format, files, checksums, size).

    ``checksums`` are the file's (``{"crc64nvme": hex}``, plus ``crc32c`` on
    GCS), or for a folder those of its manifest (each file's relative name,
    size and CRC64NVME, sorted).
    """
    algorithms = checksum_algorithms(store)
    if path.is_file():
        sums = file_checksums(path, algorithms)
        store.upload(f"{prefix}/{path.name}", path)
        size = path.stat().st_size
        return FILE_FORMAT, [{"name": path.name, "size": size, **sums}], sums, size
    if not path.is_dir():
        raise PathNotFoundError(f"cannot checkpoint {str(path)!r}: no such file or folder", path=str(path))
    files: list[dict[str, Any]] = []
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = item.relative_to(path).as_posix()
        sums = file_checksums(item, algorithms)
        store.upload(f"{prefix}/{rel}", item)
        files.append({"name": rel, "size": item.stat().st_size, **sums})
    if not files:
        raise InvalidArgumentError(f"cannot checkpoint {str(path)!r}: the folder is empty")
    manifest = Checksum(algorithms)
    manifest.update("\n".join(f"{f['name']}\t{f['size']}\t{f[CRC64NVME]}" for f in files).encode())
    return DIRECTORY_FORMAT, files, manifest.hexdigests(), sum(f["size"] for f in files)


def checkpoint_record(run_id: str, state: RunState, stored: Mapping[str, object], reached: int) -> Checkpoint:
    """The public view of a ``checkpoint`` event."""
    event = cast("CheckpointEvent", stored)
    step = int(event["step"])
    return Checkpoint(
        id=event["checkpoint"],
        run_id=run_id,
        step=step,
        saved_at=float(event["time"]),
        size=int(event["size"]),
        sha256=str(event.get("sha256") or ""),
        format=str(event["format"]),
        steps_to_redo=max(0, reached - step),
        before_last_control_change=int(event.get("control_seq", 0)) < state.last_control_seq,
        chosen_for_resume=state.resume_choice == event["checkpoint"],
        files={f["name"]: int(f["size"]) for f in event.get("files", [])},
        checksums=recorded(event.get("checksums") or stored),
        world_size=int(event.get("world_size", 1)),
    )
