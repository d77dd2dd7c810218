"""``ResumePicker``: the "Resume…" list of a run's checkpoints.

It says how the run ended ("stopped without ending its session, last
heartbeat ..., furthest step N"), lists its checkpoints with their size (and,
sharded, their shards and the ranks that saved them) and the steps each leaves
to redo, marks those saved before the last control change, the latest and the
chosen one, and chooses one through
:meth:`launchhelm.RunHandle.choose_for_resume`: the next
``load_checkpoint("resume")`` restores it, once.

What it says never contradicts itself: one sentence says what the next
``load_checkpoint("resume")`` restores (or that a closed run has no next
resume), the green confirmation of a "Choose" shows only while that choice is
still the one a resume takes, and a choice a resume already used (or a later
choice replaced) is history, said in plain text.
"""

from __future__ import annotations

from dataclasses import dataclass

from launchhelm._api import RunHandle
from launchhelm._types import Checkpoint, RunLike
from launchhelm._views._runs import row_detail
from launchhelm.widgets._base import RunWidget, StoreArg, format_time, time_labels
from launchhelm.widgets._messages import PickerCheckpoint, PickerState, synced_dict
from launchhelm.widgets._static import picker_html

__all__ = ["Choice", "ResumePicker", "picker_state", "status_sentence"]

# written by launchhelm.torch (which widgets do not import): a manifest plus one object per shard
_SHARDED_FORMAT = "launchhelm.torch.checkpoint/3"
_MANIFEST = "manifest.json"


def status_sentence(status: str, last_heartbeat: float | None, step: int, detail: str = "") -> str:
    """How the run stands, in the words the picker shows; ``detail`` is the runs table's (``views._runs``)."""
    beat = format_time(last_heartbeat)
    if status == "hung":
        return f"hung, last heartbeat {beat}, furthest step {step}: {detail or 'no step for its hang timeout'}"
    if status == "restart loop":
        return f"in a restart loop, furthest step {step}: {detail}"
    if detail:  # how its last attempt ended (hung, crashed, preempted, fenced)
        return f"{status_sentence(status, last_heartbeat, step)}; {detail}"
    if status == "stopped":
        return f"stopped without ending its session, last heartbeat {beat}, furthest step {step}"
    if status == "running":
        return f"running, last heartbeat {beat}, furthest step {step}"
    if status == "resumable":
        return f"resumable: its last session ended with finish(close_run=False), furthest step {step}"
    if status == "closed":
        return f"closed: finish() closed it, so it cannot be resumed; furthest step {step}"
    return f"{status}, furthest step {step}"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB"):
        if value < 1000:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def _layout(checkpoint: Checkpoint) -> tuple[int, str]:
    """``(shards, text)``: a sharded checkpoint's shard objects and the ranks that saved it; ``(0, "")`` else."""
    if checkpoint.format != _SHARDED_FORMAT:
        return 0, ""
    shards = sum(1 for name in checkpoint.files if name != _MANIFEST)
    ranks = checkpoint.world_size
    return shards, f"{shards} shard{'s' * (shards != 1)}, saved on {ranks} rank{'s' * (ranks != 1)}"


@dataclass(frozen=True)
class Choice:
    """A checkpoint chosen with this picker's "Choose": the confirmation stays true only while it is pending."""

    checkpoint_id: str
    step: int


def _choice_sentences(choice: Choice | None, checkpoints: list[Checkpoint], closed: bool) -> tuple[str, str]:
    """``(confirmation, earlier)``: the green confirmation while ``choice`` is what a resume takes, else its history."""
    if choice is None:
        return "", ""
    pending = next((c for c in checkpoints if c.chosen_for_resume), None)
    if pending is not None and pending.id == choice.checkpoint_id and not closed:
        restores = f'the next load_checkpoint("resume") restores step {choice.step}'
        return f"Chosen: {restores} (checkpoint {choice.checkpoint_id}).", ""
    if pending is not None and pending.id == choice.checkpoint_id:
        why = "not used: the run was closed"
    elif pending is not None:
        why = f"replaced by a later choice, step {pending.step}"
    elif all(c.id != choice.checkpoint_id for c in checkpoints):
        why = "its checkpoint was deleted since"
    else:  # still listed and no longer pending: a resume consumed it
        why = "already used by a resume"
    return "", f"Chosen earlier: step {choice.step} ({why}; checkpoint {choice.checkpoint_id})."


def picker_state(handle: RunHandle, choice: Choice | None = None) -> PickerState:
    """Everything the picker shows, read through the query API.

    ``choice`` is the checkpoint last chosen with this picker, if any: its
    confirmation is shown while it is pending, as history once not.
    """
    summary = handle.summary()
    status = str(summary["status"])
    step = int(summary["step"])
    closed = status == "closed"
    checkpoints = handle.checkpoints()
    last_heartbeat = handle.last_heartbeat
    latest = checkpoints[-1].id if checkpoints else None
    resume = next((c for c in checkpoints if c.chosen_for_resume), None) or (checkpoints[-1] if checkpoints else None)
    if resume is None:
        restores = 'No checkpoint yet: load_checkpoint("resume") has nothing to restore.'
    elif closed:  # a closed run is never resumed: "the next resume restores ..." would be false
        restores = 'This run is closed, so no load_checkpoint("resume") will restore any of its checkpoints.'
    elif resume.chosen_for_resume:
        restores = f'The next load_checkpoint("resume") restores step {resume.step} (chosen, checkpoint {resume.id}).'
    else:
        restores = (
            f'The next load_checkpoint("resume") restores step {resume.step} (the latest, checkpoint {resume.id}).'
        )
    confirmation, earlier = _choice_sentences(choice, checkpoints, closed)
    rows: list[PickerCheckpoint] = []
    for c in reversed(checkpoints):  # newest first
        shards, text = _layout(c)
        rows.append(
            {
                "id": c.id,
                "step": c.step,
                "saved_at": format_time(c.saved_at),
                "size": _size(c.size),
                "shards": shards,
                "layout": text,
                "steps_to_redo": c.steps_to_redo,
                "before_last_control_change": c.before_last_control_change,
                "latest": c.id == latest,
                "chosen": c.chosen_for_resume and not closed,
            }
        )
    attempts = handle.attempts()
    shown = len(attempts) > 1 or any(a.launcher for a in attempts)
    return {
        "run": {"id": handle.id, "name": handle.name, "project": handle.project},
        "status": status,
        # how each launch ended, so a person choosing sees what the checkpoints led to
        "attempts": [a.describe(attempts[i + 1] if i + 1 < len(attempts) else None) for i, a in enumerate(attempts)]
        if shown
        else [],
        "restart_loop": str(summary.get("restart_loop") or ""),
        "sentence": status_sentence(status, last_heartbeat, step, row_detail(summary)),
        "step": step,
        # epoch seconds of each time in the text above and below, for the browser to show as people read them
        "times": time_labels(last_heartbeat, *(c.saved_at for c in checkpoints)),
        "can_choose": not closed,
        "restores": restores,
        "confirmation": confirmation,
        "earlier": earlier,
        "checkpoints": rows,
    }


class ResumePicker(RunWidget):
    """The "Resume…" picker: choose which checkpoint the run's next ``load_checkpoint("resume")`` restores.

    For a run that stopped without ending its session it says so, with its
    last heartbeat and furthest step, and lists its checkpoints (newest
    first): step, when it was saved, the steps it leaves to redo, a mark on
    those saved before the last control change (restoring one brings back the
    tunables in force then), which is the latest and which is chosen.
    "Choose" records the choice (:meth:`launchhelm.RunHandle.choose_for_resume`).

    Parameters
    ----------
    run_or_id:
        A :class:`launchhelm.Run`, a :class:`launchhelm.RunHandle` or a run id.
    store:
        Store URL or path for a run id.
    interval:
        Seconds between reads of the store while it is shown.

    Examples
    --------
    >>> from launchhelm.widgets import ResumePicker
    >>> picker = ResumePicker(run_id)        # doctest: +SKIP
    >>> picker.choose(picker.run.checkpoints()[0].id)   # what clicking "Choose" does   # doctest: +SKIP
    """

    _bundle = "picker.js"
    state = synced_dict(PickerState)
    _actions = {"choose": "choose"}  # noqa: RUF012

    def __init__(self, run_or_id: RunLike | str, store: StoreArg = None, *, interval: float = 2.0) -> None:
        if self._reused():
            return
        self._init_run(interval)
        self._choice: Choice | None = None
        self.refresh()

    def refresh(self) -> None:
        """Re-read the run's status and checkpoints."""
        with self._lock:
            state = picker_state(self._handle, self._choice)
            if state != self.state:
                self.state = state

    def static_mimebundle(self) -> dict[str, str]:
        return {"text/html": picker_html(self.state)}

    def choose(self, checkpoint_id: str) -> None:
        """Make ``checkpoint_id`` the one the next ``load_checkpoint("resume")`` restores (as "Choose" does)."""
        chosen = self._handle.choose_for_resume(checkpoint_id)
        with self._lock:
            self._choice = Choice(chosen.id, chosen.step)
            self.refresh()
