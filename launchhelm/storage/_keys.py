"""The store layout: every key LaunchHelm reads or writes is built (and parsed) here.

One function per row of the layout table in ``docs/storage.md`` (the table
and :data:`ROWS` must agree: ``tests/storage/test_keys.py`` checks both ways),
so a layout change is one edit here, not a hunt. No other module spells a key
fragment; they call these functions, and parse listings with the ``parse_*``
helpers below.

All keys are relative to the store's root URL and use ``/``. Identifiers
(project names, run ids, session ids, checkpoint ids) are validated by their
owners before they reach a key.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

__all__ = [
    "EVAL_CHUNK_PREFIX",
    "PROJECTS",
    "ROWS",
    "RULE_NAME",
    "SEGMENT_DIR",
    "artifact_prefix",
    "artifacts_prefix",
    "attempt_name",
    "attempt_prefix",
    "chunk_key",
    "claim_key",
    "compat_key",
    "console_key",
    "console_prefix",
    "evaluation_prefix",
    "evaluations_prefix",
    "event_key",
    "events_prefix",
    "fence_name",
    "hang_grouped_key",
    "hang_key",
    "hang_recorder_key",
    "hang_stacks_key",
    "hangs_prefix",
    "heartbeat_key",
    "is_renewal_name",
    "logged_key",
    "manifest_key",
    "manifest_name",
    "media_index_key",
    "media_index_prefix",
    "media_object_key",
    "media_objects_prefix",
    "metrics_prefix",
    "new_index_name",
    "new_project_segment_name",
    "new_segment_name",
    "notice_claim_key",
    "notice_told_key",
    "notices_prefix",
    "notices_watermark_key",
    "parse_chunk_name",
    "parse_console_name",
    "parse_evaluation_tail",
    "parse_event_name",
    "parse_fence_name",
    "parse_index_name",
    "parse_manifest_name",
    "parse_media_index_name",
    "parse_notice_claim_name",
    "parse_project_listing",
    "parse_row_marker_name",
    "parse_rule_name",
    "parse_segment_name",
    "parse_snapshot_name",
    "policy_patterns",
    "project_history_manifest_key",
    "project_history_prefix",
    "project_record_key",
    "project_run_marker",
    "project_runs_prefix",
    "renewal_key",
    "request_key",
    "result_key",
    "retry_key",
    "row_marker_key",
    "rule_key",
    "rule_prefix",
    "run_prefix",
    "run_record_key",
    "score_chunk_dir",
    "score_chunk_key",
    "sessions_prefix",
    "snapshot_key",
    "summary_key",
    "table_prefix",
]

#: The folder every project lives under.
PROJECTS = "projects"
_RUNS = "runs"
#: Compacted segments live under ``<metrics prefix>/SEGMENT_DIR/``.
SEGMENT_DIR = "segments"
#: Score chunks live under ``runs/<run>/metrics/<EVAL_CHUNK_PREFIX>...``: a
#: "session" name no training session has, read by the ordinary history.
EVAL_CHUNK_PREFIX = "eval-"
#: The project rule that queues an evaluation of every checkpoint.
RULE_NAME = "evaluate_every_checkpoint"

_MANIFEST = "manifest-"
_SNAPSHOT = "snapshot-"
_INDEX = "index-"
_RENEW = "-renew-"
_JSON = ".json"
_ARROW = ".arrow"
_PARQUET = ".parquet"
_SEQ_JSON_RE = re.compile(r"^(\d{20})\.json$")
_NOTICE_CLAIM_RE = re.compile(r"^claim-(\d+)\.json$")
_SNAPSHOT_RE = re.compile(r"^snapshot-(\d{20})\.json$")
_EVALUATION_TAIL_RE = re.compile(
    r"^(?:(?P<request>request\.json)"
    r"|a(?P<attempt>\d{4})/(?:(?P<retry>retry\.json)|(?P<logged>logged\.json)"
    r"|e(?P<epoch>\d{6})(?:(?P<result>-result)|-renew-(?P<renewal>\d{6}))?\.json))$"
)


# -- projects --------------------------------------------------------------
def project_record_key(project: str) -> str:
    """``projects/<p>/project.json``: the project's marker, created by the first ``init``."""
    return f"{PROJECTS}/{project}/project.json"


def project_runs_prefix(project: str) -> str:
    """Where the project's run markers are listed."""
    return f"{PROJECTS}/{project}/{_RUNS}"


def project_run_marker(project: str, run_id: str) -> str:
    """``projects/<p>/runs/<run>``: the run's marker in its project."""
    return f"{project_runs_prefix(project)}/{run_id}"


def parse_project_listing(name: str, project: str | None = None) -> tuple[str, str] | None:
    """``(kind, value)`` of a name listed under ``projects/`` (or ``projects/<project>/``).

    ``("project", p)`` for a project record, ``("run", run_id)`` for a run
    marker; None for anything else.
    """
    parts = name.split("/")
    if project is not None:
        parts = [project, *parts]
    if len(parts) == 2 and parts[1] == "project.json":
        return "project", parts[0]
    if len(parts) == 3 and parts[1] == _RUNS:
        return "run", parts[2]
    return None


# -- a run's own prefix ----------------------------------------------------
def run_prefix(run_id: str) -> str:
    """``runs/<run>``: everything of one run lives under it."""
    return f"{_RUNS}/{run_id}"


def hangs_prefix(run_id: str, session_id: str) -> str:
    """``runs/<run>/hangs/<session>``: a hung session's stacks (``rank-<r>.txt``, ``grouped.txt``), flight
    recorders (``rank-<r>.fr.json``) and its marker."""
    return f"{run_prefix(run_id)}/hangs/{session_id}"


def hang_key(run_id: str, session_id: str) -> str:
    """``runs/<run>/hangs/<session>/hung.json``: present while a live session is hung (the watchdog's)."""
    return f"{hangs_prefix(run_id, session_id)}/hung.json"


def hang_stacks_key(run_id: str, session_id: str, rank: int) -> str:
    """``runs/<run>/hangs/<session>/rank-<r>.txt``: a hung rank's summary line, then every thread's stack."""
    return f"{hangs_prefix(run_id, session_id)}/rank-{rank}.txt"


def hang_recorder_key(run_id: str, session_id: str, rank: int) -> str:
    """``runs/<run>/hangs/<session>/rank-<r>.fr.json``: a hung rank's torch flight recorder, as torch dumps it."""
    return f"{hangs_prefix(run_id, session_id)}/rank-{rank}.fr.json"


def hang_grouped_key(run_id: str, session_id: str) -> str:
    """``runs/<run>/hangs/<session>/grouped.txt``: the hang's detail, then each distinct stack of the ranks once."""
    return f"{hangs_prefix(run_id, session_id)}/grouped.txt"


def run_record_key(run_id: str) -> str:
    """``runs/<run>/run.json``: the run's immutable record."""
    return f"{run_prefix(run_id)}/run.json"


def events_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}/events"


def event_key(run_id: str, seq: int) -> str:
    """``runs/<run>/events/<seq:020d>.json``: event ``seq`` of the run's log."""
    return f"{events_prefix(run_id)}/{seq:020d}{_JSON}"


def parse_event_name(name: str) -> int | None:
    """The sequence number of an event listed under :func:`events_prefix`, else None."""
    stem = name.split("/")[-1]
    if not stem.endswith(_JSON):
        return None
    try:
        return int(stem[: -len(_JSON)])
    except ValueError:
        return None


def snapshot_key(run_id: str, seq: int) -> str:
    """``runs/<run>/events/snapshot-<seq:020d>.json``: the folded state after event ``seq``."""
    return f"{events_prefix(run_id)}/{_SNAPSHOT}{seq:020d}{_JSON}"


def parse_snapshot_name(name: str) -> int | None:
    m = _SNAPSHOT_RE.match(name)
    return int(m.group(1)) if m else None


def sessions_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}/sessions"


def heartbeat_key(run_id: str, session_id: str) -> str:
    """``runs/<run>/sessions/<session>.json``: a session's heartbeat."""
    return f"{sessions_prefix(run_id)}/{session_id}{_JSON}"


def summary_key(run_id: str) -> str:
    """``runs/<run>/summary.json``: the run's row of the runs table, kept current by the live session."""
    return f"{run_prefix(run_id)}/summary.json"


# -- the runs table ----------------------------------------------------------
def table_prefix(project: str) -> str:
    return f"{PROJECTS}/{project}/table"


def row_marker_key(project: str, run_id: str) -> str:
    """``projects/<p>/table/<run>.json``: the run's row marker."""
    return f"{table_prefix(project)}/{run_id}{_JSON}"


def parse_row_marker_name(name: str) -> str | None:
    """The run id of a row marker listed under :func:`table_prefix`, else None."""
    if "/" in name or not name.endswith(_JSON) or name.startswith(_INDEX):
        return None
    return name[: -len(_JSON)]


def new_index_name() -> str:
    """``index-<ms>-<token>.json``: a fresh, time-sortable index of settled rows."""
    return f"{_INDEX}{int(time.time() * 1000):013d}-{os.urandom(4).hex()}{_JSON}"


def parse_index_name(name: str) -> bool:
    """Is this name (listed under :func:`table_prefix`) an index of settled rows?"""
    return name.startswith(_INDEX) and name.endswith(_JSON) and "/" not in name


# -- metrics -----------------------------------------------------------------
def metrics_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}/metrics"


def chunk_key(run_id: str, session_id: str, number: int, first_step: int, last_step: int) -> str:
    """``runs/<run>/metrics/<session>/<n:08d>-<first>-<last>.arrow``: the name carries its step range."""
    return f"{metrics_prefix(run_id)}/{session_id}/{number:08d}-{first_step}-{last_step}{_ARROW}"


def score_chunk_dir(checkpoint: str, attempt: int) -> str:
    """``eval-<ckpt>-a<k:04d>``: the "session" folder an evaluation attempt's scores are written under."""
    return f"{EVAL_CHUNK_PREFIX}{checkpoint}-a{attempt:04d}"


def score_chunk_key(run_id: str, checkpoint: str, attempt: int, step: int) -> str:
    """``runs/<run>/metrics/eval-<ckpt>-a<k>/00000000-<s>-<s>.arrow``: an evaluation attempt's scores."""
    return chunk_key(run_id, score_chunk_dir(checkpoint, attempt), 0, step, step)


def parse_chunk_name(name: str) -> tuple[str, int, int, int] | None:
    """``(session, number, first_step, last_step)`` from a key under ``metrics/``."""
    parts = name.split("/")
    if len(parts) != 2 or not parts[1].endswith(_ARROW) or parts[0] == SEGMENT_DIR:
        return None
    try:
        number, first, last = (int(x) for x in parts[1][: -len(_ARROW)].split("-"))
    except ValueError:
        return None
    return parts[0], number, first, last


def new_segment_name(level: int) -> str:
    """``segments/L<level>-<token>.parquet`` (relative to :func:`metrics_prefix`): unique, never reused."""
    return f"{SEGMENT_DIR}/L{level}-{os.urandom(8).hex()}{_PARQUET}"


def parse_segment_name(name: str) -> bool:
    return name.startswith(f"{SEGMENT_DIR}/") and name.endswith(_PARQUET)


def manifest_name(seq: int) -> str:
    """``manifest-<seq:020d>.json`` (relative to :func:`metrics_prefix`)."""
    return f"{_MANIFEST}{seq:020d}{_JSON}"


def manifest_key(run_id: str, seq: int) -> str:
    """``runs/<run>/metrics/manifest-<seq:020d>.json``: which chunks the segments replace."""
    return f"{metrics_prefix(run_id)}/{manifest_name(seq)}"


def parse_manifest_name(name: str) -> int | None:
    """The sequence number of a manifest listed under :func:`metrics_prefix`, else None."""
    if not (name.startswith(_MANIFEST) and name.endswith(_JSON)) or "/" in name:
        return None
    try:
        return int(name[len(_MANIFEST) : -len(_JSON)])
    except ValueError:
        return None


# -- the project's history dataset ---------------------------------------------
def project_history_prefix(project: str) -> str:
    """``projects/<p>/history``: settled runs' metrics merged into a few segments, by generation."""
    return f"{PROJECTS}/{project}/history"


def project_history_manifest_key(project: str, generation: int) -> str:
    """``projects/<p>/history/manifest-<gen:020d>.json``: generation ``gen`` of the project's dataset.

    Listed names parse with :func:`parse_manifest_name` (the same shape as a run's manifests).
    """
    return f"{project_history_prefix(project)}/{manifest_name(generation)}"


def new_project_segment_name(generation: int) -> str:
    """``segments/<gen:020d>-<token>.parquet`` (relative to :func:`project_history_prefix`): never reused.

    Listed names parse with :func:`parse_segment_name`.
    """
    return f"{SEGMENT_DIR}/{generation:020d}-{os.urandom(8).hex()}{_PARQUET}"


# -- console -----------------------------------------------------------------
def console_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}/console"


def console_key(run_id: str, session_id: str, number: int) -> str:
    """``runs/<run>/console/<session>/<n:08d>.txt``: what the session's process printed."""
    return f"{console_prefix(run_id)}/{session_id}/{number:08d}.txt"


def parse_console_name(name: str) -> tuple[str, int] | None:
    """``(session, number)`` of a name listed under :func:`console_prefix`, else None."""
    session, _, rest = name.partition("/")
    if not rest.endswith(".txt") or "/" in rest:
        return None
    try:
        return session, int(rest[: -len(".txt")])
    except ValueError:
        return None


def compat_key(run_id: str, api: str) -> str:
    """``runs/<run>/compat/<api>.json``: what a drop-in API (``"wandb"``, ``"tensorboard"``) records."""
    return f"{run_prefix(run_id)}/compat/{api}{_JSON}"


# -- media -----------------------------------------------------------------------
def media_object_key(run_id: str, name: str) -> str:
    """``runs/<run>/media/objects/<sha256>.<ext>``: an image, table or histogram, named by its content."""
    return f"{run_prefix(run_id)}/media/objects/{name}"


def media_objects_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}/media/objects"


def media_index_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}/media/index"


def media_index_key(run_id: str, session_id: str, first: int, last: int) -> str:
    """``runs/<run>/media/index/<session>/<first:08d>-<last:08d>.parquet``: index rows of chunks first..last."""
    return f"{media_index_prefix(run_id)}/{session_id}/{first:08d}-{last:08d}{_PARQUET}"


def parse_media_index_name(name: str) -> tuple[str, int, int] | None:
    """``(session, first, last)`` of a name listed under :func:`media_index_prefix`, else None."""
    session, _, rest = name.partition("/")
    if not rest.endswith(_PARQUET) or "/" in rest:
        return None
    first, dash, last = rest[: -len(_PARQUET)].partition("-")
    if not dash or len(first) != 8 or len(last) != 8 or not (first.isdigit() and last.isdigit()):
        return None
    return session, int(first), int(last)


# -- checkpoints (artifacts) -----------------------------------------------------
def artifacts_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}/artifacts"


def artifact_prefix(run_id: str, artifact_id: str) -> str:
    """``runs/<run>/artifacts/<id>``: a checkpoint's (or artifact's) files, invisible until its event."""
    return f"{artifacts_prefix(run_id)}/{artifact_id}"


# -- the evaluation queue ----------------------------------------------------
def rule_prefix(project: str) -> str:
    return f"{PROJECTS}/{project}/rules/{RULE_NAME}"


def rule_key(project: str, seq: int) -> str:
    """``projects/<p>/rules/evaluate_every_checkpoint/<seq:020d>.json``: one change of the project rule."""
    return f"{rule_prefix(project)}/{seq:020d}{_JSON}"


def parse_rule_name(name: str) -> int | None:
    m = _SEQ_JSON_RE.match(name)
    return int(m.group(1)) if m else None


def evaluations_prefix(project: str) -> str:
    return f"{PROJECTS}/{project}/evaluations"


def evaluation_prefix(project: str, run_id: str, checkpoint: str) -> str:
    """``projects/<p>/evaluations/<run>/<ckpt>``: one checkpoint's evaluation, all its attempts."""
    return f"{evaluations_prefix(project)}/{run_id}/{checkpoint}"


def request_key(base: str) -> str:
    """``<evaluation>/request.json``: the evaluation was asked for (by a person or the rule)."""
    return f"{base}/request{_JSON}"


def attempt_name(attempt: int) -> str:
    """``a<k:04d>``: attempt ``k`` of an evaluation (0 is the first; "Try again" opens the next)."""
    return f"a{attempt:04d}"


def attempt_prefix(base: str, attempt: int) -> str:
    return f"{base}/{attempt_name(attempt)}"


def retry_key(base: str, attempt: int) -> str:
    """``<evaluation>/a<k>/retry.json``: "Try again" opened attempt ``k``."""
    return f"{attempt_prefix(base, attempt)}/retry{_JSON}"


# -- notices (launchhelm watch) ---------------------------------------------------
def notices_prefix(project: str) -> str:
    """``projects/<p>/notices``: what ``launchhelm watch`` told, one folder per change."""
    return f"{PROJECTS}/{project}/notices"


def notice_claim_key(project: str, change: str, k: int) -> str:
    """``projects/<p>/notices/<run>/<session>/<event>/claim-<k>.json``: watcher claim ``k`` of telling ``change``."""
    return f"{notices_prefix(project)}/{change}/claim-{k}{_JSON}"


def notice_told_key(project: str, change: str) -> str:
    """``projects/<p>/notices/<run>/<session>/<event>/told.json``: ``change`` was told."""
    return f"{notices_prefix(project)}/{change}/told{_JSON}"


def parse_notice_claim_name(name: str) -> int | None:
    """``k`` of a ``claim-<k>.json`` listed under a change's folder, else None."""
    m = _NOTICE_CLAIM_RE.match(name)
    return int(m.group(1)) if m else None


def notices_watermark_key(project: str) -> str:
    """``projects/<p>/notices/watermark.json``: every change seen before its ``since`` is told."""
    return f"{notices_prefix(project)}/watermark{_JSON}"


def logged_key(base: str, attempt: int) -> str:
    """``<evaluation>/a<k>/logged.json``: the attempt's scores are in the run's history."""
    return f"{attempt_prefix(base, attempt)}/logged{_JSON}"


def claim_key(attempt_base: str, epoch: int) -> str:
    """``<attempt>/e<n:06d>.json``: lease epoch ``n`` claimed."""
    return f"{attempt_base}/e{epoch:06d}{_JSON}"


def result_key(attempt_base: str, epoch: int) -> str:
    """``<attempt>/e<n:06d>-result.json``: the epoch's outcome, or the fence that ends it."""
    return f"{attempt_base}/e{epoch:06d}-result{_JSON}"


def renewal_key(attempt_base: str, epoch: int, number: int) -> str:
    """``<attempt>/e<n:06d>-renew-<m:06d>.json``: the lease renewed."""
    return f"{attempt_base}/e{epoch:06d}{_RENEW}{number:06d}{_JSON}"


def is_renewal_name(name: str, epoch: int | None = None) -> bool:
    """Is a name listed under an attempt a renewal (of ``epoch``, if given)?"""
    return _RENEW in name and (epoch is None or name.startswith(f"e{epoch:06d}-"))


def parse_evaluation_tail(tail: str) -> re.Match[str] | None:
    """Parse a name listed under an evaluation: groups request, attempt, retry, logged, epoch, result, renewal."""
    return _EVALUATION_TAIL_RE.match(tail)


def policy_patterns(project: str | None) -> dict[str, list[str]]:
    """The key patterns an evaluation worker needs, by operation (``*`` matches within and across folders).

    The cloud IAM policies in :mod:`launchhelm._evaluation._policies` are
    built from these, so they always cover exactly the keys a worker touches.
    """
    proj = project if project is not None else "*"
    every = "*"  # a wildcard in the cloud policies' patterns
    return {
        "list": [f"{_RUNS}/", f"{PROJECTS}/" if project is None else f"{PROJECTS}/{proj}/"],
        "read": [f"{_RUNS}/", f"{PROJECTS}/{proj}/"],
        "create": [f"{evaluations_prefix(proj)}/{every}", f"{metrics_prefix(every)}/{EVAL_CHUNK_PREFIX}{every}"],
        "delete": [f"{evaluations_prefix(proj)}/{every}{_RENEW}{every}"],
    }


#: The layout table of ``docs/storage.md``: each row's key pattern and the
#: function that builds it from example arguments (the test compares them).
ROWS: dict[str, Callable[[], str]] = {
    "projects/<p>/project.json": lambda: project_record_key("p"),
    "projects/<p>/runs/<run>": lambda: project_run_marker("p", "run"),
    "runs/<run>/run.json": lambda: run_record_key("run"),
    "runs/<run>/events/<seq:020d>.json": lambda: event_key("run", 7),
    "runs/<run>/events/snapshot-<seq:020d>.json": lambda: snapshot_key("run", 7),
    "runs/<run>/sessions/<session>.json": lambda: heartbeat_key("run", "session"),
    "runs/<run>/summary.json": lambda: summary_key("run"),
    "runs/<run>/hangs/<session>/rank-<r>.txt": lambda: hang_stacks_key("run", "session", 0),
    "runs/<run>/hangs/<session>/rank-<r>.fr.json": lambda: hang_recorder_key("run", "session", 0),
    "runs/<run>/hangs/<session>/grouped.txt": lambda: hang_grouped_key("run", "session"),
    "runs/<run>/hangs/<session>/hung.json": lambda: hang_key("run", "session"),
    "projects/<p>/table/<run>.json": lambda: row_marker_key("p", "run"),
    "projects/<p>/table/index-<ms>-<token>.json": lambda: f"{table_prefix('p')}/{new_index_name()}",
    "runs/<run>/metrics/<session>/<n:08d>-<first>-<last>.arrow": lambda: chunk_key("run", "session", 3, 10, 20),
    "runs/<run>/metrics/eval-<ckpt>-a<k>/00000000-<s>-<s>.arrow": lambda: score_chunk_key("run", "ckpt", 1, 5),
    "runs/<run>/metrics/segments/L<level>-<token>.parquet": lambda: f"{metrics_prefix('run')}/{new_segment_name(2)}",
    "runs/<run>/metrics/manifest-<seq:020d>.json": lambda: manifest_key("run", 7),
    "projects/<p>/history/manifest-<gen:020d>.json": lambda: project_history_manifest_key("p", 7),
    "projects/<p>/history/segments/<gen:020d>-<token>.parquet": lambda: (
        f"{project_history_prefix('p')}/{new_project_segment_name(7)}"
    ),
    "runs/<run>/console/<session>/<n:08d>.txt": lambda: console_key("run", "session", 3),
    "runs/<run>/metrics/<session>/fenced-after-<n>.json": lambda: f"{metrics_prefix('run')}/{fence_name('session', 4)}",
    "runs/<run>/console/<session>/fenced-after-<n>.json": lambda: f"{console_prefix('run')}/{fence_name('session', 4)}",
    "runs/<run>/media/index/<session>/fenced-after-<n>.json": lambda: (
        f"{media_index_prefix('run')}/{fence_name('session', 4)}"
    ),
    "runs/<run>/compat/<api>.json": lambda: compat_key("run", "wandb"),
    "projects/<p>/notices/<run>/<session>/<event>/claim-<k>.json": lambda: notice_claim_key(
        "p", "run/session/crashed", 1
    ),
    "projects/<p>/notices/<run>/<session>/<event>/told.json": lambda: notice_told_key("p", "run/session/crashed"),
    "projects/<p>/notices/watermark.json": lambda: notices_watermark_key("p"),
    "runs/<run>/media/objects/<sha256>.<ext>": lambda: media_object_key("run", "0123abcd.png"),
    "runs/<run>/media/index/<session>/<first:08d>-<last:08d>.parquet": lambda: media_index_key("run", "session", 8, 15),
    "runs/<run>/artifacts/<id>/...": lambda: f"{artifact_prefix('run', 'id')}/model.pt",
    "projects/<p>/rules/evaluate_every_checkpoint/<seq:020d>.json": lambda: rule_key("p", 7),
    "projects/<p>/evaluations/<run>/<ckpt>/request.json": lambda: request_key(evaluation_prefix("p", "run", "ckpt")),
    "projects/<p>/evaluations/<run>/<ckpt>/a<k:04d>/retry.json": lambda: retry_key(
        evaluation_prefix("p", "run", "ckpt"), 1
    ),
    "projects/<p>/evaluations/<run>/<ckpt>/a<k:04d>/logged.json": lambda: logged_key(
        evaluation_prefix("p", "run", "ckpt"), 1
    ),
    "projects/<p>/evaluations/<run>/<ckpt>/a<k:04d>/e<n:06d>.json": lambda: claim_key(
        attempt_prefix(evaluation_prefix("p", "run", "ckpt"), 1), 2
    ),
    "projects/<p>/evaluations/<run>/<ckpt>/a<k:04d>/e<n:06d>-result.json": lambda: result_key(
        attempt_prefix(evaluation_prefix("p", "run", "ckpt"), 1), 2
    ),
    "projects/<p>/evaluations/<run>/<ckpt>/a<k:04d>/e<n:06d>-renew-<m:06d>.json": lambda: renewal_key(
        attempt_prefix(evaluation_prefix("p", "run", "ckpt"), 1), 2, 3
    ),
}


_FENCE_PREFIX = "fenced-after-"


def fence_name(session_id: str, admitted: int) -> str:
    """``<session>/fenced-after-<n>.json`` under ``metrics/``, ``console/`` or ``media/index/``: the
    session's objects there numbered ``n`` and above are not the run's (a newer attempt fenced it; ``n``
    is one past its watermark). Read from the listing itself, so readers pay no request for it."""
    return f"{session_id}/{_FENCE_PREFIX}{admitted}.json"


def parse_fence_name(name: str) -> tuple[str, int] | None:
    session, _, rest = name.partition("/")
    if not rest.startswith(_FENCE_PREFIX) or not rest.endswith(".json"):
        return None
    try:
        return session, int(rest[len(_FENCE_PREFIX) : -len(".json")])
    except ValueError:
        return None
