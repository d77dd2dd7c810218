"""Reading what is stored about one run: its record, chunks and furthest step."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from launchhelm._exceptions import ObjectNotFoundError, RunNotFoundError
from launchhelm._metrics._read import furthest_logged_step
from launchhelm._runlog._events import RunState, validate_run_id
from launchhelm._runlog._records import Heartbeat, RunRecord
from launchhelm._runlog._sessions import liveness, read_beats
from launchhelm.storage import Store
from launchhelm.storage._keys import run_record_key

__all__ = ["furthest_step", "metrics_last_step", "read_run_record", "run_record", "session_watermark"]


def run_record(store: Store, run_id: str) -> RunRecord:
    """The immutable ``run.json`` of ``run_id``, or :class:`RunNotFoundError`."""
    validate_run_id(run_id)
    try:
        return cast("RunRecord", dict(json.loads(store.read(run_record_key(run_id)))))
    except ObjectNotFoundError:
        raise RunNotFoundError(
            f"no run {run_id!r} in store {store.url}; list runs with "
            "launchhelm.Api().runs(project) or `launchhelm runs PROJECT`, and check the store "
            "(store= argument or LAUNCHHELM_STORE)",
            run_id=run_id,
        ) from None


def read_run_record(store: Store, run_id: str) -> dict[str, Any]:
    """:func:`run_record` as a plain dict: the door for callers outside the run log that hold it as one."""
    return cast("dict[str, Any]", run_record(store, run_id))


def metrics_last_step(store: Store, run_id: str, state: RunState) -> int:
    """The highest step any stored metric point has (0: none): the newest manifest and the chunk names."""
    return furthest_logged_step(store, run_id)


def furthest_step(
    store: Store, run_id: str, state: RunState, beats: Mapping[str, Heartbeat | None] | None = None
) -> int:
    """The furthest step the run has reached, in any session or attempt.

    Every session's heartbeat in one ``read_many`` (or ``beats``, if read
    already), then the metrics' highest step.
    """
    if beats is None:
        beats = read_beats(store, run_id, [s.id for s in state.sessions])
    best = 0
    for session in state.sessions:
        step = liveness(store, run_id, session, beat=beats.get(session.id)).step
        best = max(best, session.start_step, session.end_step or 0, step)
    return max(best, metrics_last_step(store, run_id, state))


def session_watermark(store: Store, run_id: str, session_id: str) -> dict[str, int]:
    """Per object prefix of a session (metrics chunks, console parts, media index chunks), the highest number
    such that every number from the lowest listed up to it is stored: what a fence admits of the session."""
    from launchhelm.storage._keys import (
        console_prefix,
        media_index_prefix,
        metrics_prefix,
        parse_chunk_name,
        parse_console_name,
        parse_media_index_name,
    )

    marks: dict[str, int] = {}
    prefixes = (
        ("metrics", metrics_prefix(run_id)),
        ("console", console_prefix(run_id)),
        ("media", media_index_prefix(run_id)),
    )
    for kind, prefix in prefixes:
        numbers: set[int] = set()
        for rest in store.list(f"{prefix}/{session_id}"):
            name = f"{session_id}/{rest}"
            if kind == "metrics":
                chunk = parse_chunk_name(name)
                if chunk is not None:
                    numbers.add(chunk[1])
            elif kind == "console":
                part = parse_console_name(name)
                if part is not None:
                    numbers.add(part[1])
            else:
                span = parse_media_index_name(name)
                if span is not None and span[2] >= span[1]:
                    numbers.update(range(span[1], span[2] + 1))  # a merged object covers its span
        if not numbers:
            marks[kind] = -1
            continue
        top = min(numbers)
        while top + 1 in numbers:
            top += 1
        marks[kind] = top
    return marks
