"""torch's flight recorder in a hang's record (issue 42): asked for by the helper, read in the training process.

``torch.distributed`` keeps a ring of the collectives each process entered, its
flight recorder (torch 2.13 keeps one for gloo and NCCL, on by default:
``TORCH_FR_BUFFER_SIZE`` entries, 0 turns it off; LaunchHelm never sets it).
Reading it is a Python call: it needs the GIL, so faulthandler's C handler
cannot take it. :class:`RecorderRelay` is a daemon thread of the training
process blocked in ``os.read`` on a FIFO (a blocked read holds no GIL: it
costs nothing while idle and is nowhere near the step path). At a hang the
helper writes a byte there and waits a bounded time for the dump to appear
beside it (:func:`request_recorder`). A stuck call that keeps the GIL keeps
the thread from answering: the record then says the recorder was not read,
and the rest of the hang is handled as without it.

The helper stores the dump as torch gives it (``rank-<r>.fr.json``) and notes
in the rank's stacks file the last collective the rank entered in each
process group (:func:`recorder_note`); rank 0's helper names the ranks behind
the others from those notes (:func:`describe_collectives`), without reading
every rank's dump.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypedDict

__all__ = [
    "RECORDER_SECONDS",
    "Collective",
    "RecorderNote",
    "RecorderRelay",
    "describe_collectives",
    "read_recorder_note",
    "recorder_line",
    "recorder_note",
    "request_recorder",
]

#: Seconds the helper waits for the training process's answer.
RECORDER_SECONDS = 5.0
_REQUEST, _STOP = b"d", b"q"
_FIFO, _TRACE, _ERROR = "request", "trace.json", "error.txt"
#: How a rank's stacks file (``rank-<r>.txt``) carries its note, on the line after the training thread's.
_NOTE_PREFIX = "flight recorder: "


class Collective(TypedDict):
    """One collective of a flight recorder, as the record compares them across ranks."""

    seq: int  # torch's collective_seq_id: the same collective has the same number on every rank of its group
    name: str  # its profiling_name, e.g. "gloo:all_reduce"
    state: str  # torch's state ("scheduled", "started", "completed")
    retired: bool  # torch's: the work finished


class RecorderNote(TypedDict, total=False):
    """A rank's flight recorder in brief: its dump's name and last collective per process group, or why none."""

    stored: str  # the dump's object name, beside the stacks file
    last: str  # the process group of the last collective the rank entered
    groups: dict[str, Collective]  # by process group: the collective with the highest number
    error: str  # why there is no dump


class RecorderRelay:
    """The training process's side: a daemon thread that dumps torch's flight recorder when the helper asks.

    ``dump`` returns the recorder's JSON (``launchhelm.torch`` passes torch's
    own call); ``directory`` is the helper's to know (:class:`WatchdogConfig`'s
    ``recorder``): the FIFO it writes to and the files the answer goes to.
    """

    def __init__(self, dump: Callable[[], bytes], parent: str | None = None) -> None:
        self.directory = tempfile.mkdtemp(prefix="launchhelm-fr-", dir=parent)
        fifo = os.path.join(self.directory, _FIFO)
        os.mkfifo(fifo, 0o600)
        # opened for reading and writing: the open waits for no writer, and the read never sees an end of file
        # (a helper that dies and is replaced opens it again)
        self._fd = os.open(fifo, os.O_RDWR)
        self._dump = dump
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="launchhelm-flight-recorder", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while True:
                asked = os.read(self._fd, 64)  # blocked here, without the GIL, until a hang
                if not asked or _STOP in asked:
                    return
                self._answer()
        except OSError:
            return
        finally:
            os.close(self._fd)

    def _answer(self) -> None:
        try:
            data, name = bytes(self._dump()), _TRACE
        except Exception as exc:  # the helper says why in the record
            data, name = f"{type(exc).__name__}: {exc}".encode(), _ERROR
        partial = os.path.join(self.directory, f"{name}.partial")
        with contextlib.suppress(OSError):  # the session ended meanwhile
            with open(partial, "wb") as file:
                file.write(data)
            os.replace(partial, os.path.join(self.directory, name))  # whole or absent for the helper

    def close(self) -> None:
        """The session ends: the thread returns, the folder goes."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.write(self._fd, _STOP)
        shutil.rmtree(self.directory, ignore_errors=True)


# -- in the helper process ------------------------------------------------------------
def request_recorder(directory: str, wait: float = RECORDER_SECONDS) -> tuple[bytes | None, str]:
    """Ask the training process's relay for its flight recorder: ``(dump, "")``, or ``(None, why not)``."""
    for name in (_TRACE, _ERROR):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))  # an earlier hang's answer
    try:
        fd = os.open(os.path.join(directory, _FIFO), os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, _REQUEST)
        finally:
            os.close(fd)
    except OSError as exc:
        return None, f"could not ask the training process for it ({exc.strerror or exc})"
    deadline = time.monotonic() + wait
    while True:
        for name in (_TRACE, _ERROR):
            try:
                with open(os.path.join(directory, name), "rb") as file:
                    data = file.read()
            except FileNotFoundError:
                continue
            if name == _ERROR:
                return None, f"torch's dump failed: {data.decode('utf-8', 'replace')[:300]}"
            return data, ""
        if time.monotonic() >= deadline:
            return None, (
                f"no answer within {wait:.0f} s (a thread that keeps the GIL, such as a stuck C call, "
                "keeps the training process from running Python)"
            )
        time.sleep(0.05)


def recorder_note(dump: bytes, stored: str) -> RecorderNote:
    """The note of a rank's flight recorder dump (torch's JSON): its last collective in each process group."""
    try:
        entries = json.loads(dump).get("entries") or []
    except (ValueError, AttributeError):
        return {"error": "torch's dump is not the JSON this version of LaunchHelm reads", "stored": stored}
    groups: dict[str, Collective] = {}
    latest: tuple[int, str] | None = None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        seq = entry.get("collective_seq_id")
        if not isinstance(seq, int):
            continue
        group = entry.get("process_group")
        key = str(group[0]) if isinstance(group, list) and group else str(entry.get("pg_id", "?"))
        if key not in groups or seq > groups[key]["seq"]:
            groups[key] = {
                "seq": seq,
                "name": str(entry.get("profiling_name", "?")),
                "state": str(entry.get("state", "?")),
                "retired": bool(entry.get("retired")),
            }
        stamp = entry.get("time_created_ns")
        created = stamp if isinstance(stamp, int) else 0
        if latest is None or created >= latest[0]:
            latest = (created, key)
    note: RecorderNote = {"stored": stored, "groups": groups}
    if latest is not None:
        note["last"] = latest[1]
    return note


def recorder_line(note: RecorderNote) -> str:
    """The note as a line of a rank's stacks file (:func:`read_recorder_note` reads it back)."""
    return _NOTE_PREFIX + json.dumps(note, sort_keys=True)


def read_recorder_note(text: str) -> RecorderNote | None:
    """The note in a ``rank-<r>.txt``'s head (before its first blank line); None where it has none."""
    head, _, _ = text.partition("\n\n")
    for line in head.splitlines()[2:]:
        if line.startswith(_NOTE_PREFIX):
            with contextlib.suppress(ValueError):
                found = json.loads(line[len(_NOTE_PREFIX) :])
                if isinstance(found, dict):
                    return RecorderNote(**found)  # type: ignore[typeddict-item]
    return None


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"


def describe_collectives(notes: Mapping[int, RecorderNote]) -> tuple[str, list[str]]:
    """From the ranks' notes: the clause naming the ranks behind the others in collectives ("" where none is),
    e.g. ``rank 1 last entered collective #8 gloo:all_reduce, rank 0 at #9, waiting``, and the grouped
    record's section: each rank's last collective, or why its recorder was not read."""
    keys = sorted({key for note in notes.values() for key in note.get("groups", {})})
    several = len(keys) > 1
    lines = ["flight recorder (torch's; each rank's last collective entered, its whole dump in rank-<r>.fr.json):"]
    for rank, note in sorted(notes.items()):
        groups = note.get("groups", {})
        last = note.get("last")
        if "error" in note:
            lines.append(f"  rank {rank}: not read: {note['error']}")
        elif last is None or last not in groups:
            lines.append(f"  rank {rank}: no collective recorded")
        else:
            c = groups[last]
            waiting = "retired" if c["retired"] else "not retired (waiting)"
            where = f" in process group {last}" if several else ""
            lines.append(f"  rank {rank}: #{c['seq']} {c['name']}{where}, state {c['state']}, {waiting}")
    for key in keys:
        entered = {r: n["groups"][key] for r, n in sorted(notes.items()) if key in n.get("groups", {})}
        top = max((c["seq"] for c in entered.values()), default=0)
        behind = sorted({c["seq"] for c in entered.values() if c["seq"] < top})
        if len(entered) < 2 or not behind:
            continue
        parts = []
        for seq in behind:
            ranks = [r for r, c in entered.items() if c["seq"] == seq]
            parts.append(f"{_ranks(ranks)} last entered collective #{seq} {entered[ranks[0]]['name']}")
        ahead = [r for r, c in entered.items() if c["seq"] == top]
        waiting = ", waiting" if all(not entered[r]["retired"] for r in ahead) else ""
        clause = f"{', '.join(parts)}, {_ranks(ahead)} at #{top}{waiting}"
        return clause + (f" (process group {key})" if several else ""), lines
    return "", lines
