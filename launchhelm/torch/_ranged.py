"""The one ranged reader of checkpoint bytes, for both load paths.

The in-place load of a single-file bundle (:mod:`._inplace`) and the sharded
load (:mod:`._sharded`) read the same way: byte ranges of a file go straight
into the memory that keeps them (``preadv`` into tensor views: no copy), each
range's CRC64NVME is taken while its bytes are still in cache, and the reads
run on a pool of threads. They differ only in what they check the CRCs
against (the whole file's, combined from its ranges; or each block's, from the
manifest), so that is left to them, and everything else is here.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from launchhelm.storage._checksum import crc64nvme

__all__ = [
    "IOV_MAX",
    "Piece",
    "Task",
    "bytes_of",
    "crc_matches",
    "crc_views",
    "cut",
    "fill_views",
    "memory_of",
    "read_crc",
    "read_upto",
    "reader_threads",
    "run_tasks",
]

#: The process-wide pool's threads (:func:`reader_threads`).
_THREADS = 2
#: (file offset, the buffers its bytes fill in order, their total length): one scatter read.
Piece = tuple[int, list[memoryview], int]
#: Buffers per scatter read (Linux takes up to IOV_MAX = 1024).
IOV_MAX = 512
#: One piece of work for :func:`run_tasks`: reads, checks and places its bytes, raises on a mismatch.
Task = Callable[[], None]


# -- memory the bytes land in ----------------------------------------------------------
def bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable, without a copy."""
    if t.numel() == 0:
        return memoryview(bytearray())
    view: memoryview = t.view(-1).view(torch.uint8).numpy().data
    return view.cast("B")


def memory_of(t: torch.Tensor, nbytes: int) -> memoryview:
    """The ``nbytes`` bytes of memory of a contiguous CPU tensor, writable, without a copy: a view
    of the address itself (``PyMemoryView_FromMemory``: cheaper a tensor than a ctypes array or
    ``.numpy()``). It does not keep the tensor alive:
    the caller holds it while the view is used."""
    if nbytes == 0:
        return memoryview(bytearray())
    return _memory_view(t.data_ptr(), nbytes, _PYBUF_WRITE)  # type: ignore[no-any-return]


_memory_view = ctypes.pythonapi.PyMemoryView_FromMemory
_memory_view.restype = ctypes.py_object
_memory_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
#: ``PyMemoryView_FromMemory``'s flag for a writable view.
_PYBUF_WRITE = 0x200


# -- reads -----------------------------------------------------------------------------
def fill_views(fd: int, views: list[memoryview], offset: int) -> None:
    """Fill ``views`` in order from the file at ``offset`` (``preadv``: no copy), however many calls."""
    index, views = 0, list(views)
    while index < len(views):
        n = os.preadv(fd, views[index:], offset)
        if n <= 0:
            missing = sum(len(v) for v in views[index:])
            raise EOFError(f"the file ended {missing} bytes early at offset {offset}")
        offset += n
        while index < len(views) and n >= len(views[index]):
            n -= len(views[index])
            index += 1
        if n:
            views[index] = views[index][n:]


def read_upto(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` from the file at ``offset`` as far as the file goes; how many bytes that was."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def read_crc(fd: int, view: memoryview, offset: int, piece: int) -> int:
    """Fill ``view`` from the file at ``offset`` (preadv: no copy) and return its CRC64NVME.

    Read and checksummed piece by piece (``piece`` bytes), each piece's CRC taken while its bytes
    are still in cache; the CRC continues from piece to piece, so no combine is needed.
    """
    view = view.cast("B")
    crc = 0
    done = 0
    while done < len(view):
        part = view[done : done + piece]
        fill_views(fd, [part], offset + done)
        crc = crc64nvme(part, crc)
        done += len(part)
    return crc


def cut(parts: list[tuple[int, memoryview]], size: int) -> list[Piece]:
    """Cut (offset, bytes) parts, sorted by offset, into scatter reads of at most ``size`` bytes
    and :data:`IOV_MAX` buffers, each over one contiguous range of the file."""
    pieces: list[Piece] = []
    start, length = 0, 0
    views: list[memoryview] = []
    for offset, view in parts:
        view = view.cast("B") if view.format != "B" else view
        pos = 0
        while pos < len(view):
            if views and (start + length != offset + pos or length >= size or len(views) >= IOV_MAX):
                pieces.append((start, views, length))
                views, length = [], 0
            if not views:
                start = offset + pos
            take = min(len(view) - pos, size - length)
            views.append(view[pos : pos + take])
            length += take
            pos += take
    if views:
        pieces.append((start, views, length))
    return pieces


# -- checks ----------------------------------------------------------------------------
def crc_views(views: Sequence[Any]) -> int:
    """The CRC64NVME of the buffers' bytes, one after another."""
    crc = 0
    for view in views:
        crc = crc64nvme(view, crc)
    return crc


def crc_matches(data: Any, recorded: str) -> bool:
    """Whether ``data``'s CRC64NVME is ``recorded`` (16 hex digits, as manifests record it)."""
    return f"{crc64nvme(data):016x}" == recorded


# -- threads ---------------------------------------------------------------------------
_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def reader_threads() -> ThreadPoolExecutor:
    """The threads that read tensor bytes, started once per process (a fork makes its own)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(_THREADS, thread_name_prefix="launchhelm-load"))
        return _pool[1]


def run_tasks(tasks: list[Task], max_threads: int) -> None:
    """Run ``tasks`` on up to ``max_threads`` threads of their own (inline when there is one);
    the exception of the first task (in order) that failed is raised, the tasks not yet started
    cancelled."""
    if len(tasks) <= 1:
        for task in tasks:
            task()
        return
    with ThreadPoolExecutor(max_workers=min(max_threads, len(tasks))) as pool:
        futures = [pool.submit(task) for task in tasks]
        try:
            for future in futures:
                future.result()
        finally:
            for future in futures:
                future.cancel()
