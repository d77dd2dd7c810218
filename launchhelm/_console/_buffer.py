"""A session's console buffer: bounded, never blocking, flushed with the metric chunks.

Never blocking the training loop, never growing without bound: each session
has a :class:`ConsoleBuffer` of at most :data:`BUFFER_BYTES` (4 MiB) not yet
written. Output arriving when it is full is dropped and counted, and the
next object says so (``[launchhelm: 12,345 lines (3.2 MiB) dropped: output
faster than the store takes it]``). A line longer than :data:`LINE_BYTES`
(64 KiB) keeps its first 64 KiB and a marker saying how much was cut.

Store layout: ``runs/<run>/console/<session>/<n:08d>.txt``, UTF-8 text as
written, each object created (put-if-absent) by the session's background
flush, with the metric chunks (same cadence; nothing written when nothing was
printed). Session ids begin with their start time, so sessions sort in order.
A SIGKILLed process keeps its output up to its last flush.
"""

from __future__ import annotations

import threading

__all__ = ["BUFFER_BYTES", "LINE_BYTES", "ConsoleBuffer"]

BUFFER_BYTES = 4 * 2**20
#: A line longer than this is cut (its first LINE_BYTES kept) with a marker.
LINE_BYTES = 64 * 2**10
#: Bytes of one stream gathered by a buffer before they are split into lines.
_SPLIT_BYTES = 65536


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class _Line:
    """The line a stream is writing: bytes kept but not yet handed on, and how long it is so far."""

    __slots__ = ("cut", "cutting", "held", "length", "skip", "waited")

    def __init__(self) -> None:
        self.held = bytearray()  # at most the line limit
        self.length = 0  # bytes of this line kept so far (held, or handed to a take before its newline)
        self.cutting = False  # past the limit: the rest of the line is dropped
        self.cut = 0  # bytes of it dropped so far
        self.skip = False  # its start was dropped with a flood: drop the rest, up to its newline
        self.waited = False  # it was open at the last take already: the next one hands it on as it is


def _lines_within(data: bytes, start: int, end: int, limit: int) -> bool:
    """Whether every line of ``data[start:end]`` (whole lines) is at most ``limit`` bytes: a few C-level scans."""
    pos = start
    while end - pos > limit:
        nl = data.rfind(b"\n", pos, pos + limit + 1)
        if nl < 0:
            return False
        pos = nl + 1
    return True


class ConsoleBuffer:
    """One session's captured output until its next flush: bounded, never blocking.

    :meth:`feed` runs on the writer's path (the fd reader thread, or a
    ``write`` call), so it only appends under a lock; :meth:`take` hands the
    background flush everything since the last one. Each stream's line is
    assembled apart, so stdout and stderr interleave by whole lines, never
    mid-line (a line still open at a flush is handed on as it is).

    Attributes
    ----------
    dropped_lines, dropped_bytes:
        Totals dropped because the buffer was full (for tests and the marker).
    cut_lines:
        Lines cut at :data:`LINE_BYTES`.
    """

    def __init__(self, limit: int = BUFFER_BYTES, line_limit: int = LINE_BYTES) -> None:
        self.limit = limit
        self.line_limit = line_limit
        self._out = bytearray()  # kept, in order, for the next take
        self._raw: list[bytes] = []  # writes of one stream not yet split into lines (a batch)
        self._raw_size = 0
        self._raw_stream = ""
        self._lines: dict[str, _Line] = {}
        self._pending_lines = 0  # dropped since the last take (for the marker)
        self._pending_bytes = 0
        self._ends_line = True  # what was handed on so far ends with a newline
        self._dropping = False  # full since the last take
        self.dropped_lines = 0
        self.dropped_bytes = 0
        self.cut_lines = 0
        self._lock = threading.Lock()

    def feed(self, data: bytes, stream: str = "stdout") -> None:
        """Keep ``data`` (bytes as ``stream`` wrote them), or count it dropped when the buffer is full.

        The hot path of a Python-level capture (two calls per ``print``):
        consecutive writes of one stream are only appended, and split into
        lines a batch (:data:`_SPLIT_BYTES`) at a time, or when the other
        stream writes, or at the take.
        """
        if not data:
            return
        with self._lock:
            if stream != self._raw_stream:
                if self._raw:
                    self._split()
                self._raw_stream = stream
            self._raw.append(data)
            self._raw_size += len(data)
            if self._raw_size >= _SPLIT_BYTES:
                self._split()

    def _split(self) -> None:
        raw = self._raw
        data = raw[0] if len(raw) == 1 else b"".join(raw)
        raw.clear()
        self._raw_size = 0
        self._lines_of(data, self._raw_stream)

    def _lines_of(self, data: bytes, stream: str) -> None:
        """Split a batch into lines: keep them (cut past the line limit) or drop them when full."""
        if self._dropping or len(self._out) + len(data) > self.limit:
            if not self._dropping:
                # full: drop everything until the next take, and the lines open now with it,
                # so what is kept stays whole lines and the marker marks the one gap
                self._dropping = True
                for open_line in self._lines.values():
                    if open_line.length or open_line.cutting:
                        self._drop(bytes(open_line.held))
                        open_line.held.clear()
                        open_line.length, open_line.cutting, open_line.cut = 0, False, 0
                        open_line.skip = True
            self._drop(data)
            dropped = self._lines.get(stream)
            if dropped is None:
                dropped = self._lines[stream] = _Line()
            dropped.skip = not data.endswith(b"\n")  # mid-line: what follows the gap is no line's start
            return
        line = self._lines.get(stream)
        if line is None:
            line = self._lines[stream] = _Line()
        if line.skip:
            end = data.find(b"\n")
            self._drop(data if end < 0 else data[: end + 1])
            if end < 0:
                return
            line.skip = False
            data = data[end + 1 :]
            if not data:
                return
        last = data.rfind(b"\n")
        if last < 0:
            self._extend(line, data)
            return
        first = data.find(b"\n")
        self._extend(line, data[:first])
        self._end(line)
        if last > first:
            middle = data[first + 1 : last + 1]
            if _lines_within(data, first + 1, last + 1, self.line_limit):  # whole (the usual case)
                self._emit(middle)
            else:
                for piece in middle.split(b"\n")[:-1]:
                    self._extend(line, piece)
                    self._end(line)
        if last + 1 < len(data):
            self._extend(line, data[last + 1 :])

    def _drop(self, data: bytes) -> None:
        lines = data.count(b"\n")
        self._pending_lines += lines
        self._pending_bytes += len(data)
        self.dropped_lines += lines
        self.dropped_bytes += len(data)

    def _emit(self, data: bytes) -> None:
        self._out += data

    def _extend(self, line: _Line, piece: bytes) -> None:
        if line.cutting:
            line.cut += len(piece)
            return
        room = self.line_limit - line.length
        if len(piece) <= room:
            line.held += piece
            line.length += len(piece)
            return
        line.held += piece[:room]
        line.length = self.line_limit
        line.cutting, line.cut = True, len(piece) - room
        self.cut_lines += 1

    def _end(self, line: _Line) -> None:
        out = bytes(line.held)
        if line.cutting:
            out += f" [launchhelm: line cut at {_size(self.line_limit)}, {line.cut:,} bytes dropped]".encode()
        self._emit(out + b"\n")
        line.held.clear()
        line.length, line.cutting, line.cut, line.waited = 0, False, 0, False

    def take(self, final: bool = False) -> bytes | None:
        """Everything kept since the last take (with a marker for what was dropped), or None.

        A line still open waits for its newline until the next take (then,
        or when ``final``, it is handed on as far as it goes: a progress bar
        that never ends its line still shows).
        """
        with self._lock:
            if self._raw:
                self._split()
            for line in self._lines.values():
                if line.held:
                    if final or line.waited:  # hand on what it has (its length counts on)
                        self._emit(bytes(line.held))
                        line.held.clear()
                        line.waited = False
                    else:
                        line.waited = True
            self._dropping = False
            if self._pending_lines or self._pending_bytes:
                ends_line = self._out.endswith(b"\n") if self._out else self._ends_line
                self._out += (
                    ("" if ends_line else "\n")
                    + f"[launchhelm: {self._pending_lines:,} line{'' if self._pending_lines == 1 else 's'} "
                    f"({_size(self._pending_bytes)}) dropped: output faster than the store takes it]\n"
                ).encode()
                self._pending_lines = self._pending_bytes = 0
            if not self._out:
                return None
            data, self._out = bytes(self._out), bytearray()  # the one copy (create takes bytes as they are)
            self._ends_line = data.endswith(b"\n")
            return data

    def put_back(self, data: bytes) -> None:
        """A take the store refused: keep it first in line for the next flush."""
        with self._lock:
            self._out[0:0] = data
