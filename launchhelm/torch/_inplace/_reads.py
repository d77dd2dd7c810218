"""Steps 2 and 3 of an in-place load: the file's bytes read, checksummed and checked."""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch

from launchhelm.storage._checksum import combine_crc64nvme
from launchhelm.torch._inplace._pagecache import _cached
from launchhelm.torch._inplace._plan import _Planned, _PlannedStorage, _rebuild
from launchhelm.torch._inplace._zip import _HEADER_SPAN, LayoutMismatch, _check_header
from launchhelm.torch._ranged import Piece, bytes_of, crc_views, cut, fill_views, memory_of, read_crc, reader_threads

#: Bytes per job: big enough for full disk speed, small enough to spread over two threads.
_CHUNK = 32 * 2**20
#: Bytes per read inside a job: each piece is CRC'd right after it lands, while it is still in the
#: CPU's cache (two pieces in flight fit a common last-level cache), so the checksum reads no memory
#: of its own (pieces too big for the cache make it read every byte from memory twice; pieces too
#: small cost a syscall each).
_PIECE = 4 * 2**20
#: A cold file (not in the page cache) is read in requests this big, CRC'd on the other thread:
#: big enough that the disk streams, as for one long read (``bench_checkpoint.py`` measures it).
_STREAM_PIECE = 64 * 2**20


class InPlaceLoad:
    """A planned load of one bundle file; see the module docstring for the steps."""

    def __init__(self, path: Path, meta: Mapping[str, object], storages: list[_PlannedStorage], size: int) -> None:
        self.path = path
        self.meta = meta
        self.size = size
        self._storages = sorted(storages, key=_file_order)
        self._crcs: list[tuple[int, int, int]] = []  # (file offset, length, CRC64NVME) of every range read
        self.matched_bytes = sum(s.nbytes for s in self._storages if s.target is not None)
        self.where = str(path)  # how errors name the checkpoint
        self.streamed = False  # step 3 read the file from disk as one stream (it was not in the page cache)
        #: every entry of the model's state dict (and no other) is read into the live tensor of its key
        self.model_in_place = False
        self.expected: dict[str, str] = {}  # the recorded checksums
        # every matched tensor on the CPU: step 3 reads contiguous runs of the file with scatter
        # reads (one preadv fills several tensors and the zip headers between them), and the zip
        # headers between two matched tensors wait for step 3 (nothing before it needs them)
        self._scatter = not any(s.target is not None and s.target.is_cuda for s in self._storages)
        self._deferred: list[tuple[int, int]] = []  # (offset, length) of those headers
        # where the plan took the data offsets from the layout: each storage's local header, checked
        # when its bytes are read (header offset, data offset), and how many were
        self._headers = sorted((s.header, s.offset, s.record) for s in self._storages if s.header >= 0)
        self._header_starts = [header for header, _, _ in self._headers]
        self._checked = 0

    # -- step 2 -------------------------------------------------------------
    def read_rest(self, map_location: Any) -> dict[str, object]:
        """Read all but the matched tensors; return the real bundle (matched slots hold the live tensors)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            pos = 0
            after_matched = False
            for storage in self._storages:
                if storage.offset > pos:
                    if self._scatter and after_matched and storage.target is not None:
                        self._deferred.append((pos, storage.offset - pos))
                    else:
                        self._read_gap(fd, pos, storage.offset)
                after_matched = storage.target is not None
                if storage.target is None:
                    fresh = torch.empty(storage.nbytes, dtype=torch.uint8)
                    if storage.nbytes:
                        crc = read_crc(fd, bytes_of(fresh), storage.offset, _PIECE)
                        self._crcs.append((storage.offset, storage.nbytes, crc))
                    storage.fresh = fresh.untyped_storage()
                pos = max(pos, storage.offset + storage.nbytes)
            if self.size > pos:
                self._read_gap(fd, pos, self.size)
        finally:
            os.close(fd)

        def replace(t: _Planned) -> torch.Tensor:
            storage = t.storage
            if storage.target is not None:
                return storage.target
            assert storage.fresh is not None
            real = torch.empty(0, dtype=t.dtype).set_(storage.fresh, t.offset, t.shape, t.stride)
            return real if map_location in (None, "cpu") else real.to(map_location)

        return cast("dict[str, object]", _rebuild(self.meta, replace))  # the bundle's top level is a dict

    def _read_gap(self, fd: int, start: int, end: int) -> None:
        for chunk in range(start, end, _CHUNK):
            buffer = bytearray(min(_CHUNK, end - chunk))
            self._crcs.append((chunk, len(buffer), read_crc(fd, memoryview(buffer), chunk, _PIECE)))
            self._check_headers(fd, chunk, memoryview(buffer))

    def _check_headers(self, fd: int, start: int, view: Any) -> None:
        """Check the storages' local headers that start in ``view`` (the file's bytes from ``start``)
        against the layout the plan used: each must carry its storage's record name and start its
        data where the plan put it. A header that runs past ``view`` is read on its own."""
        headers = self._headers
        index = bisect.bisect_left(self._header_starts, start)
        end = start + len(view)
        while index < len(headers) and headers[index][0] < end:
            header, data, record = headers[index]
            at = header - start
            local = view[at : at + _HEADER_SPAN + len(record)]
            if len(local) != _HEADER_SPAN + len(record):
                local = os.pread(fd, _HEADER_SPAN + len(record), header)
            _check_header(local, header, data, record)
            self._checked += 1
            index += 1

    # -- step 3 -------------------------------------------------------------
    def read_matched(self) -> int:
        """Read the matched tensors' bytes into them; return the whole file's CRC64NVME."""
        matched = [(s.offset, s.nbytes, s.target) for s in self._storages if s.target is not None]
        fd = os.open(self.path, os.O_RDONLY)
        staging = threading.local()
        try:
            if self._scatter:
                self._read_scattered(fd, matched)
                return self._whole_crc()
            jobs = [  # a tensor on CUDA among them: per tensor, in chunks through a pinned buffer
                (offset + start, target, start, min(_CHUNK, nbytes - start))
                for offset, nbytes, target in matched
                for start in range(0, nbytes, _CHUNK)
            ]

            def run(job: tuple[int, torch.Tensor, int, int]) -> tuple[int, int, int]:
                offset, target, start, length = job
                flat = target.detach().view(-1).view(torch.uint8)
                if flat.device.type == "cpu":
                    return offset, length, read_crc(fd, bytes_of(flat[start : start + length]), offset, _PIECE)
                pinned = getattr(staging, "buffer", None)
                if pinned is None:  # one pinned buffer per thread, reused for every chunk
                    pinned = staging.buffer = torch.empty(_CHUNK, dtype=torch.uint8, pin_memory=True)
                crc = read_crc(fd, bytes_of(pinned[:length]), offset, _PIECE)
                flat[start : start + length].copy_(pinned[:length])  # synchronous: the buffer is reused next
                return offset, length, crc

            if len(jobs) > 1:
                self._crcs += list(reader_threads().map(run, jobs))
            else:
                self._crcs += [run(job) for job in jobs]
        finally:
            os.close(fd)
        return self._whole_crc()

    def _read_scattered(self, fd: int, matched: list[tuple[int, int, torch.Tensor]]) -> None:
        """Step 3 on the CPU: the file's runs of matched tensors (and the zip headers between them)
        read in pieces, each ``preadv`` filling the tensors it spans, each piece's CRC taken on the
        thread that read it, while its bytes are still in cache. So a load makes about one
        request per :data:`_PIECE` however many tensors the model has, not one per tensor."""
        parts = [(offset, memory_of(target, nbytes)) for offset, nbytes, target in matched]
        scratch = memoryview(bytearray(sum(length for _, length in self._deferred)))  # the headers' bytes
        at = 0
        for offset, length in self._deferred:
            parts.append((offset, scratch[at : at + length]))
            at += length
        parts.sort(key=lambda part: part[0])
        pieces = cut(parts, _PIECE)
        if not _cached(fd, [(offset, length) for offset, _, length in pieces]):
            streamed = cut(parts, _STREAM_PIECE)
            if len(streamed) > 1:
                self.streamed = True
                self._crcs += _stream(fd, streamed)
                self._check_deferred(fd, scratch)
                return
        batches: list[list[Piece]] = [[]]
        filled = 0
        for piece in pieces:  # a job for the pool per _CHUNK bytes, however many pieces that is
            if filled >= _CHUNK:
                batches.append([])
                filled = 0
            batches[-1].append(piece)
            filled += piece[2]

        def run(batch: list[Piece]) -> list[tuple[int, int, int]]:
            done = []
            for offset, views, length in batch:
                fill_views(fd, views, offset)
                done.append((offset, length, crc_views(views)))
            return done

        if len(batches) > 1:
            for done in reader_threads().map(run, batches):
                self._crcs += done
        else:
            self._crcs += run(batches[0])
        self._check_deferred(fd, scratch)

    def _check_deferred(self, fd: int, scratch: memoryview) -> None:
        """:meth:`_check_headers` for the zip headers step 3 read into ``scratch``, gap after gap
        (one pass, the headers and the gaps both in file order)."""
        headers, count, index, at = self._headers, len(self._headers), 0, 0
        found = scratch.tobytes()  # bytes compare faster than memoryviews
        for offset, length in self._deferred:
            while index < count and headers[index][0] < offset:
                index += 1  # in a gap step 2 read: checked there
            end = offset + length
            while index < count and headers[index][0] < end:
                header, data, record = headers[index]
                start = at + header - offset
                span = _HEADER_SPAN + len(record)
                if header + span > end:  # runs past the gap
                    _check_header(os.pread(fd, span, header), header, data, record)
                else:
                    _check_header(found[start : start + span], header, data, record)
                self._checked += 1
                index += 1
            at += length

    def _whole_crc(self) -> int:
        if self._checked != len(self._headers):  # a header that lies in no gap: inside another record
            raise LayoutMismatch(
                f"{len(self._headers) - self._checked} of the storages' local zip headers are not where the "
                "central directory puts them"
            )
        total, pos = 0, 0
        for offset, length, crc in sorted(self._crcs):
            if offset != pos:
                raise AssertionError(f"in-place load missed bytes {pos}..{offset}")
            total = crc if pos == 0 else combine_crc64nvme(total, crc, length)
            pos += length
        if pos != self.size:
            raise AssertionError(f"in-place load read {pos} of {self.size} bytes")
        return total


def _stream(fd: int, pieces: list[Piece]) -> list[tuple[int, int, int]]:
    """Read a file that is not in the page cache: one thread makes the scatter reads, in file
    order, in big requests (:data:`_STREAM_PIECE`, so the kernel reads ahead as it does for one
    long read), the other computes each request's CRC while the next one is read: cold, as fast
    as one read of the whole file, where the two-thread piecewise path breaks the read-ahead.
    Warm, that path is the faster one (each piece CRC'd in cache), which is why this is chosen
    only when cold."""
    pending = []
    pool = reader_threads()
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:  # a wider read-ahead window for this open file (Linux doubles it)
        try:
            advise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass
    for offset, views, length in pieces:
        fill_views(fd, views, offset)
        pending.append((offset, length, pool.submit(crc_views, views)))
    return [(offset, length, future.result()) for offset, length, future in pending]


def _file_order(storage: _PlannedStorage) -> int:
    return storage.offset
