"""Public records returned by the query API and passed to callbacks."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Checkpoint", "Rewind"]


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
        Hex digest of the payload (single file), or of the manifest of files.
    format:
        ``launchhelm.torch.checkpoint/1`` or ``/2``, or ``file`` / ``directory``
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
