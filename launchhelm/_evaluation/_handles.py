"""Handles on a project's evaluation settings and on one evaluation: what ``Api`` returns."""

from __future__ import annotations

import time

from launchhelm._evaluation._queue import (
    DONE,
    FAILED,
    QUEUED,
    RUNNING,
    EvaluationQueue,
    _Listed,
    parse_evaluation_id,
    queue_for,
)
from launchhelm._exceptions import (
    EvaluationNotFoundError,
    InvalidArgumentError,
    InvalidTypeError,
)
from launchhelm._runlog._events import validate_project
from launchhelm._runlog._runinfo import read_run_record
from launchhelm._types import Evaluation
from launchhelm.storage import Store

__all__ = ["EvaluationHandle", "ProjectHandle"]


class ProjectHandle:
    """A project's settings and evaluation queue, read and changed from any process.

    Get one with ``launchhelm.Api().project(name)``; the project need not
    have runs yet (turn the rule on before training).
    """

    def __init__(self, store: Store, name: str) -> None:
        self._store = store
        self.name = validate_project(name)

    def __repr__(self) -> str:
        return f"<launchhelm.ProjectHandle {self.name}>"

    @property
    def _queue(self) -> EvaluationQueue:
        return queue_for(self._store, self.name)

    def evaluate_every_checkpoint(self, enabled: bool | None = None) -> bool:
        """The project rule "Evaluate every checkpoint": read it, or turn it on or off.

        While on, each checkpoint that finishes uploading in any run of the
        project queues one evaluation of it, for a worker
        (``@launchhelm.evaluate``) to take. Checkpoints saved while it was off
        are not queued; queue those with ``RunHandle.evaluate(checkpoint_id)``.

        Parameters
        ----------
        enabled:
            True or False sets the rule; None (default) only reads it.

        Returns
        -------
        bool
            Whether the rule is on (after the change).

        Examples
        --------
        >>> lh.Api().project("quickstart").evaluate_every_checkpoint(True)   # doctest: +SKIP
        True
        """
        if enabled is None:
            return self._queue.rule_enabled()
        if not isinstance(enabled, bool):
            raise InvalidTypeError(f"evaluate_every_checkpoint({enabled!r}): pass True, False, or nothing to read it")
        return self._queue.set_rule(enabled)

    def evaluations(self, state: str | None = None) -> list[Evaluation]:
        """Every evaluation in the project's queue, oldest queued first.

        Parameters
        ----------
        state:
            Only those in this state: ``"queued"``, ``"running"``, ``"done"``
            or ``"failed"``.
        """
        if state is not None and state not in (QUEUED, RUNNING, DONE, FAILED):
            raise InvalidArgumentError(f"state={state!r}: use 'queued', 'running', 'done', 'failed' or None")
        return self._queue.evaluations(state=state)


class EvaluationHandle:
    """One evaluation, read fresh on each call; ``retry()`` is "Try again".

    Get one with ``launchhelm.Api().evaluation(evaluation_id)``.
    """

    def __init__(self, store: Store, evaluation_id: str) -> None:
        self._store = store
        self.run_id, self.checkpoint = parse_evaluation_id(evaluation_id)
        self.id = evaluation_id
        self.project = str(read_run_record(store, self.run_id)["project"])
        self._listed()  # refuse an unknown id now

    def __repr__(self) -> str:
        return f"<launchhelm.EvaluationHandle {self.id}>"

    @property
    def _queue(self) -> EvaluationQueue:
        return queue_for(self._store, self.project)

    def _listed(self) -> _Listed:
        listed = self._queue.scan_one(self.run_id, self.checkpoint)
        if listed is None:
            raise EvaluationNotFoundError(
                f"no evaluation {self.id!r} is queued in project {self.project!r}; queue it with "
                f"Api().run({self.run_id!r}).evaluate({self.checkpoint!r})",
                evaluation_id=self.id,
            )
        return listed

    def record(self) -> Evaluation:
        """Its state now."""
        return self._queue.record(self._listed())

    @property
    def state(self) -> str:
        """``"queued"``, ``"running"``, ``"done"`` or ``"failed"``, now."""
        return self.record().state

    def retry(self) -> Evaluation:
        """Queue a failed evaluation once more ("Try again"); return its new record.

        Raises
        ------
        EvaluationStateError
            It did not fail (queued, running or done). A done evaluation is
            never re-run: its scores are logged once.
        """
        self._queue.retry(self._listed())
        return self.record()

    def wait(self, timeout: float = 60.0, poll_interval: float = 0.5) -> Evaluation:
        """Block until it is done or failed (or ``timeout`` seconds pass) and return its record.

        Raises
        ------
        InvalidArgumentError
            ``timeout`` or ``poll_interval`` is not a positive number.
        """
        for name, value in (("timeout", timeout), ("poll_interval", poll_interval)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidArgumentError(f"{name}={value!r}: give a positive number of seconds")
        deadline = time.monotonic() + timeout
        while True:
            record = self.record()
            if record.state in (DONE, FAILED) or time.monotonic() >= deadline:
                return record
            time.sleep(poll_interval)
