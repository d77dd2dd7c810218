"""Times as a person reads them: local wall-clock time, "3 min ago", "1 h 12 min".

Used by the runs table, the compare widget and the command line; the
browser's twin is ``js/src/time.js`` (same rules, so a saved notebook and a
live one read alike). Stdlib only: ``import launchhelm`` stays light.
"""

from __future__ import annotations

import math
import time

__all__ = ["ago", "duration", "local_time", "status_sentence", "when"]


def _finite(seconds: float | None) -> bool:
    return seconds is not None and isinstance(seconds, (int, float)) and math.isfinite(seconds)


def local_time(ts: float | None) -> str:
    """``"2026-05-01 12:03:04"`` in the machine's time zone, or ``"-"`` for no time."""
    if ts is None or not _finite(ts):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def duration(seconds: float | None) -> str:
    """A span in the two largest units that matter: ``"42 s"``, ``"3 min 5 s"``, ``"1 h 12 min"``, ``"2 d 3 h"``.

    Examples
    --------
    >>> duration(75), duration(4320), duration(0.4)
    ('1 min 15 s', '1 h 12 min', '0 s')
    """
    if seconds is None or not _finite(seconds):
        return "-"
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def ago(ts: float | None, now: float | None = None) -> str:
    """How long before ``now`` (default: now) ``ts`` was, in one unit: ``"just now"``, ``"3 min ago"``.

    A time ahead of ``now`` (another machine's clock) reads ``"just now"``.

    Examples
    --------
    >>> ago(1000.0, now=1180.0)
    '3 min ago'
    """
    if ts is None or not _finite(ts):
        return "never"
    delta = (time.time() if now is None else now) - ts
    if delta < 5:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if delta >= size:
            return f"{int(delta // size)} {unit} ago"
    return f"{int(delta)} s ago"


def when(ts: float | None, now: float | None = None) -> str:
    """Local time and how long ago: ``"2026-05-01 12:03:04 (3 min ago)"``."""
    if ts is None or not _finite(ts):
        return "-"
    return f"{local_time(ts)} ({ago(ts, now)})"


#: What each status means, as the runs table and ``launchhelm show`` say it.
STATUS_MEANING = {
    "running": "a live session is training it",
    "hung": "a live session has made no step for its hang timeout",
    "stopped": "stopped without ending its session (crashed or killed); resume it",
    "restart loop": "its relaunches keep failing before they make progress, so auto_resume refuses the next",
    "resumable": "its last session ended with finish(close_run=False); resume it",
    "closed": "finish() closed it; it cannot be resumed",
}


def status_sentence(
    status: str, last_heartbeat: float | None = None, now: float | None = None, *, detail: str = ""
) -> str:
    """The status with its sentence: ``"stopped without ending its session (crashed or killed); resume it;
    last heartbeat 3 min ago"``, then ``detail`` (where a hung run is, why a relaunch was refused)."""
    sentence = STATUS_MEANING.get(status, status)
    if status in ("running", "stopped", "hung") and last_heartbeat is not None and _finite(last_heartbeat):
        sentence += f"; last heartbeat {ago(last_heartbeat, now)}"
    return f"{sentence}; {detail}" if detail else sentence
