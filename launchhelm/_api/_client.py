"""The query API's entry point: :class:`Api` reads and steers the runs of a store."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from launchhelm._api._handle import RunHandle, _in_parallel, _timestamps, check_history_keys, recover_points
from launchhelm._api._project import _project_frame, read_project
from launchhelm._evaluation._handles import EvaluationHandle, ProjectHandle
from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError
from launchhelm._metrics._project import ProjectReader, project_frame
from launchhelm._runlog._events import validate_project
from launchhelm._runlog._table import project_rows
from launchhelm.storage import Store, open_store
from launchhelm.storage._keys import PROJECTS, parse_project_listing, project_runs_prefix

if TYPE_CHECKING:
    import pandas as pd


_RUN_COLUMNS = ["id", "name", "status", "step", "created", "last_heartbeat", "sessions", "rewinds", "restarts"]
#: What only some statuses have (where a run hung, why a relaunch was refused, how its last attempt ended):
#: columns only when a row has them.
_DETAIL_COLUMNS = ["hang", "hang_since", "restart_loop", "last_ending", "last_detail"]


class Api:
    """Read and steer runs in a store.

    Parameters
    ----------
    store:
        Store URL or path; default ``$LAUNCHHELM_STORE``, else ``~/.launchhelm``.
    storage_options:
        Passed to fsspec.

    Examples
    --------
    >>> import launchhelm as lh
    >>> api = lh.Api("memory://doc")
    >>> api.projects()    # doctest: +SKIP
    ['quickstart']
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | Store | None = None,
        storage_options: Mapping[str, object] | None = None,
    ) -> None:
        self.store = open_store(store, storage_options)

    def __repr__(self) -> str:
        return f"<launchhelm.Api {self.store.url}>"

    def projects(self) -> list[str]:
        """Names of the projects in the store, sorted."""
        names = set()
        for name in self.store.list(PROJECTS):
            parsed = parse_project_listing(name)
            if parsed is not None and parsed[0] == "project":
                names.add(parsed[1])
        return sorted(names)

    def run_ids(self, project: str) -> list[str]:
        """Ids of the project's runs."""
        validate_project(project)
        return [name for name in self.store.list(project_runs_prefix(project)) if "/" not in name]

    def runs(self, project: str) -> pd.DataFrame:
        """One row per run of ``project``, newest first.

        Columns: id, name, status (``running``, ``hung``, ``stopped``,
        ``restart loop``, ``resumable``, ``closed``), step (furthest
        reached), created, last_heartbeat, sessions, rewinds, restarts (sessions a
        scheduler's relaunch started); where some run has them, ``hang``
        (where a hung run is stuck) and ``hang_since``, ``restart_loop``
        (why its relaunch was refused), ``last_ending`` and ``last_detail``
        (how a stopped run's last attempt ended); then one ``config.<key>`` column
        per config value (nested dicts flattened: ``config.optim.lr``), one
        ``tunable.<key>`` column per tunable (the value in force) and one
        ``metric.<key>`` column per metric with its latest value, each
        sorted by name (missing: NaN / None).

        Reads each run's summary (kept current by its live session), all
        at once; a run whose summary is missing or behind its event log is
        folded from its log instead, so the answer is the log's.

        Examples
        --------
        >>> table = lh.Api().runs("quickstart")                      # doctest: +SKIP
        >>> table[table["config.lr"] < 1e-3].sort_values("metric.loss")  # doctest: +SKIP
        """
        import pandas as pd

        validate_project(project)
        run_ids = self.run_ids(project)
        recover_points(self.store, project, run_ids)  # sessions killed on this host: their last points first
        rows = [_timestamps(row) for row in project_rows(self.store, project, run_ids)]
        extra = sorted({k for row in rows for k in row if k.startswith("config.")})
        extra += sorted({k for row in rows for k in row if k.startswith("tunable.")})
        extra += sorted({k for row in rows for k in row if k.startswith("metric.")})
        details = [c for c in _DETAIL_COLUMNS if any(c in row for row in rows)]
        frame = pd.DataFrame(rows, columns=[*_RUN_COLUMNS, *details, *extra])
        if len(frame):
            frame = frame.sort_values("created", ascending=False, ignore_index=True)
        result: pd.DataFrame = frame
        return result

    def history(
        self,
        project: str,
        keys: Sequence[str] | str | None = None,
        runs: Sequence[str] | None = None,
        duplicates: str = "all",
    ) -> pd.DataFrame:
        """Many runs' metrics in one DataFrame, read concurrently: the base for comparing runs.

        Parameters
        ----------
        project:
            The project whose runs to read.
        keys:
            Metric names (default: every metric of every run).
        runs:
            Run ids (default: every run of the project).
        duplicates:
            As in :meth:`RunHandle.history`: ``"all"`` or ``"last"``.

        Returns
        -------
        pandas.DataFrame
            A ``run`` column (the run id), then :meth:`RunHandle.history`'s
            columns (``step``, ``attempt``, ``time``, ``abandoned``, one per
            metric); runs in the order given (default: newest first), each
            sorted by step then attempt. A metric a run never logged is NaN
            in its rows.

        Notes
        -----
        Settled runs (closed, or their last session ended) are read from the
        project's history dataset: a few requests for all of them, whatever
        their number. Every other run, and any run changed since the dataset
        was built (resumed, scored by an evaluation), is read by itself, so
        the answer is always each run's own :meth:`RunHandle.history`. Once
        a call has read 8 settled runs by themselves, it publishes a new
        generation of the dataset holding them (when the store lets it
        write); ``launchhelm compact --project P`` does it ahead of time.
        See ``docs/storage.md``, "A project's history in a few segments".

        Examples
        --------
        >>> frame = lh.Api().history("quickstart", keys=["loss"])   # doctest: +SKIP
        >>> frame.pivot_table(index="step", columns="run", values="loss")   # doctest: +SKIP
        """
        validate_project(project)
        check_history_keys(keys)
        if duplicates not in ("all", "last"):
            raise InvalidArgumentError(
                f"duplicates={duplicates!r}: use 'all' (every attempt) or 'last' (newest attempt per step)"
            )
        if runs is not None:
            if isinstance(runs, str):
                runs = [runs]
            if not isinstance(runs, Collection) or not all(isinstance(r, str) for r in runs):
                raise InvalidTypeError(f"runs={runs!r}: give a list of run ids (strings), or None for every run")
        read = read_project(self.store, project, list(runs) if runs is not None else None)
        parts = [(r.run_id, r.points, [(w.attempt, w.to_step) for w in r.rewinds]) for r in read]
        frame: pd.DataFrame | None = project_frame(parts, keys, duplicates)
        if frame is None:  # a run with nothing to show: concat's rules for empty frames, run by run
            frame = _project_frame([(r.run_id, r.frame(keys, duplicates)) for r in read])
        return frame

    def build_project_history(self, project: str) -> int:
        """Bring the project's history dataset up to date now; return how many runs its newest generation holds.

        What ``launchhelm compact --project P`` does: reads every settled run
        (last session ended, or closed) the dataset does not hold yet, one by
        one, and publishes them with those it still holds
        (``docs/storage.md``, "A project's history in a few segments").
        ``Api.history(project)`` does the same by itself once it read
        ``BUILD_AFTER`` settled runs one by one, so calling this is only
        needed to pay that first read ahead of time.
        """
        validate_project(project)
        self.store.require_coordination("publishing a project's history dataset")
        reader = ProjectReader(self.store, project)
        read_project(self.store, project, None, reader=reader, build_after=1)
        return len(reader.generation.runs) if reader.generation is not None else 0

    def _handles(self, run_ids: list[str]) -> list[RunHandle]:
        """Handles on many runs, their records read concurrently."""
        return _in_parallel([partial(RunHandle, self.store, r) for r in run_ids])

    def run(self, run_id: str) -> RunHandle:
        """A handle on the run ``run_id``.

        Raises
        ------
        InvalidArgumentError
            ``run_id`` is not a run id at all (ids are lowercase letters and digits).
        RunNotFoundError
            No run with that id is in the store.
        """
        return RunHandle(self.store, run_id)

    def project(self, name: str) -> ProjectHandle:
        """A project's rule and evaluation queue (the project need not have runs yet).

        Examples
        --------
        >>> lh.Api().project("quickstart").evaluate_every_checkpoint(True)   # doctest: +SKIP
        """
        return ProjectHandle(self.store, name)

    def evaluation(self, evaluation_id: str) -> EvaluationHandle:
        """One evaluation by id (``Evaluation.id``); ``.retry()`` is "Try again".

        Raises
        ------
        EvaluationNotFoundError
            No such evaluation is queued.
        """
        return EvaluationHandle(self.store, evaluation_id)
