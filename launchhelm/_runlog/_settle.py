"""A run whose session ended goes into its project's runs index and history dataset (issue 40, point 4).

Without this, the first reader of a project pays for every run it finds
outside the index and the dataset, one by one (and then builds them). The
helper process of the session that ended (``launchhelm._helper``) calls
:func:`settle_run` right after a clean end, and after ending a crashed
session: the run's row goes into a new runs index
(:func:`launchhelm._runlog._table.add_row`) and its points into a new
generation of the dataset (:func:`add_to_history`), with the same
create-only objects and the same races as the readers' builders. Every
step is best effort: what it misses, the next reader reads from the run
itself and builds as before, so a failure costs requests, never a point.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launchhelm._exceptions import LaunchHelmError, StorageError
from launchhelm._metrics._points import abandoned_mask
from launchhelm._metrics._project import (
    ProjectReader,
    ReadRun,
    SettledRewind,
    SettledRun,
    eval_dirs,
    list_project,
    publish,
)
from launchhelm._metrics._read import PointReader
from launchhelm._metrics._system import default_points
from launchhelm._runlog._events import EventLog
from launchhelm._runlog._liveness import requester
from launchhelm._runlog._runinfo import run_record
from launchhelm._runlog._sessions import settled_status
from launchhelm._runlog._table import add_row, read_index, table_listing
from launchhelm.storage import Store

if TYPE_CHECKING:
    from launchhelm._metrics._project import ProjectListing

__all__ = ["SETTLE_TIMEOUT", "Settled", "add_to_history", "settle_run"]

_log = logging.getLogger("launchhelm")

#: Seconds the helper gives this work before it exits anyway (``LAUNCHHELM_SETTLE_TIMEOUT``; 0: skip it).
SETTLE_TIMEOUT = 0.0  # off until a lingering helper's cost on a busy host is measured: set 30 to turn it on
#: Generations a helper tries to publish when other builders win the race (helpers of a sweep finish together).
PUBLISH_TRIES = 12
#: Other runs missing from the dataset a helper that lost a race reads and publishes with its own.
HELP_OTHERS = 16


@dataclass(frozen=True)
class Settled:
    """What :func:`settle_run` did: the run's row indexed, its points in a generation."""

    indexed: bool
    in_history: bool


def settle_run(store: Store, project: str, run_id: str) -> Settled:
    """Add a run whose session ended to its project's runs index and history dataset. Best effort."""
    indexed = in_history = False
    try:
        indexed = add_row(store, project, run_id)
    except (StorageError, LaunchHelmError) as exc:
        _log.debug("run %s: not added to the runs index: %s", run_id, exc)
    if store.atomic_create:  # without put-if-absent two builders could clobber each other
        try:
            in_history = add_to_history(store, project, run_id)
        except (StorageError, LaunchHelmError) as exc:
            _log.debug("run %s: not added to the project's history dataset: %s", run_id, exc)
    return Settled(indexed, in_history)


def _read_settled(store: Store, listing: ProjectListing, run_id: str) -> ReadRun | None:
    """The run as a generation records it, read as ``Api.history`` reads it; None while it is not settled."""
    state = EventLog(store, run_id).state()
    status = settled_status(state)
    if status is None:
        return None
    record = run_record(store, run_id)
    reader = PointReader(store, run_id)
    points = default_points(reader.read())
    rewinds = tuple(
        SettledRewind(
            to_step=int(e["to_step"]),
            reached=int(e["reached"]),
            cause=str(e.get("cause", "load_checkpoint")),
            checkpoint=e.get("checkpoint"),
            attempt=int(e.get("attempt", i + 1)),
        )
        for i, e in enumerate(state.rewinds)
    )
    mask = abandoned_mask(
        points.column("step").to_numpy(), points.column("attempt").to_numpy(), _Rewinds(list(rewinds))
    )
    dirs = set(reader.cursor.max_seen) | listing.logged.get(run_id, set())
    entry = SettledRun(
        run_id=run_id,
        segment="",
        offset=0,
        rows=points.num_rows,
        marker=str(listing.markers[run_id]),
        evals=tuple(sorted(eval_dirs(dirs))),
        name=str(record["name"]),
        created=float(record["created"]),
        status=status,
        sessions=len(state.sessions),
        rewinds=rewinds,
    )
    return ReadRun(entry, points, mask)


@dataclass(frozen=True)
class _Rewinds:
    rewinds: list[SettledRewind]


def add_to_history(store: Store, project: str, run_id: str) -> bool:
    """Publish a generation of the project's dataset that holds the run; whether one now vouches for it.

    The listing is taken before the run is read, so its marker version is
    the one the run was read under (a session started since changes it, and
    readers then read the run itself). A lost race is tried again on the
    winner's generation after a random pause, :data:`PUBLISH_TRIES` times in
    all (the helper's bound stops it first). Helpers of a sweep finish
    together and only one of them wins each generation, and a helper may run
    out of time; so each also takes in up to :data:`HELP_OTHERS` other runs
    the dataset lacks that the newest runs index holds as settled (under
    their current marker: no live run is read), read as readers read them.
    The helpers that lose then find their runs published by a winner.
    """
    import random

    by = f"{requester().get('host', '')}:{os.getpid()} (helper)"
    read: ReadRun | None = None
    others: dict[str, ReadRun] = {}
    for attempt in range(PUBLISH_TRIES):
        if attempt:
            time.sleep(random.uniform(0.0, min(2.0, 0.1 * 2**attempt)))
        listing = list_project(store, project)
        marker = listing.markers.get(run_id)
        if run_id not in listing.run_ids or marker is None:
            return False  # no marker: the readers could not vouch for its rows
        reader = ProjectReader(store, project)
        vouched = reader.vouched(listing)
        if run_id in vouched:
            return True  # a reader, or a racing helper, put it there already
        if read is None or read.entry.marker != marker:
            read = _read_settled(store, listing, run_id)
            if read is None:
                return False
        others = _others(store, project, listing, set(vouched) | {run_id}, others)
        added = {**others, run_id: read}
        if publish(store, project, reader, listing, added, by=by) is not None:
            return True
    return False


def _others(
    store: Store, project: str, listing: ProjectListing, skip: set[str], known: dict[str, ReadRun]
) -> dict[str, ReadRun]:
    """Up to :data:`HELP_OTHERS` runs the runs index holds as settled and the dataset lacks, read concurrently.

    ``known``: what an earlier try read, kept while the run's marker is unchanged.
    """
    from concurrent.futures import ThreadPoolExecutor

    markers, indexes = table_listing(store, project)
    index = read_index(store, project, indexes[-1] if indexes else None)
    wanted = [
        r
        for r, entry in sorted(index.items())
        if r not in skip and r in listing.markers and entry.get("marker") == markers.get(r) == listing.markers[r]
    ][:HELP_OTHERS]
    reuse = {r: known[r] for r in wanted if r in known and known[r].entry.marker == listing.markers[r]}
    fresh = [r for r in wanted if r not in reuse]

    def one(run_id: str) -> ReadRun | None:
        try:
            return _read_settled(store, listing, run_id)
        except (StorageError, LaunchHelmError) as exc:  # deleted meanwhile, or damaged: its reader decides
            _log.debug("run %s: not read for the project's dataset: %s", run_id, exc)
            return None

    if fresh:
        with ThreadPoolExecutor(max_workers=8) as pool:
            reads = list(pool.map(one, fresh))
        reuse.update({r: read for r, read in zip(fresh, reads, strict=True) if read is not None})
    return reuse
