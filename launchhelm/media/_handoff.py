"""Media the training process hands to its helper process: encoded, stored and indexed there.

With a helper, the training process's media thread only writes each ``log()``
call's items to the spool as ``<session>.media-h<seq>.lhm`` (the spilled
files' format, :mod:`launchhelm.media._spill`): one large write that releases
the GIL. The helper's :class:`HandoffStorer` picks the files up as they come,
encodes and ``create`` s the objects, writes one index chunk per run of
consecutive files, and deletes the files.

Index chunks of handed files are numbered :data:`HANDOFF_BASE` plus the
files' numbers: chunk ``HANDOFF_BASE+a .. HANDOFF_BASE+b`` holds the rows of
files ``a..b``, far from the session's own chunks (from 0) and the recovered
ones (:data:`~launchhelm.media._spill.RECOVERED_BASE`). The chunk is the
commit: a file whose number an index object covers is stored already and
only deleted, so a helper killed between its chunk and its deletes (or
mid-file) and replaced stores every file exactly once. Chunks are merged
:data:`~launchhelm.media._index.FANOUT` at a time while they are adjacent,
so a live run's index stays a few objects per level.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launchhelm._exceptions import AlreadyExistsError
from launchhelm._locks import flock_within
from launchhelm.media._index import FANOUT, IndexRow, encode_index, merge_tables
from launchhelm.media._spill import RECOVERED_BASE, is_handoff, read_spilled, spill_paths
from launchhelm.media._writer import object_name, store_items
from launchhelm.storage._keys import media_index_key, media_index_prefix, media_object_key, parse_media_index_name

__all__ = ["HANDOFF_BASE", "MAX_FILES", "HandoffStorer", "handed_files", "merge_spans", "store_handoff"]

_log = logging.getLogger("launchhelm")

#: Index chunk numbers of handed files start here (a session's own never get near it; recovered ones are above).
HANDOFF_BASE = 20_000_000
#: Files per index chunk at most: a backlog after an outage is indexed in pieces, each a commit.
MAX_FILES = 32
#: Object names a storer remembers having stored (a bound on its memory, not a cache to tune).
_CREATED_KEPT = 4096


#: Seconds a storer (or a seal) waits for another storer of the same session before leaving the work to it.
STORER_WAIT = 60.0


@contextlib.contextmanager
def one_storer(directory: Path, session_id: str, wait: float = STORER_WAIT) -> Iterator[bool]:
    """Hold the session's handed files for storing; yields False if another storer kept them ``wait`` s.

    Two storers at once (the helper still at work after ``finish()`` gave up
    waiting, and a ``launchhelm recover``; or a drain beside the pickup) would
    each index the files they read before the other deleted them: chunks whose
    spans overlap, and a seal whose span crosses a chunk still being written, so
    readers would skip the rows in it. An ``flock`` on the run's spool folder
    (which lives as long as the files; a few sessions of one run on one host
    take turns, which costs nothing) keeps them in turn; the kernel lets go of
    it when its holder dies.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        yield False  # the spool is gone: nothing is left to store
        return
    try:
        yield flock_within(fd, wait, 0.02)
    finally:
        os.close(fd)  # releases the lock


def handed_files(directory: Path, session_id: str) -> list[tuple[int, Path]]:
    """The session's files handed to the helper and not stored yet, oldest first."""
    return [(seq, path) for seq, path in spill_paths(directory, session_id) if is_handoff(path)]


class HandoffStorer:
    """Stores one session's handed files; one at a time per session (the helper, or its stand-in)."""

    def __init__(self, store: Any, run_id: str, session_id: str, directory: Path) -> None:
        self.store = store
        self.run_id = run_id
        self.session_id = session_id
        self.directory = directory
        self._covered: list[tuple[int, int]] | None = None  # file numbers the index holds, listed once
        self._stack: list[tuple[int, int, int, bytes | None]] = []  # (first, last, level, bytes) to merge
        self._garbage: list[tuple[float, list[str]]] = []
        self._bad: set[Path] = set()  # files that cannot be read: said once, left for a person
        self._created: set[str] = set()  # objects this storer created or found: not sent again
        self.stored = 0

    def _load(self) -> list[tuple[int, int]]:
        if self._covered is None:
            covered = []
            for rest in self.store.list(f"{media_index_prefix(self.run_id)}/{self.session_id}"):
                parsed = parse_media_index_name(f"{self.session_id}/{rest}")
                if parsed is not None and HANDOFF_BASE <= parsed[1] <= parsed[2] < RECOVERED_BASE:
                    covered.append((parsed[1] - HANDOFF_BASE, parsed[2] - HANDOFF_BASE))
            self._covered = covered
        return self._covered

    def _is_covered(self, seq: int) -> bool:
        return any(first <= seq <= last for first, last in self._load())

    def step(self, wait: float = STORER_WAIT) -> int:
        """Store the files there now (in runs of consecutive numbers); return the items stored."""
        if not self._present():
            return 0
        with one_storer(self.directory, self.session_id, wait) as mine:
            if not mine:
                return 0
            self._covered = None  # another storer may have indexed files meanwhile: one listing
            return self._step()

    def _present(self) -> list[tuple[int, Path]]:
        return [(seq, path) for seq, path in handed_files(self.directory, self.session_id) if path not in self._bad]

    def _step(self) -> int:
        present = self._present()
        todo: list[tuple[int, Path]] = []
        for seq, path in present:
            if self._is_covered(seq):
                path.unlink(missing_ok=True)  # indexed by a helper killed before its deletes
            else:
                todo.append((seq, path))
        stored = 0
        run: list[tuple[int, Path]] = []
        for seq, path in todo:
            if run and (seq != run[-1][0] + 1 or len(run) >= MAX_FILES):
                stored += self._store_run(run)
                run = []
            run.append((seq, path))
        if run:
            stored += self._store_run(run)
        return stored

    def _put(self, data: bytes, extension: str) -> str:
        name = object_name(data, extension)
        if name in self._created:
            return name  # the same picture logged again: the object is there (and indexed, so gc keeps it)
        try:
            self.store.create(media_object_key(self.run_id, name), data)
        except AlreadyExistsError:
            pass  # the same content, logged (or stored by a helper killed mid-file) before
        if len(self._created) >= _CREATED_KEPT:
            self._created.clear()
        self._created.add(name)
        return name

    def _store_run(self, run: list[tuple[int, Path]]) -> int:
        done: list[tuple[int, Path, list[IndexRow]]] = []
        for seq, path in run:
            try:
                key, step, attempt, when, items = read_spilled(path)
            except FileNotFoundError:
                continue  # a fenced session's spool deleted meanwhile
            except (ValueError, KeyError, TypeError) as exc:
                _log.warning("launchhelm: left %s in the spool: %s", path, exc)
                self._bad.add(path)
                continue
            done.append((seq, path, store_items(self._put, key, step, attempt, when, items)))
        # consecutive numbers only: a chunk's span never covers a file it does not hold
        stored = 0
        piece: list[tuple[int, Path, list[IndexRow]]] = []
        for entry in done:
            if piece and entry[0] != piece[-1][0] + 1:
                stored += self._commit(piece)
                piece = []
            piece.append(entry)
        if piece:
            stored += self._commit(piece)
        return stored

    def _commit(self, piece: list[tuple[int, Path, list[IndexRow]]]) -> int:
        first, last = piece[0][0], piece[-1][0]
        rows = [row for _, _, file_rows in piece for row in file_rows]
        data = encode_index(rows)
        try:
            self.store.create(self._key(first, last), data)
        except AlreadyExistsError:
            pass  # the same files, indexed by an earlier try
        self._load().append((first, last))
        for _, path, _ in piece:
            path.unlink(missing_ok=True)
        self._stack.append((first, last, 0, data))
        self._merge()
        self.stored += len(rows)
        return len(rows)

    def _merge(self) -> None:
        """Merge the newest :data:`FANOUT` chunks while they are adjacent and of one level."""
        while len(self._stack) >= FANOUT:
            tail = self._stack[-FANOUT:]
            level = tail[0][2]
            if any(entry[2] != level for entry in tail):
                return
            if any(tail[i + 1][0] != tail[i][1] + 1 for i in range(FANOUT - 1)):
                del self._stack[:-1]  # not adjacent (a file stored elsewhere): merge from the newest on
                return
            keys = [self._key(first, last) for first, last, _, _ in tail]
            missing = [key for key, entry in zip(keys, tail, strict=True) if entry[3] is None]
            fetched = self.store.read_many(missing) if missing else {}
            datas = [
                entry[3] if entry[3] is not None else fetched.get(key) for key, entry in zip(keys, tail, strict=True)
            ]
            if any(data is None for data in datas):
                del self._stack[-FANOUT:]  # one was deleted by hand: readers still find the others
                return
            merged = encode_index(merge_tables([d for d in datas if d is not None]))
            first, last = tail[0][0], tail[-1][1]
            try:
                self.store.create(self._key(first, last), merged)
            except AlreadyExistsError:
                pass
            del self._stack[-FANOUT:]
            self._stack.append((first, last, level + 1, merged if level == 0 else None))
            self._garbage.append((time.time(), keys))
        self._collect()

    def _key(self, first: int, last: int) -> str:
        return media_index_key(self.run_id, self.session_id, HANDOFF_BASE + first, HANDOFF_BASE + last)

    def _collect(self) -> None:
        from launchhelm._metrics._compact import compaction_grace

        grace = compaction_grace()
        now = time.time()
        old = [keys for when, keys in self._garbage if now - when >= grace]
        if old:
            self.store.delete_many([key for keys in old for key in keys])
            self._garbage = [(when, keys) for when, keys in self._garbage if now - when < grace]


def store_handoff(store: Any, run_id: str, session_id: str, directory: Path, wait: float = STORER_WAIT) -> int:
    """Store every handed file of a session in this process (recovery, or no helper to do it); the items stored."""
    storer = HandoffStorer(store, run_id, session_id, directory)
    total = 0
    while True:
        stored = storer.step(wait)
        total += stored
        if not stored:
            return total


def seal_handed(
    store: Any, run_id: str, session_id: str, directory: Path | None = None, wait: float = STORER_WAIT
) -> None:
    """Merge a session's index objects of handed files into one (at its end, once none is left to store).

    The objects merged away are deleted by ``launchhelm gc`` after the grace period, as the seal's own.
    """
    with one_storer(directory, session_id, wait) if directory is not None else contextlib.nullcontext(True) as mine:
        if not mine:
            return  # a storer is still at work: the index stays a few objects, read as they are
        merge_spans(store, run_id, session_id, HANDOFF_BASE, RECOVERED_BASE)


def merge_spans(store: Any, run_id: str, session_id: str, low: int, high: int) -> None:
    """Merge the session's index objects numbered in ``[low, high)`` into one per run of adjacent spans."""
    from launchhelm._metrics._compact import compaction_grace
    from launchhelm.media._index import choose_index_objects

    prefix = media_index_prefix(run_id)
    names = [f"{session_id}/{rest}" for rest in store.list(f"{prefix}/{session_id}")]
    ours = [n for n in names if (p := parse_media_index_name(n)) and low <= p[1] < high]
    # a merged object's name claims every file of its span: only spans with no gap are merged (files
    # not indexed yet, or stored elsewhere, must not be hidden behind one)
    spans: list[list[tuple[str, str, int, int]]] = []
    for chosen in choose_index_objects(ours):
        if spans and chosen[2] == spans[-1][-1][3] + 1:
            spans[-1].append(chosen)
        else:
            spans.append([chosen])
    for span in spans:
        if len(span) < 2:
            continue
        keys = [f"{prefix}/{name}" for name, _, _, _ in span]
        fetched = store.read_many(keys)
        if any(fetched.get(key) is None for key in keys):
            continue  # one was deleted by hand: readers still find the others
        merged = encode_index(merge_tables([fetched[key] for key in keys]))
        try:
            store.create(media_index_key(run_id, session_id, span[0][2], span[-1][3]), merged)
        except AlreadyExistsError:
            pass
        if compaction_grace() <= 0:  # as the session's own seal: what it merged goes now, else `launchhelm gc`
            store.delete_many(keys)
