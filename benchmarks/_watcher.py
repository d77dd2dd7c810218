"""The watcher on and off, for the benchmarks that time the hot path beside it (bench_log, bench_soak).

"On" is what ``init`` gives by default: the helper process beside the training process (issue 40),
timing its steps for hangs (``hang_timeout="auto"``, issue 42). "Off" is no helper at all: there is
no public switch for that (every run on a store another process can see has one), so the benchmark
stubs ``Run._plan_helper`` for the runs it starts while off; the training process then writes its
step into a plain buffer instead of the shared page, as a ``memory://`` run does.

The helper's own cost is read from ``/proc/<pid>/stat`` (CPU: utime + stime) and
``/proc/<pid>/status`` (VmRSS, VmHWM) of ``run._helper.process``, the ``Popen`` the run keeps.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MODES = ("off", "on")


@contextlib.contextmanager
def watcher(on: bool) -> Iterator[dict[str, Any]]:
    """Runs started inside have the watcher ``on`` (the defaults) or none at all; yields ``init``'s extra
    keyword arguments."""
    import launchhelm._run as run_module

    if on:
        yield {}
        return
    original = run_module.Run._plan_helper
    run_module.Run._plan_helper = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield {"hang_timeout": None}
    finally:
        run_module.Run._plan_helper = original  # type: ignore[method-assign]


@dataclass
class Usage:
    """The helper process's CPU seconds so far and its resident memory, MiB (now and its peak)."""

    cpu_s: float
    rss_mib: float
    hwm_mib: float


def usage(pid: int) -> Usage:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    with open(f"/proc/{pid}/status") as file:
        status = dict(line.split(":", 1) for line in file.read().splitlines() if line.startswith("Vm"))
    return Usage(cpu, int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024)


def helper_pid(run: Any) -> int | None:
    helper = run._helper
    return None if helper is None else int(helper.process.pid)


#: Seconds every run waits after ``init`` before its timed part, the watcher on or off: the first
#: flush and heartbeat then fall in neither or both, not only in the run that waited for its helper.
LEAST_WAIT = 2.5


def settle(run: Any, on: bool, least: float = LEAST_WAIT, timeout: float = 20.0) -> Usage | None:
    """Before a timed part: with the watcher ``on``, wait until the run's helper runs and has done starting
    (its CPU clock stops moving: an interpreter importing launchhelm), so that its start-up is not counted
    as the loop's; either way wait at least ``least`` seconds. The helper's usage then (its start-up's
    CPU), or None where it is off or the run has no helper."""
    started = time.monotonic()
    found = _helper_idle(run, started + timeout) if on else None
    time.sleep(max(0.0, least - (time.monotonic() - started)))
    return found


def _helper_idle(run: Any, deadline: float) -> Usage | None:
    while helper_pid(run) is None:
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
    pid = helper_pid(run)
    assert pid is not None
    last, still = usage(pid).cpu_s, 0
    while still < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
        now = usage(pid).cpu_s
        still = still + 1 if now - last < 0.005 else 0
        last = now
    return usage(pid)


@dataclass
class Spent:
    """What the helper spent over a timed part: CPU seconds, the part's wall seconds, memory at its end."""

    cpu_s: float
    wall_s: float
    rss_mib: float
    hwm_mib: float
    startup_cpu_s: float

    def line(self) -> str:
        share = 100 * self.cpu_s / self.wall_s if self.wall_s else float("nan")
        return (
            f"the watcher (helper process): {self.cpu_s:.2f} CPU s over {self.wall_s:.1f} s timed ({share:.2f}% of "
            f"one CPU), RSS {self.rss_mib:.1f} MiB (peak {self.hwm_mib:.1f}); its start-up {self.startup_cpu_s:.2f} "
            "CPU s, not timed"
        )


class Meter:
    """The helper's CPU over a timed part: ``start()`` after :func:`settle`, ``stop()`` before ``finish()``."""

    def __init__(self, run: Any, startup: Usage | None) -> None:
        self.pid = helper_pid(run)
        self.startup = startup
        self._before: Usage | None = None
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._before = usage(self.pid) if self.pid is not None else None

    def before_rss_mib(self) -> float | None:
        """The helper's RSS when :meth:`start` was called (None: no helper)."""
        return self._before.rss_mib if self._before is not None else None

    def stop(self) -> Spent | None:
        wall = time.perf_counter() - self._t0
        if self.pid is None or self._before is None or self.startup is None:
            return None
        after = usage(self.pid)
        return Spent(after.cpu_s - self._before.cpu_s, wall, after.rss_mib, after.hwm_mib, self.startup.cpu_s)


def add(spent: list[Spent]) -> Spent | None:
    """Several timed parts as one: CPU and wall summed, memory the highest."""
    if not spent:
        return None
    return Spent(
        sum(s.cpu_s for s in spent),
        sum(s.wall_s for s in spent),
        max(s.rss_mib for s in spent),
        max(s.hwm_mib for s in spent),
        max(s.startup_cpu_s for s in spent),
    )
