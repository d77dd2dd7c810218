"""``EvaluationTable``: each checkpoint's evaluation, live, with its actions.

Per checkpoint of a run (or of every run of a project): the state of its
newest evaluation (queued; running, with the worker and its lease; done,
with the scores; failed, with the message), the attempts it took, "Try
again" on failed rows, "Evaluate this checkpoint" on rows never evaluated,
and the project's "Evaluate every checkpoint…" switch. Everything goes
through the query API: ``RunHandle.evaluations()``, ``RunHandle.evaluate()``,
``Api.evaluation(id).retry()``, ``Api.project(p).evaluate_every_checkpoint()``.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable

from launchhelm._api import Api, RunHandle
from launchhelm._exceptions import InvalidArgumentError, RunNotFoundError
from launchhelm._types import Evaluation, RunLike
from launchhelm.widgets._base import LiveWidget, StoreArg, format_time, front_end, resolve_run, run_key, time_labels
from launchhelm.widgets._messages import EvaluationRow, EvaluationsState, synced_dict
from launchhelm.widgets._static import evaluations_html

__all__ = ["EvaluationTable", "describe_evaluation", "evaluation_rows"]

#: What a checkpoint with no evaluation shows as its state.
NOT_EVALUATED = "not evaluated"


def _scores(scores: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.4g}" for name, value in scores.items()) or "no scores"


def describe_evaluation(evaluation: Evaluation, now: float | None = None) -> str:
    """What the table shows beside an evaluation's state."""
    if evaluation.state == "done":
        return _scores(evaluation.scores)
    if evaluation.state == "failed":
        return evaluation.error or "failed without a message"
    if evaluation.state == "running":
        detail = f"on {evaluation.worker or 'a worker'}"
        if evaluation.lease_expires is not None:
            detail += f", lease until {format_time(evaluation.lease_expires)}"
            if evaluation.lease_expires < (time.time() if now is None else now):
                detail += " (lapsed: another worker may take it over)"
        return detail
    return f"queued at {format_time(evaluation.queued_at)}"


def _took(evaluation: Evaluation | None) -> float | None:
    """Seconds a finished evaluation ran (None while it has not finished)."""
    if evaluation is None or evaluation.started_at is None or evaluation.finished_at is None:
        return None
    return max(0.0, evaluation.finished_at - evaluation.started_at)


def evaluation_rows(handles: Iterable[RunHandle]) -> list[EvaluationRow]:
    """One row per checkpoint of each run (newest first): its evaluation's state, or "not evaluated"."""
    rows: list[EvaluationRow] = []
    for handle in handles:
        by_checkpoint = {e.checkpoint: e for e in handle.evaluations()}
        for checkpoint in reversed(handle.checkpoints()):
            evaluation = by_checkpoint.get(checkpoint.id)
            rows.append(
                {
                    "run_id": handle.id,
                    "run_name": handle.name,
                    "checkpoint": checkpoint.id,
                    "step": checkpoint.step,
                    "state": evaluation.state if evaluation else NOT_EVALUATED,
                    "detail": describe_evaluation(evaluation) if evaluation else "",
                    # the times in the detail, for the browser to show as people read them
                    "times": time_labels(evaluation.queued_at, evaluation.lease_expires) if evaluation else {},
                    "took": _took(evaluation),
                    "attempts": evaluation.attempts if evaluation else 0,
                    "evaluation_id": evaluation.id if evaluation else None,
                    "can_retry": evaluation is not None and evaluation.state == "failed",
                    "can_evaluate": evaluation is None,
                }
            )
    return rows


class EvaluationTable(LiveWidget[tuple[Api, RunHandle | None, str]]):
    """Each checkpoint's evaluation: state, worker and lease, scores or error, attempts.

    "Try again" retries a failed evaluation, "Evaluate this checkpoint"
    queues one for a checkpoint never evaluated (saved before the rule
    existed), and "Evaluate every checkpoint…" switches the project's rule
    (each checkpoint that finishes uploading gets one evaluation queued).
    Updates live while shown.

    Parameters
    ----------
    project_or_run:
        A project name (every run's checkpoints), or a :class:`launchhelm.Run`,
        :class:`launchhelm.RunHandle` or run id (that run's).
    store:
        Store URL or path for a name or id.
    interval:
        Seconds between reads of the store.

    Examples
    --------
    >>> from launchhelm.widgets import EvaluationTable
    >>> EvaluationTable("quickstart")     # doctest: +SKIP
    """

    state = synced_dict(EvaluationsState)
    _actions = {"retry": "retry", "evaluate": "evaluate", "set_rule": "set_rule"}  # noqa: RUF012

    @classmethod
    def _reuse_key(
        cls, project_or_run: RunLike | str, store: StoreArg = None, **_: object
    ) -> tuple[tuple[Hashable, ...], tuple[Api, RunHandle | None, str]]:
        if isinstance(project_or_run, str):
            api = Api(store)
            if project_or_run in api.projects():
                return (cls.__qualname__, api.store.url, "project", project_or_run), (api, None, project_or_run)
            try:
                handle = api.run(project_or_run)
            except RunNotFoundError:
                raise RunNotFoundError(
                    f"{project_or_run!r} is neither a project nor a run id in {api.store.url}; "
                    f"its projects: {', '.join(api.projects()) or 'none yet'}"
                ) from None
        else:
            api, handle = resolve_run(project_or_run, store)
        return run_key(cls, api, handle), (api, handle, handle.project)

    def __init__(self, project_or_run: RunLike | str, store: StoreArg = None, *, interval: float = 2.0) -> None:
        if self._reused():
            return
        self._esm, self._css, self.missing_front_end = front_end("evaluations.js")
        super().__init__(interval=interval)
        self._setup_live()
        self._api: Api = self._resolved[0]
        self._handle: RunHandle | None = self._resolved[1]
        self.project: str = self._resolved[2]
        self._handles: dict[str, RunHandle] = {}
        self._notice = ""
        self.refresh()

    def __repr__(self) -> str:
        scope = f"run {self._handle.id}" if self._handle is not None else f"project {self.project}"
        return f"<launchhelm.widgets.EvaluationTable {scope}>"

    def is_active(self) -> bool:
        # poll slowly while nothing is queued or running: a worker changes nothing then
        return any(r["state"] in ("queued", "running") for r in self.state.get("rows", []))

    def _runs(self) -> list[RunHandle]:
        if self._handle is not None:
            return [self._handle]
        for run_id in self._api.run_ids(self.project):
            if run_id not in self._handles:
                self._handles[run_id] = self._api.run(run_id)
        return sorted(self._handles.values(), key=lambda h: h.created, reverse=True)

    def _run(self, run_id: str) -> RunHandle:
        if self._handle is not None and self._handle.id == run_id:
            return self._handle
        return self._handles.get(run_id) or self._api.run(run_id)

    def refresh(self) -> None:
        """Re-read the checkpoints, their evaluations and the project's rule."""
        with self._lock:
            state: EvaluationsState = {
                "scope": "run" if self._handle is not None else "project",
                "project": self.project,
                "run": {"id": self._handle.id, "name": self._handle.name} if self._handle is not None else None,
                "rule": self._api.project(self.project).evaluate_every_checkpoint(),
                "rows": evaluation_rows(self._runs()),
                "notice": self._notice,
            }
            if state != self.state:
                self.state = state

    def static_mimebundle(self) -> dict[str, str]:
        return {"text/html": evaluations_html(self.state)}

    def rows(self) -> list[EvaluationRow]:
        """The rows shown now (one per checkpoint, newest first)."""
        return list(self.state.get("rows", []))

    # -- actions (buttons) ---------------------------------------------------
    def retry(self, evaluation_id: str) -> None:
        """The "Try again" button: queue the failed evaluation ``evaluation_id`` again."""
        self._api.evaluation(evaluation_id).retry()
        self._say(f"Evaluation {evaluation_id} queued again.")

    def evaluate(self, checkpoint_id: str, run_id: str | None = None) -> None:
        """The "Evaluate this checkpoint" button: queue an evaluation of ``checkpoint_id``."""
        handle = self._run(run_id) if run_id else self._handle
        if handle is None:
            raise InvalidArgumentError("evaluate() on a project's table needs run_id=")
        handle.evaluate(checkpoint_id)
        self._say(f"Evaluation of checkpoint {checkpoint_id} queued.")

    def set_rule(self, enabled: bool) -> None:
        """Switch the project's "Evaluate every checkpoint…" rule on or off."""
        self._api.project(self.project).evaluate_every_checkpoint(bool(enabled))
        self._say(
            f"Every checkpoint of project {self.project} that finishes uploading is now evaluated."
            if enabled
            else f"Checkpoints of project {self.project} are no longer evaluated automatically."
        )

    def _say(self, notice: str) -> None:
        with self._lock:
            self._notice = notice
            self.refresh()
