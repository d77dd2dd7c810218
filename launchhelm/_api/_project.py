"""Many runs of a project at once: settled runs from the project's history dataset, the rest each by itself."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from launchhelm._api._handle import RunHandle, RunView, _in_parallel, recover_points
from launchhelm._exceptions import RunNotFoundError
from launchhelm._metrics._points import abandoned_mask, history_frame
from launchhelm._metrics._project import (
    BUILD_AFTER,
    ProjectListing,
    ProjectReader,
    ReadRun,
    SettledRewind,
    SettledRun,
    eval_dirs,
    list_project,
    publish,
)
from launchhelm._metrics._system import default_points
from launchhelm._runlog._liveness import requester
from launchhelm._runlog._sessions import settled_status as _settled_status
from launchhelm._types import Rewind
from launchhelm.storage import Store

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


@dataclass(frozen=True)
class _Rewound:
    """The part of a run's state :func:`abandoned_mask` reads: its rewinds' attempts and steps."""

    rewinds: list[dict[str, int]]


@dataclass
class ProjectRun:
    """One run of a project read: its points (arrival order, the run's own metrics) and rewinds.

    From the project dataset (``handle`` None) or from the run itself; the
    frame is built the same way from either, so both read the same.
    """

    run_id: str
    name: str
    created: float
    status: str | None  # "resumable" / "closed" when settled, else None (not asked: a live run's is)
    sessions: int
    rewinds: list[Rewind]
    points: pa.Table
    handle: RunHandle | None = None

    def frame(self, keys: Sequence[str] | str | None, duplicates: str) -> pd.DataFrame:
        """:meth:`RunHandle.history`'s frame (stream "default")."""
        state = _Rewound([{"attempt": r.attempt, "to_step": r.to_step} for r in self.rewinds])
        frame = history_frame(self.points, keys=keys, duplicates=duplicates)
        frame.insert(3, "abandoned", abandoned_mask(frame["step"].to_numpy(), frame["attempt"].to_numpy(), state))
        return frame


def _read_one(handle: RunHandle) -> ProjectRun:
    """A run read by itself, as :meth:`RunHandle.history` reads it (its state, then its points)."""
    state = handle._state()
    points = default_points(handle._read_points())
    return ProjectRun(
        handle.id,
        handle.name,
        handle.created,
        _settled_status(state),
        len(state.sessions),
        handle._rewinds_of(state),
        points,
        handle,
    )


def _from_dataset(entry: SettledRun, points: pa.Table) -> ProjectRun:
    rewinds = [
        Rewind(
            to_step=int(r["to_step"]),
            reached=int(r["reached"]),
            cause=str(r["cause"]),
            checkpoint=r.get("checkpoint"),
            attempt=int(r["attempt"]),
        )
        for r in entry.rewinds
    ]
    return ProjectRun(entry.run_id, entry.name, entry.created, entry.status, entry.sessions, rewinds, points)


def _checked_handles(store: Store, project: str, run_ids: list[str]) -> dict[str, RunHandle]:
    handles = _in_parallel([partial(RunHandle, store, r) for r in run_ids])
    for handle in handles:
        if handle.project != project:
            raise RunNotFoundError(
                f"run {handle.id} belongs to project {handle.project!r}, not {project!r}; "
                f"list {project!r}'s runs with Api().runs({project!r})",
                run_id=handle.id,
            )
    return {h.id: h for h in handles}


def read_project(
    store: Store,
    project: str,
    runs: list[str] | None,
    *,
    reader: ProjectReader | None = None,
    build_after: int | None = None,
) -> list[ProjectRun]:
    """Many runs of a project: settled ones from the project dataset, the rest each from itself.

    ``runs`` None: every run, newest first; else those ids, in that order.
    Four listings and the dataset's newest manifest and segments (when the
    runs in it are still exact: see :mod:`launchhelm._metrics._project`), plus
    each other run's own reads, concurrently. When ``build_after`` or more
    settled runs were read by themselves (default
    :data:`~launchhelm._metrics._project.BUILD_AFTER`), publishes a new
    generation holding them, if the store lets this process write (best
    effort; a read-only credential just reads).
    """
    reader = reader or ProjectReader(store, project)
    listing = list_project(store, project)
    wanted = listing.run_ids if runs is None else runs
    # a session killed on this host: its spooled points go up first, and its run is read by itself
    recovered = recover_points(store, project, [r for r in dict.fromkeys(wanted) if r in set(listing.run_ids)])
    found = {r: _from_dataset(e, t) for r, (e, t) in reader.read(listing, wanted, recovered).items()}
    rest = [r for r in dict.fromkeys(wanted) if r not in found]
    if rest:
        handles = _checked_handles(store, project, rest)
        for run in _in_parallel([partial(_read_one, handles[r]) for r in rest]):
            found[run.run_id] = run
    settled = [
        found[r]
        for r in rest
        if found[r].status is not None and listing.markers.get(r) is not None and r not in recovered
    ]
    if settled and len(settled) >= (BUILD_AFTER if build_after is None else build_after):
        _publish(store, project, reader, listing, settled)
    ordered = [found[r] for r in wanted]
    if runs is None:
        ordered.sort(key=lambda run: run.created, reverse=True)
    return ordered


def _publish(
    store: Store, project: str, reader: ProjectReader, listing: ProjectListing, settled: list[ProjectRun]
) -> None:
    """A new generation with ``settled`` added (they were just read by themselves). Best effort."""
    if not store.atomic_create:
        return  # no put-if-absent: two builders could clobber each other
    added = {}
    for run in settled:
        assert run.handle is not None
        state = _Rewound([{"attempt": r.attempt, "to_step": r.to_step} for r in run.rewinds])
        points = run.points
        mask = abandoned_mask(points.column("step").to_numpy(), points.column("attempt").to_numpy(), state)
        dirs = set(run.handle._points.cursor.max_seen) | listing.logged.get(run.run_id, set())
        entry = SettledRun(
            run_id=run.run_id,
            segment="",
            offset=0,
            rows=points.num_rows,
            marker=str(listing.markers[run.run_id]),
            evals=tuple(sorted(eval_dirs(dirs))),
            name=run.name,
            created=run.created,
            status=str(run.status),
            sessions=run.sessions,
            rewinds=tuple(
                SettledRewind(
                    to_step=r.to_step, reached=r.reached, cause=r.cause, checkpoint=r.checkpoint, attempt=r.attempt
                )
                for r in run.rewinds
            ),
        )
        added[run.run_id] = ReadRun(entry, points, mask)
    publish(store, project, reader, listing, added, by=f"{requester().get('host', '')}:{os.getpid()}")


def _project_frame(parts: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """Runs' frames as one, a ``run`` column first (as :meth:`Api.history` returns it)."""
    import pandas as pd

    frames = []
    for run_id, frame in parts:
        frame.insert(0, "run", run_id)
        frames.append(frame)
    if not frames:
        empty: pd.DataFrame = pd.DataFrame({"run": pd.Series([], dtype=object)})
        return empty
    result: pd.DataFrame = pd.concat(frames, ignore_index=True, sort=False)
    return result


def settled_views(
    store: Store, project: str, run_ids: Sequence[str], keys: Sequence[str] | None, reader: ProjectReader
) -> dict[str, RunView]:
    """The views of those ``run_ids`` the project dataset holds exactly (the rest: poll each run).

    What :class:`~launchhelm.widgets.CompareChart` (and so the runs table's
    selection) reads many runs through: four listings, plus the dataset's
    manifest and segments when a new generation appeared.
    """
    import pandas as pd

    listing = list_project(store, project)
    listed = set(listing.run_ids)
    recovered = recover_points(store, project, [r for r in run_ids if r in listed])
    views = {}
    for run_id, (entry, points) in reader.read(listing, run_ids, recovered).items():
        run = _from_dataset(entry, points)
        summary = {
            "id": run.run_id,
            "name": run.name,
            "status": run.status,
            "created": pd.Timestamp(run.created, unit="s", tz="UTC"),
            "sessions": run.sessions,
            "rewinds": len(run.rewinds),
        }
        views[run_id] = RunView(summary=summary, rewinds=run.rewinds, history=run.frame(keys, "all"))
    return views
