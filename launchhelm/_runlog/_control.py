"""Tunables and control actions: requests from outside, applied at step boundaries.

A notebook (or the CLI, or a widget) records a request as an event in the
run's log: ``control_tunables`` with new values, or ``control_action`` with
``pause``, ``resume``, ``stop`` or ``checkpoint``. The training process polls
the log from its background thread every ``control_interval`` seconds (one
``list`` of the run's events plus one ``read`` per new event, so a few
requests per poll on S3 at most), and applies what arrived at its next step
boundary, in the main thread: when ``global_step`` advances (the watched
optimizer's ``step()``, or an assignment). Each application is recorded as a
``control_applied`` event with the step it took effect at.

Every request that changes a setting a checkpoint holds (tunables, pause,
resume) is a *control change*; its sequence number is the run's control sequence number.
Checkpoints record the number in force when they were saved, so "Resume…"
can mark those saved before the last change, and restoring one brings back
the tunables and control state in force then.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError, TunableNotFoundError
from launchhelm._runlog._events import RunState
from launchhelm._runlog._records import Json

__all__ = ["ACTIONS", "check_plain", "check_tunable_changes", "in_force"]

#: What ``RunHandle.control()`` takes.
ACTIONS = ("pause", "resume", "stop", "checkpoint")


def _kind(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, Mapping):
        return "dict"
    return type(value).__name__


def check_plain(value: object, where: str) -> None:
    """Refuse what is not a plain JSON value, naming the key path.

    Config and tunables must round-trip through the event log (JSON) and,
    for tunables, through ``torch.load(weights_only=True)`` in a checkpoint.
    """
    if value is None or isinstance(value, (bool, str)):
        return
    if type(value) in (int, float):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgumentError(f"{where} is {value}; use a finite number or a string")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidTypeError(f"{where} has a key {k!r} of type {type(k).__name__}; keys must be strings")
            check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_plain(v, f"{where}[{i}]")
        return
    kind = type(value)
    raise InvalidTypeError(
        f"{where} is a {kind.__name__} ({kind.__module__}.{kind.__qualname__}); config and tunables hold "
        "plain values (str, int, float, bool, None, lists and dicts of them), which every checkpoint restores "
        "with torch.load(weights_only=True): convert it first, e.g. float(x) or str(path)"
    )


def check_tunable_changes(current: Mapping[str, object], changes: Mapping[str, object]) -> dict[str, Json]:
    """Validate ``changes`` against the run's tunables; return them as plain values.

    A change must name a tunable the run was started with, keep its kind
    (a number stays a number, ints may become floats and back; a bool stays a
    bool; a string a string...; a tunable that was None takes anything plain),
    and hold only plain values.
    """
    if not changes:
        raise InvalidArgumentError("set_tunables() needs at least one change, e.g. set_tunables(lr=1e-4)")
    out: dict[str, Json] = {}
    for name, value in changes.items():
        if name not in current:
            known = ", ".join(sorted(current)) or "none: start the run with lh.init(..., tunables={...})"
            raise TunableNotFoundError(f"the run has no tunable {name!r} (its tunables: {known})", name=name)
        check_plain(value, f"tunable {name!r}")
        old = current[name]
        if old is not None and _kind(old) != _kind(value):
            raise InvalidTypeError(
                f"tunable {name!r} is a {_kind(old)} ({old!r}); {value!r} is a {_kind(value)}: give a {_kind(old)}"
            )
        if isinstance(value, tuple):
            value = list(value)
        if _kind(old) == "number" and isinstance(old, float) and isinstance(value, int):
            value = float(value)
        out[name] = json.loads(json.dumps(value))  # a deep, plain copy
    return out


def in_force(initial: Mapping[str, Json], state: RunState) -> tuple[dict[str, Json], int, bool]:
    """``(tunables, control_seq, paused)`` the last training process had applied."""
    if not state.applied:
        return dict(initial), 0, False
    last = state.applied[-1]
    return dict(last.get("tunables") or initial), int(last.get("control_seq") or 0), bool(last.get("paused"))
