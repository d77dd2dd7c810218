"""``RunDetails``: a run's status, config, tunables and controls (the Details tab);
``RunLogs``: what its process printed, followed live (the Logs tab).

Tunables are changed with :meth:`launchhelm.RunHandle.set_tunables`, the
pause / resume / stop / checkpoint buttons call
:meth:`launchhelm.RunHandle.control`; the training process applies both at
its next step boundary, so the widget shows what is in force and what is
still pending.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping

import traitlets

from launchhelm._api import RunHandle
from launchhelm._console._read import last_lines
from launchhelm._exceptions import InvalidArgumentError
from launchhelm._types import RunLike
from launchhelm._views._runs import row_detail
from launchhelm.widgets._base import RunWidget, StoreArg, format_time, time_labels
from launchhelm.widgets._messages import (
    MSG_APPEND,
    MSG_RESET,
    DetailsState,
    Json,
    LogsState,
    ResetMessage,
    synced_dict,
)
from launchhelm.widgets._picker import status_sentence
from launchhelm.widgets._static import details_html

__all__ = ["RunDetails", "RunLogs", "details_state"]

#: The control buttons, in the order shown.
CONTROL_ACTIONS = ("pause", "resume", "stop", "checkpoint")


def _plain(values: Mapping[str, object]) -> dict[str, Json]:
    """A JSON-safe copy for the front end (config values are what JSON holds; anything else shows as its repr)."""
    copy: dict[str, Json] = json.loads(json.dumps(dict(values), default=repr))
    return copy


def details_state(handle: RunHandle, rule: bool, notice: str = "") -> DetailsState:
    """Everything the Details tab shows, read through the query API."""
    summary = handle.summary()
    status = str(summary["status"])
    tunables = dict(handle.tunables)
    pending = handle.pending_controls()
    last_heartbeat = handle.last_heartbeat
    attempts = handle.attempts()
    shown = len(attempts) > 1 or any(a.launcher for a in attempts)
    return {
        "run": {"id": handle.id, "name": handle.name, "project": handle.project},
        "status": status,
        "sentence": status_sentence(status, last_heartbeat, int(summary["step"]), row_detail(summary)),
        "step": int(summary["step"]),
        "created": format_time(handle.created),
        "last_heartbeat": format_time(last_heartbeat),
        # epoch seconds: the browser shows them as people read them, and how long the run has run
        "created_ts": handle.created,
        "last_heartbeat_ts": last_heartbeat,
        "times": time_labels(handle.created, last_heartbeat, *(p.get("time") for p in pending)),
        "sessions": int(summary["sessions"]),
        "rewinds": int(summary["rewinds"]),
        "attempts": [a.describe(attempts[i + 1] if i + 1 < len(attempts) else None) for i, a in enumerate(attempts)]
        if shown
        else [],
        "control_state": handle.control_state if status == "running" else None,
        "config": _plain(handle.config),
        "tunables": _plain(tunables),
        "pending": [
            {
                "seq": int(p.get("seq", 0)),
                "what": (
                    ", ".join(f"{k}={v!r}" for k, v in dict(p.get("changes") or {}).items())
                    if p.get("what") == "tunables"
                    else str(p.get("what"))
                ),
                "time": format_time(p.get("time")),
            }
            for p in pending
        ],
        "can_control": status == "running",
        "can_tune": status != "closed" and bool(tunables),
        "actions": list(CONTROL_ACTIONS),
        "rule": rule,
        "notice": notice,
    }


class RunDetails(RunWidget):
    """A run's Details tab: status, config, tunables (editable) and control buttons.

    Parameters
    ----------
    run_or_id:
        A :class:`launchhelm.Run`, a :class:`launchhelm.RunHandle` or a run id.
    store:
        Store URL or path for a run id.
    interval:
        Seconds between reads of the store.
    """

    _bundle = "details.js"
    #: Which view of details.js draws it.
    view = traitlets.Unicode("details").tag(sync=True)
    state = synced_dict(DetailsState)
    _actions = {"set_tunables": "set_tunables", "control": "control", "set_rule": "set_rule"}  # noqa: RUF012

    def __init__(self, run_or_id: RunLike | str, store: StoreArg = None, *, interval: float = 2.0) -> None:
        if self._reused():
            return
        self._init_run(interval)
        self._notice = ""
        self.refresh()

    def refresh(self) -> None:
        """Re-read status, tunables, pending control changes and the project's rule."""
        with self._lock:
            rule = self._api.project(self._handle.project).evaluate_every_checkpoint()
            state = details_state(self._handle, rule, self._notice)
            if state != self.state:
                self.state = state

    def static_mimebundle(self) -> dict[str, str]:
        return {"text/html": details_html(self.state)}

    # -- actions (buttons) ---------------------------------------------------
    def set_tunables(self, values: dict[str, Json]) -> None:
        """Change tunables (applied by the training process at its next step boundary)."""
        if not values:
            raise InvalidArgumentError("set_tunables() got no tunable to change: pass {name: value}")
        seq = self._handle.set_tunables(**values)
        changes = ", ".join(f"{k}={v!r}" for k, v in values.items())
        self._say(f"Asked for {changes} (request {seq}); the training process applies it at its next step.")

    def control(self, action: str) -> None:
        """Pause, resume, stop or checkpoint the run (at its next step boundary)."""
        seq = self._handle.control(action)
        self._say(f"Asked the run to {action} (request {seq}); the training process applies it at its next step.")

    def set_rule(self, enabled: bool) -> None:
        """Switch the project's "Evaluate every checkpoint…" rule."""
        self._api.project(self._handle.project).evaluate_every_checkpoint(bool(enabled))
        self._say("Every checkpoint is now evaluated." if enabled else "Checkpoints are no longer evaluated.")

    def _say(self, notice: str) -> None:
        with self._lock:
            self._notice = notice
            self.refresh()


#: Lines the Logs tab keeps (kernel and page): older ones leave the top as new ones come.
LOG_LINES = 5000
#: Lines of the log in the picture a notebook saves.
STATIC_LOG_LINES = 200


class RunLogs(RunWidget):
    """A run's Logs tab: what its process printed to stdout and stderr, followed live.

    Reads :meth:`launchhelm.RunHandle.console_follower` every ``interval``
    seconds: one listing, plus the console objects written since (none when
    nothing was printed). The page shows the last :data:`LOG_LINES` lines in
    monospace and stays scrolled to the bottom while you are at the bottom.

    Parameters
    ----------
    run_or_id:
        A :class:`launchhelm.Run`, a :class:`launchhelm.RunHandle` or a run id.
    store:
        Store URL or path for a run id.
    interval:
        Seconds between reads of the store.

    Examples
    --------
    >>> from launchhelm.widgets import RunLogs
    >>> RunLogs(run_id)          # doctest: +SKIP
    """

    _bundle = "details.js"
    #: Which view of details.js draws it.
    view = traitlets.Unicode("logs").tag(sync=True)
    state = synced_dict(LogsState)

    def __init__(self, run_or_id: RunLike | str, store: StoreArg = None, *, interval: float = 1.0) -> None:
        if self._reused():
            return
        self._init_run(interval)
        self._follower = self._handle.console_follower(tail=LOG_LINES)
        self._text = ""
        self.refresh()

    @property
    def text(self) -> str:
        """The log as the tab holds it (its last :data:`LOG_LINES` lines)."""
        return self._text

    def refresh(self) -> None:
        """Read what was printed since the last refresh, and send it to the page."""
        with self._lock:
            new = self._follower.poll()
            status = self._handle.status
            if new:
                self._text = last_lines(self._text + new, LOG_LINES)
                self.send_when_ready({"type": MSG_APPEND, "text": new})
            state: LogsState = {"status": status, "empty": not self._text, "max_lines": LOG_LINES}
            if state != self.state:
                self.state = state

    def snapshot_messages(self) -> list[ResetMessage]:
        return [{"type": MSG_RESET, "text": self._text}]

    def static_mimebundle(self) -> dict[str, str]:
        shown = last_lines(self._text, STATIC_LOG_LINES)
        return {
            "text/html": "<pre class='lh-log' style='font-family:monospace;font-size:12px;max-height:320px;"
            f"overflow:auto'>{html.escape(shown)}</pre>"
        }
