"""Hangs: watched from the helper process beside each training process (issue 42).

A hang must be seen even when the stuck call holds the GIL, so no thread of
the training process can watch it. The helper (``launchhelm._helper``, started
by ``init``) shares a page with the training process (:class:`Beacon`): the
training process writes its step there (one store into an mmap on the step
path: no syscall, no lock) and a "not counting" depth around saves, loads,
pauses and evaluations. The helper samples the page and times the steps
itself (:class:`HangClock`), so the training side never reads a clock.

When the clock says hung, the helper sends the training process
:data:`DUMP_SIGNAL`, for which the process registered ``faulthandler``: its
C handler writes every thread's stack to a file without the GIL. The
helper stores that dump under ``runs/<id>/hangs/``, names the training
thread's innermost function in a one-line summary (under DDP, rank 0's
helper groups the ranks by their training thread's whole stack, the
outliers first: :func:`group_stacks`; where the process runs ``torch.distributed``,
torch's flight recorder too: :mod:`launchhelm._runlog._flightrec`) and, with
``auto_resume``, ends the session as ``hung`` and SIGKILLs the process so
the scheduler relaunches the job (the helper then uploads the spool's points,
as after any kill). Without ``auto_resume`` it leaves the process alone and
says so in the log.

The page also says whether the session ended (its done slot): the helper
tells a clean end from a death by it (:func:`watch`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import mmap
import os
import re
import select
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from launchhelm._exceptions import InvalidArgumentError
from launchhelm._runlog._flightrec import (
    RecorderNote,
    describe_collectives,
    read_recorder_note,
    recorder_line,
    recorder_note,
    request_recorder,
)

__all__ = [
    "AUTO",
    "DUMP_SIGNAL",
    "READY_SLOT",
    "STEP_SLOT",
    "Beacon",
    "Frame",
    "HangClock",
    "ParentWatch",
    "StackGroup",
    "WatchdogConfig",
    "Watched",
    "describe_groups",
    "group_stacks",
    "grouped_record",
    "hang_setting",
    "parse_dump",
    "read_stacks_file",
    "stacks_file",
    "summarize_dump",
    "training_stack",
    "watch",
]

_log = logging.getLogger("launchhelm")

AUTO = "auto"
#: faulthandler's signal while a session lives: a real-time signal few programs use.
DUMP_SIGNAL: int = int(getattr(signal, "SIGRTMIN", signal.SIGUSR2)) + (6 if hasattr(signal, "SIGRTMIN") else 0)
#: "auto": the floor of the timeout, and how many times the slowest recent step it is.
AUTO_FLOOR = 300.0
AUTO_FACTOR = 10.0
#: "auto" arms after this many step changes (the first step, a compile, is not a measure).
AUTO_ARM_STEPS = 3
#: Slowest of how many recent steps "auto" scales with.
RECENT_STEPS = 32

# the page: int64 slots
_MAGIC, _STEP, _NOT_COUNTING, _THREAD, _DONE, _START = 0, 1, 2, 3, 4, 5
STEP_SLOT = _STEP
#: The last flush request the helper stored, acknowledged (launchhelm._metrics._pickup).
FLUSHED_SLOT = 6
#: Non-zero once the helper's flush thread loaded the encoder: it stores a request without an import first.
READY_SLOT = 7
_SLOTS = 8
SLOTS = _SLOTS
_MAGIC_VALUE = 0x4C48_4841_4E47_0001  # "LHHANG" v1


def hang_setting(value: object) -> float | str | None:
    """``hang_timeout`` checked: seconds, ``"auto"`` or None."""
    if value is None or value == AUTO:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise InvalidArgumentError(
            f"hang_timeout={value!r}: give a positive number of seconds, 'auto' (the default) or None (off); "
            "nothing was written"
        )
    return float(value)


class Beacon:
    """The page the training process writes its progress to; an anonymous buffer when no watchdog runs."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._map: mmap.mmap | None = None
        self._closed = False
        if path is None:
            self.slots = memoryview(bytearray(8 * _SLOTS)).cast("q")
        else:
            self._file = open(path, "r+b")  # noqa: SIM115 - held for the session
            self._map = mmap.mmap(self._file.fileno(), 8 * _SLOTS)
            self.slots = memoryview(self._map).cast("q")
        self.slots[_MAGIC] = _MAGIC_VALUE
        self.slots[_STEP] = -1
        self.slots[_THREAD] = threading.get_ident()

    def begin(self, step: int, thread: int) -> None:
        """The session started at ``step`` on ``thread``: steps are changes from it, the hang is that thread's."""
        self.slots[_START] = step
        self.slots[_STEP] = step
        self.slots[_THREAD] = thread

    @property
    def counting_paused(self) -> bool:
        return bool(self.slots[_NOT_COUNTING])

    @classmethod
    def create(cls, directory: str) -> Beacon:
        fd, path = tempfile.mkstemp(prefix="launchhelm-beacon-", dir=directory)
        os.write(fd, bytes(8 * _SLOTS))
        os.close(fd)
        return cls(path)

    @contextlib.contextmanager
    def not_counting(self) -> Iterator[None]:
        """Time in here is no step time (a save, a load, a pause, an evaluation)."""
        self.slots[_NOT_COUNTING] += 1
        try:
            yield
        finally:
            self.slots[_NOT_COUNTING] -= 1

    def stop_counting(self) -> None:
        """No time counts from now on (the session ends)."""
        self.slots[_NOT_COUNTING] += 1

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.slots[_DONE] = 1
        # the mapping stays until the page is garbage: a log() or a save on another thread may
        # still hold the slots, and a released view would raise there
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class HangClock:
    """When a session that reports its steps is hung: the rule of ``hang_timeout``, on the watchdog's clock."""

    def __init__(self, timeout: float | str, *, floor: float = AUTO_FLOOR, start: int = -1) -> None:
        self.timeout_setting = timeout
        self.floor = floor
        self.step = start  # the session's first step; a change from it is its first step made
        self.changes = 0
        self.last_progress: float | None = None
        self.recent: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)

    def observe(self, now: float, step: int, not_counting: int) -> None:
        """One look at the page at ``now`` (monotonic seconds)."""
        if not_counting > 0:
            # the clock stops: a step's time starts again when the section ends
            if self.last_progress is not None:
                self.last_progress = now
            return
        if step == self.step:
            return
        if self.last_progress is not None and self.changes >= 1:
            # the first step (a compile) is not a measure; steps faster than the look share its time
            self.recent.append((now - self.last_progress) / max(1, abs(step - self.step)))
        self.step = step
        self.changes += 1
        self.last_progress = now

    def timeout(self) -> float | None:
        """Seconds without a step that make a hang now; None while not armed."""
        if self.timeout_setting != AUTO:
            return float(self.timeout_setting) if self.changes >= 1 else None
        if self.changes < AUTO_ARM_STEPS:
            return None
        return max(self.floor, AUTO_FACTOR * max(self.recent, default=0.0))

    def stalled(self, now: float) -> float | None:
        """Seconds since the last step if that is past the timeout, else None."""
        limit = self.timeout()
        if limit is None or self.last_progress is None:
            return None
        idle = now - self.last_progress
        return idle if idle > limit else None

    @property
    def typical(self) -> float | None:
        if not self.recent:
            return None
        ordered = sorted(self.recent)
        return ordered[len(ordered) // 2]


_THREAD_LINE = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME_LINE = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)')
#: The line after a rank's summary in its stacks file: whose stack the hang is (its training thread).
_TRAINING_LINE = re.compile(r"^training thread (0x[0-9a-f]+)$")


@dataclass(frozen=True)
class Frame:
    """One frame of a faulthandler dump, as it compares across ranks: the file's name (its folder differs
    from host to host), the function and the line; ``path`` as the dump gave it, shown, not compared."""

    file: str
    func: str
    line: int
    path: str = field(default="", compare=False)

    @property
    def place(self) -> str:
        return f"`{self.func}` ({self.file}:{self.line})"


def parse_dump(dump: str) -> dict[int, list[Frame]]:
    """Every thread's frames in a faulthandler dump, innermost first, by thread id."""
    stacks: dict[int, list[Frame]] = {}
    current: list[Frame] | None = None
    for line in dump.splitlines():
        head = _THREAD_LINE.match(line)
        if head:
            current = stacks.setdefault(int(head.group(2), 16), [])
            continue
        frame = _FRAME_LINE.match(line)
        if frame and current is not None:
            path = frame["file"]
            current.append(Frame(os.path.basename(path), frame["func"], int(frame["line"]), path))
    return stacks


def training_stack(dump: str, thread: int) -> list[Frame]:
    """The frames of ``thread`` (the training thread) in a dump; the first thread's where it is missing."""
    stacks = parse_dump(dump)
    return stacks.get(thread) or next(iter(stacks.values()), [])


def summarize_dump(dump: str, thread: int) -> str:
    """The training thread's innermost Python function in a faulthandler dump, as ``func (file:line)``."""
    frames = training_stack(dump, thread)
    return frames[0].place if frames else _NO_FRAME


_NO_FRAME = "no Python frame in the dump"


def stacks_file(summary: str, thread: int, dump: str, recorder: RecorderNote | None = None) -> str:
    """A rank's ``rank-<r>.txt``: its one-line summary, whose stack the hang is, its flight recorder's note
    where it has one (:mod:`launchhelm._runlog._flightrec`), then faulthandler's dump."""
    note = f"{recorder_line(recorder)}\n" if recorder is not None else ""
    return f"{summary}\ntraining thread 0x{thread:016x}\n{note}\n{dump}"


def read_stacks_file(text: str) -> list[Frame]:
    """The training thread's frames from a ``rank-<r>.txt`` (:func:`stacks_file`)."""
    head, _, dump = text.partition("\n\n")
    lines = head.splitlines()
    found = _TRAINING_LINE.match(lines[1]) if len(lines) > 1 else None
    return training_stack(dump, int(found.group(1), 16) if found else -1)


@dataclass
class StackGroup:
    """Ranks whose training threads stand in the same whole stack."""

    frames: tuple[Frame, ...]
    ranks: list[int]

    @property
    def place(self) -> str:
        return self.frames[0].place if self.frames else _NO_FRAME


def _waiting(group: StackGroup) -> bool:
    """Stands in torch itself, where a rank waits for a peer (a collective, autograd), not in the stuck code."""
    return bool(re.search(r"\((distributed_c10d|graph|_tensor|distributed|__init__|c10d_logger)\.py:", group.place))


def group_stacks(stacks: Mapping[int, Sequence[Frame]]) -> list[StackGroup]:
    """Ranks grouped by their training thread's whole stack (every frame's file, function and line), the
    smallest groups (the outliers) first; between groups as small, one waiting in torch comes after."""
    groups: dict[tuple[Frame, ...], StackGroup] = {}
    for rank, frames in sorted(stacks.items()):
        key = tuple(frames)
        groups.setdefault(key, StackGroup(key, [])).ranks.append(rank)
    return sorted(groups.values(), key=lambda g: (len(g.ranks), _waiting(g), g.ranks[0]))


def _where(group: StackGroup, groups: Sequence[StackGroup]) -> str:
    """The group's innermost place; where another group's stack ends in the same place, also the first
    frame (from the inside) at which they part, so that the line tells them apart."""
    where = group.place
    twins = [g for g in groups if g is not group and g.frames[:1] == group.frames[:1]]
    if not twins or not group.frames:
        return where
    parts = max(_parting(group.frames, g.frames) for g in twins)
    if parts <= 0 or parts >= len(group.frames):
        return where
    return f"{where} from {group.frames[parts].place}"


def _parting(a: Sequence[Frame], b: Sequence[Frame]) -> int:
    """The first frame, from the inside, at which two stacks differ (past the shorter where one ends the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def describe_groups(groups: Sequence[StackGroup], world: int) -> str:
    """``rank 1 in `hang_here` (w.py:9); rank 0 in `wait` (distributed_c10d.py:4)``: each group of ranks and
    its innermost function, in :func:`group_stacks`'s order; ranks with no stacks named last."""
    parts = [f"rank{'s' * (len(g.ranks) > 1)} {', '.join(map(str, g.ranks))} in {_where(g, groups)}" for g in groups]
    found = {r for g in groups for r in g.ranks}
    missing = [r for r in range(world) if r not in found]
    if missing:
        parts.append(f"no stacks from rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))}")
    return "; ".join(parts)


def grouped_record(detail: str, groups: Sequence[StackGroup], world: int, recorder: Sequence[str] = ()) -> str:
    """The hang's ``grouped.txt``: its one-line detail, then each distinct training-thread stack once, with
    the ranks that stand in it (every thread of every rank is in the ranks' own files), then the flight
    recorder's section where ranks have one (:func:`~launchhelm._runlog._flightrec.describe_collectives`)."""
    lines = [detail, ""]
    for group in groups:
        ranks = ", ".join(map(str, group.ranks))
        lines.append(
            f"rank{'s' * (len(group.ranks) > 1)} {ranks} ({len(group.ranks)} of {world}), most recent call first:"
        )
        lines += [f'  File "{f.path or f.file}", line {f.line} in {f.func}' for f in group.frames] or [f"  {_NO_FRAME}"]
        lines.append("")
    if recorder:
        lines += [*recorder, ""]
    return "\n".join(lines)


@dataclass
class WatchdogConfig:
    """What the helper process is told at its start (one JSON line on its stdin)."""

    beacon: str
    dump: str
    parent: int
    store: str
    storage_options: dict[str, Any] | None
    project: str
    run_id: str
    session: str
    rank: int
    timeout: float | str | None  # None: hangs are not watched
    end_hung: bool
    poll: float
    floor: float
    world: int = 1  # ranks of the job: rank 0's helper gathers every rank's stacks
    recorder: str = ""  # the folder of the training process's RecorderRelay ("": torch's flight recorder not read)


class ParentWatch:
    """The helper's view of the training process: gone once its pid exits (a pidfd where Linux has one),
    its stdin pipe hits EOF, or the helper has another parent."""

    def __init__(
        self, parent: int, on_message: Callable[[dict[str, Any]], None] | None = None, pending: bytes = b""
    ) -> None:
        self.parent = parent
        self._eof = False
        # lines the training process sends after the config (flush requests): handed to ``on_message``
        self._on_message = on_message
        self._partial = b""
        self._take(pending)
        self._pidfd = -1
        with contextlib.suppress(AttributeError, OSError):  # Linux 5.3+, Python 3.9+
            self._pidfd = os.pidfd_open(parent)

    def wait(self, timeout: float) -> None:
        """Sleep ``timeout`` seconds, or less: wakes at once when the training process ends."""
        fds: list[int] = [] if self._eof else [sys.stdin.fileno()]
        if self._pidfd >= 0:
            fds.append(self._pidfd)
        select.select(fds, [], [], timeout)

    def gone(self) -> bool:
        if os.getppid() != self.parent:
            return True
        if self._pidfd >= 0 and select.select([self._pidfd], [], [], 0)[0]:
            return True  # it exited; it may not be reaped yet
        while not self._eof:
            ready, _, _ = select.select([sys.stdin.buffer], [], [], 0)
            if not ready:
                break
            data = os.read(sys.stdin.fileno(), 65536)
            self._eof = not data
            self._take(data)
        return self._eof

    def _take(self, data: bytes) -> None:
        if not data or self._on_message is None:
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue  # not ours
            if isinstance(message, dict):
                self._on_message(message)

    def exited(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to have exited (closing its pipe comes first)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._pidfd >= 0:
                if select.select([self._pidfd], [], [], 0)[0]:
                    return True
            elif not _alive(self.parent) or _zombie(self.parent):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


@dataclass
class Watched:
    """How the watch ended: ``died`` (the training process is gone without ending its session) and its last step."""

    died: bool
    step: int


# -- in the helper process ------------------------------------------------------------
def watch(config: WatchdogConfig, parent: ParentWatch) -> Watched:
    """Watch the training process until it ends; time its steps when ``config.timeout`` is set."""
    try:
        with open(config.beacon, "r+b") as file:
            page = mmap.mmap(file.fileno(), 8 * _SLOTS)
    except FileNotFoundError:
        return Watched(died=False, step=-1)  # the session ended before the helper looked
    slots = memoryview(page).cast("q")
    clock = HangClock(config.timeout, floor=config.floor, start=int(slots[_START])) if config.timeout else None
    told = False
    while True:
        if slots[_DONE] or parent.gone():
            if told and not config.end_hung:
                _unmark(config)  # the session ended (or died) while marked: its status says so by itself
            return Watched(died=not slots[_DONE], step=int(slots[_STEP]))
        if clock is not None:
            now = time.monotonic()
            clock.observe(now, int(slots[_STEP]), int(slots[_NOT_COUNTING]))
            idle = clock.stalled(now)
            if idle is None:
                if told:
                    _log.warning("launchhelm: run %s steps again (step %d)", config.run_id, clock.step)
                    _unmark(config)
                told = False
            elif not told:
                told = True
                _on_hang(config, clock, idle, int(slots[_THREAD]))
        # waits on the pipe and the pid: the session's end is seen at once, and finish() does not wait a poll
        parent.wait(config.poll if clock is not None else 1.0)


def _read_dump(config: WatchdogConfig) -> str:
    """Ask the training process for its stacks and wait for faulthandler's C handler to write them."""
    start = os.path.getsize(config.dump)
    os.kill(config.parent, DUMP_SIGNAL)
    size, deadline = start, time.monotonic() + 5.0
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = os.path.getsize(config.dump)
        if now > start and now == size:
            break
        size = now
    with open(config.dump, "rb") as file:
        file.seek(start)
        return file.read().decode("utf-8", "replace")


def _unmark(config: WatchdogConfig) -> None:
    from launchhelm.storage import open_store
    from launchhelm.storage._keys import hang_key

    try:
        open_store(config.store, config.storage_options).delete(hang_key(config.run_id, config.session))
    except Exception as exc:  # the status stays hung until the next hang or the session's end
        _log.warning("launchhelm: could not clear the hang of run %s: %s", config.run_id, exc)


def _fmt(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _on_hang(config: WatchdogConfig, clock: HangClock, idle: float, thread: int) -> None:
    from launchhelm._runlog._events import SESSION_ENDED, EventLog
    from launchhelm._runlog._table import mark_row
    from launchhelm.storage import open_store
    from launchhelm.storage._keys import hang_grouped_key, hang_key, hang_stacks_key

    dump = _read_dump(config)
    frames = training_stack(dump, thread)
    typical = clock.typical
    detail = f"no step for {_fmt(idle)} after step {clock.step}" + (
        f", typically {typical:.2g} s" if typical is not None else ""
    )
    stalled = detail
    detail += f"; rank {config.rank} in {frames[0].place if frames else _NO_FRAME}"
    key = hang_stacks_key(config.run_id, config.session, config.rank)
    _log.warning("launchhelm: run %s is hung: %s; stacks in %s", config.run_id, detail, key)
    try:
        store = open_store(config.store, config.storage_options)
        note = _store_recorder(store, config)  # before the stacks: rank 0 reads both once it sees the stacks
        store.put(key, stacks_file(detail, thread, dump, note).encode())
        if config.rank != 0:
            _follower_done(config)  # rank 0 records the hang, with this rank's stacks
            return
        # every rank's helper stores its stacks; rank 0's groups the ranks by their whole stack, the
        # ranks not where the others are first, and keeps each distinct stack once
        notes = {config.rank: note} if note is not None else {}
        stacks = _gather(store, config, frames, notes) if config.world > 1 else {0: frames}
        groups = group_stacks(stacks)
        detail = f"{stalled}; {describe_groups(groups, config.world)}"
        behind, recorder = describe_collectives(notes) if notes else ("", [])
        if behind:
            detail += f"; flight recorder: {behind}"
        store.put(
            hang_grouped_key(config.run_id, config.session),
            grouped_record(detail, groups, config.world, recorder).encode(),
        )
        if config.end_hung:
            EventLog(store, config.run_id).append(
                SESSION_ENDED,
                {
                    "session": config.session,
                    "close_run": False,
                    "reason": "hung",
                    "step": max(clock.step, 0),
                    "ending": "hung",
                    "detail": detail,
                },
            )
            mark_row(store, config.project, config.run_id, config.session, "ended")
        else:
            # the process is left alone (a debugger may want it): its status says hung until it steps
            marker = {"since": time.time() - idle, "step": clock.step, "detail": detail}
            store.put(hang_key(config.run_id, config.session), json.dumps(marker).encode())
    except Exception as exc:  # the kill below must happen anyway: the scheduler relaunches
        _log.warning("launchhelm: could not record the hang of run %s: %s", config.run_id, exc)
    if config.end_hung:
        # the helper then sees it gone and uploads its spool, as after any kill (its session already ended)
        _log.warning("launchhelm: ending the hung process %d so that it is relaunched", config.parent)
        with contextlib.suppress(ProcessLookupError):
            os.kill(config.parent, signal.SIGKILL)


#: Seconds rank 0's helper waits for the other ranks' stacks (their helpers see the stall about as soon).
GATHER_SECONDS = 20.0
#: Seconds a rank > 0 that hung waits for rank 0 to end the attempt before it ends its own process.
FOLLOWER_GRACE = 45.0


def _store_recorder(store: Any, config: WatchdogConfig) -> RecorderNote | None:
    """This rank's flight recorder, asked for (a bounded wait) and stored beside its stacks; its note for the
    stacks file. None where the training process has no relay (no recorder, or not torch.distributed)."""
    from launchhelm.storage._keys import hang_recorder_key

    if not config.recorder:
        return None
    dump, why = request_recorder(config.recorder)
    key = hang_recorder_key(config.run_id, config.session, config.rank)
    if dump is not None:
        try:
            store.put(key, dump)
            return recorder_note(dump, key.rsplit("/", 1)[1])
        except Exception as exc:  # the stacks are stored without it
            why = f"could not store it: {type(exc).__name__}: {exc}"
    _log.warning("launchhelm: run %s: torch's flight recorder is not in the hang's record: %s", config.run_id, why)
    return {"error": why}


def _gather(
    store: Any, config: WatchdogConfig, own: list[Frame], notes: dict[int, RecorderNote] | None = None
) -> dict[int, list[Frame]]:
    """Every rank's training-thread stack, read from the stacks files the ranks' helpers store (and into
    ``notes``, their flight recorders' notes where they have one)."""
    from launchhelm.storage._keys import hangs_prefix

    prefix = hangs_prefix(config.run_id, config.session)
    found: dict[int, list[Frame]] = {config.rank: own}
    deadline = time.monotonic() + float(os.environ.get("LAUNCHHELM_HANG_GATHER", GATHER_SECONDS))
    while True:
        names = [n for n in store.list(prefix) if re.fullmatch(r"rank-\d+\.txt", n)]
        wanted = [f"{prefix}/{n}" for n in names if int(n[5:-4]) not in found]
        for key, data in store.read_many(wanted).items():
            if data is not None:
                rank, text = int(key.rsplit("rank-", 1)[1][:-4]), data.decode("utf-8", "replace")
                found[rank] = read_stacks_file(text)
                note = read_recorder_note(text)
                if notes is not None and note is not None:
                    notes[rank] = note
        if len(found) >= config.world or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    return found


def _follower_done(config: WatchdogConfig) -> None:
    """A rank > 0: its stacks are stored; with ``auto_resume`` its process must not outlive the attempt."""
    if not config.end_hung:
        return
    deadline = time.monotonic() + float(os.environ.get("LAUNCHHELM_HANG_FOLLOWER_GRACE", FOLLOWER_GRACE))
    while time.monotonic() < deadline and _alive(config.parent) and not _zombie(config.parent):
        time.sleep(0.5)  # rank 0 ends the attempt; its launcher (torchrun) then stops this process
    _log.warning("launchhelm: ending hung rank %d's process %d so that it is relaunched", config.rank, config.parent)
    with contextlib.suppress(ProcessLookupError):
        os.kill(config.parent, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _zombie(pid: int) -> bool:
    """Exited, not yet reaped by its parent."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            stat = file.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[:1] == ["Z"]
