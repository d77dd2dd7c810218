"""Points logged and not yet stored, held compactly: one array per column, not a Python object per value.

``log()`` appends a row's step, attempt and time, and its values with their
keys' ids, to flat :mod:`array` columns (about 17 bytes a value where a list of
dicts took about 90), and the flush hands those columns to numpy and Arrow
without a Python loop per value. A buffer is cut at :attr:`PointBuffer.limit`
values, so each one becomes one chunk of bounded size, and knows where the
session's spool stood when it was cut: the spool's state then says exactly
which points the store has.

When logging outruns the store, the session stops buffering (the points are
in the spool already) and :func:`read_spool` reads them back from there, a
bounded piece at a time: memory stays bounded and nothing is dropped.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launchhelm._metrics._pause import pause

if TYPE_CHECKING:
    import numpy as np

__all__ = ["KeyIds", "PointBuffer", "read_spool"]

#: Bytes a buffered value takes in memory, roughly: its value, and its row's share of the rest
#: (step, attempt, time and layout id: 24 bytes a row, 5 values a row taken as typical).
BYTES_PER_VALUE = 13


class KeyIds:
    """The session's metric names, each given a small integer once, and the rows' layouts (shared by its buffers).

    A layout is the keys of one ``log()`` call, in order; most rows repeat one
    of a few, so a row keeps its layout's id rather than a key id per value.
    """

    __slots__ = ("_arrays", "ids", "layouts", "names", "shapes")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []
        self.layouts: dict[tuple[str, ...], int] = {}  # layout id by the row's keys in order
        self.shapes: list[tuple[int, ...]] = []  # key ids by layout id
        self._arrays: tuple[int, Any] | None = None

    def key_id(self, key: str) -> int:
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = len(self.names)
            self.names.append(key)
        return found

    def layout(self, keys: tuple[str, ...]) -> int:
        shape = tuple(self.key_id(k) for k in keys)
        found = self.layouts[keys] = len(self.shapes)
        self.shapes.append(shape)
        return found

    def arrays(self, upto: int) -> tuple[Any, Any, Any]:
        """``(length, start, flat)`` numpy arrays over the first ``upto`` layouts: each layout's key count,
        where its ids start in ``flat``, and every layout's key ids end to end."""
        import numpy as np

        cached = self._arrays
        if cached is None or cached[0] < upto:
            shapes = list(self.shapes)  # a snapshot: the training thread may add layouts meanwhile
            length = np.fromiter((len(s) for s in shapes), dtype=np.int64, count=len(shapes))
            start = np.zeros(len(shapes), dtype=np.int64)
            np.cumsum(length[:-1], out=start[1:])
            flat = np.fromiter((k for s in shapes for k in s), dtype=np.uint32, count=int(length.sum()))
            cached = self._arrays = (len(shapes), (length, start, flat))
        return cached[1]


class PointBuffer:
    """Rows of points in columns: per row ``step``, ``attempt``, ``time``, layout id; per value the value.

    ``end`` is where the spool stood after the last row (None without a spool).
    """

    __slots__ = ("attempts", "end", "keys", "limit", "rows", "steps", "times", "values")

    def __init__(self, keys: KeyIds, limit: int) -> None:
        self.keys = keys
        self.limit = limit
        self.steps: array[int] = array("q")
        self.attempts: array[int] = array("i")
        self.times: array[float] = array("d")
        self.rows: array[int] = array("I")  # layout id of each row
        self.values: array[float] = array("d")
        self.end: tuple[int, int] | None = None

    def append(self, step: int, attempt: int, now: float, row: dict[str, float]) -> bool:
        """Add one row; True once the buffer holds :attr:`limit` values (time to cut it)."""
        names = tuple(row)
        layout = self.keys.layouts.get(names)
        if layout is None:
            layout = self.keys.layout(names)
        self.steps.append(step)
        self.attempts.append(attempt)
        self.times.append(now)
        self.rows.append(layout)
        self.values.extend(row.values())
        return len(self.values) >= self.limit

    def __len__(self) -> int:
        return len(self.values)

    def step_range(self) -> tuple[int, int]:
        """The lowest and highest step held (0, 0 when empty)."""
        import numpy as np

        if not self.steps:
            return 0, 0
        steps = np.frombuffer(self.steps, dtype=np.int64)
        return int(steps.min()), int(steps.max())

    def counts(self) -> np.ndarray[Any, Any]:
        """Values per row (numpy)."""
        import numpy as np

        if not self.rows:
            return np.zeros(0, np.int64)
        rows = np.frombuffer(self.rows, dtype=np.uint32)
        length = self.keys.arrays(int(rows.max()) + 1)[0]
        return length[rows]  # type: ignore[no-any-return]

    def key_ids_used(self) -> np.ndarray[Any, Any]:
        """The key ids the buffer's rows use, ascending (numpy)."""
        import numpy as np

        if not self.rows:
            return np.zeros(0, np.uint32)
        rows = np.frombuffer(self.rows, dtype=np.uint32)
        length, start, flat = self.keys.arrays(int(rows.max()) + 1)
        layouts = np.flatnonzero(np.bincount(rows))
        return np.unique(np.concatenate([flat[start[i] : start[i] + length[i]] for i in layouts]))

    def _counts_and_kids(self, first_row: int = 0, stop_row: int | None = None) -> tuple[Any, Any]:
        """Values per row, and the key id of each value, for rows ``first_row`` to ``stop_row``."""
        import numpy as np

        if not self.rows:
            return np.zeros(0, np.int64), np.zeros(0, np.uint32)
        rows = np.frombuffer(self.rows, dtype=np.uint32)[first_row:stop_row]
        if not len(rows):
            return np.zeros(0, np.int64), np.zeros(0, np.uint32)
        top = int(rows.max())
        length, start, flat = self.keys.arrays(top + 1)
        counts = length[rows]
        first = int(rows[0])
        if not (rows != first).any():  # one layout throughout (the usual case)
            shape = flat[start[first] : start[first] + length[first]]
            return counts, np.tile(shape, len(rows))
        ends = np.cumsum(counts)
        within = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(ends - counts, counts)
        return counts, flat[np.repeat(start[rows], counts) + within]

    def columns(self, first: int = 0, stop: int | None = None, first_value: int = 0) -> tuple[Any, ...]:
        """``(step, attempt, time, key id, value)``, one entry per value (numpy): of every row, or of
        rows ``first`` up to ``stop``, whose first value is value number ``first_value``."""
        import numpy as np

        stop = len(self.rows) if stop is None else stop
        counts, kids = self._counts_and_kids(first, stop)

        def per_value(column: array[Any], dtype: Any) -> np.ndarray[Any, Any]:
            base = np.frombuffer(column, dtype=dtype)[first:stop] if len(column) else np.zeros(0, dtype)
            return np.repeat(base, counts)

        values = (
            np.frombuffer(self.values, dtype=np.float64)[first_value : first_value + len(kids)]
            if self.values
            else np.zeros(0, np.float64)
        )
        return (
            per_value(self.steps, np.int64),
            per_value(self.attempts, np.int32),
            per_value(self.times, np.float64),
            kids,
            values,
        )

    def latest(self) -> dict[str, float]:
        """The last value of each key in the buffer (for the run's summary).

        Pure Python, walking back from the last row until every layout was met (a few rows, usually):
        a training process whose helper writes the chunks never loads numpy (16 MiB) for this.
        """
        shapes = self.keys.shapes
        layouts = set(self.rows)
        found: dict[str, float] = {}
        names = self.keys.names
        end = len(self.values)
        for row in range(len(self.rows) - 1, -1, -1):
            layout = self.rows[row]
            shape = shapes[layout]
            end -= len(shape)
            if layout not in layouts:
                continue
            layouts.discard(layout)
            for offset, kid in enumerate(shape):
                found.setdefault(names[kid], self.values[end + offset])
            if not layouts:
                break
        return found


# -- reading the session's own spool back ---------------------------------------------------
# the record layout of launchhelm._metrics._spool: u32 length, then the body; a row's body is
# type (2), step, attempt, time, pair count, then (key id, value) pairs
_LEN = struct.Struct("<I")
_ROW_HEAD = struct.Struct("<BqidH")
_PAIR = struct.Struct("<Id")
_ROW = 2
_HEADER_BYTES = 8
#: Spooled rows parsed in one numpy pass (the background thread pauses between passes).
_PARSE_ROWS = 1 << 13


@dataclass
class SpoolPiece:
    """Points read back from the spool, and where the read stopped (the next record)."""

    buffer: PointBuffer
    end: tuple[int, int]


def _row_dtype(pairs: int) -> Any:
    import numpy as np

    names = ["len", "type", "step", "attempt", "time", "pairs"]
    formats: list[Any] = ["<u4", "u1", "<i8", "<i4", "<f8", "<u2"]
    offsets = [0, 4, 5, 13, 17, 25]
    for j in range(pairs):
        names += [f"k{j}", f"v{j}"]
        formats += ["<u4", "<f8"]
        offsets += [27 + 12 * j, 31 + 12 * j]
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": 27 + 12 * pairs})


def _parse(data: bytes | memoryview, stop: int, spool_names: dict[int, str], out: PointBuffer) -> int:
    """Append the row records in ``data[:stop]`` to ``out``; return where parsing stopped.

    Runs of records with the same number of pairs (nearly all of them) are
    read by numpy in one go; the rest one at a time.
    """
    import numpy as np

    keys = out.keys
    ours = np.zeros(max(spool_names, default=-1) + 1, dtype=np.uint32)
    for kid, name in spool_names.items():
        ours[kid] = keys.key_id(name)
    pos = 0
    while pos + 4 <= stop:
        (length,) = _LEN.unpack_from(data, pos)
        if length == 0 or pos + 4 + length > stop:
            break
        if data[pos + 4] != _ROW:  # a key definition: the live spool's table is known already
            pos += 4 + length
            continue
        pairs = _ROW_HEAD.unpack_from(data, pos + 4)[4]
        size = 4 + length
        count = min((stop - pos) // size, _PARSE_ROWS)
        if size == 27 + 12 * pairs and count > 1:
            view = np.frombuffer(data, dtype=_row_dtype(pairs), count=count, offset=pos)
            same = (view["len"] == length) & (view["type"] == _ROW) & (view["pairs"] == pairs)
            n = count if bool(same.all()) else int(np.argmin(same))
            run = view[:n]
            kids = np.stack([run[f"k{j}"] for j in range(pairs)], axis=1).reshape(-1) if n else None
            if n > 1 and kids is not None and int(kids.max(initial=0)) < len(ours):
                out.steps.frombytes(run["step"].astype(np.int64).tobytes())
                out.attempts.frombytes(run["attempt"].astype(np.int32).tobytes())
                out.times.frombytes(run["time"].astype(np.float64).tobytes())
                # each row's layout: the distinct key orders among these rows (nearly always one)
                matrix = ours[kids].reshape(n, pairs)
                if not (matrix != matrix[0]).any():
                    shapes, which = matrix[:1], np.zeros(n, dtype=np.int64)
                else:
                    shapes, which = np.unique(matrix, axis=0, return_inverse=True)
                names = keys.names
                ids = []
                for shape in shapes:
                    row_keys = tuple(names[int(k)] for k in shape)
                    found = keys.layouts.get(row_keys)
                    ids.append(keys.layout(row_keys) if found is None else found)
                out.rows.frombytes(np.asarray(ids, dtype=np.uint32)[which.reshape(-1)].tobytes())
                values = np.stack([run[f"v{j}"] for j in range(pairs)], axis=1).reshape(-1)
                out.values.frombytes(values.astype(np.float64).tobytes())
                pos += n * size
                pause()  # a slice at a time: the training thread gets the GIL between them
                continue
        _, step, attempt, when, pairs = _ROW_HEAD.unpack_from(data, pos + 4)
        row: dict[str, float] = {}
        for j in range(pairs):
            kid, value = _PAIR.unpack_from(data, pos + 4 + _ROW_HEAD.size + j * _PAIR.size)
            known = spool_names.get(kid)
            if known is not None:
                row[known] = value
        if row:
            out.append(step, attempt, when, row)
        pos += size
    return pos


def read_spool(
    directory: Path,
    session_id: str,
    start: tuple[int, int],
    end: tuple[int, int],
    spool_names: dict[int, str],
    max_bytes: int,
) -> Iterator[SpoolPiece]:
    """The rows a live session spooled from ``start`` up to ``end``, in pieces of at most ``max_bytes`` of spool.

    ``spool_names`` maps the spool's key ids to names (the live spool's own
    table, taken with ``end``). Each piece ends on a record boundary. The
    pieces number their keys themselves (the live buffers' table is the
    training thread's).
    """
    import mmap

    keys = KeyIds()
    file, pos = start
    # read into one anonymous map, reused: a new ``bytes`` of several MiB each read would be a large
    # malloc freed at once, which raises glibc's mmap threshold (see metrics._heap)
    block = mmap.mmap(-1, max_bytes)
    while (file, pos) < end:
        path = directory / f"{session_id}-{file:06d}.log"
        stop_in_file = end[1] if file == end[0] else None
        with open(path, "rb") as f:
            f.seek(pos)
            want = max_bytes if stop_in_file is None else min(max_bytes, stop_in_file - pos)
            got = f.readinto(memoryview(block)[:want])
        data = memoryview(block)[:got]
        out = PointBuffer(keys, 1 << 62)
        used = _parse(data, len(data), spool_names, out)
        if used == 0 and stop_in_file is None and (len(data) < max_bytes or _at_end(data)):
            file, pos = file + 1, _HEADER_BYTES  # nothing more in this file: its zero padding
            continue
        pos += used
        if used == 0 and stop_in_file is not None:
            break  # only a partial record before ``end``: cannot happen with an end taken under the log lock
        yield SpoolPiece(out, (file, pos))


def _at_end(data: bytes | memoryview) -> bool:
    return len(data) >= 4 and _LEN.unpack_from(data, 0)[0] == 0
