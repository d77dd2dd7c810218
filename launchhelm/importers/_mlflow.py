"""MLflow tracking stores: every run of every experiment (or of one), through MLflow's own client.

Every tracking URI MLflow's ``MlflowClient`` reads works: a SQL database
(``sqlite:///mlflow.db``), a file store (``./mlruns``), a tracking server
(``http://host:5000``), Databricks. A run's params become its config (as
MLflow stores them: strings), its name the run's name, and every metric's
full history (``get_metric_history``) its points, with MLflow's steps and
timestamps. Tags, the experiment and the run's status go into the record of
the import (the first event of the run). Metrics are merged in the order
they were logged (by timestamp), so a run resumed from an earlier step gets
a new attempt from the step it went back to.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from launchhelm._exceptions import InvalidArgumentError, SourceReadError
from launchhelm.importers._common import ImportResult, Recorder, SourceRun, import_runs, require
from launchhelm.storage import Store

if TYPE_CHECKING:
    from mlflow.entities import Experiment, Run
    from mlflow.tracking import MlflowClient

__all__ = ["import_mlflow"]

_EXTRA = "import-mlflow"
_PAGE = 1000


def _client(tracking_uri: str) -> MlflowClient:
    tracking = require("mlflow.tracking", _EXTRA, "importing from MLflow")
    client: MlflowClient = tracking.MlflowClient(tracking_uri=tracking_uri)
    return client


def _experiments(client: MlflowClient, tracking_uri: str, experiment: str | None) -> list[Experiment]:
    if experiment is not None:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            names = sorted(e.name for e in _all_experiments(client))
            raise InvalidArgumentError(
                f"no MLflow experiment named {experiment!r} at {tracking_uri}; it has: {', '.join(names) or 'none'}"
            )
        return [found]
    return _all_experiments(client)


def _all_experiments(client: MlflowClient) -> list[Experiment]:
    experiments: list[Experiment] = []
    token = None
    while True:
        page = client.search_experiments(max_results=_PAGE, page_token=token)
        experiments.extend(page)
        token = page.token
        if not token:
            return experiments


def _runs(client: MlflowClient, experiment_ids: list[str]) -> list[Run]:
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs(
            experiment_ids, max_results=_PAGE, page_token=token, order_by=["attributes.start_time ASC"]
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _source(client: MlflowClient, tracking_uri: str, run: Run, experiment_name: str) -> SourceRun:
    info, data = run.info, run.data
    run_id = str(info.run_id)
    name = str(info.run_name or data.tags.get("mlflow.runName") or run_id)

    def read(recorder: Recorder) -> None:
        try:
            histories = [client.get_metric_history(run_id, key) for key in sorted(data.metrics)]
        except Exception as exc:  # the client's own errors (MlflowException) are not ours to name
            raise SourceReadError(
                f"MLflow could not read the metric history of run {run_id} at {tracking_uri}: {exc}",
                source=run_id,
            ) from exc
        # in the order they were logged: a step logged again after later ones is a new attempt
        merged = heapq.merge(
            *(((m.timestamp, i, n, m) for n, m in enumerate(history)) for i, history in enumerate(histories))
        )
        point = recorder.point
        for timestamp, _, _, metric in merged:
            point(metric.key, int(metric.step), timestamp / 1000.0, float(metric.value))

    return SourceRun(
        kind="mlflow",
        key=run_id,
        label=f"{experiment_name}/{name} ({run_id})",
        read=read,
        name=name,
        config=dict(data.params),
        created=info.start_time / 1000.0 if info.start_time else None,
        ended=info.end_time / 1000.0 if info.end_time else None,
        imported={
            "uri": tracking_uri,
            "experiment": experiment_name,
            "experiment_id": str(info.experiment_id),
            "status": str(info.status),
            "user": str(info.user_id or ""),
            "tags": dict(data.tags),
        },
    )


def import_mlflow(
    tracking_uri: str | os.PathLike[str],
    project: str,
    *,
    experiment: str | None = None,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
) -> ImportResult:
    """Import the runs of an MLflow tracking store, one LaunchHelm run per MLflow run.

    Needs MLflow's client: ``pip install 'launchhelm[import-mlflow]'``
    (``mlflow-skinny`` with SQLAlchemy and Alembic for SQL stores).

    Parameters
    ----------
    tracking_uri:
        Where MLflow keeps the runs: ``sqlite:///mlflow.db``, ``./mlruns``,
        ``http://host:5000``... (what ``MLFLOW_TRACKING_URI`` would say).
    project:
        The LaunchHelm project the runs go into.
    experiment:
        Only this experiment's runs (default: every active experiment's).
    store, storage_options:
        The LaunchHelm store, as for :func:`launchhelm.init`.
    progress:
        Show a progress bar on stderr.
    report:
        Called with one line per run (what the command line prints).

    Returns
    -------
    ImportResult
        The runs imported, and those found already imported (skipped).

    Raises
    ------
    MissingExtraError
        MLflow is not installed (also an ``ImportError``).
    InvalidArgumentError
        No experiment of that name.
    ImportFailedError
        Some runs could not be imported; the others were.

    Examples
    --------
    >>> from launchhelm.importers import import_mlflow
    >>> import_mlflow("sqlite:///mlflow.db", "migrated", experiment="sweep")   # doctest: +SKIP
    <ImportResult migrated: 40 imported, 0 already imported>
    """
    uri = os.fspath(tracking_uri)
    client = _client(uri)
    try:
        experiments = _experiments(client, uri, experiment)
        sources = [_source(client, uri, run, e.name) for e in experiments for run in _runs(client, [e.experiment_id])]
    except InvalidArgumentError:
        raise
    except Exception as exc:  # a URI MLflow cannot open, a server that does not answer
        raise SourceReadError(f"MLflow could not list the runs at {uri}: {exc}", source=uri) from exc
    return import_runs(
        "mlflow", sources, project, store=store, storage_options=storage_options, progress=progress, report=report
    )
