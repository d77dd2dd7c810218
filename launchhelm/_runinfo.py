"""Reading what is stored about one run: its record, chunks and furthest step."""

from __future__ import annotations

import json
from typing import Any

from launchhelm._events import RunState, run_prefix, validate_run_id
from launchhelm._exceptions import ObjectNotFoundError, RunNotFoundError
from launchhelm._sessions import liveness
from launchhelm.metrics._read import furthest_logged_step
from launchhelm.storage import Store

__all__ = ["furthest_step", "read_run_record"]


def read_run_record(store: Store, run_id: str) -> dict[str, Any]:
    """The immutable ``run.json`` of ``run_id``, or :class:`RunNotFoundError`."""
    validate_run_id(run_id)
    try:
        return dict(json.loads(store.read(f"{run_prefix(run_id)}/run.json")))
    except ObjectNotFoundError:
        raise RunNotFoundError(
            f"no run {run_id!r} in store {store.url}; list runs with "
            "launchhelm.Api().runs(project) or `launchhelm runs PROJECT`, and check the store "
            "(store= argument or LAUNCHHELM_STORE)",
            run_id=run_id,
        ) from None


def furthest_step(store: Store, run_id: str, state: RunState) -> int:
    """The furthest step the run has reached, in any session or attempt."""
    best = 0
    for session in state.sessions:
        best = max(best, session.start_step, session.end_step or 0, liveness(store, run_id, session).step)
    return max(best, furthest_logged_step(store, run_id))
