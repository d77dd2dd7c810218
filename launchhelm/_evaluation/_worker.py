"""Evaluation workers: ``@launchhelm.evaluate`` and ``EvaluationContext``.

A worker takes the project's queued evaluations one at a time (the queue,
leases and results are described in ``launchhelm._evaluation._queue``)::

    @launchhelm.evaluate(project="quickstart")
    def score(ctx: launchhelm.EvaluationContext) -> dict[str, float]:
        model = load(ctx.download_to("checkpoints"))
        return {"accuracy": accuracy(model), "loss": loss(model)}

    score.serve()

While the function runs, a background thread renews the worker's lease
every quarter of ``lease_seconds``. A worker that dies leaves the evaluation
to the next one once its lease lapses (at once if it was a process on the
same host); a worker stalled past its lease is fenced and its result is
dropped. Ctrl-C releases the lease, so another worker takes the evaluation
at once.

An outage of the store is ridden out: the worker says once that the store
stopped answering and once that it answers again; meanwhile it keeps its
claim, and a score function that failed because the store was unreachable
(its download, say) runs again once it answers, rather than being recorded
as failed. A result is published once the store takes it.

Access: a worker reads ``runs/`` and ``projects/<p>/``, and writes only
under ``projects/<p>/evaluations/`` and ``runs/*/metrics/eval-*``
(``launchhelm policy evaluation --store s3://...`` prints the S3 policy).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from launchhelm._evaluation._queue import (
    DEFAULT_LEASE_SECONDS,
    DONE,
    FAILED,
    RESULT,
    SCORE_PREFIX,
    Claim,
    EvaluationQueue,
    _Listed,
)
from launchhelm._evaluation._records import Outcome
from launchhelm._exceptions import CheckpointError, InvalidArgumentError, InvalidTypeError
from launchhelm._metrics._points import coerce_value, validate_key
from launchhelm._runlog._events import RunState, validate_project
from launchhelm.storage import Store, open_store
from launchhelm.storage._backends import request_budget

if TYPE_CHECKING:
    from launchhelm._api import RunHandle
    from launchhelm._runlog._records import CheckpointEvent
    from launchhelm._types import Checkpoint

__all__ = ["EvaluationContext", "EvaluationWorker", "evaluate"]

_log = logging.getLogger("launchhelm.evaluation")

#: Seconds between looks at the queue when it is empty.
DEFAULT_POLL_INTERVAL = 2.0
#: Seconds between sweeps for checkpoints the rule covers that nobody queued.
DEFAULT_DISCOVER_INTERVAL = 30.0

ScoreFunction = Callable[["EvaluationContext"], Mapping[str, object]]

T = TypeVar("T")


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise InvalidArgumentError(f"{name}={value!r}: give a positive number of seconds")
    return float(value)


def _check_scores(returned: object) -> dict[str, float]:
    if not isinstance(returned, Mapping):
        raise InvalidTypeError(
            f"the score function returned a {type(returned).__name__}; return a dict of score names to "
            'numbers, e.g. {"accuracy": 0.91}'
        )
    scores: dict[str, float] = {}
    for name, value in returned.items():
        if not isinstance(name, str):
            raise InvalidTypeError(f"score name {name!r} is a {type(name).__name__}; names must be strings")
        key = f"{SCORE_PREFIX}{name}"
        try:
            validate_key(key)
            scores[name] = coerce_value(key, value)
        except (TypeError, ValueError) as exc:
            raise InvalidTypeError(f"score {name!r} is not a number that can be logged: {exc}") from None
    return scores


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the store not answering, as opposed to an answer."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (ConnectionError, TimeoutError)):
            return True
        current = current.__cause__ or current.__context__
    return False


class _StoreWatch:
    """One line when the store stops answering, one when it answers again, from any of the worker's threads."""

    def __init__(self, worker: str, url: str) -> None:
        self._worker = worker
        self._url = url
        self._lock = threading.Lock()
        self.since: float | None = None  # wall time of the first failure of the current outage
        self.ended = -math.inf  # wall time the store last answered again
        self.doing = ""  # what the worker holds meanwhile, for the first line

    def failed(self, exc: BaseException) -> bool:
        """True if ``exc`` is an outage (said once); False for any other error (the caller says it)."""
        if not _unreachable(exc):
            return False
        with self._lock:
            if self.since is not None:
                return True
            if time.time() - self.ended < request_budget():
                # a request the outage swallowed, failing after the store answered again: the old outage
                _log.debug(
                    "evaluation worker %s: a request from before the store answered failed: %s", self._worker, exc
                )
                return True
            self.since = time.time()
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        _log.warning(
            "launchhelm: evaluation worker %s: the store %s is not answering since %s (%s); %s; retrying",
            self._worker,
            self._url,
            time.strftime("%H:%M:%S", time.localtime(self.since)),
            reason,
            self.doing or "nothing is lost",
        )
        return True

    def answered(self) -> None:
        with self._lock:
            if self.since is None:
                return
            self.ended = time.time()
            lasted, self.since = self.ended - self.since, None
        _log.warning(
            "launchhelm: evaluation worker %s: the store %s answers again after %.0fs; going on",
            self._worker,
            self._url,
            lasted,
        )


#: Longest wait between tries while the store is not answering.
_OUTAGE_RETRY = 2.0


class _LeaseKeeper:
    """Renews a claim every quarter lease until stopped; notices when it is fenced."""

    def __init__(self, queue: EvaluationQueue, claim: Claim, watch: _StoreWatch | None = None) -> None:
        self._queue = queue
        self._claim = claim
        self._watch = watch
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"launchhelm-lease-{claim.id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        interval = max(self._claim.lease_seconds / 4, 0.02)
        number = 0
        while not self._stop.wait(interval):
            try:
                if self._queue.is_fenced(self._claim):
                    _log.warning(
                        "lost the lease on evaluation %s (another worker took it over after it lapsed); "
                        "this worker's result will be dropped",
                        self._claim.id,
                    )
                    self.lost.set()
                    return
                number += 1
                self._queue.renew(self._claim, number)
                if self._watch is not None:
                    self._watch.answered()
            except Exception as exc:  # the store may come back before the lease lapses
                if self._watch is not None:
                    self._watch.failed(exc)
                _log.debug("renewing the lease on %s failed: %s", self._claim.id, exc)


def _release(queue: EvaluationQueue, claim: Claim) -> None:
    try:
        queue.release(claim)
        _log.info("released the lease on %s", claim.id)
    except Exception as exc:  # it lapses on its own
        _log.warning("could not release the lease on %s: %s", claim.id, exc)


class EvaluationContext:
    """What a score function is asked to score: one checkpoint of one run.

    Attributes
    ----------
    evaluation_id:
        ``<run id>-<checkpoint id>``.
    checkpoint_id:
        The checkpoint's id (what ``save_checkpoint`` returned).
    step:
        The step it was saved at: scores are logged there as ``eval/<name>``.
    run_id:
        The training run.
    worker:
        This worker's name.
    """

    def __init__(
        self,
        *,
        store: Store,
        claim: Claim,
        event: CheckpointEvent,
        state: RunState,
        keeper: _LeaseKeeper,
    ) -> None:
        self._store = store
        self._claim = claim
        self._event = event.copy()
        self._state = state
        self._keeper = keeper
        self._downloads: list[Path] = []
        self._keep = False
        self.evaluation_id = claim.id
        self.checkpoint_id = claim.checkpoint
        self.run_id = claim.run_id
        self.step = int(event["step"])
        self.worker = claim.worker
        self._run: RunHandle | None = None
        self._checkpoint: Checkpoint | None = None

    def __repr__(self) -> str:
        return f"<launchhelm.EvaluationContext {self.checkpoint_id} of run {self.run_id} at step {self.step}>"

    @property
    def run(self) -> RunHandle:
        """The training run, as ``launchhelm.Api().run(run_id)`` gives it."""
        if self._run is None:
            from launchhelm._api import RunHandle

            self._run = RunHandle(self._store, self.run_id)
        return self._run

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint scored (``.id``, ``.step``, ``.format``, ``.files``, ...)."""
        if self._checkpoint is None:
            from launchhelm._runlog._checkpoints import checkpoint_record
            from launchhelm._runlog._runinfo import furthest_step

            reached = furthest_step(self._store, self.run_id, self._state)
            self._checkpoint = checkpoint_record(self.run_id, self._state, self._event, reached)
        return self._checkpoint

    @property
    def lease_lost(self) -> bool:
        """True once another worker took this evaluation over (its result will be dropped).

        A long score function may check it and give up early.
        """
        return self._keeper.lost.is_set()

    def download_to(self, directory: str | os.PathLike[str] | None = None, *, keep: bool = False) -> Path:
        """Download the checkpoint's file(s), verify them, and return the local path.

        Files land in ``<directory>/<checkpoint id>/``. Each file's size and
        checksum (CRC64NVME; sha256 for checkpoints recorded that way earlier)
        are checked against what was recorded when it was saved.

        Parameters
        ----------
        directory:
            Where to put them; default a temporary folder.
        keep:
            Keep the files after the evaluation; by default they are removed
            when the score function returns, so a long-lived worker does not
            fill its disk.

        Returns
        -------
        pathlib.Path
            The file, for a single-file checkpoint (``launchhelm.torch``
            bundles, ``run.checkpoint(file)``); the folder, for
            ``run.checkpoint(folder)``.

        Raises
        ------
        CheckpointError
            A file is missing from the store or differs from what was saved.
        """
        from launchhelm._runlog._checkpoints import DIRECTORY_FORMAT
        from launchhelm.storage._checksum import file_checksums, mismatches, recorded, verifying_algorithms

        base = Path(tempfile.mkdtemp(prefix="launchhelm-eval-")) if directory is None else Path(directory)
        target = (base / self.checkpoint_id).absolute()
        files = list(self._event.get("files") or [])
        if not files:
            raise CheckpointError(f"checkpoint {self.checkpoint_id} records no files", run_id=self.run_id)
        self._downloads.append(base if directory is None else target)
        self._keep = self._keep or keep
        prefix = str(self._event["prefix"])
        for entry in files:
            name = str(entry["name"])
            local = (target / name).absolute()
            if target not in local.parents:
                raise CheckpointError(f"checkpoint {self.checkpoint_id} names a file outside itself: {name!r}")
            try:
                self._store.download(f"{prefix}/{name}", local)
            except FileNotFoundError:
                raise CheckpointError(
                    f"file {name!r} of checkpoint {self.checkpoint_id} is missing from the store",
                    run_id=self.run_id,
                    step=self.step,
                ) from None
            size = local.stat().st_size
            if size != int(entry["size"]):
                raise CheckpointError(
                    f"file {name!r} of checkpoint {self.checkpoint_id} has {size} bytes, "
                    f"{entry['size']} were saved: the stored copy is damaged",
                    run_id=self.run_id,
                    step=self.step,
                )
            expected = recorded(entry)
            wrong = mismatches(expected, file_checksums(local, verifying_algorithms(expected)))
            if wrong:
                raise CheckpointError(
                    f"file {name!r} of checkpoint {self.checkpoint_id} does not match its {wrong[0]}: "
                    "the stored copy is damaged",
                    run_id=self.run_id,
                    step=self.step,
                )
        if self._event.get("format") == DIRECTORY_FORMAT or len(files) != 1:
            return target
        return target / str(files[0]["name"])

    def _cleanup(self) -> None:
        if self._keep:
            return
        for path in self._downloads:
            shutil.rmtree(path, ignore_errors=True)


class EvaluationWorker:
    """A score function turned into a worker by :func:`launchhelm.evaluate`.

    Calling it calls the function; :meth:`serve` takes queued evaluations.
    """

    def __init__(
        self,
        function: ScoreFunction,
        *,
        project: str,
        store: str | os.PathLike[str] | Store | None = None,
        storage_options: Mapping[str, object] | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        discover_interval: float = DEFAULT_DISCOVER_INTERVAL,
        name: str | None = None,
    ) -> None:
        if not callable(function):
            raise InvalidTypeError(f"evaluate() decorates a score function, not a {type(function).__name__}")
        self.function = function
        self.project = validate_project(project)
        self.store_url = store
        self.storage_options = storage_options
        self.lease_seconds = _positive("lease_seconds", lease_seconds)
        self.poll_interval = _positive("poll_interval", poll_interval)
        self.discover_interval = _positive("discover_interval", discover_interval)
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InvalidArgumentError(f"name={name!r}: give a non-empty string or None")
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        functools.update_wrapper(self, function)

    def __call__(self, ctx: EvaluationContext) -> Mapping[str, object]:
        return self.function(ctx)

    def __repr__(self) -> str:
        return f"<launchhelm.EvaluationWorker {getattr(self.function, '__name__', '?')} project={self.project!r}>"

    def _replace(
        self,
        *,
        project: str | None = None,
        store: str | os.PathLike[str] | Store | None = None,
        storage_options: Mapping[str, object] | None = None,
        lease_seconds: float | None = None,
        poll_interval: float | None = None,
        discover_interval: float | None = None,
        name: str | None = None,
    ) -> EvaluationWorker:
        """A copy with other settings (the command line's ``--store`` and friends); None keeps a setting."""
        return EvaluationWorker(
            self.function,
            project=self.project if project is None else project,
            store=self.store_url if store is None else store,
            storage_options=self.storage_options if storage_options is None else storage_options,
            lease_seconds=self.lease_seconds if lease_seconds is None else lease_seconds,
            poll_interval=self.poll_interval if poll_interval is None else poll_interval,
            discover_interval=self.discover_interval if discover_interval is None else discover_interval,
            name=self.name if name is None else name,
        )

    def serve(
        self,
        max_evaluations: int | None = None,
        *,
        stop_when_idle: bool = False,
        poll_interval: float | None = None,
    ) -> int:
        """Take queued evaluations one at a time until interrupted.

        Ctrl-C (KeyboardInterrupt) stops it cleanly: an evaluation in progress
        is abandoned and its lease released, so another worker takes it at
        once.

        Parameters
        ----------
        max_evaluations:
            Stop after taking this many.
        stop_when_idle:
            Return as soon as nothing is left that this worker may take
            (after looking for checkpoints the rule covers that nobody queued).
        poll_interval:
            Seconds between looks at an empty queue (default: the decorator's).

        Returns
        -------
        int
            How many evaluations this worker finished (done or failed).

        Raises
        ------
        CoordinationUnsupportedError
            The store has no atomic put-if-absent, so leases cannot work.
        """
        if max_evaluations is not None and (
            isinstance(max_evaluations, bool) or not isinstance(max_evaluations, int) or max_evaluations < 1
        ):
            raise InvalidArgumentError(f"max_evaluations={max_evaluations!r}: give a positive integer or None")
        poll = self.poll_interval if poll_interval is None else _positive("poll_interval", poll_interval)
        taken = finished = 0
        next_discovery = 0.0
        try:  # Ctrl-C at any moment, even while the store's client library loads, is a clean stop
            store = open_store(self.store_url, self.storage_options)
            store.require_coordination("evaluation workers")
            queue = EvaluationQueue(store, self.project)
            self._watch = _StoreWatch(self.name, store.url)
            _log.info("worker %s serving project %s in %s", self.name, self.project, store.url)
            while max_evaluations is None or taken < max_evaluations:
                if time.monotonic() >= next_discovery:
                    next_discovery = time.monotonic() + self.discover_interval
                    self._discover(queue)
                claim = self._claim_next(queue)
                if claim is None and stop_when_idle:
                    self._discover(queue)
                    claim = self._claim_next(queue)
                    if claim is None:
                        break
                if claim is None:
                    time.sleep(poll)
                    continue
                taken += 1
                if self._evaluate(store, queue, claim):
                    finished += 1
        except KeyboardInterrupt:
            _log.info("worker %s interrupted; stopped after %d evaluations", self.name, finished)
        return finished

    _watch: _StoreWatch | None = None

    def _store_failed(self, exc: BaseException) -> bool:
        """An outage is said once (True); other errors are the caller's to say (False)."""
        return self._watch is not None and self._watch.failed(exc)

    def _store_answered(self) -> None:
        if self._watch is not None:
            self._watch.answered()

    def _discover(self, queue: EvaluationQueue) -> None:
        try:
            queue.discover()
        except Exception as exc:  # the sweep is a safety net: try again next time
            if not self._store_failed(exc):
                _log.warning("looking for checkpoints to queue failed: %s", exc)
            return
        self._store_answered()

    def _claim_next(self, queue: EvaluationQueue) -> Claim | None:
        try:
            listing = queue.scan()
        except Exception as exc:  # the store may come back: a worker outlives a blip
            if not self._store_failed(exc):
                _log.warning("could not list the queue of project %s: %s", self.project, exc)
            return None
        self._store_answered()
        candidates: list[tuple[float, str, _Listed]] = []
        for listed in listing.values():
            if listed.objects(listed.attempt).logged:
                continue  # done, and its scores are in the run's metrics
            try:
                if queue.repair(listed):
                    _log.info("logged the scores of %s, which its worker left unlogged", listed.id)
                candidates.append((float(queue.request(listed)["queued_at"]), listed.id, listed))
            except Exception as exc:
                if not self._store_failed(exc):
                    _log.warning("could not look at evaluation %s: %s", listed.id, exc)
        candidates.sort(key=lambda c: c[:2])  # oldest queued first
        for _, _, listed in candidates:
            try:
                claim = queue.try_claim(listed, self.name, self.lease_seconds)
            except Exception as exc:
                if not self._store_failed(exc):
                    _log.warning("could not take evaluation %s: %s", listed.id, exc)
                continue
            if claim is not None:
                return claim
        return None

    def _evaluate(self, store: Store, queue: EvaluationQueue, claim: Claim) -> bool:
        """Run the function on one claimed evaluation and publish the outcome; True if published.

        While the store is not answering, the claim is kept (its lease keeper
        retries the renewals): a function that failed for want of the store
        runs again once it answers, and the outcome is published once the
        store takes it.
        """
        keeper = _LeaseKeeper(queue, claim, self._watch)
        keeper.start()
        outcome: Outcome
        _log.info("evaluating %s (run %s, step %s)", claim.checkpoint, claim.run_id, claim.request.get("step"))
        if self._watch is not None:
            self._watch.doing = f"evaluation {claim.id} keeps its lease and goes on when the store is back"
        try:
            while True:
                outcome, failed_on_store = self._run_function(store, queue, claim, keeper)
                if not failed_on_store or keeper.lost.is_set():
                    break
                self._until_answered(store, claim, keeper)
            published = False
            if not keeper.lost.is_set():  # fenced: publishing would fail on the fence anyway
                try:
                    published = self._publish(queue, claim, outcome, keeper)
                except Exception as exc:  # the next worker takes it once the lease lapses
                    _log.warning("could not publish the result of %s: %s", claim.id, exc)
                    keeper.stop()
                    _release(queue, claim)
                    return False
            keeper.stop()
        except BaseException:  # Ctrl-C, SystemExit: give the lease up for the next worker
            keeper.stop()
            _release(queue, claim)
            raise
        finally:
            if self._watch is not None:
                self._watch.doing = ""
        if published:
            try:
                self._through_outage(lambda: queue.finish(claim, outcome), None)
            except Exception as exc:  # the next worker's scan logs them (EvaluationQueue.repair)
                _log.warning("the result of %s is in, but logging its scores failed: %s", claim.id, exc)
        if not published:
            _log.warning("evaluation %s was taken over by another worker; this result was dropped", claim.id)
            queue.collect_renewals(claim.attempt_prefix, epoch=claim.epoch)  # a fenced epoch's are garbage
        elif outcome["state"] == DONE:
            shown = ", ".join(f"{k}={v:.6g}" for k, v in outcome["scores"].items())
            _log.info("evaluated %s at step %s: %s", claim.checkpoint, outcome["step"], shown or "no scores")
        else:
            _log.warning("evaluation %s failed: %s", claim.id, outcome["error"])
        return published

    def _publish(self, queue: EvaluationQueue, claim: Claim, outcome: Outcome, keeper: _LeaseKeeper) -> bool:
        """Publish the outcome, through an outage; True if it is ours that stands."""
        tries = [0]

        def attempt() -> bool:
            tries[0] += 1
            return queue.publish(claim, outcome)

        if self._through_outage(attempt, keeper):
            return True
        if tries[0] == 1:
            return False
        # an earlier try may have landed with its answer lost: then the slot holds our result
        body = self._through_outage(lambda: queue._read_immutable(claim.slot_key), keeper)
        return bool(
            body.get("kind") == RESULT
            and body.get("worker") == claim.worker
            and body.get("epoch") == claim.epoch
            and body.get("attempt") == claim.attempt
        )

    def _run_function(
        self, store: Store, queue: EvaluationQueue, claim: Claim, keeper: _LeaseKeeper
    ) -> tuple[Outcome, bool]:
        """The outcome of one call of the score function, and whether it failed because the store did not answer."""
        ctx: EvaluationContext | None = None
        try:
            event, run_attempt, state = queue.checkpoint_event(claim.run_id, claim.checkpoint)
            ctx = EvaluationContext(store=store, claim=claim, event=event, state=state, keeper=keeper)
            scores = _check_scores(self.function(ctx))
            done: Outcome = {
                "state": DONE,
                "scores": scores,
                "step": ctx.step,
                "run_attempt": run_attempt,
                # the checkpoint's time: the points sit beside the training
                # metrics of that step, not at the moment they were scored
                "point_time": float(event["time"]),
            }
            self._store_answered()
            return done, False
        except Exception as exc:
            failed: Outcome = {
                "state": FAILED,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            }
            return failed, self._store_failed(exc)
        finally:
            if ctx is not None:
                ctx._cleanup()

    def _until_answered(self, store: Store, claim: Claim, keeper: _LeaseKeeper) -> None:
        """Wait, keeping the claim, until the store answers (or the lease is lost)."""
        delay = 0.25
        while not keeper.lost.is_set():
            time.sleep(delay)
            try:
                store.exists(claim.slot_key)
            except Exception as exc:
                if not self._store_failed(exc):
                    raise
                delay = min(delay * 2, _OUTAGE_RETRY)
                continue
            self._store_answered()
            return

    def _through_outage(self, op: Callable[[], T], keeper: _LeaseKeeper | None) -> T:
        """``op()``, tried again while the store is not answering (until it answers, or the lease is lost)."""
        delay = 0.25
        while True:
            try:
                out = op()
            except Exception as exc:
                if not self._store_failed(exc) or (keeper is not None and keeper.lost.is_set()):
                    raise
                time.sleep(delay)
                delay = min(delay * 2, _OUTAGE_RETRY)
                continue
            self._store_answered()
            return out


def evaluate(
    project: str,
    *,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    discover_interval: float = DEFAULT_DISCOVER_INTERVAL,
    name: str | None = None,
) -> Callable[[ScoreFunction], EvaluationWorker]:
    """Turn a score function into an evaluation worker for ``project``.

    The function takes an :class:`EvaluationContext` and returns
    ``{name: number}``; each number is logged to the training run as
    ``eval/<name>`` at the checkpoint's step. An exception (or a value that
    is not a real number) marks that evaluation failed, with the message and
    traceback, and the worker goes on.

    Parameters
    ----------
    project:
        The project whose queue the worker serves.
    store, storage_options:
        As for :func:`launchhelm.init`.
    lease_seconds:
        How long a claim lasts without renewal (renewed every quarter of it
        while the function runs); another worker takes over after that.
    poll_interval:
        Seconds between looks at an empty queue.
    discover_interval:
        Seconds between sweeps for checkpoints the rule covers that nobody
        queued (a training process that died right after saving).
    name:
        The worker's name in listings; default ``host:pid``.

    Examples
    --------
    >>> import launchhelm as lh
    >>> @lh.evaluate(project="quickstart")
    ... def score(ctx: lh.EvaluationContext) -> dict[str, float]:
    ...     path = ctx.download_to("checkpoints")
    ...     return {"size": path.stat().st_size}
    >>> score.serve()   # doctest: +SKIP
    """
    if callable(project):
        raise InvalidTypeError('use @launchhelm.evaluate(project="name"): the project to serve is required')
    validate_project(project)
    settings = {
        "lease_seconds": _positive("lease_seconds", lease_seconds),
        "poll_interval": _positive("poll_interval", poll_interval),
        "discover_interval": _positive("discover_interval", discover_interval),
    }

    def wrap(function: ScoreFunction) -> EvaluationWorker:
        return EvaluationWorker(
            function, project=project, store=store, storage_options=storage_options, name=name, **settings
        )

    return wrap
