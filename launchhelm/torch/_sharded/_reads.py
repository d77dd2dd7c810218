"""Reading a sharded checkpoint's chunks: where they come from, the planned byte ranges, the reader."""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from launchhelm._exceptions import CheckpointError
from launchhelm.storage import LocalStore, Store
from launchhelm.torch._manifest import MAX_MANIFEST_BYTES, TensorEntry
from launchhelm.torch._ranged import Task, bytes_of, crc_matches, read_upto, run_tasks
from launchhelm.torch._records import LoadTarget
from launchhelm.torch._sharded._state import Box

if TYPE_CHECKING:
    from launchhelm.torch._run import TorchRun

_READ_THREADS = 8
#: Blocks (of BLOCK_SIZE) one read request covers: large enough to stream, small enough to spread
#: a shard's reads over the threads (and an object store's connections).
_PIECE_BLOCKS = 4


class _Source:
    """Where a checkpoint's objects are read: a store prefix, or a local folder.

    Local files (a folder, or a ``LocalStore``) are read with ``preadv`` straight into
    the memory that keeps the bytes; other stores answer ranged GETs, copied in once.
    """

    def __init__(self, run: TorchRun | None, target: LoadTarget | None, folder: Path | None = None) -> None:
        self.store = run._store if run is not None else None
        self.prefix = str(target.get("key", "")).rsplit("/", 1)[0] if target is not None else ""
        if folder is None and target is not None and target.get("path"):
            folder = Path(str(target["path"]))
        if folder is None and isinstance(self.store, LocalStore):
            folder = self.store.root / self.prefix
        self.folder = folder
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, name: str) -> int:
        with self._lock:
            fd = self._fds.get(name)
            if fd is None:
                assert self.folder is not None
                fd = self._fds[name] = os.open(self.folder / name, os.O_RDONLY)
            return fd

    @classmethod
    def at(cls, store: Store, prefix: str) -> _Source:
        """A checkpoint's objects under ``prefix`` of ``store``, with no run (export, consolidation)."""
        source = cls(None, None)
        source.store, source.prefix = store, prefix
        if isinstance(store, LocalStore):
            source.folder = store.root / prefix
        return source

    def read_into(self, name: str, start: int, view: memoryview) -> int:
        """Fill ``view`` with the object's bytes from ``start``; how many there were."""
        if self.folder is not None:
            return read_upto(self._fd(name), view, start)
        assert self.store is not None
        data = self.store.read_range(f"{self.prefix}/{name}", start, start + len(view))
        view[: len(data)] = data
        return len(data)

    def whole(self, name: str) -> bytes:
        if self.folder is not None:
            path = self.folder / name
            if path.stat().st_size > MAX_MANIFEST_BYTES:
                raise CheckpointError(f"{path} is larger than a manifest may be")
            return path.read_bytes()
        assert self.store is not None
        return self.store.read(f"{self.prefix}/{name}")

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


@dataclass
class _Read:
    """One ranged read: a saved chunk's blocks covering its overlap with this rank's box."""

    obj: str
    start: int  # in the object
    end: int
    crcs: list[str]  # of the blocks read, in order
    block: int
    first: int  # byte of the overlap's first element, from `start`
    overlap: tuple[int, ...]
    strides: tuple[int, ...]  # of the saved chunk, in elements
    dtype: torch.dtype
    dest: torch.Tensor  # the view of the new local tensor it fills


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))


def _plan_reads(entry: TensorEntry, objects: list[str], block: int, box: Box, dest: torch.Tensor) -> list[_Read]:
    offset, shape = box
    dtype = dest.dtype
    reads = []
    for chunk in entry["chunks"]:
        c_off, c_shape = tuple(chunk["offset"]), tuple(chunk["shape"])
        lo = tuple(max(a, b) for a, b in zip(offset, c_off, strict=True))
        hi = tuple(min(a + s, b + t) for a, s, b, t in zip(offset, shape, c_off, c_shape, strict=True))
        if any(h <= low for low, h in zip(lo, hi, strict=True)) or math.prod(c_shape) == 0:
            continue
        strides = _row_major(c_shape)
        first = sum((a - b) * s for a, b, s in zip(lo, c_off, strides, strict=True))
        last = sum((h - 1 - b) * s for h, b, s in zip(hi, c_off, strides, strict=True))
        size = dtype.itemsize
        b0, b1 = first * size // block, -(-(last + 1) * size // block)
        start = chunk["start"] + b0 * block
        end = chunk["start"] + min(b1 * block, chunk["nbytes"])
        view = dest[tuple(slice(a - o, h - o) for a, h, o in zip(lo, hi, offset, strict=True))]
        reads.append(
            _Read(
                obj=objects[chunk["object"]],
                start=start,
                end=end,
                crcs=chunk["crc64nvme"][b0:b1],
                block=block,
                first=first * size - b0 * block,
                overlap=tuple(h - low for low, h in zip(lo, hi, strict=True)),
                strides=strides,
                dtype=dtype,
                dest=view,
            )
        )
    return reads


class _Reader:
    """Runs planned reads in pieces on a thread pool, each block checked against its CRC64NVME.

    Where the overlap a read fills is one contiguous run of both the saved chunk and
    the destination (a shard that equals, or lies along the first dimension of, a saved
    chunk: FSDP2's case, at any world size), its whole blocks are read straight into the
    destination tensor and checked there; only a block that straddles the overlap's ends
    goes through a block-sized scratch buffer. Every other overlap is read into one buffer
    and copied out with its strides.
    """

    def __init__(self, source: _Source, where: str) -> None:
        self.source = source
        self.where = where
        self._local = threading.local()

    def _fill(self, obj: str, start: int, view: memoryview) -> None:
        if self.source.read_into(obj, start, view) != len(view):
            raise CheckpointError(f"{self.where}: object {obj} is shorter than its record (truncated)")

    def _check(self, read: _Read, index: int, data: memoryview) -> None:
        if not crc_matches(data, read.crcs[index]):
            at = read.start + index * read.block
            raise CheckpointError(
                f"{self.where}: object {read.obj} does not match its crc64nvme at bytes {at}..{at + len(data)}: "
                "corrupted"
            )

    @staticmethod
    def _blocks(read: _Read) -> list[tuple[int, int, int]]:
        """(index, start, end) in the object of each block ``read`` covers."""
        return [
            (i, read.start + i * read.block, min(read.start + (i + 1) * read.block, read.end))
            for i in range(len(read.crcs))
        ]

    def tasks(self, read: _Read) -> list[Task]:
        """Callables that together read, check and place ``read``."""
        size = read.dtype.itemsize
        numel = math.prod(read.overlap)
        count = read.strides[0] * (read.overlap[0] - 1) + 1 if read.overlap else 1
        for stride, extent in zip(read.strides[1:], read.overlap[1:], strict=True):
            count += stride * (extent - 1)
        blocks = self._blocks(read)
        if numel and count == numel and read.dest.is_contiguous():
            return self._direct(read, blocks, numel * size)
        return self._strided(read, blocks, count * size)

    def _direct(self, read: _Read, blocks: list[tuple[int, int, int]], nbytes: int) -> list[Task]:
        out = bytes_of(read.dest)
        lo = read.start + read.first  # where the destination's bytes start in the object
        hi = lo + nbytes
        tasks: list[Task] = []
        run: list[tuple[int, int, int]] = []

        def direct(group: list[tuple[int, int, int]]) -> None:
            first, last = group[0][1], group[-1][2]
            target = out[first - lo : last - lo]
            self._fill(read.obj, first, target)
            for index, b0, b1 in group:
                self._check(read, index, target[b0 - first : b1 - first])

        def edge(index: int, b0: int, b1: int) -> None:
            scratch = memoryview(bytearray(b1 - b0))
            self._fill(read.obj, b0, scratch)
            self._check(read, index, scratch)
            a, b = max(b0, lo), min(b1, hi)
            out[a - lo : b - lo] = scratch[a - b0 : b - b0]

        for index, b0, b1 in blocks:
            if lo <= b0 and b1 <= hi:
                run.append((index, b0, b1))
                if len(run) == _PIECE_BLOCKS:
                    tasks.append(partial(direct, run))
                    run = []
                continue
            if run:
                tasks.append(partial(direct, run))
                run = []
            tasks.append(partial(edge, index, b0, b1))
        if run:
            tasks.append(partial(direct, run))
        return tasks

    def _strided(self, read: _Read, blocks: list[tuple[int, int, int]], span: int) -> list[Task]:
        scratch = torch.empty(read.end - read.start, dtype=torch.uint8)
        data = bytes_of(scratch)
        pieces = [blocks[i : i + _PIECE_BLOCKS] for i in range(0, len(blocks), _PIECE_BLOCKS)]
        left = [len(pieces)]
        lock = threading.Lock()

        def piece(group: list[tuple[int, int, int]]) -> None:
            first, last = group[0][1], group[-1][2]
            target = data[first - read.start : last - read.start]
            self._fill(read.obj, first, target)
            for index, b0, b1 in group:
                self._check(read, index, target[b0 - first : b1 - first])
            with lock:
                left[0] -= 1
                done = left[0] == 0
            if done and read.dest.numel():  # the last piece in places the overlap
                flat = scratch[read.first : read.first + span]
                read.dest.copy_(flat.view(read.dtype).as_strided(read.overlap, read.strides))

        return [partial(piece, group) for group in pieces]

    def _verify(self, read: _Read) -> list[Task]:
        """Tasks that read ``read``'s blocks into a scratch buffer of their thread and check them, keeping nothing."""
        blocks = self._blocks(read)

        def piece(group: list[tuple[int, int, int]]) -> None:
            first, last = group[0][1], group[-1][2]
            scratch = getattr(self._local, "scratch", None)
            if scratch is None or scratch.numel() < last - first:
                scratch = self._local.scratch = torch.empty(last - first, dtype=torch.uint8)
            target = bytes_of(scratch)[: last - first]
            self._fill(read.obj, first, target)
            for index, b0, b1 in group:
                self._check(read, index, target[b0 - first : b1 - first])

        return [partial(piece, blocks[i : i + _PIECE_BLOCKS]) for i in range(0, len(blocks), _PIECE_BLOCKS)]

    def run(self, reads: list[_Read], verify: list[_Read] | None = None) -> None:
        """Read, check and place ``reads``; only read and check ``verify``. Raises CheckpointError."""
        tasks = [task for read in reads for task in self.tasks(read)]
        tasks += [task for read in verify or () for task in self._verify(read)]
        try:
            run_tasks(tasks, _READ_THREADS)
        except FileNotFoundError as exc:
            raise CheckpointError(f"{self.where}: object {Path(str(exc.filename)).name} is missing") from None
        finally:
            self.source.close()
