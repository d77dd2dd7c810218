"""Neptune exports: the Parquet files ``neptune-exporter export`` writes, read with pyarrow.

The exporter's schema is published (its README, ``model.py``'s ``SCHEMA``):
one row per value, with ``project_id``, ``run_id``, ``attribute_path``,
``attribute_type``, ``step`` (decimal(18, 6)), ``timestamp`` (ms, UTC) and
one typed value column per kind. Each run is
``<data-path>/<project dir>/<run>_part_<n>.parquet``; ``part_0`` is renamed
into place last, so a run without it is an unfinished export and is left
out. Parameters (``float``, ``int``, ``string``, ``bool``, ``datetime``,
``string_set``) become the config, ``float_series`` the points, ``sys/*``
attributes the record of the import; string, histogram and file series are
counted and left out. Neptune's steps are decimals: LaunchHelm's are
integers, so a step with a fraction needs ``step_multiplier`` (as the
exporter's own loaders do).
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import cast

from launchhelm._exceptions import InvalidArgumentError, PathNotFoundError, SourceReadError
from launchhelm._types import JSONValue
from launchhelm.importers._common import ImportResult, Recorder, SourceRun, import_runs
from launchhelm.storage import Store

__all__ = ["import_neptune"]

_PART = re.compile(r"^(.+)_part_(\d+)\.parquet$")
_PARAMETERS = {
    "float": "float_value",
    "int": "int_value",
    "string": "string_value",
    "bool": "bool_value",
    "datetime": "datetime_value",
    "string_set": "string_set_value",
}
_COLUMNS = ["project_id", "run_id", "attribute_path", "attribute_type", "step", "timestamp", *_PARAMETERS.values()]


def _plain(value: JSONValue | datetime.datetime) -> JSONValue:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [*sorted(cast("list[str]", value))]  # a string set has no order
    return value


def _read_parts(parts: list[Path], recorder: Recorder, step_multiplier: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tables = []
    for part in parts:
        try:
            table = pq.read_table(part, columns=_COLUMNS)
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise SourceReadError(
                f"{part} is not a readable neptune-exporter Parquet file: {exc}", source=str(part)
            ) from exc
        tables.append(table)
    table = pa.concat_tables(tables, promote_options="permissive")
    sys_values: dict[str, JSONValue] = {}
    config: dict[str, JSONValue] = {}
    kinds = table.column("attribute_type").to_pylist()
    paths = table.column("attribute_path").to_pylist()
    columns = {name: table.column(name) for name in _PARAMETERS.values()}
    for i, (kind, path) in enumerate(zip(kinds, paths, strict=True)):
        column = _PARAMETERS.get(kind)
        if column is not None:
            value = _plain(columns[column][i].as_py())
            (sys_values if path.startswith("sys/") else config)[path] = value
        elif kind != "float_series":
            recorder.skip(f"{kind} values ({path!r}...)")
    series = table.filter(pc.equal(table.column("attribute_type"), "float_series"))
    if series.num_rows:
        steps = series.column("step").to_pylist()
        times = series.column("timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
        keys = series.column("attribute_path").to_pylist()
        values = series.column("float_value").to_numpy(zero_copy_only=False)
        # the order they were logged in: a step logged again later is a new attempt
        order = np.argsort(np.nan_to_num(times.astype(np.float64), nan=np.inf), kind="stable")
        point = recorder.point
        scale = Decimal(step_multiplier)
        for i in order.tolist():
            raw: Decimal = steps[i] if steps[i] is not None else Decimal(0)
            scaled = raw * scale
            if scaled != scaled.to_integral_value():
                raise SourceReadError(
                    f"{keys[i]!r} has a step with a fraction ({raw}); LaunchHelm's steps are integers: import with "
                    "step_multiplier (--step-multiplier) such that every step is whole, e.g. 1000 for milli-steps",
                    source=str(parts[0]),
                )
            point(keys[i], int(scaled), float(times[i]) / 1000.0, float(values[i]))
    run_ids = pc.unique(table.column("run_id")).to_pylist()
    recorder.config = config
    custom = sys_values.get("sys/custom_run_id")
    recorder.name = str(custom or (run_ids[0] if run_ids else recorder.name))
    created = sys_values.get("sys/creation_time")
    if isinstance(created, str):
        recorder.created = datetime.datetime.fromisoformat(created).timestamp()
    recorder.imported.update(
        {
            "project_id": (pc.unique(table.column("project_id")).to_pylist() or [None])[0],
            "run_id": run_ids[0] if run_ids else None,
            "experiment": sys_values.get("sys/name"),
            "fork_parent": sys_values.get("sys/forking/parent"),
            "fork_step": sys_values.get("sys/forking/step"),
            "sys": sys_values,
        }
    )


def _sources(path: str | os.PathLike[str], step_multiplier: int) -> list[SourceRun]:
    root = Path(path)
    if not root.is_dir():
        raise PathNotFoundError(
            f"no neptune-exporter data folder at {os.fspath(path)!r}: give its --data-path (default ./exports/data)",
            path=os.fspath(path),
        )
    runs: dict[tuple[Path, str], dict[int, Path]] = {}
    for file in sorted(root.rglob("*_part_*.parquet")):
        match = _PART.match(file.name)
        if match is not None:
            runs.setdefault((file.parent, match.group(1)), {})[int(match.group(2))] = file
    complete = {key: parts for key, parts in runs.items() if 0 in parts}  # part_0 is renamed last
    if not complete:
        raise PathNotFoundError(
            f"no exported Neptune runs (<run>_part_0.parquet files) under {os.fspath(path)!r}",
            path=os.fspath(path),
        )

    def reader(ordered: list[Path]) -> Callable[[Recorder], None]:
        return lambda recorder: _read_parts(ordered, recorder, step_multiplier)

    sources = []
    for (folder, prefix), parts in sorted(complete.items()):
        rel = f"{folder.relative_to(root).as_posix()}/{prefix}"
        ordered = [parts[n] for n in sorted(parts)]
        sources.append(
            SourceRun(
                kind="neptune",
                key=rel,  # the exporter's folder (a digest of the project) and the run's file prefix
                label=rel,
                read=reader(ordered),
                name=prefix,
                imported={"uri": os.fspath(path), "parts": [p.name for p in ordered]},
            )
        )
    return sources


def import_neptune(
    path: str | os.PathLike[str],
    project: str,
    *,
    step_multiplier: int = 1,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
) -> ImportResult:
    """Import what ``neptune-exporter export`` wrote: one LaunchHelm run per exported Neptune run.

    Read with pyarrow (a dependency already); no Neptune package is needed.

    Parameters
    ----------
    path:
        The exporter's ``--data-path`` (default ``./exports/data``), or one project folder in it.
    project:
        The LaunchHelm project the runs go into.
    step_multiplier:
        Neptune's steps are decimals; each is multiplied by this before it
        becomes LaunchHelm's integer step (1: steps must be whole already).
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
    PathNotFoundError
        ``path`` holds no complete exported run.
    InvalidArgumentError
        ``step_multiplier`` is not a positive integer.
    ImportFailedError
        Some runs could not be imported (a damaged file, a step with a
        fraction: :class:`SourceReadError` in ``failures``); the others were.
    """
    if isinstance(step_multiplier, bool) or not isinstance(step_multiplier, int) or step_multiplier < 1:
        raise InvalidArgumentError(f"step_multiplier={step_multiplier!r}: give a positive integer (1, 10, 1000...)")
    return import_runs(
        "neptune",
        _sources(path, step_multiplier),
        project,
        store=store,
        storage_options=storage_options,
        progress=progress,
        report=report,
    )
