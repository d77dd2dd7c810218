"""The evaluation queue's records: requests, retries, outcomes, result slots and rule changes.

Each is what one object under a project's ``evaluations/`` holds (see docs/storage.md), or what a
worker hands the queue; :mod:`launchhelm._evaluation._queue` reads and writes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict

from launchhelm._runlog._records import Requester

if TYPE_CHECKING:
    from typing import TypeAlias

    from typing_extensions import NotRequired

__all__ = [
    "DoneOutcome",
    "EvaluationRequest",
    "FailedOutcome",
    "Outcome",
    "RetryRecord",
    "RuleEntry",
    "Slot",
]


class EvaluationRequest(TypedDict):
    """``.../request.json``: what :meth:`EvaluationQueue.queue` creates, once per checkpoint."""

    format: str
    id: str
    project: str
    run_id: str
    checkpoint: str
    step: int
    checkpoint_time: float
    queued_at: float
    #: ``"rule"`` or ``"manual"``; requests queued by earlier versions lack it (a rule's)
    reason: NotRequired[str]


class RetryRecord(TypedDict):
    """``.../a<n>/retry.json``: someone asked for another attempt of a failed evaluation."""

    time: float
    by: Requester


class DoneOutcome(TypedDict):
    """What a worker publishes when the score function returned: the scores and where they are logged."""

    state: Literal["done"]
    scores: dict[str, float]
    step: int
    #: the run attempt the checkpoint was saved under (its points go with that attempt)
    run_attempt: int
    point_time: float


class FailedOutcome(TypedDict):
    """What a worker publishes when the score function raised."""

    state: Literal["failed"]
    error: str
    traceback: str


#: The outcome of one call of the score function.
Outcome: TypeAlias = DoneOutcome | FailedOutcome


class Slot(TypedDict, total=False):
    """An epoch's result slot as read back: a result or a fence (``kind``).

    A result is an :data:`Outcome` plus who published it (``worker``,
    ``attempt``, ``epoch``, ``started_at``, ``finished_at``); a fence says
    why the epoch can no longer publish (``reason``, ``by``, ``time``).
    """

    kind: str
    state: str
    scores: dict[str, float]
    step: int
    run_attempt: int
    point_time: float
    error: str
    traceback: str
    worker: str
    attempt: int
    epoch: int
    started_at: float
    finished_at: float
    reason: str
    by: str
    time: float


class _EvaluationFields(TypedDict, total=False):
    """The fields of an :class:`Evaluation` that its state decides."""

    state: str
    scores: dict[str, float]
    error: str | None
    traceback: str | None
    worker: str | None
    lease_expires: float | None
    started_at: float | None
    finished_at: float | None


class RuleEntry(TypedDict):
    """One change of a project's evaluate-every-checkpoint rule."""

    enabled: bool
    time: float
    by: Requester
