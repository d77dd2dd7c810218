"""Preemption notices: a signal becomes a checkpoint at the next step boundary and a resumable exit.

A scheduler warns before it kills (Kubernetes, GCP and torchrun's agent send
SIGTERM, SLURM's ``--signal`` SIGUSR1). With ``preemption`` on, ``init``
installs :class:`PreemptionListener`: its signal handler only remembers the
signal, raises the run's control flag (the one the step hook already reads,
so listening costs nothing per step) and writes a byte to a pipe; the same
pipe is the interpreter's wakeup fd where nobody else holds it, so the
notice reaches the watcher even while the main thread waits in C. The run
acts at its next step boundary (``Run._preempt``); the listener's watcher
thread, woken by that byte, keeps the budget: if the process has not exited
``budget`` seconds after the notice (a rank stuck in a collective with a dead
peer), it ends the session itself, saying that no checkpoint was saved, and
exits the process with ``128 + signal``.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import subprocess
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_SIGNALS",
    "PREEMPT_ACTION",
    "PreemptionListener",
    "PreemptionSettings",
    "preemption_settings",
    "requeue_slurm_job",
    "slurm_requeue_command",
]

_log = logging.getLogger("launchhelm")

#: What a preemption notice is, unless ``preemption_signals`` says otherwise.
DEFAULT_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGUSR1")
#: Seconds from the notice to the process's exit, unless ``preemption_budget`` says otherwise.
DEFAULT_BUDGET = 25.0
#: The control action a notice becomes (a rank > 0 appends it to the log for rank 0's poller).
PREEMPT_ACTION = "preempt"
#: Signals that cannot be caught, or that mean a fault rather than a notice.
_REFUSED = frozenset({"SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGCHLD"})
#: Seconds of the budget kept for ending the session when the save did not finish in time.
_END_RESERVE = 3.0


@dataclass(frozen=True)
class PreemptionSettings:
    """What ``init``'s preemption options asked for, checked."""

    signals: tuple[signal.Signals, ...]
    budget: float


def preemption_settings(options: Mapping[str, Any]) -> PreemptionSettings | None:
    """The preemption options of ``init``, checked before any I/O; None when preemption is off.

    ``preemption`` defaults to ``auto_resume``. The signals and the budget are
    checked even when it is off, so a typo is found on a laptop, not at the
    first preemption.

    Raises
    ------
    InvalidArgumentError
        An unknown or uncatchable signal name, or a budget that is not a positive number of seconds.
    InvalidTypeError
        ``preemption`` not a bool, or signal names that are not strings.
    """
    enabled = options.get("preemption")
    if enabled is None:
        enabled = options.get("auto_resume", False)
    if not isinstance(enabled, bool):
        raise InvalidTypeError(f"preemption={enabled!r}: pass True or False (None: as auto_resume)")
    signals = _signals(options.get("preemption_signals"))
    budget = options.get("preemption_budget")
    if budget is None:
        budget = DEFAULT_BUDGET
    elif isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (budget > 0 and math.isfinite(budget)):
        raise InvalidArgumentError(
            f"preemption_budget={budget!r}: give the positive number of seconds the scheduler allows between "
            f"its notice and its kill (default {DEFAULT_BUDGET:g}); nothing was written"
        )
    return PreemptionSettings(signals, float(budget)) if enabled else None


def _signals(given: object) -> tuple[signal.Signals, ...]:
    if given is None:
        given = DEFAULT_SIGNALS
    names = [given] if isinstance(given, str) else given
    if not isinstance(names, (list, tuple)) or not names:
        raise InvalidArgumentError(
            f"preemption_signals={given!r}: give a tuple of signal names such as {DEFAULT_SIGNALS!r}; "
            "nothing was written"
        )
    found: list[signal.Signals] = []
    for name in names:
        if not isinstance(name, str):
            raise InvalidTypeError(
                f"preemption_signals holds {name!r}, a {type(name).__name__}: give signal names such as 'SIGTERM'"
            )
        full = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
        number = getattr(signal.Signals, full, None) if full.isidentifier() else None
        if number is None or full in _REFUSED:
            why = "cannot be caught or means a fault" if full in _REFUSED else "is not a signal on this system"
            raise InvalidArgumentError(
                f"preemption_signals: {name!r} {why}; give the signals your scheduler sends before it kills, "
                f"such as {DEFAULT_SIGNALS!r}; nothing was written"
            )
        if number not in found:
            found.append(number)
    return tuple(found)


class PreemptionListener:
    """The signal handlers of one session and the watcher thread that keeps the budget.

    ``on_notice`` is called with the signal on the run's side, in the training
    thread, never in the handler. ``raise_flag`` makes the next step boundary
    look (the run's control flag). ``tell_others`` runs on the watcher thread
    when the notice arrives (a rank > 0 appends a control request there).
    ``end_unsaved`` ends the session when the budget runs out before the
    training thread could (called on a thread of its own, with the detail).
    """

    def __init__(
        self,
        settings: PreemptionSettings,
        *,
        raise_flag: Callable[[], None],
        tell_others: Callable[[str], None],
        end_unsaved: Callable[[str], None],
        describe: Callable[[], str],
    ) -> None:
        self.settings = settings
        #: the first notice's signal number (None: no notice yet); read by ``run.preempted``
        self.signum: int | None = None
        self._noticed_at = 0.0
        self._delivered = False  # the notice became a request at a step boundary
        self._raise_flag = raise_flag
        self._tell_others = tell_others
        self._end_unsaved = end_unsaved
        self._describe = describe
        self._previous: dict[signal.Signals, Any] = {}
        self._wake_r = self._wake_w = -1
        self._wakeup_owned = False  # the interpreter's wakeup fd is our pipe (see install)
        self._thread: threading.Thread | None = None
        self._ending = threading.Lock()  # held by whoever ends the session: the training thread or the budget
        self._ended = threading.Event()

    # -- installing -------------------------------------------------------------
    def install(self) -> bool:
        """Install the handlers and start the watcher; False (and one warning) off the main thread."""
        if threading.current_thread() is not threading.main_thread():
            _log.warning(
                "launchhelm: preemption notices are not listened for: init() was called from thread %r, and only "
                "the main thread can install signal handlers; call init() from the main thread",
                threading.current_thread().name,
            )
            return False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        for number in self.settings.signals:
            self._previous[number] = signal.signal(number, self._handle)
        # Python runs ``_handle`` in the main thread between bytecodes: never while that thread waits in
        # C (a collective whose peer is gone). The interpreter's own C handler writes each signal's number
        # to the wakeup fd at once, so the watcher sees the notice anyway. Taken only where nobody holds it
        # (an asyncio loop's), and given back at the session's end.
        try:
            held = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            held = -2
        if held == -1:
            self._wakeup_owned = True
        elif held >= 0:
            signal.set_wakeup_fd(held)  # someone else's: left as it was
        self._thread = threading.Thread(target=self._watch, name="launchhelm-preemption", daemon=True)
        self._thread.start()
        return True

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        # only flags and one write to a pipe: the training thread may be anywhere, holding any lock
        if self.signum is not None:
            return
        self._noticed_at = time.monotonic()
        self.signum = signum
        self._raise_flag()
        self._wake(b"n")

    def arm(self, signum: int) -> None:
        """Start the budget on a rank that learnt of the notice from another (the request reached it)."""
        if self.signum is None:
            self._noticed_at = time.monotonic()
            self.signum = signum
            self._delivered = True  # it came as a request: nothing to hand over
            self._wake(b"a")

    def _wake(self, byte: bytes) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, byte)
            except OSError:
                pass

    def take_notice(self) -> str | None:
        """Training thread, at a step boundary: the signal's name once, when a notice waits."""
        if self.signum is None or self._delivered:
            return None
        self._delivered = True
        return signal.Signals(self.signum).name

    # -- the watcher ---------------------------------------------------------------
    def _watch(self) -> None:
        notices = {int(number) for number in self.settings.signals}
        while True:
            try:
                byte = os.read(self._wake_r, 1)
            except OSError:
                return
            if not byte or byte in (b"n", b"a"):
                break
            if byte[0] in notices:  # the C handler's byte: ``_handle`` may not run for as long as C holds on
                if self.signum is None:
                    self._noticed_at = time.monotonic()
                    self.signum = byte[0]
                    self._raise_flag()
                byte = b"n"
                break
            # another signal's number (SIGINT...): not a notice
        if byte not in (b"n", b"a") or self.signum is None:
            return  # closed: the session ended without a notice
        name = signal.Signals(self.signum).name
        deadline = self._noticed_at + self.settings.budget
        if byte == b"n":
            try:
                self._tell_others(name)
            except Exception as exc:  # the budget still holds
                _log.warning("launchhelm: could not pass the preemption notice on: %s", exc)
        reserve = min(_END_RESERVE, self.settings.budget / 4)
        if not self._ended.wait(max(0.0, deadline - reserve - time.monotonic())) and self._ending.acquire(
            blocking=False
        ):
            # the training thread never reached a step boundary (or its save is stuck): end without it
            detail = (
                f"{name}; no checkpoint saved within the {self.settings.budget:g}s preemption budget "
                f"(at step {self._describe()}); the latest checkpoint is still the one before"
            )
            ender = threading.Thread(target=self._end_quietly, args=(detail,), name="launchhelm-preempt-end")
            ender.daemon = True
            ender.start()
            ender.join(max(0.0, deadline - time.monotonic()))
        # the process must be gone by the deadline, whatever holds it (atexit hooks, a collective)
        time.sleep(max(0.0, deadline - time.monotonic()))
        _log.warning("launchhelm: preemption budget of %gs spent: exiting now", self.settings.budget)
        logging.shutdown()
        os._exit(128 + self.signum)

    def _end_quietly(self, detail: str) -> None:
        try:
            self._end_unsaved(detail)
        except BaseException as exc:  # the exit must happen anyway
            _log.warning("launchhelm: could not end the preempted session: %s", exc)
        finally:
            self._ended.set()

    # -- ending --------------------------------------------------------------------
    def begin_ending(self) -> bool:
        """Training thread: claim the session's end; False if the budget's watcher already ended it."""
        if self._ending.acquire(blocking=False):
            return True
        self._ended.wait(max(0.0, self._noticed_at + self.settings.budget - time.monotonic()))
        return False

    def ended(self) -> None:
        """The preempted session is over; the watcher now only makes sure the process exits in time."""
        self._ended.set()
        self._restore()

    def close(self) -> None:
        """The session ended without a notice: put the handlers back and stop the watcher."""
        self._restore()
        if self.signum is None and self._wake_w >= 0 and not self._wakeup_owned:
            os.close(self._wake_w)  # the watcher's read returns b""
            self._wake_w = -1
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join()
            os.close(self._wake_r)
            self._wake_r = -1

    def _restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal works on the main thread only; the process is on its way out
        if self._wakeup_owned:
            held = signal.set_wakeup_fd(-1)
            if held != self._wake_w:
                signal.set_wakeup_fd(held)  # taken over since: theirs now
            self._wakeup_owned = False  # (until then the pipe stays open: its number is never reused)
        if not self._previous:
            return
        previous, self._previous = self._previous, {}
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)


def slurm_requeue_command(
    environ: Mapping[str, str], scontrol: str | None, show_job: Callable[[list[str]], str]
) -> list[str] | None:
    """The ``scontrol requeue`` to run after a preemption's save, or None.

    Only for a SLURM job (``SLURM_JOB_ID``) submitted as requeueable
    (``scontrol show job`` says ``Requeue=1``), where ``scontrol`` is found,
    and only while it is ``RUNNING``: a job SLURM itself is requeueing or
    ending (``scontrol requeue``, preemption by requeue: ``COMPLETING``)
    refuses a second requeue, and would only print a failure.
    """
    job = environ.get("SLURM_JOB_ID", "").strip()
    if not job or scontrol is None:
        return None
    try:
        shown = show_job([scontrol, "show", "job", job])
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("launchhelm: `scontrol show job %s` failed (%s): not requeueing", job, exc)
        return None
    fields = shown.split()
    if "Requeue=1" not in fields or "JobState=RUNNING" not in fields:
        return None
    return [scontrol, "requeue", job]


def _show_job(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout


def requeue_slurm_job() -> bool:
    """Requeue this SLURM job if it is requeueable (see :func:`slurm_requeue_command`); True if asked."""
    command = slurm_requeue_command(os.environ, shutil.which("scontrol"), _show_job)
    if command is None:
        return False
    try:
        subprocess.run(command, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("launchhelm: `%s` failed: %s", " ".join(command), exc)
        return False
    _log.info("launchhelm: SLURM job %s requeued", command[-1])
    return True
