"""The checkpoint registry: opaque payload files plus a ``checkpoint`` event.

A checkpoint exists only once its event does. The payload is uploaded first
under a fresh, unique key (invisible to readers until complete), its size and
sha256 are recorded, and only then is the event appended. A crash mid-upload
leaves an orphan for garbage collection, never a half checkpoint. The core
does not know what is inside a payload; ``launchhelm.torch`` does.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import Any, BinaryIO

from launchhelm._events import RunState, run_prefix
from launchhelm._exceptions import InvalidArgumentError, PathNotFoundError
from launchhelm._types import Checkpoint

__all__ = ["HashingWriter", "artifact_prefix", "checkpoint_record", "new_artifact_id", "upload_path"]

FILE_FORMAT = "file"
DIRECTORY_FORMAT = "directory"


def new_artifact_id(step: int) -> str:
    """A unique, sortable-by-step artifact id such as ``ckpt-00000064-3fa2b1c9``."""
    return f"ckpt-{step:08d}-{os.urandom(4).hex()}"


def artifact_prefix(run_id: str, artifact_id: str) -> str:
    return f"{run_prefix(run_id)}/artifacts/{artifact_id}"


class HashingWriter:
    """A write-only file that hashes and counts what passes through it.

    For a large buffer the hash runs on a second thread while this thread
    writes the same buffer out (hashlib and file writes both release the
    GIL), and ``write`` returns once both are done: the buffer may be a view
    that ``torch.save`` reuses after the call, so it is never kept beyond it.
    A large save thus costs about one pass over the bytes instead of two.
    """

    _MIN_THREADED = 1 << 20

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._requests: queue.Queue[memoryview | None] | None = None
        self._done: queue.Queue[BaseException | None] | None = None
        self._thread: threading.Thread | None = None

    def _hash_loop(self) -> None:
        assert self._requests is not None and self._done is not None
        while (view := self._requests.get()) is not None:
            try:
                self.sha256.update(view)
                self._done.put(None)
            except BaseException as exc:  # handed back to the writing thread
                self._done.put(exc)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n < self._MIN_THREADED:
            self.sha256.update(view)
            self.raw.write(view)
        else:
            if self._thread is None:
                self._requests, self._done = queue.Queue(), queue.Queue()
                self._thread = threading.Thread(target=self._hash_loop, name="launchhelm-sha256", daemon=True)
                self._thread.start()
            assert self._requests is not None and self._done is not None
            self._requests.put(view)
            try:
                self.raw.write(view)
            finally:
                failure = self._done.get()  # the view is not used after this call returns
            if failure is not None:
                raise failure
        self.size += n
        return n

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        """Stop the hashing thread (idempotent)."""
        if self._thread is not None:
            assert self._requests is not None
            self._requests.put(None)
            self._thread.join()
            self._thread = None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * 2**20):
            digest.update(block)
    return digest.hexdigest()


def upload_path(store: Any, prefix: str, path: Path) -> tuple[str, list[dict[str, Any]], str, int]:
    """Upload a file or a folder under ``prefix``: (format, files, sha256, size).

    ``sha256`` is the file's digest, or for a folder the digest of its
    manifest (each file's relative name, size and digest, sorted).
    """
    if path.is_file():
        digest = sha256_file(path)
        store.upload(f"{prefix}/{path.name}", path)
        size = path.stat().st_size
        return FILE_FORMAT, [{"name": path.name, "size": size, "sha256": digest}], digest, size
    if not path.is_dir():
        raise PathNotFoundError(f"cannot checkpoint {str(path)!r}: no such file or folder", path=str(path))
    files: list[dict[str, Any]] = []
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = item.relative_to(path).as_posix()
        digest = sha256_file(item)
        store.upload(f"{prefix}/{rel}", item)
        files.append({"name": rel, "size": item.stat().st_size, "sha256": digest})
    if not files:
        raise InvalidArgumentError(f"cannot checkpoint {str(path)!r}: the folder is empty")
    manifest = "\n".join(f"{f['name']}\t{f['size']}\t{f['sha256']}" for f in files)
    return DIRECTORY_FORMAT, files, hashlib.sha256(manifest.encode()).hexdigest(), sum(f["size"] for f in files)


def checkpoint_record(run_id: str, state: RunState, event: dict[str, Any], reached: int) -> Checkpoint:
    """The public view of a ``checkpoint`` event."""
    step = int(event["step"])
    return Checkpoint(
        id=event["checkpoint"],
        run_id=run_id,
        step=step,
        saved_at=float(event["time"]),
        size=int(event["size"]),
        sha256=str(event["sha256"]),
        format=str(event["format"]),
        steps_to_redo=max(0, reached - step),
        before_last_control_change=int(event.get("control_seq", 0)) < state.last_control_seq,
        chosen_for_resume=state.resume_choice == event["checkpoint"],
        files={f["name"]: int(f["size"]) for f in event.get("files", [])},
    )
