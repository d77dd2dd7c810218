"""Public records returned by the query API and passed to callbacks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import TypeAlias

    from launchhelm.storage import Store

__all__ = ["Attempt", "Checkpoint", "Evaluation", "JSONValue", "Rewind", "RunLike"]

#: A value as JSON carries it: what ``json.loads`` returns and ``json.dumps`` takes
#: (configs, tunables, control changes, stored records' free-form parts).
JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None


@runtime_checkable
class RunLike(Protocol):
    """A run or a handle on one: what the widgets and the display hook take.

    Both :class:`launchhelm.Run` (being written here) and
    :class:`launchhelm.RunHandle` (read from a store) satisfy it, so code above
    the core names a run without importing the writer.
    """

    @property
    def id(self) -> str: ...

    @property
    def store(self) -> Store: ...


@dataclass(frozen=True)
class Attempt:
    """One session of a run: a launch of its job, and how it ended (``RunHandle.attempts()``).

    Attributes
    ----------
    session:
        The session's id.
    launcher:
        The scheduler's launch (``{"scheduler", "job", "restart", "instance"}``) with
        ``auto_resume``; None for a launch no scheduler named.
    host:
        The host its process ran on.
    started_at, ended_at:
        Epoch seconds; ``ended_at`` is None while it runs, and for a session that died
        without a word it is its last heartbeat.
    first_step, last_step:
        The run's step when the session started, and the furthest it reached.
    ending:
        ``"running"``, ``"finished"``, ``"preempted"``, ``"crashed"`` (died without a
        notice), ``"hung"`` or ``"fenced"`` (a newer attempt of its job took over).
    detail:
        What ended it, in words (the signal, the exception, who replaced it).
    helper:
        While it runs: the pid of its helper process on ``host``, as its last heartbeat
        says (None: no helper, or a store written before this field).
    """

    session: str
    launcher: Mapping[str, object] | None
    host: str | None
    started_at: float
    ended_at: float | None
    first_step: int
    last_step: int
    ending: str
    detail: str | None = None
    helper: int | None = None

    def describe(self, after: Attempt | None = None) -> str:
        """One line, e.g. "preempted at step 4,812 (SIGTERM at step 4812, checkpoint ... saved); relaunched
        41 s later on node-3". ``after`` is the next attempt, if any."""
        launcher = self.launcher or {}
        restart = launcher.get("restart")
        by = f"{launcher.get('scheduler')} job {launcher.get('job')}" if launcher else "a launch"
        if isinstance(restart, list) and restart:
            counts = list(restart)
            while len(counts) > 1 and counts[-1] == 0:  # SLURM's (requeues, torchrun restarts): "1", "1/2"
                counts.pop()
            by += f" (restart {'/'.join(str(x) for x in counts)})"
        where = f" on {self.host}" if self.host else ""
        if self.ending == "running":
            line = f"running since step {self.first_step:,}, now at {self.last_step:,}"
            if self.helper is not None:
                line += f"; its helper process is pid {self.helper}"
        else:
            line = f"{self.ending} at step {self.last_step:,}"
            if self.detail and self.detail not in ("finish", "exit"):
                line += f" ({self.detail})"
        line = f"{by}{where}: steps {self.first_step:,}-{self.last_step:,}; {line}"
        if after is not None:
            gap = f" {after.started_at - self.ended_at:.0f} s later" if self.ended_at is not None else ""
            line += f"; relaunched{gap}" + (f" on {after.host}" if after.host else "")
        return line


@dataclass(frozen=True)
class Rewind:
    """History went back: a load restored ``to_step`` after the run had reached ``reached``.

    Points logged afterwards at steps ``to_step + 1 .. reached`` are a new
    attempt; the abandoned attempt's values stay stored.

    Attributes
    ----------
    to_step:
        The step the run continues from (the checkpoint's step).
    reached:
        The furthest step the run had reached before the rewind.
    cause:
        Why: ``"load_checkpoint"`` (a restore in a resumed or running process).
    checkpoint:
        Id of the checkpoint restored (None for a restore from a plain path).
    attempt:
        The attempt number points carry after this rewind.
    """

    to_step: int
    reached: int
    cause: str
    checkpoint: str | None
    attempt: int = 0

    def describe(self) -> str:
        """The sentence the charts show: "Resumed from step 64 after reaching 352"."""
        return f"Resumed from step {self.to_step} after reaching {self.reached}"


@dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint of a run, as the "Resume…" picker lists it.

    Attributes
    ----------
    id:
        Artifact id (what ``save_checkpoint`` returned).
    run_id:
        The run it belongs to.
    step:
        The step it restores.
    saved_at:
        When it was published, seconds since the epoch.
    size:
        Payload bytes (all files).
    sha256:
        Hex sha256 of the payload (single file) or of its manifest, for
        checkpoints recorded that way by earlier versions; ``""`` for newer
        ones, which record ``checksums`` instead.
    format:
        ``launchhelm.torch.checkpoint/1``, ``/2`` or ``/3`` (sharded), or ``file`` / ``directory``
        for plain ``run.checkpoint(path)`` artifacts.
    steps_to_redo:
        The furthest step the run reached minus ``step``: what restoring it replays.
    before_last_control_change:
        Saved before the run's latest control change (tunables, pause...), so
        restoring it brings back the settings in force then.
    chosen_for_resume:
        Someone chose it: the next ``load_checkpoint("resume")`` restores it.
    files:
        ``name -> size`` of the payload files.
    checksums:
        ``{"crc64nvme": hex}`` of the payload (single file) or of its
        manifest, plus ``"crc32c"`` on GCS; ``{"sha256": hex}`` for older ones.
    world_size:
        How many ranks saved it (1: a single process).
    """

    id: str
    run_id: str
    step: int
    saved_at: float
    size: int
    sha256: str
    format: str
    steps_to_redo: int
    before_last_control_change: bool
    chosen_for_resume: bool
    files: dict[str, int]
    checksums: dict[str, str] = field(default_factory=dict)
    world_size: int = 1


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of a checkpoint, as the checkpoint list shows it.

    Read with ``RunHandle.evaluations()`` or ``Api.project(p).evaluations()``;
    a snapshot, not a live view.

    Attributes
    ----------
    id:
        ``<run id>-<checkpoint id>``: what ``Api.evaluation()`` takes.
    run_id, checkpoint, step:
        The run, the checkpoint scored and the step it was saved at.
    state:
        ``"queued"`` (waiting for a worker, or for another one after its
        worker's lease lapsed), ``"running"`` (a worker holds a live lease),
        ``"done"`` (``scores`` are logged to the run as ``eval/<name>``) or
        ``"failed"`` (``error`` and ``traceback`` say why).
    scores:
        ``name -> value`` as the score function returned them (``done`` only).
    error, traceback:
        Why it failed (``failed`` only).
    worker:
        The worker running it, or that finished it.
    lease_expires:
        When the running worker's lease lapses unless renewed (``running`` only).
    attempts:
        How many times a worker started it (a takeover after a worker died
        and each "Try again" count).
    retries:
        How many times "Try again" (``retry()``) queued it again.
    queued_at, started_at, finished_at:
        Seconds since the epoch; ``started_at`` is when the current (or last)
        worker took it.
    project:
        The project whose queue holds it.
    reason:
        ``"rule"`` (the project's evaluate-every-checkpoint rule) or
        ``"manual"`` ("Evaluate this checkpoint").
    """

    id: str
    run_id: str
    checkpoint: str
    step: int
    state: str
    scores: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    traceback: str | None = None
    worker: str | None = None
    lease_expires: float | None = None
    attempts: int = 0
    retries: int = 0
    queued_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    project: str = ""
    reason: str = "rule"

    def describe(self) -> str:
        """One line for a listing: ``done: accuracy=0.91, loss=0.3``."""
        if self.state == "done":
            shown = ", ".join(f"{k}={v:.6g}" for k, v in self.scores.items())
            return f"done: {shown or 'no scores'}"
        if self.state == "failed":
            return f"failed: {self.error}"
        if self.state == "running":
            left = "" if self.lease_expires is None else f", lease {self.lease_expires - time.time():.0f}s left"
            return f"running on {self.worker}{left}"
        return "queued"
