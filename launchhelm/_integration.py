"""What the framework integrations share: find, download and verify a published checkpoint, record a restore.

``launchhelm.lightning`` and ``launchhelm.transformers`` let the framework
write its own checkpoint files and publish them with :meth:`Run.checkpoint`
(upload under a fresh key, size and CRC64NVME recorded, then the event). To
resume, they fetch a published checkpoint back to local disk, checking every
file against what was recorded, hand the path to the framework, and record
the rewind once the framework has restored it. Imports no framework and no
torch: the core stays light.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from launchhelm._exceptions import CheckpointError, InvalidArgumentError, InvalidTypeError
from launchhelm._run import Run
from launchhelm._runlog._checkpoints import DIRECTORY_FORMAT
from launchhelm._runlog._events import RunState
from launchhelm._runlog._records import CheckpointEvent
from launchhelm._types import JSONValue, Rewind
from launchhelm.storage import Store
from launchhelm.storage._checksum import file_checksums, mismatches, recorded, verifying_algorithms

__all__ = [
    "PendingRestore",
    "check_arguments",
    "download_checkpoint",
    "existing_run",
    "find_checkpoint",
    "job_run_id",
    "plain_config",
    "record_restore",
]


class PendingRestore:
    """A checkpoint fetched for the framework to restore: which one, at what step, whether it consumes the choice."""

    def __init__(self, checkpoint_id: str, step: int, consume: bool, path: Path) -> None:
        self.checkpoint_id = checkpoint_id
        self.step = step
        self.consume = consume
        self.path = path


def check_arguments(owner: str, project: object, run: object, config: object, resume: object) -> None:
    """What a logger or callback is given before it starts a run: refused as the user wrote it."""
    if run is not None and not isinstance(run, Run):
        raise InvalidTypeError(f"run= takes a launchhelm.Run (from launchhelm.init), not {type(run).__name__}")
    if run is None and not isinstance(project, str):
        raise InvalidArgumentError(f"{owner} needs a project name ({owner}('quickstart')) or run=launchhelm.init(...)")
    if config is not None and not isinstance(config, Mapping):
        raise InvalidTypeError(f"config is a {type(config).__name__}; pass a dict")
    if resume is not None and not isinstance(resume, str):
        raise InvalidTypeError(f"resume={resume!r}: pass the run id string (run.id)")


def find_checkpoint(state: RunState, run_id: str, which: str) -> tuple[CheckpointEvent | None, bool]:
    """The checkpoint event ``which`` names, and whether restoring it consumes the resume choice.

    ``"latest"``: the newest; ``"resume"``: the one chosen with
    ``RunHandle.choose_for_resume()``, else the newest; otherwise a
    checkpoint id of the run. (None, False) when the run has no checkpoint
    yet (for ``"latest"`` and ``"resume"``).
    """
    if not isinstance(which, str):
        raise InvalidTypeError(f"pass 'latest', 'resume' or a checkpoint id, not a {type(which).__name__} {which!r}")
    if which in ("latest", "resume"):
        event = state.latest_checkpoint if which == "latest" else state.resume_checkpoint
        if event is None:
            return None, False
        return event, which == "resume" and state.resume_choice == event["checkpoint"]
    event = state.checkpoint(which)
    if event is None:
        known = [str(e["checkpoint"]) for e in state.checkpoints[-3:]]
        hint = f" (its newest: {', '.join(known)})" if known else ""
        raise CheckpointError(
            f"run {run_id} has no checkpoint {which!r}{hint}: pass 'latest', 'resume' or one of its checkpoint ids "
            "(RunHandle.checkpoints())",
            run_id=run_id,
        )
    return event, False


def download_checkpoint(store: Store, run_id: str, event: CheckpointEvent, directory: Path) -> Path:
    """Fetch a published checkpoint's files into ``directory/<checkpoint id>``, each verified; return its path.

    The folder for a folder checkpoint, the file for a single-file one.
    Every file's size and checksum are checked against the record made when
    it was published; a missing or damaged file raises
    :class:`CheckpointError` and nothing is returned.
    """
    checkpoint_id = str(event["checkpoint"])
    target = (directory / checkpoint_id).absolute()
    files = list(event.get("files") or [])
    if not files:
        raise CheckpointError(f"checkpoint {checkpoint_id} records no files", run_id=run_id)
    prefix = str(event["prefix"])
    for entry in files:
        name = str(entry["name"])
        local = (target / name).absolute()
        if target not in local.parents:
            raise CheckpointError(f"checkpoint {checkpoint_id} names a file outside itself: {name!r}", run_id=run_id)
        try:
            store.download(f"{prefix}/{name}", local)
        except FileNotFoundError:
            raise CheckpointError(
                f"file {name!r} of checkpoint {checkpoint_id} is missing from the store; restore another one "
                "(RunHandle.checkpoints())",
                run_id=run_id,
            ) from None
        size = local.stat().st_size
        if size != int(entry["size"]):
            raise CheckpointError(
                f"file {name!r} of checkpoint {checkpoint_id} has {size} bytes, {entry['size']} were saved: the "
                "stored copy is damaged; restore another one",
                run_id=run_id,
            )
        expected = recorded(entry)
        wrong = mismatches(expected, file_checksums(local, verifying_algorithms(expected)))
        if wrong:
            raise CheckpointError(
                f"file {name!r} of checkpoint {checkpoint_id} does not match its {wrong[0]}: the stored copy is "
                "damaged; restore another one",
                run_id=run_id,
            )
    if event.get("format") == DIRECTORY_FORMAT or len(files) != 1:
        return target
    return target / str(files[0]["name"])


def record_restore(run: Run, step: int, pending: PendingRestore | None, cause: str) -> Rewind | None:
    """After the framework restored ``step``: record the rewind (if it goes back), consume the choice, move the step.

    ``pending`` is the checkpoint fetched for it (None: the framework
    restored something LaunchHelm did not fetch, or nothing).
    """
    checkpoint_id = pending.checkpoint_id if pending is not None and pending.step == step else None
    rewind = run._record_rewind(step, checkpoint_id, cause, run.reached)
    if pending is not None and checkpoint_id is not None and pending.consume:
        run._consume_resume_choice(pending.checkpoint_id)
    run._step = step  # not a step boundary: control requests wait for the next step
    if rewind is not None:
        run._run_rewind_callbacks(rewind)
    return rewind


def plain_config(values: Mapping[str, object]) -> dict[str, JSONValue]:
    """``values`` as plain JSON config: numbers, strings, bools, None, lists and dicts; anything else as ``str``."""

    def plain(value: object) -> JSONValue:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value) if math.isfinite(value) else str(value)
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, os.PathLike):
            return cast("str", os.fspath(value))  # a str path (a bytes one fails json.dumps below, as before)
        item = getattr(value, "item", None)  # numpy and torch scalars
        if callable(item):
            try:
                return plain(item())
            except (TypeError, ValueError, RuntimeError):
                pass
        enum_value: object = getattr(value, "value", None)
        if isinstance(enum_value, (str, int, float, bool)):
            return enum_value
        return str(value)

    out = {str(k): plain(v) for k, v in values.items()}
    json.dumps(out)  # plain by construction
    return out


def job_run_id(project: str | None, options: Mapping[str, Any]) -> str | None:
    """With ``auto_resume`` in ``options``: the run id every launch of this job computes, on every rank (no
    collective needed); None without ``auto_resume`` or without a job identity."""
    if project is None or not options.get("auto_resume"):
        return None
    from launchhelm._runlog._launch import auto_run_id, launch_identity

    launch = launch_identity(explicit=options.get("run_id"))
    return auto_run_id(project, launch) if launch is not None else None


def existing_run(store: Store, run_id: str) -> bool:
    """Whether ``run_id`` exists yet (a job's first launch: rank 0 may still be creating it)."""
    from launchhelm._exceptions import RunNotFoundError
    from launchhelm._runlog._runinfo import read_run_record

    try:
        read_run_record(store, run_id)
    except RunNotFoundError:
        return False
    return True
