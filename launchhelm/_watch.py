"""``launchhelm watch``: tell someone, exactly once, when a run of a project changes (issue 42).

A watcher polls the project's runs table and derives each run's changes
from state it reads (never from a stream, so a change made while no watcher
ran is still found): ``started``, ``relaunched``, ``preempted``, ``crashed``,
``hung``, ``restart_loop``, ``finished``. Every watcher names a change alike
(``<run>/<session>/<event>``), and tells it only after claiming it with
put-if-absent on the store, so any number of watchers on any machines tell it
once. See docs/storage.md, "Notices: ``launchhelm watch``".

Cost per poll, whatever the project's size: the listing of
``projects/<p>/table/`` (row markers and their versions: one request per
1,000 runs), one concurrent read of each live run's heartbeat, summary and
hang marker, a full read only of runs whose row marker changed, and a few
requests per new change. Settled runs cost nothing past the listing.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, TypedDict

from launchhelm._evaluation._queue import FAILED, RESULT
from launchhelm._exceptions import AlreadyExistsError, InvalidArgumentError, LaunchHelmError, StorageError
from launchhelm._runlog._events import RunState, SessionRecord, read_state
from launchhelm._runlog._restarts import DEFAULT_MAX_FAILED_RESTARTS, failed_attempts
from launchhelm._runlog._sessions import fresher_beat, heartbeat_key, liveness, parse_object, summary_key
from launchhelm._runlog._summary import restart_loop_text
from launchhelm._runlog._table import read_index
from launchhelm.storage import Store
from launchhelm.storage._keys import (
    evaluation_prefix,
    evaluations_prefix,
    hang_key,
    notice_claim_key,
    notice_told_key,
    notices_prefix,
    notices_watermark_key,
    parse_evaluation_tail,
    parse_index_name,
    parse_notice_claim_name,
    parse_row_marker_name,
    request_key,
    row_marker_key,
    run_record_key,
    table_prefix,
)

__all__ = [
    "EVENTS",
    "DeliveryError",
    "Notice",
    "Watcher",
    "exec_delivery",
    "parse_events",
    "parse_since",
    "post_delivery",
]

_log = logging.getLogger("launchhelm")

STARTED: Final = "started"
RELAUNCHED: Final = "relaunched"
PREEMPTED: Final = "preempted"
CRASHED: Final = "crashed"
HUNG: Final = "hung"
RESTART_LOOP: Final = "restart_loop"
FINISHED: Final = "finished"
EVALUATION_FAILED: Final = "evaluation_failed"
#: Every event a watcher can tell, in the order a run goes through them.
EVENTS: Final = (STARTED, RELAUNCHED, PREEMPTED, CRASHED, HUNG, RESTART_LOOP, FINISHED, EVALUATION_FAILED)

#: A claim older than this without ``told.json`` was a watcher that died mid-notice.
DEFAULT_LEASE = 60.0
#: Claims of one change before it is given up (marked told, with the failure): a receiver that never takes it.
MAX_CLAIMS = 5
#: Seconds before the watermark a watcher that starts also tells: hosts' clocks disagree (told.json stops repeats).
_CLOCK_MARGIN = 10.0
#: Seconds a row marker saying "started" may wait for its session's start event before it is given up on.
_START_GRACE = 300.0
#: Runs read at once in a poll.
_THREADS = 16


class Notice(TypedDict):
    """The JSON object a watcher tells (``--exec``'s stdin, ``--post``'s body)."""

    event: str
    project: str
    run: str
    name: str
    step: int
    time: float
    detail: str
    #: the change's name, the same from every watcher: a receiver may drop a repeat by it
    id: str


class DeliveryError(LaunchHelmError, RuntimeError):
    """A notice was not delivered (the command failed, the URL did not take it); it is tried again."""


@dataclass
class _Change:
    notice: Notice
    #: when the change became visible to any watcher (a stale heartbeat: its last beat plus the timeout)
    seen: float


@dataclass
class _Run:
    """What this watcher knows of one run between polls."""

    version: str | None
    #: when its marker was last put (the listing's time), if the backend says
    modified: float | None = None
    name: str = ""
    #: the last session while it has not ended and was alive at the last read (read lightly each poll)
    live: SessionRecord | None = None
    #: read it whole again next poll: its marker names a session its log did not show yet
    reread: bool = False


def parse_events(text: str | None) -> tuple[str, ...]:
    """``--events started,crashed`` checked against :data:`EVENTS`; None: every event."""
    if text is None:
        return EVENTS
    wanted = tuple(e.strip() for e in text.split(",") if e.strip())
    unknown = [e for e in wanted if e not in EVENTS]
    if unknown or not wanted:
        raise InvalidArgumentError(
            f"--events {text!r}: unknown event(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {','.join(EVENTS)}"
        )
    return wanted


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: ``all``, seconds since the epoch, an ISO 8601 time, or a duration ago (``30m``, ``2h``, ``1d``)."""
    from datetime import datetime

    from launchhelm._gc import parse_duration

    now = time.time() if now is None else now
    if text == "all":
        return 0.0
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if value > 10**8:  # seconds since the epoch; smaller bare numbers are seconds ago
            return value
        return now - value
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgumentError(
            f"--since {text!r}: give 'all', a time (2026-12-06T11:00:00Z, or seconds since the epoch), "
            "or how long ago (30m, 2h, 1d)"
        ) from None
    return stamp.timestamp()


def exec_delivery(command: str, timeout: float) -> Callable[[Notice], None]:
    """Deliver by running ``command`` (a shell command line) with the notice as JSON on its stdin."""

    def deliver(notice: Notice) -> None:
        try:
            done = subprocess.run(
                command,
                shell=True,
                input=json.dumps(notice).encode() + b"\n",
                timeout=timeout,
                capture_output=True,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DeliveryError(f"--exec {command!r} did not finish within {timeout:.0f}s") from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip().splitlines()
            raise DeliveryError(f"--exec {command!r} exited with {done.returncode}" + (f": {err[-1]}" if err else ""))

    return deliver


def post_delivery(url: str, budget: float) -> Callable[[Notice], None]:
    """Deliver by POSTing the notice as JSON to ``url``, retrying with backoff for at most ``budget`` seconds.

    A 5xx answer, 429 or a connection error is retried; another 4xx is not (the receiver refuses it).
    """

    def deliver(notice: Notice) -> None:
        body = json.dumps(notice).encode()
        deadline = time.monotonic() + budget
        pause = 0.5
        while True:
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            left = deadline - time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=max(1.0, min(30.0, left))) as answer:
                    answer.read()
                return
            except urllib.error.HTTPError as exc:
                if exc.code < 500 and exc.code != 429:
                    raise DeliveryError(f"--post {url}: the receiver refused the notice (HTTP {exc.code})") from None
                why = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                why = str(getattr(exc, "reason", exc))
            if time.monotonic() + pause > deadline:
                raise DeliveryError(f"--post {url}: not delivered within {budget:.0f}s (last: {why})")
            _log.info("launchhelm watch: --post %s failed (%s); trying again in %.1fs", url, why, pause)
            time.sleep(pause)
            pause = min(pause * 2, 8.0)

    return deliver


def _step(session: SessionRecord, beat: Mapping[str, object] | None = None) -> int:
    step = max(session.start_step, session.end_step or 0)
    if beat is not None:
        raw = beat.get("step")
        if isinstance(raw, (int, float)):
            step = max(step, int(raw))
    return step


class Watcher:
    """Follows one project and tells each change of its runs once, with any number of watchers.

    Parameters
    ----------
    store:
        The project's store.
    project:
        The project to follow.
    deliver:
        Tells one notice; raises :class:`DeliveryError` (or anything) when it did not. None: nothing
        is claimed or marked, :meth:`poll` only returns what it would tell (``launchhelm watch``
        without ``--exec`` or ``--post`` prints them).
    events:
        The events to tell; others are not claimed, so a watcher told them may still.
    interval:
        Seconds between the caller's polls (the default ``since``'s margin and start depend on it).
    since:
        Changes that became visible before this time are not told. None: the project's watermark
        (what earlier watchers told up to) less a margin, else the start less one poll.
    lease:
        Seconds a claim holds a change before another watcher may tell it again.
    """

    def __init__(
        self,
        store: Store,
        project: str,
        deliver: Callable[[Notice], None] | None,
        *,
        events: Sequence[str] = EVENTS,
        interval: float = 10.0,
        since: float | None = None,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        if interval <= 0:
            raise InvalidArgumentError(f"--interval {interval}: give a positive number of seconds between polls")
        if lease <= 0:
            raise InvalidArgumentError(f"lease {lease}: give a positive number of seconds")
        self.store = store
        self.project = project
        self.deliver = deliver
        self.events = frozenset(events)
        self.interval = interval
        self.lease = lease
        self.identity = f"{socket.gethostname()}:{os.getpid()}"
        self._since = since
        self._runs: dict[str, _Run] = {}
        #: changes seen and not yet told (a claim of another watcher still holds them, or delivery failed)
        self._pending: dict[str, _Change] = {}
        self._done: set[str] = set()
        #: evaluation result objects already looked at (they are immutable)
        self._results: set[str] = set()
        self._first = True

    # -- since ---------------------------------------------------------------------------
    @property
    def since(self) -> float:
        """Changes that became visible before this are not told (decided at the first poll)."""
        if self._since is None:
            self._since = self._default_since()
        return self._since

    def _default_since(self) -> float:
        margin = max(2 * self.interval, _CLOCK_MARGIN)
        mark = parse_object(
            self.store.read_many([notices_watermark_key(self.project)]).get(notices_watermark_key(self.project))
        )
        if mark is not None and isinstance(mark.get("since"), (int, float)):
            # changes seen after it may not be told yet (a watcher died): told.json sorts out repeats
            return float(mark["since"]) - margin  # type: ignore[arg-type]
        return time.time() - self.interval  # the first watcher of the project: not its whole past

    # -- polling -----------------------------------------------------------------------------
    def poll(self) -> list[Notice]:
        """One poll: read what changed, tell what is new. Returns the notices told (or, without
        ``deliver``, those it would tell)."""
        began = time.time()
        since = self.since
        markers, newest_index = self._listing()
        index = read_index(self.store, self.project, newest_index) if self._first and newest_index else {}
        full: list[str] = []
        light: list[str] = []
        for run_id, (version, modified) in markers.items():
            known = self._runs.get(run_id)
            if known is None:
                entry = index.get(run_id)
                if (
                    entry is not None
                    and version is not None
                    and entry.get("marker") == version
                    and modified is not None
                    and modified < since
                ):
                    # settled before `since`: nothing of it is told, and its marker says when it next changes
                    self._runs[run_id] = _Run(version=version)
                    continue
                self._runs[run_id] = _Run(version=version, modified=modified)
                full.append(run_id)
            elif known.version != version or known.reread:
                known.version, known.modified = version, modified
                full.append(run_id)
            elif known.live is not None:
                light.append(run_id)
        changes: list[_Change] = []
        if full:
            with ThreadPoolExecutor(max_workers=min(_THREADS, len(full))) as pool:
                for found in pool.map(self._read_full_or_later, full):
                    changes.extend(found)
        if light:
            changes.extend(self._read_light(light))
        if EVALUATION_FAILED in self.events:
            changes.extend(self._evaluation_failures(since))
        self._first = False
        for change in changes:
            cid = change.notice["id"]
            if cid in self._done or change.notice["event"] not in self.events or change.seen < since:
                continue
            self._pending.setdefault(cid, change)
        told: list[Notice] = []
        for cid, change in sorted(self._pending.items(), key=lambda kv: kv[1].notice["time"]):
            if self.deliver is None:
                told.append(change.notice)
                self._done.add(cid)
            elif self._tell(change):
                told.append(change.notice)
        for notice in told:
            self._pending.pop(notice["id"], None)
        if self.deliver is not None:
            self._put_watermark(began)
        return told

    def _listing(self) -> tuple[dict[str, tuple[str | None, float | None]], str | None]:
        markers: dict[str, tuple[str | None, float | None]] = {}
        indexes: list[str] = []
        for info in self.store.list_info(table_prefix(self.project)):
            if parse_index_name(info.key):
                indexes.append(info.key)
            elif (run_id := parse_row_marker_name(info.key)) is not None:
                markers[run_id] = (info.version, info.modified)
        return markers, max(indexes) if indexes else None

    def _read_full_or_later(self, run_id: str) -> list[_Change]:
        try:
            return self._read_full(run_id)
        except Exception as exc:  # one damaged or half-written run must not stop the project's notices
            _log.warning("launchhelm watch: could not read run %s (%s); trying again next poll", run_id, exc)
            self._runs[run_id].reread = True
            return []

    def _read_full(self, run_id: str) -> list[_Change]:
        """A run whose marker changed (or that this watcher never read): its log, and its last session's signs."""
        known = self._runs[run_id]
        state, _ = read_state(self.store, run_id)
        last = state.last_session
        keys = [summary_key(run_id), row_marker_key(self.project, run_id)]
        if last is not None and last.ended_at is None:
            keys += [heartbeat_key(run_id, last.id), hang_key(run_id, last.id)]
        if not known.name:
            keys.append(run_record_key(run_id))
        got = self.store.read_many(keys)
        summary = parse_object(got.get(summary_key(run_id)))
        marker = parse_object(got.get(row_marker_key(self.project, run_id)))
        # the marker is put before its session's start event: read again until the log shows that session
        # (for a while: a process killed between the two never writes it)
        put = marker.get("time") if marker is not None else None
        known.reread = (
            marker is not None
            and marker.get("state") == "started"
            and marker.get("session") not in {s.id for s in state.sessions}
            and isinstance(put, (int, float))
            and time.time() - float(put) < _START_GRACE
        )
        if not known.name:
            record = parse_object(got.get(run_record_key(run_id))) or summary or {}
            known.name = str(record.get("name") or "")
        changes: list[_Change] = []
        for i in range(len(state.sessions)):
            found = list(self._session_changes(run_id, known.name, state, i))
            if i == len(state.sessions) - 1 and known.modified is not None:
                # its end is put in the log before the marker: a watcher that polled between the two saw
                # neither, so the end counts as seen when the marker was put (what `since` is compared with)
                for change in found[1:]:
                    change.seen = max(change.seen, known.modified)
            changes.extend(found)
        known.live = None
        if last is not None and last.ended_at is None and not state.closed:
            beat = fresher_beat(parse_object(got.get(heartbeat_key(run_id, last.id))), summary, last.id)
            changes.extend(
                self._live_changes(run_id, known, last, beat, parse_object(got.get(hang_key(run_id, last.id))))
            )
        changes.extend(self._restart_loop(run_id, known, state))
        return changes

    def _read_light(self, run_ids: list[str]) -> list[_Change]:
        """Live runs whose marker did not change: only their last session's heartbeat, summary and hang marker."""
        keys: list[str] = []
        for run_id in run_ids:
            live = self._runs[run_id].live
            assert live is not None
            keys += [heartbeat_key(run_id, live.id), summary_key(run_id), hang_key(run_id, live.id)]
        got = self.store.read_many(keys)
        changes: list[_Change] = []
        for run_id in run_ids:
            known = self._runs[run_id]
            live = known.live
            assert live is not None
            beat = fresher_beat(
                parse_object(got.get(heartbeat_key(run_id, live.id))),
                parse_object(got.get(summary_key(run_id))),
                live.id,
            )
            changes.extend(
                self._live_changes(run_id, known, live, beat, parse_object(got.get(hang_key(run_id, live.id))))
            )
        return changes

    def _notice(self, event: str, run_id: str, name: str, session: str, step: int, at: float, detail: str) -> Notice:
        return Notice(
            event=event,
            project=self.project,
            run=run_id,
            name=name,
            step=step,
            time=at,
            detail=detail,
            id=f"{run_id}/{session}/{event}",
        )

    def _session_changes(self, run_id: str, name: str, state: RunState, i: int) -> Iterable[_Change]:
        session = state.sessions[i]
        host = str(session.process.get("hostname") or "?")
        if i > 0 and session.launcher is not None:
            launcher = session.launcher
            restart = launcher.get("restart")
            detail = f"relaunched by {launcher.get('scheduler')} job {launcher.get('job')}" + (
                f" (restart {'.'.join(str(r) for r in restart)})" if isinstance(restart, list) and restart else ""
            )
            event = RELAUNCHED
        else:
            detail = f"resumed at step {session.start_step}" if session.resumed else "a first session"
            event = STARTED
        detail += f" on {host} (pid {session.process.get('pid')})"
        yield _Change(
            self._notice(event, run_id, name, session.id, session.start_step, session.started_at, detail),
            session.started_at,
        )
        ending = session.ending
        if session.ended_at is not None:
            at = session.ended_at
        elif ending == CRASHED and i + 1 < len(state.sessions):
            at = state.sessions[i + 1].started_at  # found dead when the next session started
        else:
            return
        if ending in (FINISHED, PREEMPTED, CRASHED, HUNG):
            if ending == FINISHED:
                text = "finish() closed the run" if session.closed_run else "its session ended; the run is resumable"
            else:
                text = session.detail or session.end_reason or ending
            yield _Change(self._notice(ending, run_id, name, session.id, _step(session), at, text), at)

    def _live_changes(
        self,
        run_id: str,
        known: _Run,
        session: SessionRecord,
        beat: Mapping[str, object] | None,
        hang: Mapping[str, object] | None,
    ) -> list[_Change]:
        # the runs table's own rule (liveness): at once when its host is this one and its pid is gone
        live = liveness(self.store, run_id, session, beat=beat)
        step = _step(session, beat)
        if not live.alive:
            known.live = None  # a new session changes its marker; nothing more comes of this one
            detail = f"died without a notice ({live.reason}) after step {step}"
            at = live.last_heartbeat or session.started_at
            # visible from any host at the latest once the heartbeat is stale: what `since` is compared with
            seen = at + session.heartbeat_timeout
            return [_Change(self._notice(CRASHED, run_id, known.name, session.id, step, at, detail), seen)]
        known.live = session
        if hang is None:
            return []
        since = hang.get("since")
        now = time.time()
        at = float(since) if isinstance(since, (int, float)) else now
        hung_step = hang.get("step")
        return [
            _Change(
                self._notice(
                    HUNG,
                    run_id,
                    known.name,
                    session.id,
                    int(hung_step) if isinstance(hung_step, (int, float)) else step,
                    at,
                    str(hang.get("detail") or "no step for its hang timeout"),
                ),
                now,  # still hung now: a watcher that starts later tells it too
            )
        ]

    def _restart_loop(self, run_id: str, known: _Run, state: RunState) -> list[_Change]:
        """Attempts in a row that failed without progress: the next launch with ``auto_resume`` is refused."""
        if RESTART_LOOP not in self.events or state.closed:
            return []
        refused = state.restart_loop  # a launch refused it, with the job's own max_failed_restarts
        if refused is not None and state.last_session is not None:
            last = state.last_session
            detail = "a relaunch was refused: " + restart_loop_text(refused).removeprefix("relaunch refused: ")
            at = float(refused["time"])
            return [_Change(self._notice(RESTART_LOOP, run_id, known.name, last.id, _step(last), at, detail), at)]
        tail = [s for s in state.sessions if s.start_seq > state.resume_choice_seq]
        if len(tail) < DEFAULT_MAX_FAILED_RESTARTS:
            return []
        last = tail[-1]
        if known.live is not None or last.launcher is None or last.ending in (FINISHED, PREEMPTED):
            return []
        failed = failed_attempts(self.store, run_id, state)  # a listing of the run's metrics
        if len(failed) < DEFAULT_MAX_FAILED_RESTARTS:
            return []
        at = last.ended_at or time.time()
        detail = f"the last {len(failed)} attempts each ended without a step past where they resumed: " + "; ".join(
            f"{a['ending']} ({a['detail'] or 'no detail'}) at step {a['step']}" for a in failed
        )
        return [_Change(self._notice(RESTART_LOOP, run_id, known.name, last.id, _step(last), at, detail), at)]

    def _evaluation_failures(self, since: float) -> list[_Change]:
        """Failed evaluation attempts: a listing of the project's queue, and each new result slot read once."""
        prefix = evaluations_prefix(self.project)
        fresh: dict[str, tuple[str, str, int, float]] = {}
        for info in self.store.list_info(prefix):
            if info.key in self._results:
                continue
            parts = info.key.split("/", 2)
            parsed = parse_evaluation_tail(parts[2]) if len(parts) == 3 else None
            if parsed is None or not parsed.group("result"):
                continue
            self._results.add(info.key)
            at = info.modified if info.modified is not None else time.time()
            if at < since:
                continue  # before `since`: not told, so not read
            fresh[f"{prefix}/{info.key}"] = (parts[0], parts[1], int(parsed.group("attempt")), at)
        if not fresh:
            return []
        # the result and its request (which has the checkpoint's step), all in one round
        requests = {key: request_key(evaluation_prefix(self.project, r, c)) for key, (r, c, _, _) in fresh.items()}
        got = self.store.read_many([*fresh, *requests.values()])
        changes = []
        for key, (run_id, checkpoint, attempt, at) in fresh.items():
            slot = parse_object(got.get(key))
            request = parse_object(got.get(requests[key])) or {}
            if slot is None or slot.get("kind") != RESULT or slot.get("state") != FAILED:
                continue  # done, or a fence (the lease was taken over: not a failure of the evaluation)
            known = self._runs.get(run_id)
            step = request.get("step")
            finished = slot.get("finished_at")
            notice = Notice(
                event=EVALUATION_FAILED,
                project=self.project,
                run=run_id,
                name=known.name if known is not None else "",
                step=int(step) if isinstance(step, (int, float)) else 0,
                time=float(finished) if isinstance(finished, (int, float)) else at,
                detail=f"evaluation of checkpoint {checkpoint} (attempt {attempt}) failed: {slot.get('error')}",
                id=f"{run_id}/{checkpoint}/a{attempt:04d}/{EVALUATION_FAILED}",
            )
            changes.append(_Change(notice, at))
        return changes

    # -- telling once --------------------------------------------------------------------------
    def _tell(self, change: _Change) -> bool:
        """Claim, deliver, mark told. True once told (by this watcher); False: not now."""
        notice = change.notice
        cid = notice["id"]
        base = f"{notices_prefix(self.project)}/{cid}"
        names = {info.key.rsplit("/", 1)[-1] for info in self.store.list_info(base)}
        if "told.json" in names:
            self._done.add(cid)  # another watcher told it
            self._pending.pop(cid, None)
            return False
        claims = sorted(k for n in names if (k := parse_notice_claim_name(n)) is not None)
        k = claims[-1] if claims else 0
        if k:
            claim = parse_object(
                self.store.read_many([notice_claim_key(self.project, cid, k)]).get(
                    notice_claim_key(self.project, cid, k)
                )
            )
            claimed = claim.get("time") if claim is not None else None
            # the claimer's own lease: it bounded its delivery by it
            held = claim.get("lease") if claim is not None else None
            lease = float(held) if isinstance(held, (int, float)) and held > 0 else self.lease
            if isinstance(claimed, (int, float)) and time.time() - float(claimed) < lease:
                return False  # a watcher holds it: told by it, or by us after its lease
            if k >= MAX_CLAIMS:
                _log.error("launchhelm watch: giving up on %s after %d tries", cid, k)
                self._mark_told(cid, {"gave_up": True, "claims": k})
                return False
        body = {"watcher": self.identity, "time": time.time(), "lease": self.lease}
        try:
            self.store.create(notice_claim_key(self.project, cid, k + 1), json.dumps(body).encode())
        except AlreadyExistsError:
            return False  # another watcher claimed it first
        assert self.deliver is not None
        try:
            self.deliver(notice)
        except Exception as exc:  # told again once the claim's lease runs out
            _log.warning("launchhelm watch: could not tell %s: %s; trying again after %.0fs", cid, exc, self.lease)
            return False
        self._mark_told(cid, {"claim": k + 1})
        return True

    def _mark_told(self, cid: str, extra: Mapping[str, object]) -> None:
        body = {"watcher": self.identity, "time": time.time(), **extra}
        try:
            self.store.create(notice_told_key(self.project, cid), json.dumps(body).encode())
        except AlreadyExistsError:
            pass  # a watcher whose claim we thought expired told it too (the id lets a receiver drop it)
        self._done.add(cid)
        self._pending.pop(cid, None)

    def _put_watermark(self, began: float) -> None:
        # every change seen before `since` is told, but for those still pending
        since = min([began, *(c.seen for c in self._pending.values())])
        body = {"since": since, "watcher": self.identity, "time": time.time()}
        try:
            self.store.put(notices_watermark_key(self.project), json.dumps(body).encode())
        except StorageError as exc:
            _log.debug("launchhelm watch: could not put the watermark: %s", exc)
