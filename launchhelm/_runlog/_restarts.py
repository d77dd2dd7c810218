"""Restart loops: ``auto_resume`` refuses a launch after attempts in a row that failed without progress.

A relaunch that crashes right after its load, relaunched again and again,
burns the scheduler's budget (issue 42). Before a relaunch's session starts,
:func:`check_restart_loop` looks at the attempts since the last resume choice,
newest first: one that ended crashed, hung or fenced (killed and replaced)
without progress counts; one that finished, was preempted, or made progress
stops the count. Progress is a published checkpoint, or a logged step past
where the attempt resumed (its rewind's step, else the step it started at).
"""

from __future__ import annotations

from launchhelm._exceptions import InvalidArgumentError, RestartLoopError
from launchhelm._runlog._events import RunState, SessionRecord
from launchhelm.storage import Store
from launchhelm.storage._keys import metrics_prefix, parse_chunk_name

__all__ = ["DEFAULT_MAX_FAILED_RESTARTS", "check_restart_loop", "restart_limit"]

#: Failed attempts in a row before a launch is refused, unless ``max_failed_restarts`` says otherwise.
DEFAULT_MAX_FAILED_RESTARTS = 3
#: Endings that say nothing went wrong: they end a run of failures.
_FINE = frozenset({"finished", "preempted"})


def restart_limit(value: object) -> int | None:
    """``max_failed_restarts`` checked: a positive int or None (never refuse)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(
            f"max_failed_restarts={value!r}: give a positive number of attempts (default "
            f"{DEFAULT_MAX_FAILED_RESTARTS}) or None to never refuse a relaunch; nothing was written"
        )
    return value


def _reached(store: Store, run_id: str) -> dict[str, int]:
    """The highest step each session logged (its metric chunks, recovered spools included)."""
    reached: dict[str, int] = {}
    prefix = metrics_prefix(run_id)
    for key in store.list(prefix):
        parsed = parse_chunk_name(key[len(prefix) + 1 :] if key.startswith(prefix) else key)
        if parsed is not None:
            session, _, _, last = parsed
            reached[session] = max(reached.get(session, -1), last)
    return reached


def _resumed_from(state: RunState, session: SessionRecord) -> tuple[int, str | None]:
    rewinds = [r for r in state.rewinds if r.get("session") == session.id]
    if rewinds:
        return int(rewinds[-1]["to_step"]), rewinds[-1].get("checkpoint")
    return session.start_step, None


def failed_attempts(store: Store, run_id: str, state: RunState) -> list[dict[str, object]]:
    """The attempts in a row, newest last, that ended badly without progress (since the last resume choice)."""
    published = {str(c.get("session")) for c in state.checkpoints}
    reached: dict[str, int] | None = None
    failed: list[dict[str, object]] = []
    for session in reversed(state.sessions):
        if session.start_seq <= state.resume_choice_seq:
            break  # a person chose where to resume after these: they no longer count
        if session.ending in _FINE or session.id in published:
            break
        if reached is None:
            reached = _reached(store, run_id)
        start, checkpoint = _resumed_from(state, session)
        last = reached.get(session.id, -1)
        if session.ending == "hung" and session.end_step is not None:
            last = max(last, session.end_step)  # the watchdog's step: what the hung attempt reached
        if last > start:
            break
        failed.append(
            {
                "session": session.id,
                "ending": session.ending or "crashed",
                "detail": session.detail or "",
                "step": start,
                "checkpoint": checkpoint,
            }
        )
    failed.reverse()
    return failed


def check_restart_loop(store: Store, run_id: str, state: RunState, limit: int | None) -> None:
    """Refuse the launch with :class:`RestartLoopError` if ``limit`` attempts in a row failed without progress."""
    if limit is None:
        return
    failed = failed_attempts(store, run_id, state)
    if len(failed) < limit:
        return
    lines = "\n".join(
        f"  - session {a['session']}: {a['ending']} ({a['detail'] or 'no detail'}), resumed at step {a['step']}"
        + (f" from checkpoint {a['checkpoint']}" if a["checkpoint"] else "")
        for a in failed
    )
    raise RestartLoopError(
        f"run {run_id}: refusing to relaunch: the last {len(failed)} attempts each ended without a step past "
        f"where they resumed (max_failed_restarts={limit}):\n{lines}\n"
        "Fix the cause, then choose a checkpoint to resume from (RunHandle.choose_for_resume(...), or the "
        "picker), which clears this; or pass max_failed_restarts=None",
        run_id=run_id,
        attempts=failed,
    )
