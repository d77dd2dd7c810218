"""The helper process: one child beside each training process (issue 40; design in docs/storage.md).

``init`` starts it (``python -c "... launchhelm._helper ..."`` in ``ps``) in its
own session, so that a signal to the training process's group (torchrun's
SIGTERM, a notebook kernel's restart) does not reach it. What it does today:

- it watches for hangs when ``hang_timeout`` is set (``launchhelm._runlog._watchdog``);
- it encodes, stores and indexes the media the training process hands over in
  the spool (``launchhelm.media._handoff``), as they come;
- when the training process dies without ending its session (any signal, the
  OOM killer), it uploads what the spool holds with ``launchhelm recover``'s
  machinery, ends the session as ``crashed`` (the signal, where it can read it
  before the process is reaped) and exits: the points reach the store without
  anyone reopening the run on this host. A fenced session's spool is
  deleted, not uploaded;
- once the session ended (cleanly, or by its drain), it adds the run to the
  project's runs index and history dataset (``launchhelm._runlog._settle``),
  so the first reader of the project pays no more than the second; within
  ``LAUNCHHELM_SETTLE_TIMEOUT`` seconds (off by default: 0), past which it exits anyway.

The drain has a bounded time (``LAUNCHHELM_DRAIN_TIMEOUT``, 60 s): past it the
helper exits and the spool stays for ``launchhelm recover``. It never outlives
that: it exits when the training process ends, cleanly or not, after at most
the drain's and the settling's bounds.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launchhelm._console._capture import terminal_fds
from launchhelm._runlog._flightrec import RecorderRelay
from launchhelm._runlog._sessions import PROCESS_DIED
from launchhelm._runlog._settle import SETTLE_TIMEOUT
from launchhelm._runlog._watchdog import DUMP_SIGNAL, Beacon, ParentWatch, WatchdogConfig, watch

if TYPE_CHECKING:
    from launchhelm.storage._remote import HelperStore

__all__ = ["DRAIN_TIMEOUT", "MAX_REPLACED", "Helper", "HelperConfig", "run_session"]

_log = logging.getLogger("launchhelm")

#: Seconds the helper gives a dead process's spool to reach the store (``LAUNCHHELM_DRAIN_TIMEOUT``).
DRAIN_TIMEOUT = 60.0
#: Helpers a session replaces after deaths before it goes on without one (a helper that cannot live).
MAX_REPLACED = 3
#: Signals the helper ignores: a Ctrl-C's and the schedulers' notices are the training process's.
_NOTICES = "INT TERM USR1 USR2 HUP"
#: What the helper's command line says, for ``ps`` and the tests.
COMMAND = "import sys; from launchhelm._helper_boot import main; sys.exit(main())"


@dataclass
class HelperConfig(WatchdogConfig):
    spool: str | None = None  # the spool root the training process writes (None: no spool)
    session_seq: int = 0  # the session's start event: its fence check (EventLog.guard)
    drain_timeout: float = DRAIN_TIMEOUT
    settle_timeout: float = SETTLE_TIMEOUT  # 0: the first reader settles the run, as before the helper did
    flush: bool = False  # it writes the session's chunks (LAUNCHHELM_HELPER_FLUSH; launchhelm._metrics._pickup)


class Helper:
    """The training process's side: starts the child, and tells it the session ended cleanly."""

    def __init__(
        self, process: subprocess.Popen[bytes], beacon: Beacon, dump: IO[bytes] | None, dump_path: str, line: bytes
    ) -> None:
        self.process = process
        self.beacon = beacon
        self._dump = dump
        self._dump_path = dump_path
        self._line = line  # its config: a replacement gets the same
        self.replaced = 0
        self.relay: RecorderRelay | None = None  # torch's flight recorder, read at a hang (launchhelm.torch's)

    @classmethod
    def start(
        cls,
        *,
        beacon: Beacon,
        timeout: float | str | None,
        store_url: str,
        storage_options: Mapping[str, Any] | None,
        project: str,
        run_id: str,
        session: str,
        session_seq: int,
        spool: str | None,
        rank: int = 0,
        world: int = 1,
        end_hung: bool,
        flight_recorder: Callable[[], bytes] | None = None,
        flush: bool = False,
        process: subprocess.Popen[bytes] | None = None,
    ) -> Helper | None:
        """Start the helper; None (with one line saying why) where it cannot reach the store.

        ``flight_recorder`` (``launchhelm.torch``'s, where torch records collectives) is called in a
        thread of this process when the helper finds a hang (:mod:`launchhelm._runlog._flightrec`)."""
        try:
            options = json.loads(json.dumps(dict(storage_options or {})))
        except (TypeError, ValueError):
            _log.warning(
                "launchhelm: run %s has no helper process: its storage_options are not plain JSON, and the "
                "helper needs them to reach the store; hangs are not watched, and a killed process's last "
                "points wait in the spool for `launchhelm recover`",
                run_id,
            )
            return None
        dump: IO[bytes] | None = None
        dump_path = ""
        if timeout is not None:
            fd, dump_path = tempfile.mkstemp(prefix="launchhelm-stacks-", dir=tempfile.gettempdir())
            dump = os.fdopen(fd, "w+b")
        config = HelperConfig(
            beacon=beacon.path or "",
            dump=dump_path,
            parent=os.getpid(),
            store=store_url,
            storage_options=options,
            project=project,
            run_id=run_id,
            session=session,
            rank=rank,
            world=world,
            timeout=timeout,
            end_hung=end_hung,
            poll=float(os.environ.get("LAUNCHHELM_HANG_POLL", "0.5")),
            floor=float(os.environ.get("LAUNCHHELM_HANG_AUTO_FLOOR", "300")),  # tests only
            spool=spool,
            session_seq=session_seq,
            drain_timeout=float(os.environ.get("LAUNCHHELM_DRAIN_TIMEOUT") or DRAIN_TIMEOUT),
            settle_timeout=float(os.environ.get("LAUNCHHELM_SETTLE_TIMEOUT") or SETTLE_TIMEOUT),
            flush=flush,
        )
        relay = _relay(flight_recorder, config) if timeout is not None else None
        line = json.dumps(config.__dict__).encode() + b"\n"
        try:
            # ``process``: the helper init started to serve the store (serve_store), given its session now
            if process is None or not _tell(process, line):
                process = _spawn(line)
        except BaseException:
            if dump is not None:
                dump.close()
                os.unlink(dump_path)
            if relay is not None:
                relay.close()
            raise
        if dump is not None:
            faulthandler.register(DUMP_SIGNAL, file=dump, all_threads=True, chain=False)
        helper = cls(process, beacon, dump, dump_path, line)
        helper.relay = relay
        return helper

    def replace_if_gone(self) -> tuple[int, int] | None:
        """If the helper process died while the session lives, start another with the same config.

        Returns the dead one's pid and exit code (negative: the signal), or None if it runs. The
        spool and the page are the training process's, so the new helper takes over where the old
        one was: nothing is lost.
        """
        code = self.process.poll()
        if code is None:
            return None
        old = self.process
        if old.stdin is not None:
            with contextlib.suppress(OSError):
                old.stdin.close()
        self.process = _spawn(self._line)
        self.replaced += 1
        return old.pid, code

    def send(self, line: bytes) -> bool:
        """One line to the helper's stdin (a flush request); False where the helper is gone."""
        pipe = self.process.stdin
        if pipe is None or self.process.poll() is not None:
            return False
        try:
            pipe.write(line)
            pipe.flush()
        except (OSError, ValueError):  # a broken pipe, or closed by stop()
            return False
        return True

    def stop(self) -> None:
        """The session ends cleanly: the helper exits without draining, faulthandler lets go of the signal."""
        if self._dump is not None:
            with contextlib.suppress(ValueError, RuntimeError):
                faulthandler.unregister(DUMP_SIGNAL)
            # the files first: a preemption's budget may end the process while this waits for the child
            self._dump.close()
            with contextlib.suppress(OSError):
                os.unlink(self._dump_path)
        if self.relay is not None:
            self.relay.close()
        self.beacon.close()  # its done slot: a clean end, not a death
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        # not waited for: a helper still importing (a short session) exits once it looks, and finish()
        # need not wait for that; it is reaped at the next start or stop
        with _leaving_lock:
            _leaving.append(self.process)
        _reap()


def _relay(flight_recorder: Callable[[], bytes] | None, config: HelperConfig) -> RecorderRelay | None:
    """The thread that dumps torch's flight recorder at the helper's request; its folder in ``config``."""
    if flight_recorder is None:
        return None
    try:
        relay = RecorderRelay(flight_recorder, tempfile.gettempdir())
    except OSError as exc:  # the hang's record goes without it
        _log.warning("launchhelm: run %s: torch's flight recorder will not be read at a hang (%s)", config.run_id, exc)
        return None
    config.recorder = relay.directory
    return relay


def serve_store(url: str, storage_options: Mapping[str, Any] | None, progress: bool | None) -> HelperStore:
    """Start the session's helper now, before the run exists, serving the store at ``url`` to this process
    (``LAUNCHHELM_HELPER_STORE=1``; docs/storage.md, "The store's client in the helper"). The session's
    configuration follows on its stdin when the run exists (:meth:`Helper.start` with ``process``).

    Raises the store's own error where it cannot be opened; TypeError where ``storage_options`` are not
    plain JSON (the helper could not be given them)."""
    import socket

    from launchhelm.storage._remote import HelperStore

    options = json.loads(json.dumps(dict(storage_options or {})))
    ours, theirs = socket.socketpair()
    serve = {"url": url, "options": options, "progress": progress, "fd": theirs.fileno()}
    try:
        process = _spawn(json.dumps({"serve": serve}).encode() + b"\n", pass_fds=(theirs.fileno(),))
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    store = HelperStore.connect(ours, process, url, options, progress)
    store.session_helper = True
    return store


def _spawn(line: bytes, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    _reap()
    # its stdout and stderr are the ones from before the console capture: holding the capture's pipes, it
    # would make finish() wait out the capture's drain timeout for each stream
    with terminal_fds() as fds:
        process = subprocess.Popen(
            # ``-c COMMAND``, not ``-m``: runpy warns where the module is already imported (a test may have);
            # through sh's `trap ''`: the notices are ignored from the exec on, before Python's imports, and
            # an ignored signal stays ignored across exec (run_session keeps them so)
            ["/bin/sh", "-c", f'trap \'\' {_NOTICES}; exec "$0" -c "$1"', sys.executable, COMMAND],
            stdin=subprocess.PIPE,
            stdout=fds.get(1),
            stderr=fds.get(2),
            close_fds=True,
            pass_fds=pass_fds,
            start_new_session=True,  # a signal to the training process's group must not end the drain
        )
    assert process.stdin is not None
    process.stdin.write(line)
    process.stdin.flush()  # stdin stays open: its EOF tells the helper that training is gone
    return process


def _tell(process: subprocess.Popen[bytes], line: bytes) -> bool:
    """``line`` to a running helper's stdin; False where it is gone."""
    if process.stdin is None or process.poll() is not None:
        return False
    try:
        process.stdin.write(line)
        process.stdin.flush()
    except (OSError, ValueError):
        return False
    return True


#: Helpers told to exit, not reaped yet (referenced, so that no Popen is collected while it runs).
_leaving: list[subprocess.Popen[bytes]] = []
_leaving_lock = threading.Lock()


def _reap() -> None:
    with _leaving_lock:
        _leaving[:] = [process for process in _leaving if process.poll() is None]


# -- in the helper process ---------------------------------------------------------------
def _exit_status(pid: int) -> str | None:
    """How ``pid`` ended, read from /proc while it is a zombie (its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            stat = file.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    code = int(fields[49])  # field 52, exit_code, as waitpid reports it
    if code & 0x7F:
        try:
            return f"was killed by {signal.Signals(code & 0x7F).name}"
        except ValueError:
            return f"was killed by signal {code & 0x7F}"
    return f"exited with status {code >> 8} without finishing"


def _fenced(config: HelperConfig) -> bool:
    """Whether a newer attempt fenced the session: its points after the fence are not the run's."""
    from launchhelm._runlog._events import EventLog
    from launchhelm.storage import open_store

    state = EventLog(open_store(config.store, config.storage_options), config.run_id).state()
    return any(s.id == config.session and s.ending == "fenced" for s in state.sessions)


def drain(config: HelperConfig, how: str) -> None:
    """The training process died: its spool to the store, its session ended as crashed."""
    from launchhelm._metrics._spool import recover_run
    from launchhelm._runlog._events import SESSION_ENDED, EventLog, SequenceTaken
    from launchhelm._runlog._runinfo import furthest_step
    from launchhelm._runlog._table import mark_row
    from launchhelm.storage import open_store

    store = open_store(config.store, config.storage_options)
    root = Path(config.spool) if config.spool else None
    if _fenced(config):
        if root is not None:  # what it logged after the fence is not the run's, not even for `recover`
            for path in (root / config.run_id).glob(f"{config.session}*"):
                path.unlink(missing_ok=True)
        return
    points = recover_run(store, config.run_id, root) if root is not None else 0
    if points:
        mark_row(store, config.project, config.run_id, "recovered", "recovered")
    events = EventLog(store, config.run_id)
    events.guard(config.session, config.session_seq)
    while True:
        state = events.state()
        ours = next((s for s in state.sessions if s.id == config.session), None)
        if ours is None or ours.ended_at is not None or state.last_session is not ours:
            break  # it ended (a hang), or a later session replaced it: the log says how already
        reached = furthest_step(store, config.run_id, state)  # as finish() records it: the run's furthest
        detail = f"the training process (pid {config.parent}) {how}; its helper uploaded {points} spooled point(s)"
        try:
            events.append(
                SESSION_ENDED,
                {
                    "session": config.session,
                    "close_run": False,
                    "reason": PROCESS_DIED,
                    "step": reached,
                    "ending": "crashed",
                    "detail": detail,
                },
                expect_seq=state.last_seq + 1,
            )
        except SequenceTaken:
            continue  # a relaunch started meanwhile: decide again
        mark_row(store, config.project, config.run_id, config.session, "ended")
        break
    _log.warning(
        "launchhelm: run %s: the training process %s; %d spooled point(s) uploaded", config.run_id, how, points
    )


def _drain_bounded(config: HelperConfig, parent: ParentWatch) -> int:
    """:func:`drain` within ``config.drain_timeout``; past it the spool stays for ``launchhelm recover``."""
    parent.exited(5.0)  # its pipe closes before it exits: recovery takes only a dead process's spool
    # the status is readable only until its parent reaps it (a shell or a test waiting on it wins the race):
    # then the words are the watcher's for a pid found gone
    how = _exit_status(config.parent) or "died without a notice (its exit status was reaped before it was seen)"
    failed: list[BaseException] = []

    def run() -> None:
        try:
            drain(config, how)
        except BaseException as exc:
            failed.append(exc)

    worker = threading.Thread(target=run, name="launchhelm-drain", daemon=True)
    worker.start()
    worker.join(config.drain_timeout)
    if worker.is_alive() or failed:
        why = f"{type(failed[0]).__name__}: {failed[0]}" if failed else f"no answer within {config.drain_timeout:.0f} s"
        _log.warning(
            "launchhelm: run %s: the training process %s, and its helper could not store its last points (%s); "
            "they stay in the spool at %s: `launchhelm recover` on this host uploads them",
            config.run_id,
            how,
            " ".join(why.split())[:200],
            Path(config.spool or "?") / config.run_id,
        )
        return 1
    return 0


class MediaPickup:
    """A thread of the helper: stores the media files the training process hands over, as they come."""

    #: Seconds between looks at the spool while nothing is there.
    POLL = 0.05

    def __init__(self, config: HelperConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="launchhelm-media", daemon=True)

    @classmethod
    def start(cls, config: HelperConfig) -> MediaPickup | None:
        if not config.spool or config.rank != 0:
            return None  # no spool, or a rank > 0's helper (it has no media of its own)
        pickup = cls(config)
        pickup._thread.start()
        return pickup

    def stop(self, timeout: float) -> None:
        """Stop after the file in hand (a drain stores the rest, one storer at a time)."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        from launchhelm._metrics._pause import yield_on_wakeup
        from launchhelm.media._handoff import HandoffStorer

        # this thread only, in the helper: on waking it never takes a core from the training thread at once
        yield_on_wakeup()
        config = self.config
        directory = Path(config.spool or ".") / config.run_id
        storer: HandoffStorer | None = None
        failing = False
        from launchhelm._exceptions import StoreUnreachableError
        from launchhelm.media._handoff import handed_files

        while not self._stop.is_set():
            try:
                if storer is None:
                    if not handed_files(directory, config.session):
                        self._stop.wait(self.POLL)
                        continue  # nothing handed over yet: no store to open (an outage stays unseen here)
                    from launchhelm.storage import open_store

                    storer = HandoffStorer(
                        open_store(config.store, config.storage_options), config.run_id, config.session, directory
                    )
                stored = storer.step()
            except Exception as exc:  # the store: try again; the files wait in the spool
                if not failing:
                    # an unreachable store is said once, by the training process's outage notice
                    # (and a spool folder its training process removed at a clean end has nothing left to store)
                    quiet = isinstance(exc, StoreUnreachableError) or not directory.is_dir()
                    level = logging.DEBUG if quiet else logging.WARNING
                    _log.log(level, "launchhelm: run %s: its helper could not store media yet: %s", config.run_id, exc)
                failing = True
                self._stop.wait(1.0)
                continue
            failing = False
            if not stored:
                self._stop.wait(self.POLL)


def _settle_bounded(config: HelperConfig) -> None:
    """The ended session's run into its project's runs index and history, within ``config.settle_timeout``.

    Past it the helper exits anyway (the caller's ``os._exit``): the run is
    then read by itself and built by the first reader, as without a helper.
    """
    if config.settle_timeout <= 0 or config.rank != 0:
        return

    def run() -> None:
        from launchhelm._runlog._settle import settle_run
        from launchhelm.storage import open_store

        try:
            settle_run(open_store(config.store, config.storage_options), config.project, config.run_id)
        except Exception as exc:  # best effort: a reader does the same work
            _log.debug("run %s: not settled by its helper: %s", config.run_id, exc)

    worker = threading.Thread(target=run, name="launchhelm-settle", daemon=True)
    worker.start()
    worker.join(config.settle_timeout)


def run_session(first: dict[str, Any], rest: bytes) -> int:
    """The helper's session, from its configuration (``first``) and what came after it on stdin; its
    start (``launchhelm._helper_boot.main``) has read them, and served the store where asked."""
    config = HelperConfig(**first)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # LaunchHelm's own process: its threads' policy, pyarrow's pool and glibc's heap may be tuned here
    # (never in the training process, which is the user's)
    from launchhelm._metrics._heap import own_this_process

    own_this_process()
    # a Ctrl-C, and a scheduler's notices (SLURM signals every process of a job step; Kubernetes every
    # process of the container), are the training process's: the helper ends when that process ends,
    # and must live through a preemption's grace period to drain a trainer killed at its end
    for name in _NOTICES.split():
        signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)
    from launchhelm._metrics._pickup import PointPickup

    points = PointPickup.start(config)
    parent = ParentWatch(config.parent, points.offer if points is not None else None, rest)
    code = 0
    pickup = MediaPickup.start(config)
    try:
        watched = watch(config, parent)
        if pickup is not None:
            pickup.stop(10.0)
        if points is not None:
            points.stop(10.0 if watched.died else 0.0)  # a drain takes the state file's lock after its chunk
        if watched.died and config.rank == 0:  # a rank > 0 has no spool and no session of its own
            code = _drain_bounded(config, parent)
        if code == 0:
            _settle_bounded(config)
    finally:
        # a killed training process cannot remove the page and the dump: the helper outlives it briefly
        if parent.gone():
            for path in (config.beacon, config.dump):
                if path:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            if config.recorder:
                shutil.rmtree(config.recorder, ignore_errors=True)
    logging.shutdown()
    os._exit(code)  # a drain thread stuck on an unreachable store must not hold the exit
