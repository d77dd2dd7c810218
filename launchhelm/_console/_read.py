"""Reading a run's console log back: listing its objects, the whole text, its tail, following it live."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launchhelm.storage import Store
from launchhelm.storage._keys import console_prefix, parse_console_name, parse_fence_name

__all__ = ["ConsoleFollower", "list_console", "read_console"]

# -- reading -----------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class ConsolePart:
    """One console object: sessions in start order, then in the order the session wrote them."""

    session: str
    number: int
    key: str


def list_console(store: Store, run_id: str) -> list[ConsolePart]:
    """One listing of ``runs/<id>/console/``: every object, in order."""
    prefix = console_prefix(run_id)
    parts = []
    fences: dict[str, int] = {}
    for name in store.list(prefix):
        parsed = parse_console_name(name)
        if parsed is None:
            fence = parse_fence_name(name)
            if fence is not None:
                fences[fence[0]] = min(fences.get(fence[0], fence[1]), fence[1])
            continue
        session, number = parsed
        parts.append(ConsolePart(session, number, f"{prefix}/{name}"))
    if fences:  # a fenced session's parts past its watermark were printed after a newer attempt took over
        parts = [p for p in parts if p.number < fences.get(p.session, p.number + 1)]
    parts.sort()
    return parts


def sessions_of(parts: Iterable[ConsolePart]) -> list[str]:
    return sorted({p.session for p in parts})


def _join(parts: list[ConsolePart], found: Mapping[str, bytes | None]) -> str:
    """The text of ``parts`` (read into ``found``), a newline between sessions that did not end a line."""
    texts: list[str] = []
    session: str | None = None
    decoder: codecs.IncrementalDecoder | None = None
    ends_line = True
    for part in parts:
        data = found.get(part.key)
        if data is None:
            continue
        if part.session != session:
            if decoder is not None:
                texts.append(decoder.decode(b"", final=True))
            if not ends_line:
                texts.append("\n")
            session = part.session
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
        if data:
            assert decoder is not None  # the first part's session differs from None: it set one
            texts.append(decoder.decode(data))
            ends_line = data.endswith(b"\n")
    if decoder is not None:
        texts.append(decoder.decode(b"", final=True))
    return "".join(texts)


def last_lines(text: str, n: int) -> str:
    """The last ``n`` lines of ``text`` (a final line without newline counts)."""
    if n <= 0:
        return ""
    end = len(text) - 1 if text.endswith("\n") else len(text)
    start = end
    for _ in range(n):
        start = text.rfind("\n", 0, start)
        if start < 0:
            return text
    return text[start + 1 :]


def _tail(store: Store, parts: list[ConsolePart], n: int) -> str:
    """The last ``n`` lines, reading objects from the end in growing concurrent batches."""
    if n <= 0 or not parts:
        return ""
    found: dict[str, bytes | None] = {}
    taken = 0
    while True:
        more = min(len(parts), max(4, 2 * taken))
        found.update(store.read_many([p.key for p in parts[len(parts) - more : len(parts) - taken]]))
        taken = more
        text = _join(parts[len(parts) - taken :], found)
        if text.count("\n") > n or taken == len(parts):
            return last_lines(text, n)


def read_console(store: Store, run_id: str, session: str | None = None, tail: int | None = None) -> str:
    """What the run's sessions printed (``session``: only that one), or its last ``tail`` lines."""
    parts = list_console(store, run_id)
    if session is not None:
        parts = [p for p in parts if p.session == session]
    if tail is not None:
        return _tail(store, parts, tail)
    return _join(parts, store.read_many([p.key for p in parts]))


class ConsoleFollower:
    """Reads a run's console as it grows: each :meth:`poll` returns only what is new.

    A poll costs one listing plus one concurrent read of the objects not yet
    seen (none when nothing was printed). The first poll returns the last
    ``tail`` lines (all with ``tail=None``).
    """

    def __init__(self, store: Store, run_id: str, tail: int | None = None) -> None:
        self._store = store
        self._run_id = run_id
        self._tail = tail
        self._seen: set[str] = set()
        self._session: str | None = None
        self._decoder: codecs.IncrementalDecoder | None = None
        self._ends_line = True
        self._first = True

    def poll(self) -> str:
        """The text written since the last poll ("" when nothing new)."""
        parts = [p for p in list_console(self._store, self._run_id) if p.key not in self._seen]
        if not parts:
            return ""
        if self._first and self._tail is not None:
            self._first = False
            text = _tail(self._store, parts, self._tail)
            self._seen.update(p.key for p in parts)
            self._session = parts[-1].session
            self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
            self._ends_line = not text or text.endswith("\n")
            return text
        self._first = False
        found = self._store.read_many([p.key for p in parts])
        out: list[str] = []
        for part in parts:
            data = found.get(part.key)
            if data is None:
                break  # not readable yet (it was listed): take it and what follows next time
            self._seen.add(part.key)
            if part.session != self._session:
                if self._decoder is not None:
                    out.append(self._decoder.decode(b"", final=True))
                if not self._ends_line:
                    out.append("\n")
                self._session = part.session
                self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
            assert self._decoder is not None  # set with ``_session``, which the first part's differs from
            piece = self._decoder.decode(data)
            out.append(piece)
            if piece:
                self._ends_line = piece.endswith("\n")
        return "".join(out)
