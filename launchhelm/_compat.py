"""What the drop-in APIs (``launchhelm.wandb``, ``launchhelm.tensorboard``) share.

Their runs are ordinary LaunchHelm runs. What another tracker's API records
and a LaunchHelm run has no place for (W&B's summary and ``define_metric``,
TensorBoard's text) is one JSON object per run and API,
``runs/<id>/compat/<api>.json``: put by the run's live session (its single
writer, as the run's summary) from the background flush when it changed,
at most every :data:`RECORD_INTERVAL` seconds, and by the API at its
``finish()`` / ``close()``. See docs/compat.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypedDict

from launchhelm._exceptions import ObjectNotFoundError
from launchhelm._run import Run
from launchhelm._types import JSONValue
from launchhelm.storage import Store
from launchhelm.storage._keys import compat_key

__all__ = ["RECORD_INTERVAL", "CompatSession", "SessionOptions", "compat_key", "read_compat"]

#: Seconds between puts of a changed record while the session lives (it changes with every ``log()``);
#: the session's end puts it at once. A live session then adds about one request per this many seconds.
RECORD_INTERVAL = 10.0


class SessionOptions(TypedDict, total=False):
    """How the run under a drop-in API runs: the :func:`launchhelm.init` settings of these names."""

    flush_interval: float | None
    heartbeat_interval: float | None
    heartbeat_timeout: float | None
    control_interval: float | None
    system_metrics: bool | float | None
    capture_console: bool
    takeover: bool
    compaction_memory: int | str | None


def read_compat(store: Store, run_id: str, api: str, fmt: str) -> dict[str, JSONValue]:
    """The record of ``api`` for ``run_id``; empty when there is none, or it is damaged or of another format."""
    try:
        body = json.loads(store.read(compat_key(run_id, api)))
    except (ObjectNotFoundError, FileNotFoundError, ValueError):
        return {}
    return body if isinstance(body, dict) and body.get("format") == fmt else {}


class CompatSession(Run):
    """A LaunchHelm run whose background flush (and final flush) also calls ``after_flush``."""

    after_flush: Callable[[], None] | None = None

    def _flush(self, drain: bool = True) -> bool:
        more = super()._flush(drain)
        hook = self.after_flush
        if hook is not None:
            hook()
        return more
