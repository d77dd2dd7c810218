"""Is a session's process still alive?

A relaunch script or a scheduler's requeue resumes a run right after the
crash, long before any heartbeat could go stale. So a session records where
its process runs: the host (hostname, kernel boot id and PID namespace, so a
rebooted machine or another container is not mistaken for this one), its pid
and the process start time (so a recycled pid is not mistaken for it). A
session on this host whose process is gone is known dead at once; one on
another host is dead once its heartbeat is older than its timeout.
"""

from __future__ import annotations

import os
from functools import lru_cache

from launchhelm._runlog._records import Requester

__all__ = ["ProcessIdentity", "process_identity", "process_state", "requester"]

ProcessIdentity = dict[str, object]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def host_id() -> str:
    """A stable id of this host (and PID namespace) for this boot."""
    import hashlib
    import socket

    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    raw = "|".join([socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), pidns])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _proc_start(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks) of ``pid`` from /proc, None if gone."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], fields[19]


def process_identity() -> ProcessIdentity:
    """Where the calling process runs, as recorded in a session's start event."""
    import socket

    pid = os.getpid()
    started = _proc_start(pid)
    return {
        "host_id": host_id(),
        "hostname": socket.gethostname(),
        "pid": pid,
        "proc_start": started[1] if started else None,
    }


def process_state(identity: ProcessIdentity) -> str:
    """``"alive"``, ``"dead"`` or ``"unknown"`` (another host: ask the heartbeat)."""
    if identity.get("host_id") != host_id():
        return "unknown"
    pid = identity.get("pid")
    if not isinstance(pid, int):
        return "unknown"
    if os.path.isdir("/proc/self"):
        started = _proc_start(pid)
        if started is None:
            return "dead"
        state, start = started
        if state in ("Z", "X"):  # killed, not yet reaped by its parent
            return "dead"
        if identity.get("proc_start") is not None and start != identity.get("proc_start"):
            return "dead"  # the pid was recycled by another process
        return "alive"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except PermissionError:
        return "alive"
    return "alive"


def requester() -> Requester:
    """Who asked for a change (a control request, a rule, a queued evaluation): user, host, pid."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no user database entry (containers)
        user = "?"
    return {"user": user, "host": socket.gethostname(), "pid": os.getpid()}
