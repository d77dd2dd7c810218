"""The evaluation queue: a project rule, queued evaluations, leases, results.

Everything here is objects in the store written with ``Store.create``
(put-if-absent); there is no server. Keys, relative to the store's root::

    projects/<p>/rules/evaluate_every_checkpoint/<seq:020d>.json   the rule: {"enabled": bool, "time"}
    projects/<p>/evaluations/<run>/<ckpt>/request.json              queued (one per checkpoint)
        .../a<A:04d>/retry.json           "Try again": attempt A >= 1 of a failed evaluation
        .../a<A:04d>/e<N:06d>.json        lease epoch N of attempt A claimed by a worker
        .../a<A:04d>/e<N:06d>-renew-<k:06d>.json   the k-th renewal of that lease
        .../a<A:04d>/e<N:06d>-result.json the result slot of epoch N: a result or a fence
        .../a<A:04d>/logged.json          the result's scores are in the run's metrics
    runs/<run>/metrics/eval-<ckpt>-a<A:04d>/00000000-<step>-<step>.arrow   eval/<name> points

Queueing. The evaluation of checkpoint ``c`` of run ``r`` has the id
``r-c`` and one ``request.json``, created with ``create``: however many
processes race to queue it (the training process when it publishes the
checkpoint, a worker that finds a checkpoint the rule covers but nobody
queued because the training process died in between, a person pressing
"Evaluate this checkpoint"), exactly one request exists.

Leases. A worker takes attempt ``A`` by creating epoch 1 (``e000001.json``),
holding its worker name, host, pid and ``expires`` (its clock plus
``lease_seconds``, two minutes by default). A background thread renews it
every quarter lease by creating ``e<N>-renew-<k>.json`` with a new
``expires``. Another worker may take over when the newest renewal has
expired (or at once when the holder is a process on the same host that is
gone, or released the lease on Ctrl-C). Taking over epoch ``N`` is two
creates: first a *fence* in epoch N's result slot (``e<N>-result.json`` =
``{"kind": "fence"}``), then ``e<N+1>.json``. The old holder sees the fence
at its next renewal and stops renewing.

Results. A worker publishes by creating its own epoch's result slot. That
create is the single linearisation point: it fails if the slot holds a
fence, so a fenced worker can never publish, whatever the timing (it may
have stalled for an hour and wake up mid-takeover); and since epoch ``N+1``
is only ever claimed after slot ``N`` is fenced, at most one epoch of an
attempt holds a real result. A failed attempt can be retried (a new attempt
``A+1`` with its own epochs); a done one cannot, so each evaluation has at
most one done result. Its scores become one metric chunk at a key derived
from the evaluation and attempt, written with ``create`` from the result
alone (so a worker that died between the two is repaired by the next worker
writing the same chunk), then ``logged.json``. A score already logged at a
step is therefore never logged twice, and no fenced worker's score is logged.

Clocks only decide *when* a lease looks lapsed; correctness never depends
on them.

Access. A worker reads ``runs/`` (run records, event logs, checkpoint
files, heartbeats) and ``projects/<p>/`` (run list, rule, queue); it writes
only under ``projects/<p>/evaluations/`` (requests for checkpoints the rule
covers, claims, renewals, results) and ``runs/*/metrics/eval-*`` (its score
chunks), and deletes only renewal objects (``*-renew-*``) of finished
leases. :func:`worker_policy` prints that as an S3 bucket policy
(``launchhelm policy evaluation --store s3://bucket/prefix``).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, cast

from launchhelm._evaluation._records import (
    EvaluationRequest,
    Outcome,
    RetryRecord,
    RuleEntry,
    Slot,
    _EvaluationFields,
)
from launchhelm._exceptions import (
    AlreadyExistsError,
    CheckpointError,
    EvaluationStateError,
    InvalidArgumentError,
    ObjectNotFoundError,
)
from launchhelm._runlog._events import REWIND, EventLog, RunState, validate_project, validate_run_id
from launchhelm._runlog._liveness import ProcessIdentity, process_identity, process_state, requester
from launchhelm._runlog._records import CheckpointEvent, RewindEvent
from launchhelm._types import Evaluation, JSONValue
from launchhelm.storage import Store
from launchhelm.storage._keys import (
    attempt_name,
    attempt_prefix,
    claim_key,
    evaluation_prefix,
    evaluations_prefix,
    is_renewal_name,
    logged_key,
    parse_evaluation_tail,
    parse_rule_name,
    project_runs_prefix,
    renewal_key,
    request_key,
    result_key,
    retry_key,
    rule_key,
    rule_prefix,
    score_chunk_key,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "Claim",
    "EvaluationQueue",
    "on_checkpoint_published",
    "queue_for",
]

_log = logging.getLogger("launchhelm.evaluation")

QUEUED, RUNNING = "queued", "running"
DONE: Final = "done"
FAILED: Final = "failed"
#: Seconds a worker's lease lasts unless renewed.
DEFAULT_LEASE_SECONDS = 120.0
REQUEST_FORMAT = "launchhelm.evaluation/1"
#: What a result slot holds: a real outcome, or a fence that keeps the
#: epoch's (lapsed or released) holder from ever publishing.
RESULT, FENCE = "result", "fence"
SCORE_PREFIX = "eval/"


_CHECKPOINT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def evaluation_id(run_id: str, checkpoint: str) -> str:
    return f"{run_id}-{checkpoint}"


def parse_evaluation_id(value: object) -> tuple[str, str]:
    """``(run id, checkpoint id)`` of an evaluation id, or ``ValueError``."""
    if isinstance(value, str):
        run_id, _, checkpoint = value.partition("-")
        try:
            validate_run_id(run_id)
        except ValueError:
            pass
        else:
            if _CHECKPOINT_ID_RE.fullmatch(checkpoint):
                return run_id, checkpoint
    raise InvalidArgumentError(
        f"invalid evaluation id {value!r}: evaluation ids look like '<run id>-<checkpoint id>', "
        "as listed by RunHandle.evaluations()"
    )


def _dumps(body: Mapping[str, object]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _checkpoint_event(event: Mapping[str, object]) -> CheckpointEvent:
    # the run log hands checkpoint events out as plain dicts (RunState.checkpoints)
    return cast("CheckpointEvent", event)


def _rule_enabled_at(entries: list[RuleEntry], when: float) -> bool:
    enabled = False
    for entry in entries:
        if float(entry["time"]) <= when:
            enabled = bool(entry["enabled"])
    return enabled


def _count_rewinds_before(events: Sequence[RewindEvent], seq: int) -> int:
    return sum(1 for e in events if e.get("type") == REWIND and int(e["seq"]) < seq)


# -- what a listing says ------------------------------------------------------
@dataclass
class _AttemptObjects:
    retry: bool = False
    logged: bool = False
    epochs: set[int] = field(default_factory=set)
    renewals: dict[int, int] = field(default_factory=dict)  # epoch -> newest renewal number
    slots: set[int] = field(default_factory=set)  # epochs whose result slot exists

    @property
    def epoch(self) -> int:
        """The newest claimed epoch (0: never taken)."""
        return max(self.epochs, default=0)


@dataclass
class _Listed:
    """The objects of one evaluation, from one listing (no reads)."""

    project: str
    run_id: str
    checkpoint: str
    request: bool = False
    attempts: dict[int, _AttemptObjects] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return evaluation_id(self.run_id, self.checkpoint)

    @property
    def base(self) -> str:
        return evaluation_prefix(self.project, self.run_id, self.checkpoint)

    @property
    def attempt(self) -> int:
        """The current attempt: the newest "Try again", else 0."""
        return max((a for a, objs in self.attempts.items() if a == 0 or objs.retry), default=0)

    def objects(self, attempt: int) -> _AttemptObjects:
        return self.attempts.get(attempt) or _AttemptObjects()

    def add(self, tail: str) -> None:
        m = parse_evaluation_tail(tail)
        if m is None:
            return
        if m["request"]:
            self.request = True
            return
        objs = self.attempts.setdefault(int(m["attempt"]), _AttemptObjects())
        if m["retry"]:
            objs.retry = True
        elif m["logged"]:
            objs.logged = True
        else:
            epoch = int(m["epoch"])
            if m["result"]:
                objs.slots.add(epoch)
            elif m["renewal"]:
                objs.renewals[epoch] = max(objs.renewals.get(epoch, 0), int(m["renewal"]))
            else:
                objs.epochs.add(epoch)


@dataclass(frozen=True)
class _LeaseView:
    worker: str
    process: ProcessIdentity
    started_at: float
    expires: float

    def alive(self, now: float) -> bool:
        if now > self.expires:
            return False
        return process_state(self.process) != "dead"  # a process gone on this host holds nothing


@dataclass
class Claim:
    """A lease epoch this worker holds on one attempt of one evaluation."""

    project: str
    run_id: str
    checkpoint: str
    attempt: int
    epoch: int
    worker: str
    lease_seconds: float
    started_at: float
    request: EvaluationRequest

    @property
    def id(self) -> str:
        return evaluation_id(self.run_id, self.checkpoint)

    @property
    def base(self) -> str:
        return evaluation_prefix(self.project, self.run_id, self.checkpoint)

    @property
    def attempt_prefix(self) -> str:
        return attempt_prefix(self.base, self.attempt)

    @property
    def slot_key(self) -> str:
        return result_key(self.attempt_prefix, self.epoch)

    def renewal_key(self, number: int) -> str:
        return renewal_key(self.attempt_prefix, self.epoch, number)

    def lease_body(self, now: float) -> bytes:
        return _dumps(
            {
                "worker": self.worker,
                "process": process_identity(),
                "started_at": self.started_at,
                "time": now,
                "expires": now + self.lease_seconds,
                "lease_seconds": self.lease_seconds,
            }
        )


class EvaluationQueue:
    """One project's evaluation queue in a store: the protocol, for readers and workers.

    Immutable objects (requests, results, rule entries) are read once and
    cached, so refreshing a listing costs one list plus a read per running
    evaluation.
    """

    def __init__(self, store: Store, project: str) -> None:
        self.store = store
        self.project = validate_project(project)
        self._cache: dict[str, dict[str, JSONValue]] = {}
        self._renewals: dict[str, tuple[str, _LeaseView]] = {}  # attempt prefix -> newest lease read
        self._rules: dict[str, RuleEntry] = {}
        self._logs: dict[str, EventLog] = {}
        self._closed_runs: set[str] = set()

    # -- reading ----------------------------------------------------------
    def _read_immutable(self, key: str) -> dict[str, JSONValue]:
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = dict(json.loads(self.store.read(key)))
        return found

    def scan(self, run_id: str | None = None) -> dict[str, _Listed]:
        """Every evaluation of the project (or of one run), by id, from one listing."""
        base = evaluations_prefix(self.project)
        prefix = base if run_id is None else f"{base}/{run_id}"
        found: dict[str, _Listed] = {}
        for name in self.store.list(prefix):
            parts = name.split("/", 2) if run_id is None else [run_id, *name.split("/", 1)]
            if len(parts) != 3:
                continue
            run, checkpoint, tail = parts
            eid = evaluation_id(run, checkpoint)
            listed = found.get(eid)
            if listed is None:
                listed = found[eid] = _Listed(self.project, run, checkpoint)
            listed.add(tail)
        return {eid: listed for eid, listed in found.items() if listed.request}

    def scan_one(self, run_id: str, checkpoint: str) -> _Listed | None:
        listed = _Listed(self.project, run_id, checkpoint)
        for name in self.store.list(listed.base):
            listed.add(name)
        return listed if listed.request else None

    def request(self, listed: _Listed) -> EvaluationRequest:
        return cast("EvaluationRequest", self._read_immutable(request_key(listed.base)))

    def slot(self, listed: _Listed, attempt: int, epoch: int) -> Slot:
        return cast("Slot", self._read_immutable(result_key(attempt_prefix(listed.base, attempt), epoch)))

    def lease_view(self, listed: _Listed, attempt: int, epoch: int) -> _LeaseView:
        """The newest claim or renewal of ``epoch``: who holds it and until when."""
        prefix = attempt_prefix(listed.base, attempt)
        renewal = listed.objects(attempt).renewals.get(epoch)
        keys = [claim_key(prefix, epoch)]
        if renewal:
            keys.insert(0, renewal_key(prefix, epoch, renewal))
        cached = self._renewals.get(prefix)
        if cached is not None and cached[0] == keys[0]:
            return cached[1]
        for key in keys:
            try:
                body = json.loads(self.store.read(key))
            except (ObjectNotFoundError, PermissionError):
                # renewals are collected once a result exists: read the claim
                # (a least-privilege S3 key answers 403 for a missing object)
                continue
            view = _LeaseView(
                worker=str(body.get("worker", "?")),
                process=dict(body.get("process") or {}),
                started_at=float(body.get("started_at", body.get("time", 0.0))),
                expires=float(body["expires"]),
            )
            self._renewals[prefix] = (key, view)
            return view
        raise ObjectNotFoundError(f"lease epoch {epoch} of evaluation {listed.id} has no readable claim")

    def outcome(self, listed: _Listed) -> Slot | None:
        """The current attempt's result (done or failed), or None if it has none."""
        attempt = listed.attempt
        objs = listed.objects(attempt)
        epoch = objs.epoch
        if epoch and epoch in objs.slots:
            slot = self.slot(listed, attempt, epoch)
            if slot.get("kind") == RESULT:
                return slot
        return None

    def record(self, listed: _Listed, now: float | None = None) -> Evaluation:
        """The public record of one evaluation: two or three reads at most, most of them cached."""
        now = time.time() if now is None else now
        request = self.request(listed)
        attempt = listed.attempt
        objs = listed.objects(attempt)
        queued_at = float(request["queued_at"])
        if attempt:
            retried = cast("RetryRecord", self._read_immutable(retry_key(listed.base, attempt)))
            queued_at = float(retried["time"])
        fields: _EvaluationFields = {"state": QUEUED}
        epoch = objs.epoch
        result = self.outcome(listed)
        if result is not None:
            fields = {
                "state": str(result["state"]),
                "scores": dict(result.get("scores") or {}),
                "error": result.get("error"),
                "traceback": result.get("traceback"),
                "worker": result.get("worker"),
                "started_at": result.get("started_at"),
                "finished_at": result.get("finished_at"),
            }
        elif epoch and epoch not in objs.slots:
            view = self.lease_view(listed, attempt, epoch)
            if view.alive(now):
                fields = {
                    "state": RUNNING,
                    "worker": view.worker,
                    "lease_expires": view.expires,
                    "started_at": view.started_at,
                }
        return Evaluation(
            id=listed.id,
            run_id=listed.run_id,
            checkpoint=listed.checkpoint,
            step=int(request["step"]),
            attempts=sum(len(o.epochs) for o in listed.attempts.values()),
            retries=attempt,
            queued_at=queued_at,
            project=self.project,
            reason=str(request.get("reason", "rule")),
            **fields,
        )

    def evaluations(self, run_id: str | None = None, state: str | None = None) -> list[Evaluation]:
        """Records of one run's evaluations by step, or the project's, oldest queued first."""
        now = time.time()
        records = [self.record(listed, now) for listed in self.scan(run_id).values()]
        if state is not None:
            records = [r for r in records if r.state == state]
        if run_id is None:
            records.sort(key=lambda r: (r.queued_at, r.run_id, r.step, r.checkpoint))
        else:
            records.sort(key=lambda r: (r.step, r.checkpoint))
        return records

    # -- the rule -----------------------------------------------------------
    def rule_entries(self) -> list[RuleEntry]:
        """Every change of the project's evaluate-every-checkpoint rule, oldest first."""
        prefix = rule_prefix(self.project)
        for name in self.store.list(prefix):
            if parse_rule_name(name) is not None and name not in self._rules:
                self._rules[name] = cast("RuleEntry", dict(json.loads(self.store.read(f"{prefix}/{name}"))))
        return [self._rules[name] for name in sorted(self._rules)]

    def rule_enabled(self) -> bool:
        entries = self.rule_entries()
        return bool(entries[-1]["enabled"]) if entries else False

    def set_rule(self, enabled: bool) -> bool:
        self.store.require_coordination("the evaluate-every-checkpoint rule")
        while True:
            entries = self.rule_entries()
            if entries and bool(entries[-1]["enabled"]) == enabled:
                return enabled
            body: RuleEntry = {"enabled": enabled, "time": time.time(), "by": requester()}
            try:
                self.store.create(rule_key(self.project, len(self._rules) + 1), _dumps(body))
            except AlreadyExistsError:
                continue  # someone changed it at the same moment: look again
            return enabled

    # -- queueing -----------------------------------------------------------
    def queue(self, run_id: str, event: CheckpointEvent, reason: str) -> bool:
        """Queue the evaluation of a published checkpoint; False if it already was."""
        checkpoint = str(event["checkpoint"])
        if not _CHECKPOINT_ID_RE.fullmatch(checkpoint):
            raise CheckpointError(f"checkpoint id {checkpoint!r} cannot name an evaluation", run_id=run_id)
        body: EvaluationRequest = {
            "format": REQUEST_FORMAT,
            "id": evaluation_id(run_id, checkpoint),
            "project": self.project,
            "run_id": run_id,
            "checkpoint": checkpoint,
            "step": int(event["step"]),
            "checkpoint_time": float(event["time"]),
            "queued_at": time.time(),
            "reason": reason,
        }
        try:
            self.store.create(request_key(evaluation_prefix(self.project, run_id, checkpoint)), _dumps(body))
        except AlreadyExistsError:
            return False
        return True

    def discover(self, known: Mapping[str, _Listed] | None = None) -> int:
        """Queue checkpoints the rule covers that nobody queued; return how many.

        The training process queues each checkpoint right after publishing
        it; one that died in between (or could not reach the queue) leaves
        it to this sweep. The same ``create`` keeps it to one evaluation.
        """
        entries = self.rule_entries()
        if not any(e["enabled"] for e in entries):
            return 0
        known = self.scan() if known is None else known
        queued = 0
        runs_prefix = project_runs_prefix(self.project)
        for run_id in self.store.list(runs_prefix):
            if "/" in run_id or run_id in self._closed_runs:
                continue
            log = self._logs.get(run_id)
            if log is None:
                log = self._logs[run_id] = EventLog(self.store, run_id)
            state = log.state()
            for stored in state.checkpoints:
                event = _checkpoint_event(stored)
                if evaluation_id(run_id, event["checkpoint"]) in known:
                    continue
                if _rule_enabled_at(entries, float(event["time"])) and self.queue(run_id, event, "rule"):
                    _log.info("queued the evaluation of checkpoint %s of run %s", event["checkpoint"], run_id)
                    queued += 1
            if state.closed:
                self._closed_runs.add(run_id)  # no checkpoint can come after closing
        return queued

    def retry(self, listed: _Listed) -> bool:
        """Queue a new attempt of a failed evaluation; False if someone just did."""
        record = self.record(listed)
        if record.state != FAILED:
            what = {
                QUEUED: "it is still queued",
                RUNNING: f"it is running on {record.worker}",
                DONE: "it is done (its scores are logged; a score is never logged twice)",
            }.get(record.state, record.state)
            raise EvaluationStateError(
                f"evaluation {listed.id} was not retried: only a failed evaluation can be tried again, and {what}",
                evaluation_id=listed.id,
                state=record.state,
            )
        self.store.require_coordination("retrying an evaluation")
        key = retry_key(listed.base, listed.attempt + 1)
        try:
            self.store.create(key, _dumps({"time": time.time(), "by": requester()}))
        except AlreadyExistsError:
            return False
        return True

    # -- working ------------------------------------------------------------
    def _fence(self, listed: _Listed, attempt: int, epoch: int, reason: str, worker: str) -> bool:
        """Make sure epoch ``epoch`` can never publish; False if it already did."""
        key = result_key(attempt_prefix(listed.base, attempt), epoch)
        body: Slot = {"kind": FENCE, "reason": reason, "by": worker, "time": time.time()}
        try:
            self.store.create(key, _dumps(body))
            return True
        except AlreadyExistsError:
            return self._read_immutable(key).get("kind") != RESULT

    def try_claim(self, listed: _Listed, worker: str, lease_seconds: float, now: float | None = None) -> Claim | None:
        """Take the evaluation's current attempt if it is free (or its lease lapsed)."""
        now = time.time() if now is None else now
        attempt = listed.attempt
        objs = listed.objects(attempt)
        epoch = objs.epoch
        if epoch:
            if epoch in objs.slots:
                if self.slot(listed, attempt, epoch).get("kind") == RESULT:
                    return None  # finished
            else:
                view = self.lease_view(listed, attempt, epoch)
                if view.alive(now):
                    return None
                why = "lease lapsed" if now > view.expires else "holder process gone"
                if not self._fence(listed, attempt, epoch, why, worker):
                    return None  # it finished just now
        claim = Claim(
            project=self.project,
            run_id=listed.run_id,
            checkpoint=listed.checkpoint,
            attempt=attempt,
            epoch=epoch + 1,
            worker=worker,
            lease_seconds=lease_seconds,
            started_at=now,
            request=self.request(listed),
        )
        try:
            self.store.create(claim_key(claim.attempt_prefix, claim.epoch), claim.lease_body(now))
        except AlreadyExistsError:
            return None  # another worker took it first
        return claim

    def is_fenced(self, claim: Claim) -> bool:
        """Has another worker fenced this claim's epoch (or has a newer epoch begun)?"""
        names = self.store.list(claim.attempt_prefix)
        mine = f"e{claim.epoch:06d}"
        for name in names:
            m = parse_evaluation_tail(f"{attempt_name(claim.attempt)}/{name}")
            if m is None or m["epoch"] is None:
                continue
            if int(m["epoch"]) > claim.epoch or (name.startswith(mine) and m["result"]):
                return True
        return False

    def renew(self, claim: Claim, number: int) -> None:
        try:
            self.store.create(claim.renewal_key(number), claim.lease_body(time.time()))
        except AlreadyExistsError:
            pass  # an earlier, ambiguous try of this renewal landed

    def publish(self, claim: Claim, outcome: Outcome) -> bool:
        """Create the claim's result slot: True if published, False if fenced."""
        body = {
            "kind": RESULT,
            **outcome,
            "worker": claim.worker,
            "attempt": claim.attempt,
            "epoch": claim.epoch,
            "started_at": claim.started_at,
            "finished_at": time.time(),
        }
        try:
            self.store.create(claim.slot_key, _dumps(body))
        except AlreadyExistsError:
            return False
        self._cache[claim.slot_key] = json.loads(_dumps(body))
        return True

    def finish(self, claim: Claim, outcome: Outcome) -> None:
        """After :meth:`publish`: log a done result's scores, collect the lease's renewals."""
        if outcome["state"] == DONE:
            published = cast("Slot", self._cache[claim.slot_key])
            self.log_scores(claim.run_id, claim.checkpoint, claim.attempt, published)
        self.collect_renewals(claim.attempt_prefix)

    def release(self, claim: Claim) -> None:
        """Give the lease up now (Ctrl-C): the next worker takes it without waiting."""
        body = {"kind": FENCE, "reason": "released", "by": claim.worker, "time": time.time()}
        try:
            self.store.create(claim.slot_key, _dumps(body))
        except AlreadyExistsError:
            return  # fenced already, or our result is in
        self.collect_renewals(claim.attempt_prefix, epoch=claim.epoch)

    def collect_renewals(self, attempt_prefix: str, epoch: int | None = None) -> None:
        """Delete renewal objects nobody reads any more (garbage collection only)."""
        try:
            for name in self.store.list(attempt_prefix):
                if is_renewal_name(name, epoch):
                    self.store.delete(f"{attempt_prefix}/{name}")
        except Exception as exc:  # garbage left behind is harmless
            _log.debug("could not collect renewals under %s: %s", attempt_prefix, exc)

    def log_scores(self, run_id: str, checkpoint: str, attempt: int, result: Slot) -> None:
        """Write a done result's scores as the run's ``eval/<name>`` points, once.

        The chunk is derived from the result alone and created at a key of
        its own, so whoever writes it (the publishing worker, or a later one
        repairing a crash in between) writes the same points, once.
        """
        from launchhelm._metrics._points import encode_chunk

        scores = {f"{SCORE_PREFIX}{k}": float(v) for k, v in dict(result.get("scores") or {}).items()}
        step = int(result["step"])
        if scores:
            row = (step, int(result["run_attempt"]), float(result["point_time"]), scores)
            try:
                self.store.create(score_chunk_key(run_id, checkpoint, attempt, step), encode_chunk([row]))
            except AlreadyExistsError:
                pass
        base = evaluation_prefix(self.project, run_id, checkpoint)
        try:
            self.store.create(logged_key(base, attempt), _dumps({"time": time.time()}))
        except AlreadyExistsError:
            pass

    def repair(self, listed: _Listed) -> bool:
        """Log the scores of a done evaluation whose worker died before logging them."""
        objs = listed.objects(listed.attempt)
        if objs.logged:
            return False
        result = self.outcome(listed)
        if result is None or result.get("state") != DONE:
            return False
        self.log_scores(listed.run_id, listed.checkpoint, listed.attempt, result)
        return True

    def checkpoint_event(self, run_id: str, checkpoint: str) -> tuple[CheckpointEvent, int, RunState]:
        """The checkpoint's event, the run attempt it was saved under, and the run's state."""
        log = self._logs.get(run_id)
        if log is None:
            log = self._logs[run_id] = EventLog(self.store, run_id)
        state = log.state()
        stored = state.checkpoint(checkpoint)
        if stored is None:
            raise CheckpointError(f"run {run_id} has no published checkpoint {checkpoint!r}", run_id=run_id)
        event = _checkpoint_event(stored)
        return event, _count_rewinds_before(state.rewinds, int(event["seq"])), state


_queues: weakref.WeakKeyDictionary[Store, dict[str, EvaluationQueue]] = weakref.WeakKeyDictionary()
_queues_lock = threading.Lock()


def queue_for(store: Store, project: str) -> EvaluationQueue:
    """The (cached) queue of ``project`` in ``store``: handles share what they read."""
    with _queues_lock:
        per_store = _queues.setdefault(store, {})
        found = per_store.get(project)
        if found is None:
            found = per_store[project] = EvaluationQueue(store, project)
        return found


def on_checkpoint_published(store: Store, project: str, run_id: str, event: Mapping[str, object]) -> None:
    """Queue the checkpoint's evaluation if the project's rule is on (called right after publishing).

    Never raises: the checkpoint is published already, and an evaluation
    worker queues whatever this could not (``EvaluationQueue.discover``).
    """
    try:
        queue = queue_for(store, project)
        if queue.rule_enabled():
            queue.queue(run_id, _checkpoint_event(event), "rule")
    except Exception as exc:
        _log.warning(
            "checkpoint %s of run %s is saved, but queueing its evaluation failed (%s); "
            "an evaluation worker will queue it",
            event.get("checkpoint"),
            run_id,
            exc,
        )


def queue_manual(store: Store, project: str, run_id: str, state: RunState, checkpoint_id: str) -> Evaluation:
    """``RunHandle.evaluate``: queue one checkpoint's evaluation (idempotent)."""
    event = state.checkpoint(checkpoint_id) if isinstance(checkpoint_id, str) else None
    if event is None:
        known = ", ".join(e["checkpoint"] for e in state.checkpoints[-5:]) or "none yet"
        raise CheckpointError(
            f"run {run_id} has no checkpoint {checkpoint_id!r} to evaluate (its latest: {known}); "
            "pick one from RunHandle.checkpoints()",
            run_id=run_id,
        )
    store.require_coordination("queueing an evaluation")
    queue = queue_for(store, project)
    queue.queue(run_id, _checkpoint_event(event), "manual")
    listed = queue.scan_one(run_id, checkpoint_id)
    assert listed is not None  # just created, or created before
    return queue.record(listed)
