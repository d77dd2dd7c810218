"""The spool: every logged point written to a memory-mapped file on local disk as it is logged.

A store on a shared mapping survives the process's death (SIGKILL, the OOM
killer): the page is the kernel's, and the kernel writes it back. So points
logged in the seconds before a crash are not lost with the in-memory buffer:
when the run is next opened on this host (the resuming session, a reader,
``launchhelm recover``), the spool of a dead session is uploaded as the chunks
its flushes would have written. Only the kernel or the machine going down
loses the spool, and with it at most the flush interval (2 s) of points.

Layout (``$LAUNCHHELM_SPOOL``, default ``~/.cache/launchhelm/spool``)::

    <run>/<session>.json          who wrote it: run, session, store URL, process
    <run>/<session>.state         64 bytes, mmap'd: what the store already has
    <run>/<session>-<k:06d>.log   records, mmap'd, 8 MiB each; deleted once flushed

A record is its body then, written last, its length: a record cut short by
the kill has no length yet and ends the spool. Bodies: a key definition
(``K``, id, name) or a point row (``P``, step, attempt, time, then id/value
pairs). Each file starts by defining every key known, so a file stands alone.

The state file holds the next chunk number and a pending flush (chunk
number, where in the spool it ends) written before the chunk's ``create``,
and the flushed position written after it. Recovery looks up a pending chunk
in the store, so a kill between ``create`` and the state update neither
loses nor repeats a point; recovered chunks get the numbers the session would
have used, so a recovery that repeats one cut short ``create``s the same keys.
On one host, recoveries of a spool take turns (:func:`claim_spool`): the
dead process's helper draining it, and a relaunch or a reader opening the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from launchhelm._locks import flock_within

__all__ = ["Spool", "claim_spool", "recover_run", "recover_runs", "spool_root"]

_log = logging.getLogger("launchhelm")

FILE_BYTES = 8 * 2**20
_HEADER = b"LHSPOOL1"
_LEN = struct.Struct("<I")
_ROW_HEAD = struct.Struct("<BqidH")  # type P, step, attempt, time, pairs
_PAIR = struct.Struct("<Id")
_KEY_HEAD = struct.Struct("<BI")  # type K, id
# state: next chunk number, pending chunk number (-1: none), pending end (file, offset), flushed (file, offset)
_STATE = struct.Struct("<qqqqqq")
STATE = _STATE  # the helper process writes it too, when it flushes (launchhelm._metrics._pickup)
_ROW, _KEY = 2, 1
#: Bytes of the spool faulted in ahead of the writer by the flush thread (see Spool.prepare).
PREFAULT_BYTES = 2**20
_MADV_POPULATE_WRITE = 23  # Linux 5.14+; mmap has no name for it before Python 3.13


def _advise(mm: mmap.mmap, advice: int, start: int, length: int, step: int) -> None:
    """``madvise`` ``length`` bytes from ``start`` (page-aligned), ``step`` bytes a call with pauses between.

    Each call holds the GIL. An error ends it quietly: an older kernel or
    another system lacks the advice, or ``log()`` closed the file meanwhile.
    """
    from launchhelm._metrics._pause import pause

    for at in range(start, start + max(0, length), step):
        try:
            mm.madvise(advice, at, min(step, start + length - at))
        except (OSError, ValueError, AttributeError):
            return
        pause()


def _release(mm: mmap.mmap, start: int, length: int) -> None:
    """Unmap written pages from the process (``MADV_DONTNEED``): the file keeps them.

    On a shared file mapping the page cache holds the data and writes it back;
    only the process's page table lets go, so a spool file's written pages
    stop counting in the resident set long before the file is closed.
    """
    _advise(mm, getattr(mmap, "MADV_DONTNEED", -1), start, length, 2**20)


def _populate(mm: mmap.mmap, start: int, length: int) -> None:
    """Fault in (for writing) ``length`` bytes of ``mm`` from ``start`` (page-aligned), where Linux can."""
    _advise(mm, _MADV_POPULATE_WRITE, start, length, 2**18)


def spool_root() -> Path:
    return Path(os.environ.get("LAUNCHHELM_SPOOL") or Path.home() / ".cache" / "launchhelm" / "spool")


def _structs(pairs: int) -> struct.Struct:
    return struct.Struct("<BqidH" + "Id" * pairs)


class Spool:
    """One session's spool (the writing side). ``append`` runs on ``log()``'s hot path."""

    def __init__(self, run_id: str, session_id: str, meta: dict[str, Any], directory: Path | None = None) -> None:
        self.dir = (directory or spool_root()) / run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.session_id = session_id
        (self.dir / f"{session_id}.json").write_text(json.dumps(meta))
        self._state_fd = os.open(self.dir / f"{session_id}.state", os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self._state_fd, _STATE.size)
        self._state = mmap.mmap(self._state_fd, _STATE.size)
        _STATE.pack_into(self._state, 0, 0, -1, 0, 0, 0, 0)
        self._ids: dict[str, int] = {}
        self._structs: dict[int, struct.Struct] = {}
        self._file = -1
        self._mm: mmap.mmap | None = None
        self._fd = -1
        self._pos = 0
        self._lock = threading.Lock()  # rotation and closing against the flush thread
        self._ready: list[tuple[int, mmap.mmap, int]] = []  # the next file, made ready by prepare()
        self._made = -1  # the highest file number made so far
        self._removed = 0  # files below this number are deleted
        self._retired: list[tuple[mmap.mmap, int]] = []  # ready files not used, unmapped by retire()
        self._released = (-1, 0)  # (file, offset): its pages before offset are unmapped (see prepare)
        self._open_next()

    # -- files ----------------------------------------------------------------------
    def _path(self, k: int) -> Path:
        return self.dir / f"{self.session_id}-{k:06d}.log"

    def _map(self, k: int) -> tuple[mmap.mmap, int]:
        fd = os.open(self._path(k), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, FILE_BYTES)
        # written, not stored through the map: a new file's first page can wait milliseconds on the
        # file system, and a store through the map would wait holding the GIL
        os.pwrite(fd, _HEADER, 0)
        return mmap.mmap(fd, FILE_BYTES), fd

    def _open_next(self) -> None:
        """Move on to the next file: the one the flush thread made ready, if it did (creating a file
        can wait on the file system's journal: better not in ``log()``).

        The file left behind is unmapped here and now (a fraction of a millisecond, once per file):
        kept mapped until the next flush, a burst's written pages would all count in the RSS."""
        k = self._file + 1
        try:
            ready: tuple[int, mmap.mmap, int] | None = self._ready.pop()  # atomic: no lock in log()
        except IndexError:
            ready = None
        if ready is not None and ready[0] == k:
            _, mm, fd = ready
        else:
            if ready is not None:
                self._retired.append(ready[1:])
            with self._lock:  # the flush thread may be making this very file ready
                try:
                    ready = self._ready.pop()
                except IndexError:
                    ready = None
                if ready is not None and ready[0] == k:
                    _, mm, fd = ready
                else:
                    if ready is not None:
                        self._retired.append(ready[1:])
                    mm, fd = self._map(k)
                    self._made = max(self._made, k)
                    if k == 0:
                        # the first file is made in init: its first pages faulted in now, else the first
                        # log() to reach each one waits on the file system (ms) holding the GIL, until
                        # the first flush's prepare() faults pages in ahead
                        _populate(mm, 0, PREFAULT_BYTES)
        old_mm, old_fd = self._mm, self._fd
        self._file = k
        self._mm, self._fd, self._pos = mm, fd, len(_HEADER)
        if old_mm is not None:
            old_mm.close()
            os.close(old_fd)
        for key, kid in self._ids.items():  # each file defines every key it may use
            self._write_key(key, kid)

    def prepare(self) -> None:
        """From the flush thread: make the next file ready, and fault in the pages the next appends
        will write, so ``log()`` finds them mapped."""
        self.retire()
        with self._lock:
            mm = self._mm
            if mm is None:
                return  # closed
            k = self._file + 1
            # never a file made before (log() may be moving onto it right now, without the lock)
            if not self._ready and k > self._made and self._pos > FILE_BYTES // 2:
                ready = (k, *self._map(k))
                self._made = k
                _populate(ready[1], 0, PREFAULT_BYTES)
                self._ready.append(ready)
            file = self._file
            start = self._pos & ~(mmap.PAGESIZE - 1)
            _populate(mm, start, min(FILE_BYTES, start + PREFAULT_BYTES) - start)
            # pages behind the writer are never written again: out of the resident set with them
            done = self._released[1] if self._released[0] == file else 0
            if start - done >= PREFAULT_BYTES:
                _release(mm, done, start - done)
                self._released = (file, start)
        self.retire()

    def retire(self) -> None:
        """Unmap and close ready files a rotation did not use."""
        while True:
            try:
                mm, fd = self._retired.pop()
            except IndexError:  # none left (or another thread took the last)
                return
            mm.close()
            os.close(fd)

    def _write_key(self, key: str, kid: int) -> None:
        raw = key.encode()
        body = _KEY_HEAD.pack(_KEY, kid) + raw
        self._commit(body)

    def _commit(self, body: bytes) -> None:
        mm, pos = self._mm, self._pos
        assert mm is not None
        end = pos + 4 + len(body)
        if end + 4 > FILE_BYTES:
            self._open_next()
            mm, pos = self._mm, self._pos
            assert mm is not None
            end = pos + 4 + len(body)
        mm[pos + 4 : end] = body
        _LEN.pack_into(mm, pos, len(body))  # last: the record counts from now on
        self._pos = end

    # -- the hot path ------------------------------------------------------------------
    def append(self, step: int, attempt: int, now: float, row: dict[str, float]) -> None:
        """Record one ``log()`` call (the caller holds its buffer lock)."""
        ids = self._ids
        values: list[Any] = [_ROW, step, attempt, now, len(row)]
        for key, value in row.items():
            kid = ids.get(key)
            if kid is None:
                kid = ids[key] = len(ids)
                self._write_key(key, kid)
            values.append(kid)
            values.append(value)
        packer = self._structs.get(len(row))
        if packer is None:
            packer = self._structs[len(row)] = _structs(len(row))
        size = packer.size
        mm, pos = self._mm, self._pos
        if mm is None:
            return  # closed: the session ended
        if pos + 8 + size > FILE_BYTES:
            self._open_next()
            mm, pos = self._mm, self._pos
            assert mm is not None
        packer.pack_into(mm, pos + 4, *values)
        _LEN.pack_into(mm, pos, size)
        self._pos = pos + 4 + size

    def key_names(self) -> dict[int, str]:
        """The spool's key ids and names so far. Call under the same lock as ``append``."""
        return {kid: key for key, kid in self._ids.items()}

    def position(self) -> tuple[int, int]:
        """Where the next record goes: (file, offset). Call under the same lock as ``append``."""
        return self._file, self._pos

    # -- flushing -------------------------------------------------------------------------
    def pending(self, number: int, end: tuple[int, int], next_number: int) -> None:
        """Before a chunk's ``create``: it is number ``number`` and holds the spool up to ``end``."""
        flushed = _STATE.unpack_from(self._state, 0)[4:6]
        _STATE.pack_into(self._state, 0, next_number, number, end[0], end[1], *flushed)

    def flushed(self, end: tuple[int, int], next_number: int) -> None:
        """After the chunk landed: the store has every point up to ``end``; drop files wholly before it."""
        _STATE.pack_into(self._state, 0, next_number, -1, 0, 0, end[0], end[1])
        self.retire()
        for k in range(self._removed, end[0]):  # from the last one deleted: a flood's spool has hundreds
            try:
                self._path(k).unlink()
            except FileNotFoundError:
                pass
        self._removed = max(self._removed, end[0])

    def state(self) -> tuple[int, int, tuple[int, int], tuple[int, int]]:
        """The state file as it stands: next chunk number, pending chunk (-1: none) and its end, flushed end."""
        return state_of(self._state)

    def close(self, *, remove: bool, keep_media: bool = False) -> None:
        """End of the session: with ``remove`` (every point is in the store), delete the spool.

        With ``keep_media``, spilled media files stay (the store did not take them in time), and so
        do the files a recovery needs to find them; the session is marked ended, so that a recovery
        takes them while this process still runs.
        """
        with self._lock:
            if self._mm is not None:
                self._mm.close()
                os.close(self._fd)
                self._mm = None
            self._retired += [r[1:] for r in self._ready]
            self._ready.clear()
            self.retire()
            self._state.close()
            os.close(self._state_fd)
        if remove:
            from launchhelm.media._spill import spill_paths

            media = keep_media and bool(spill_paths(self.dir, self.session_id))
            if media:
                meta_path = self.dir / f"{self.session_id}.json"
                meta = json.loads(meta_path.read_text())
                meta_path.write_text(json.dumps({**meta, "ended": True}))
            for path in self.dir.glob(f"{self.session_id}*"):
                if media and (".media-" in path.name or path.suffix in (".json", ".state")):
                    continue
                path.unlink(missing_ok=True)
            try:
                self.dir.rmdir()
            except OSError:
                pass  # other sessions' spools are there


# -- recovery ----------------------------------------------------------------------------
def _records(path: Path, start: int) -> tuple[list[tuple[int, int, float, dict[int, float]]], dict[int, str]]:
    rows: list[tuple[int, int, float, dict[int, float]]] = []
    keys: dict[int, str] = {}
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return rows, keys
    if not data.startswith(_HEADER):
        return rows, keys
    pos = len(_HEADER)
    while pos + 4 <= len(data):
        (length,) = _LEN.unpack_from(data, pos)
        if length == 0 or pos + 4 + length > len(data):
            break  # the end, or a record the kill cut short
        body = data[pos + 4 : pos + 4 + length]
        kind = body[0]
        if kind == _KEY:
            _, kid = _KEY_HEAD.unpack_from(body, 0)
            keys[kid] = body[_KEY_HEAD.size :].decode()
        elif kind == _ROW and pos >= start:
            _, step, attempt, when, pairs = _ROW_HEAD.unpack_from(body, 0)
            values = {}
            for i in range(pairs):
                kid, value = _PAIR.unpack_from(body, _ROW_HEAD.size + i * _PAIR.size)
                values[kid] = value
            rows.append((step, attempt, when, values))
        pos += 4 + length
    return rows, keys


def state_of(page: Any) -> tuple[int, int, tuple[int, int], tuple[int, int]]:
    """A state file's fields from its mapped page: next chunk number, pending chunk and its end, flushed end.

    The flushed end is a record's position: a fresh state's (0, 0) is the first file's first record.
    """
    next_number, pending, pf, po, ff, fo = _STATE.unpack_from(page, 0)
    return next_number, pending, (pf, max(po, len(_HEADER))), (ff, max(fo, len(_HEADER)))


def resume_point(
    store: Any, run_id: str, session_id: str, state: tuple[int, int, tuple[int, int], tuple[int, int]]
) -> tuple[int, tuple[int, int]]:
    """Where a writer taking a live spool over goes on: the next chunk number and the flushed end.

    A pending chunk (a writer killed between its pending mark and its flushed one) is looked up:
    if it landed, its points are stored; if not, its number is free again.
    """
    next_number, pending, pending_end, flushed = state
    if pending >= 0:
        if chunk_lookup(store, run_id, session_id)(pending):
            return max(next_number, pending + 1), pending_end
        return pending, flushed
    return next_number, flushed


def _read_state(path: Path) -> tuple[int, int, tuple[int, int], tuple[int, int]] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < _STATE.size:
        return None
    next_number, pending, pf, po, ff, fo = _STATE.unpack_from(raw, 0)
    return next_number, pending, (pf, po), (ff, fo)


def recover_session(
    store: Any, run_id: str, session_id: str, directory: Path, chunk_exists: Callable[[int], bool]
) -> int:
    """Upload what a dead session spooled but never flushed; return the points recovered."""
    from launchhelm._exceptions import AlreadyExistsError
    from launchhelm._metrics._points import chunk_key, encode_chunk

    state = _read_state(directory / f"{session_id}.state")
    if state is None:
        return 0
    next_number, pending, pending_end, flushed = state
    if pending >= 0 and chunk_exists(pending):
        flushed, next_number = pending_end, max(next_number, pending + 1)
    elif pending >= 0:
        next_number = pending  # the flush never landed: its chunk is ours to write
    files = sorted(directory.glob(f"{session_id}-*.log"))
    rows_out = []
    for path in files:
        k = int(path.stem.rsplit("-", 1)[1])
        if k < flushed[0]:
            continue
        rows, keys = _records(path, flushed[1] if k == flushed[0] else 0)
        rows_out += [(s, a, t, {keys[kid]: v for kid, v in vals.items() if kid in keys}) for s, a, t, vals in rows]
    rows_out = [r for r in rows_out if r[3]]
    recovered = 0
    # as the flushes would have: a chunk per 10,000 rows at most
    for start in range(0, len(rows_out), 10_000):
        batch = rows_out[start : start + 10_000]
        first, last = min(r[0] for r in batch), max(r[0] for r in batch)
        try:
            store.create(chunk_key(run_id, session_id, next_number, first, last), encode_chunk(batch))
        except AlreadyExistsError:
            pass  # another recovery of this spool got there first
        next_number += 1
        recovered += sum(len(r[3]) for r in batch)
    return recovered


def chunk_lookup(store: Any, run_id: str, session_id: str) -> Callable[[int], bool]:
    """Whether the session's chunk ``n`` landed: listed, or covered by the newest manifest (compacted, collected)."""
    from launchhelm._metrics._layout import list_metrics, read_manifest

    found: dict[str, Any] = {}

    def exists(number: int) -> bool:
        if not found:
            listing = list_metrics(store, run_id)
            found["numbers"] = {c.number for c in listing.chunks if c.dir == session_id}
            found["covered"] = read_manifest(store, run_id, listing.newest_manifest).covered.get(session_id, -1)
        return number in found["numbers"] or number <= int(found["covered"])

    return exists


#: Seconds a recovery waits for another one of the same spool (a helper draining it) before leaving it.
CLAIM_WAIT = 60.0


@contextlib.contextmanager
def claim_spool(directory: Path, session_id: str, wait: float = CLAIM_WAIT) -> Iterator[bool]:
    """Hold a dead session's spool for recovery; yields False if there is nothing left to recover.

    Two recoveries of one spool on one host (a killed process's helper draining it, and a
    relaunch or a reader opening the run) would otherwise race: the second could read files the
    first is deleting and ``create`` a chunk number with other rows. An ``flock`` on the state file
    serialises them; the second then finds the file unlinked (the first finished) and skips it.
    The kernel releases the lock when its holder dies, so a killed recovery blocks nobody.
    """
    try:
        fd = os.open(directory / f"{session_id}.state", os.O_RDWR)
    except FileNotFoundError:
        yield False
        return
    try:
        if not flock_within(fd, wait, 0.05):
            _log.debug("spool of session %s is held by another recovery: left to it", session_id)
            yield False
            return
        yield os.fstat(fd).st_nlink > 0  # unlinked: the holder before us recovered it
    finally:
        os.close(fd)  # releases the lock


def recover_runs(store: Any, run_ids: list[str]) -> int:
    """:func:`recover_run` for each of ``run_ids`` with a spool on this host (a directory lookup each)."""
    root = spool_root()
    if not root.is_dir():
        return 0
    return sum(recover_run(store, run_id, root) for run_id in run_ids if (root / run_id).is_dir())


def recover_run(store: Any, run_id: str, directory: Path | None = None) -> int:
    """Recover every dead (or ended) session's spool of ``run_id`` on this host; return points and media stored.

    A spool whose session's process still runs is left alone, and so is one
    written for another store.
    """
    from launchhelm._runlog._liveness import process_state
    from launchhelm.media._recover import recover_media

    base = (directory or spool_root()) / run_id
    if not base.is_dir():
        return 0
    total = 0
    for meta_path in sorted(base.glob("*.json")):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        session_id = str(meta.get("session", meta_path.stem))
        if meta.get("store") != store.url:
            continue
        if not meta.get("ended") and process_state(dict(meta.get("process") or {})) != "dead":
            continue  # a live session's spool is its own
        with claim_spool(base, session_id) as claimed:
            if not claimed:
                continue  # recovered by whoever held it (a helper draining it), or still being recovered
            exists = chunk_lookup(store, run_id, session_id)
            try:
                total += recover_session(store, run_id, session_id, base, exists)
                total += recover_media(store, run_id, session_id, base)
            except Exception as exc:  # keep the spool for the next try
                _log.warning("could not recover the spooled metrics of run %s session %s: %s", run_id, session_id, exc)
                continue
            for path in base.glob(f"{session_id}*"):
                path.unlink(missing_ok=True)
    try:
        base.rmdir()
    except OSError:
        pass
    return total
