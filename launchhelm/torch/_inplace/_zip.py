"""torch's zip layout: the central directory, where each record's data lies, its local headers."""

from __future__ import annotations

import operator
import os
import struct

#: Bytes of a local zip header that ``get_record_offset`` reads: its fixed part, which holds the
#: lengths of the name and extra field that follow (a header may straddle two pages).
_HEADER_SPAN = 30
#: The lengths of a local header's name and extra field, at its byte 26.
_LOCAL_LENGTHS = struct.Struct("<HH")


class _Unparsed(Exception):
    """A zip directory :func:`_header_offsets` does not follow: the plan reads headers as before."""


def _header_offsets(fd: int) -> list[int]:
    """The local header offset of every entry of the zip file (see :func:`_directory`)."""
    return [entry[1] for entry in _directory(fd)[0]]


#: A central directory entry: (name, local header offset, compressed size, flags, method).
_Entry = tuple[bytes, int, int, int, int]
#: A central directory entry's fixed part: flags, method, compressed and uncompressed sizes, the
#: lengths of its name, extra field and comment, its local header's offset.
_CENTRAL = struct.Struct("<8xHH8xIIHHH8xI")


def _directory(fd: int) -> tuple[list[_Entry], int]:
    """Every entry of the zip file, from its central directory (zip64 included), and the offset
    where that directory starts. Raises :class:`_Unparsed` or ``struct.error`` for what it does
    not follow. (``zipfile`` gives the same, at several times the cost an entry.)"""
    size = os.fstat(fd).st_size
    tail_start = max(0, size - (22 + 65535 + 20))
    tail = os.pread(fd, size - tail_start, tail_start)
    end = tail.rfind(b"PK\x05\x06")
    if end < 0:
        raise _Unparsed("no end of central directory")
    count, cd_size, cd_offset = struct.unpack_from("<10xHII", tail, end)
    if 0xFFFFFFFF in (cd_size, cd_offset) or count == 0xFFFF:
        locator = end - 20
        if locator < 0 or tail[locator : locator + 4] != b"PK\x06\x07":
            raise _Unparsed("no zip64 locator")
        (record_at,) = struct.unpack_from("<8xQ", tail, locator)
        record = os.pread(fd, 56, record_at)
        if record[:4] != b"PK\x06\x06":
            raise _Unparsed("no zip64 end of central directory")
        count, cd_size, cd_offset = struct.unpack_from("<32xQQQ", record)
    directory = os.pread(fd, cd_size, cd_offset)
    entries: list[_Entry] = []
    at = 0
    unpack = _CENTRAL.unpack_from
    for _ in range(count):
        if not directory.startswith(b"PK\x01\x02", at):
            raise _Unparsed("bad central directory entry")
        flags, method, csize, usize, name_len, extra_len, comment_len, offset = unpack(directory, at)
        # sizes or offset past 32 bits: in the zip64 extra field, in this order, those that overflowed
        if csize == 0xFFFFFFFF or usize == 0xFFFFFFFF or offset == 0xFFFFFFFF:
            extra = directory[at + 46 + name_len : at + 46 + name_len + extra_len]
            pos = 0
            while pos + 4 <= len(extra):
                tag, length = struct.unpack_from("<HH", extra, pos)
                if tag == 1:
                    field = pos + 4
                    if usize == 0xFFFFFFFF:
                        (usize,) = struct.unpack_from("<Q", extra, field)
                        field += 8
                    if csize == 0xFFFFFFFF:
                        (csize,) = struct.unpack_from("<Q", extra, field)
                        field += 8
                    if offset == 0xFFFFFFFF:
                        (offset,) = struct.unpack_from("<Q", extra, field)
                    break
                pos += 4 + length
            else:
                raise _Unparsed("no zip64 extra field")
        entries.append((directory[at + 46 : at + 46 + name_len], offset, csize, flags, method))
        at += 46 + name_len + extra_len + comment_len
    return entries, cd_offset


#: torch's writer starts every record's data at a multiple of this many bytes (``kFieldAlignment``).
_ALIGNMENT = 64
#: A data descriptor's possible lengths (with or without its signature, 32- or 64-bit sizes): all
#: under 64 bytes and 4 apart, so the alignment tells which one follows a record's data.
_DESCRIPTORS = frozenset((12, 16, 20, 24))


def _sequential_layout(fd: int) -> tuple[bytes, dict[str, tuple[int, int, int]]] | None:
    """Each record's (local header offset, data offset, size), by the name torch gives it (``data/0``...),
    from the central directory alone, where the zip is laid out as torch writes one: each record
    stored (not compressed), its data (and data descriptor, 12 to 24 bytes) ending where the next
    record's local header starts (the last one's where the directory starts), its data starting
    at a multiple of 64 (which tells the descriptor's length: only one of those fits), its local
    header no shorter than its fixed part and name. A record's data then starts at the next
    header less its size and descriptor, and a plan reads no local header (``get_record_offset`` reads
    each, one ``pread`` a storage). The load checks each
    storage's local header (where its data starts, and the record name it carries) against this
    when it reads its bytes anyway (:meth:`InPlaceLoad._check_headers`). Returns the archive's
    folder (``archive/``) too. None for any other zip: each header is read first."""
    try:
        entries, cd_offset = _directory(fd)
        if not entries:
            return None
        folder = entries[0][0].split(b"/", 1)[0] + b"/"  # torch names the archive by its first entry
        skip = len(folder)
        entries.sort(key=_header_order)
        layout: dict[str, tuple[int, int, int]] = {}
        ends = [entry[1] for entry in entries[1:]]
        ends.append(cd_offset)
        for (name, header, csize, flags, method), end in zip(entries, ends):  # noqa: B905 (same length)
            if method or flags & 0x1 or not name.startswith(folder):
                return None  # compressed, encrypted, another archive's
            data = end - csize
            if flags & 0x8:  # a data descriptor follows the data: 12 to 24 bytes, which alignment tells
                descriptor = data % _ALIGNMENT
                if descriptor not in _DESCRIPTORS:
                    return None
                data -= descriptor
            elif data % _ALIGNMENT:
                return None  # a gap
            if not 30 + len(name) <= data - header <= 30 + len(name) + 0xFFFF:
                return None  # a header too short, or one no header could be
            layout[name[skip:].decode()] = (header, data, csize)
    except (OSError, _Unparsed, struct.error, UnicodeDecodeError):
        return None
    return (folder, layout) if len(layout) == len(entries) else None


_header_order = operator.itemgetter(1)


class LayoutMismatch(Exception):
    """A storage's local zip header does not put its data where the central directory's layout
    said (:func:`_sequential_layout`): the file is damaged (or laid out unlike torch's)."""


def _check_header(local: bytes, header: int, data: int, record: bytes) -> None:
    """Raise :class:`LayoutMismatch` unless ``local`` (the bytes at ``header``, its fixed part and
    name) is the local zip header of ``record`` with its data starting at ``data``."""
    if (
        local[:4] != b"PK\x03\x04"
        or len(local) != _HEADER_SPAN + len(record)
        or _LOCAL_LENGTHS.unpack_from(local, 26) != (len(record), data - header - _HEADER_SPAN - len(record))
        or local[_HEADER_SPAN:] != record
    ):
        raise LayoutMismatch(
            f"the local zip header at byte {header} is not that of {record.decode(errors='replace')} "
            f"with its data at byte {data}, as the central directory says"
        )
