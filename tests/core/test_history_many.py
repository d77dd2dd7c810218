"""Many runs at once, and the metrics in an open format.

If these fail, comparing runs in a notebook needs one slow read per run, or
a user's DuckDB query over the store disagrees with what LaunchHelm shows.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pandas as pd
import pytest
from lhtest import BUCKET

import launchhelm as lh
from launchhelm._metrics._compact import Compactor
from launchhelm._metrics._layout import list_metrics, read_manifest

duckdb = pytest.importorskip("duckdb", reason="duckdb comes with the dev extras")


def _runs(store: str, project: str = "many", count: int = 3) -> list[lh.Run]:
    runs = []
    for i in range(count):
        run = lh.init(project, store=store, config={"lr": 0.1 * (i + 1)}, flush_interval=3600)
        for step in range(1, 11 + i):
            run.global_step = step
            run.log({"loss": 1.0 / step + i, **({"acc": step / 100} if i else {})})
            if step % 3 == 0:
                run.flush()
        run.finish()
        runs.append(run)
    return runs


@pytest.mark.slow
def test_api_history_reads_many_runs_into_one_frame_with_a_run_column(store_url: str) -> None:
    runs = _runs(store_url)
    api = lh.Api(store_url)
    frame = api.history("many")
    assert frame.columns[:5].tolist() == ["run", "step", "attempt", "time", "abandoned"]
    assert set(frame.columns[5:]) == {"loss", "acc"}
    assert frame["run"].tolist() == [r.id for r in reversed(runs) for _ in range(10 + runs.index(r))]
    for run in runs:
        alone = api.run(run.id).history()
        mine = frame[frame["run"] == run.id].drop(columns="run").reset_index(drop=True)
        pd.testing.assert_frame_equal(mine[alone.columns], alone, check_dtype=False)
    assert frame[frame["run"] == runs[0].id]["acc"].isna().all()  # never logged there
    picked = api.history("many", keys=["loss"], runs=[runs[1].id, runs[0].id], duplicates="last")
    assert picked.columns.tolist() == ["run", "step", "attempt", "time", "abandoned", "loss"]
    assert picked["run"].unique().tolist() == [runs[1].id, runs[0].id]


def test_api_history_refuses_a_run_of_another_project(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    (other,) = _runs(store, project="other", count=1)
    _runs(store, project="many", count=1)
    with pytest.raises(lh.RunNotFoundError, match="belongs to project 'other'"):
        lh.Api(store).history("many", runs=[other.id])
    with pytest.raises(ValueError, match="duplicates="):
        lh.Api(store).history("many", duplicates="first")


def _httpfs(con: duckdb.DuckDBPyConnection) -> None:
    import duckdb_ext

    (path,) = glob.glob(os.path.join(duckdb_ext.__path__[0], "extensions", "*", "*", "httpfs.duckdb_extension"))
    con.execute(f"LOAD '{path}'")


def _named_segments(store: lh.storage.Store, run_id: str) -> list[str]:
    listing = list_metrics(store, run_id)
    manifest = read_manifest(store, run_id, listing.newest_manifest)
    assert listing.uncovered(manifest) == []  # finish() compacted everything
    return [store.url_for(f"runs/{run_id}/metrics/{s.key}") for s in manifest.segments]


def _check_query(con: duckdb.DuckDBPyConnection, store: lh.storage.Store, runs: list[lh.Run]) -> None:
    files = [f for r in runs for f in _named_segments(store, r.id)]
    got = con.execute(
        "SELECT regexp_extract(filename, 'runs/([a-z0-9]+)/metrics', 1) AS run, key, count(*) AS n, sum(value) AS total"
        " FROM read_parquet($files, filename = true) GROUP BY ALL ORDER BY run, key",
        {"files": files},
    ).fetchall()
    frame = lh.Api(store).history("many")
    want = []
    for run_id, part in frame.groupby("run"):
        for key in ("acc", "loss"):
            values = part[key].dropna()
            if len(values):
                want.append((run_id, key, len(values), pytest.approx(values.sum())))
    assert sorted(got) == sorted(want)


def test_duckdb_reads_a_local_stores_segments(tmp_path: Path) -> None:
    store = lh.storage.open_store(tmp_path / "store")
    runs = _runs(str(tmp_path / "store"))
    _check_query(duckdb.connect(), store, runs)
    # the glob a user would write finds the same points once the grace period has passed
    for run in runs:
        Compactor(store, run.id, by="test").collect(list_metrics(store, run.id), grace=0)
    total = duckdb.sql(f"SELECT count(*) FROM read_parquet('{tmp_path}/store/runs/*/metrics/segments/*.parquet')")
    assert total.fetchone()[0] == sum(10 + i for i in range(3)) + sum(10 + i for i in range(1, 3))  # type: ignore[index]


@pytest.mark.slow
def test_duckdb_reads_segments_straight_from_s3(moto_endpoint: str) -> None:
    url = f"s3://{BUCKET}/duck-{os.urandom(3).hex()}"
    store = lh.storage.open_store(url)
    runs = _runs(url)
    con = duckdb.connect()
    _httpfs(con)
    host = moto_endpoint.split("://", 1)[1]
    con.execute(
        "CREATE SECRET moto (TYPE s3, KEY_ID 'testing', SECRET 'testing', REGION 'us-east-1', "
        f"ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)"
    )
    _check_query(con, store, runs)
