"""Whether a file's pages are in the page cache, and the prefetch of its zip headers when not."""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launchhelm.torch._inplace._zip import _HEADER_SPAN, _header_offsets, _Unparsed

#: How many chunks :func:`_cached` looks at.
_PROBES = 8
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@contextlib.contextmanager
def _headers_prefetched(path: Path) -> Iterator[None]:
    """While planning, every record's local zip header is asked of the kernel at once
    (``POSIX_FADV_WILLNEED``, which does not wait), before ``get_record_offset`` reads them one
    by one (a storage's data offset lies past its header, whose length only the header says).
    On a file not in the page cache those were as many random reads, one after another, as the
    bundle has tensors; asked at once, the disk serves them together.

    Afterwards the header pages this brought in are dropped again (``POSIX_FADV_DONTNEED``, once
    each one's read has landed):
    left in the cache, these islands (one every tensor) break the kernel's read-ahead of the
    stream that follows, and dropped, they do not. Pages that were cached before stay.

    A file whose pages are cached all over (:data:`_SPREAD` probes) is left as it is.

    Only a hint: where fadvise, ``mincore`` or the directory parse fail, the reads are as they were
    (and where only ``mincore`` fails, the headers are prefetched and stay)."""
    advise = getattr(os, "posix_fadvise", None)
    fd = -1
    brought: list[int] = []
    try:
        if advise is not None:
            fd = os.open(path, os.O_RDONLY)
            size = os.fstat(fd).st_size
            with contextlib.suppress(_NoProbe):
                if _resident(fd, [size * i // _SPREAD for i in range(_SPREAD)]):
                    raise _Warm  # pages all over the file are cached: so are its headers, as a rule
            pages = sorted({at // _PAGE * _PAGE for h in _header_offsets(fd) for at in (h, h + _HEADER_SPAN - 1)})
            try:
                if not _resident(fd, pages[:: max(1, len(pages) // _PROBES)]):  # else cached, as is usual
                    brought = [page for page, cached in zip(pages, _residency(fd, pages), strict=True) if not cached]
                asked = brought
            except _NoProbe:
                asked = pages
            for page in asked:
                advise(fd, page, _PAGE, os.POSIX_FADV_WILLNEED)
    except (OSError, _Unparsed, struct.error, _Warm):
        brought = []
    try:
        yield
    finally:
        if fd >= 0:
            try:
                for page in brought:
                    os.pread(fd, 1, page)  # waits for a read still in flight (a page under I/O is not dropped)
                    advise(fd, page, _PAGE, os.POSIX_FADV_DONTNEED)  # type: ignore[misc]
            except OSError:
                pass
            os.close(fd)


class _Warm(Exception):
    """The file looks cached: :func:`_headers_prefetched` asks nothing of the kernel."""


#: Pages spread over the whole file that :func:`_headers_prefetched` looks at first: all cached, and
#: the file is taken as warm (no directory parse, no advice: a warm load skips that work).
_SPREAD = 16


def _cached(fd: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether the matched bytes look to be in the page cache: the middle pages of a few of these
    (offset, length) ranges, spread over them (not their first pages, which hold a zip header the
    plan may have read), asked of the kernel without reading anything
    (:func:`_resident`, ``mincore`` on a mapping of the file). Where that is not available, a page
    of each is read with ``RWF_NOWAIT``, which fails rather than wait for the disk (but starts a
    read-ahead there, which costs a cold load a little).

    Where neither works (not Linux or macOS, a file system without them) the answer is yes: the
    two-thread path is right for a warm file and only somewhat slower on a cold one.
    """
    step = max(1, len(ranges) // _PROBES)
    probes = ranges[::step]
    try:
        return _resident(fd, [offset + length // 2 for offset, length in probes])
    except Exception:  # no mincore or mmap here (Windows, a file system that cannot map): ask another way
        pass
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None:
        return True
    scratch = memoryview(bytearray(4096))
    for offset, length in probes:
        want = min(len(scratch), length - length // 2)
        try:
            if os.preadv(fd, [scratch[:want]], offset + length // 2, flag) < want:
                return False
        except BlockingIOError:
            return False
        except OSError:  # EOPNOTSUPP and kin: no way to tell
            return True
    return True


_libc: Any = None


class _NoProbe(Exception):
    """mmap or mincore failed: :func:`_cached` asks another way."""


def _resident(fd: int, offsets: list[int]) -> bool:
    """Whether the page at each offset of the file is in the page cache (see :func:`_residency`)."""
    return all(_residency(fd, offsets, stop_at_absent=True))


def _residency(fd: int, offsets: list[int], *, stop_at_absent: bool = False) -> list[bool]:
    """For each offset, whether its page of the file is in the page cache, by ``mincore`` on a
    read-only shared mapping of the file (which reads nothing; the mapping is dropped at once).
    ``stop_at_absent``: the list ends at the first page that is not.

    Linux answers for files this process owns or may write (else it reports pages as absent:
    a cold-path read, still correct). Raises :class:`_NoProbe` where mapping or ``mincore`` fails."""
    import mmap

    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = libc
    size = os.fstat(fd).st_size
    if size == 0 or not offsets:
        return [True] * len(offsets)
    address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address is None or address == ctypes.c_void_p(-1).value:
        raise _NoProbe(f"mmap: errno {ctypes.get_errno()}")
    try:
        vector = (ctypes.c_ubyte * 1)()
        found = []
        for offset in offsets:
            page = min(offset, size - 1) // _PAGE * _PAGE
            if _libc.mincore(address + page, 1, vector) != 0:
                raise _NoProbe(f"mincore: errno {ctypes.get_errno()}")
            found.append(bool(vector[0] & 1))
            if stop_at_absent and not found[-1]:
                break
        return found
    finally:
        _libc.munmap(address, size)
