"""A whole project's history from its history dataset, in a few requests, exactly as run by run.

If these fail, comparing a sweep reads every run one by one again (seconds
per hundred runs on S3), or worse, a comparison shows points that differ
from the run's own history: a rewind's abandoned attempt, a run resumed or
scored after the dataset was built, a damaged manifest trusted.
"""

from __future__ import annotations

import os
import secrets
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from http_proxy import RequestCounter
from lhtest import BUCKET, make_store_url

import launchhelm as lh
from launchhelm._api._project import _project_frame, _publish, read_project
from launchhelm._cli import main as cli_main
from launchhelm._metrics import _project
from launchhelm._metrics._points import encode_chunk
from launchhelm._metrics._project import ProjectReader, list_project
from launchhelm.storage import open_store
from launchhelm.storage._keys import (
    evaluation_prefix,
    logged_key,
    project_history_manifest_key,
    project_history_prefix,
    score_chunk_key,
)

PROJECT = "sweep"


@pytest.fixture(autouse=True)
def _readers_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the readers' builds (what a store without helpers relies on): the helpers
    leave each ended run to them (``tests/core/test_settle.py`` tests the helpers' own)."""
    monkeypatch.setenv("LAUNCHHELM_SETTLE_TIMEOUT", "0")


def _per_run(
    api: lh.Api, project: str, keys: object = None, duplicates: str = "all", runs: object = None
) -> pd.DataFrame:
    """The reference: each run's own ``RunHandle.history``, newest first (what Api.history did before)."""
    ids = api.run_ids(project) if runs is None else list(runs)  # type: ignore[call-overload]
    handles = [api.run(r) for r in ids]
    if runs is None:
        handles.sort(key=lambda h: h.created, reverse=True)
    parts = []
    for handle in handles:
        frame = handle.history(keys=keys, duplicates=duplicates)  # type: ignore[arg-type]
        frame.insert(0, "run", handle.id)
        parts.append(frame)
    return pd.concat(parts, ignore_index=True, sort=False)


def _same(api: lh.Api, project: str = PROJECT) -> None:
    """``Api.history`` equals the run-by-run reads exactly, for every way of asking."""
    ids = api.run_ids(project)
    for keys, duplicates, runs in [
        (None, "all", None),
        (None, "last", None),
        (["acc", "loss"], "all", None),
        ("loss", "last", None),
        (None, "all", [ids[-1], ids[0]]),
    ]:
        got = api.history(project, keys=keys, duplicates=duplicates, runs=runs)
        pd.testing.assert_frame_equal(got, _per_run(api, project, keys, duplicates, runs))


def _settled_run(store: object, i: int, *, rewind: bool = False, close: bool = True) -> str:
    run = lh.init(PROJECT, store=store, config={"i": i}, flush_interval=3600, system_metrics=False)
    for step in range(1, 13 + i % 3):
        run.global_step = step
        run.log({"loss": 1.0 / step + i, **({"acc": step / 100} if i % 2 else {}), f"only{i % 3}": float(step)})
    if rewind:
        run._record_rewind(5, None, "test", run.global_step)
        for step in range(6, 10):
            run.global_step = step
            run.log({"loss": -float(step)})  # attempt 1's values
    run.finish(close_run=close)
    return run.id


def _vouched(store: lh.storage.Store) -> set[str]:
    reader = ProjectReader(store, PROJECT)
    return set(reader.read(list_project(store, PROJECT), lh.Api(store).run_ids(PROJECT)))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def two_backends(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return make_store_url(request.param, tmp_path, request)


@pytest.mark.slow
def test_the_project_dataset_reads_exactly_as_each_run_does(two_backends: str) -> None:
    store = two_backends
    settled = [_settled_run(store, i, rewind=i == 1, close=i % 4 != 0) for i in range(9)]
    live = lh.init(PROJECT, store=store, flush_interval=3600, system_metrics=False)
    live.log({"loss": 7.0})
    live.flush()
    api = lh.Api(store)
    before = _per_run(api, PROJECT)
    pd.testing.assert_frame_equal(api.history(PROJECT), before)  # read run by run, and publishes generation 1
    assert _vouched(api.store) == set(settled)  # the live run stays out
    rewound = api.history(PROJECT, runs=[settled[1]])
    assert rewound["abandoned"].any() and (rewound["attempt"] == 1).any()
    _same(api)

    # the live run settles after the dataset was built: read by itself until a build takes it in
    live.log({"loss": 6.0})
    live.finish()
    _same(api)
    assert live.id not in _vouched(api.store)
    assert api.build_project_history(PROJECT) == 10
    assert _vouched(api.store) == {*settled, live.id}
    _same(api)

    # a settled run resumed (its row marker changes) and an evaluation scored after the build
    resumed = lh.init(PROJECT, store=store, resume=settled[0], flush_interval=3600, system_metrics=False)
    resumed.global_step = 40
    resumed.log({"loss": 0.5})
    resumed.finish(close_run=False)
    scored = settled[2]
    api.store.create(score_chunk_key(scored, "ck1", 0, 3), encode_chunk([(3, 0, 1.7e9, {"eval/acc": 0.9})]))
    api.store.create(logged_key(evaluation_prefix(PROJECT, scored, "ck1"), 0), b"{}")
    assert _vouched(api.store) == {*settled, live.id} - {settled[0], scored}
    _same(api)
    assert api.history(PROJECT, runs=[scored])["eval/acc"].notna().sum() == 1
    # a store written before the dataset (or with it deleted) reads the same, run by run
    api.store.delete_many(
        [f"{project_history_prefix(PROJECT)}/{k}" for k in api.store.list(project_history_prefix(PROJECT))]
    )
    assert _vouched(api.store) == set()
    pd.testing.assert_frame_equal(read_and_never_write(api), _per_run(api, PROJECT))


def read_and_never_write(api: lh.Api) -> pd.DataFrame:
    runs = read_project(api.store, PROJECT, None, build_after=10**9)
    return _project_frame([(r.run_id, r.frame(None, "all")) for r in runs])


@pytest.mark.slow
def test_a_damaged_or_missing_manifest_or_segment_falls_back_to_each_runs_own_reads(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    settled = [_settled_run(store, i) for i in range(8)]
    api = lh.Api(store)
    assert api.build_project_history(PROJECT) == 8
    listing = list_project(api.store, PROJECT)
    manifest = Path(store) / project_history_manifest_key(PROJECT, listing.newest)
    good = manifest.read_bytes()
    reference = _per_run(api, PROJECT)
    for damage in [
        b"{not json",
        b'{"format": "launchhelm.project-history/99", "generation": 1}',
        good[: len(good) // 2],
    ]:
        manifest.write_bytes(damage)
        assert _vouched(api.store) == set()
        pd.testing.assert_frame_equal(read_and_never_write(api), reference)
    manifest.write_bytes(good)
    assert _vouched(api.store) == set(settled)
    (segment,) = (Path(store) / project_history_prefix(PROJECT) / "segments").iterdir()
    segment.write_bytes(b"PAR1 damaged PAR1")
    assert _vouched(api.store) == set()
    pd.testing.assert_frame_equal(read_and_never_write(api), reference)
    segment.unlink()
    assert _vouched(api.store) == set()
    pd.testing.assert_frame_equal(api.history(PROJECT), reference)  # and publishes a sound generation 2
    assert _vouched(api.store) == set(settled)
    pd.testing.assert_frame_equal(api.history(PROJECT), reference)


def test_racing_builders_never_clobber_each_other(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    [_settled_run(store, i) for i in range(3)]
    first, second = ProjectReader(store, PROJECT), ProjectReader(store, PROJECT)
    listing = list_project(store, PROJECT)  # the second builder saw no generation yet
    runs = read_project(store, PROJECT, None, reader=second, build_after=10**9)
    assert all(r.handle is not None for r in runs)  # read run by run
    read_project(store, PROJECT, None, reader=first, build_after=1)  # the first publishes generation 1
    assert first.generation is not None and first.generation.number == 1
    _publish(store, PROJECT, second, listing, runs)  # also tries generation 1: loses, takes its segment back
    assert second.generation is None
    names = store.list(project_history_prefix(PROJECT))
    assert names == ["manifest-00000000000000000001.json", *first.generation.segments]
    assert lh.Api(store).history(PROJECT)["run"].nunique() == 3
    pd.testing.assert_frame_equal(lh.Api(store).history(PROJECT), _per_run(lh.Api(store), PROJECT))


@pytest.mark.slow
def test_the_compare_chart_reads_settled_runs_from_the_dataset(tmp_path: Path) -> None:
    from launchhelm.widgets import CompareChart

    store = str(tmp_path / "store")
    settled = [_settled_run(store, i, rewind=i == 1, close=i != 3) for i in range(8)]
    api = lh.Api(store)
    api.build_project_history(PROJECT)
    chart = CompareChart(PROJECT, runs=settled, store=api)
    try:
        assert chart._from_dataset == set(settled)
        pd.testing.assert_frame_equal(chart.history(), _per_run(api, PROJECT, runs=settled))
        assert [r.to_step for r in chart._views[settled[1]].rewinds] == [5]
        resumed = lh.init(PROJECT, store=store, resume=settled[3], flush_interval=3600, system_metrics=False)
        resumed.global_step = 50
        resumed.log({"loss": 0.25})
        resumed.flush()
        chart.refresh()  # the resumed run is read by itself from now on, live
        assert chart._from_dataset == set(settled) - {settled[3]}
        pd.testing.assert_frame_equal(chart.history(), _per_run(api, PROJECT, runs=settled))
        assert 0.25 in chart.history().query(f"run == '{settled[3]}'")["loss"].tolist()
        resumed.finish()
    finally:
        chart.close()


def _counted_store(moto_endpoint: str, prefix: str) -> tuple[RequestCounter, lh.storage.Store]:
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    url = f"s3://{BUCKET}/{prefix}"
    return proxy, open_store(url, {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})


@pytest.mark.slow
def test_a_project_read_costs_the_same_requests_for_10_or_30_runs(moto_endpoint: str) -> None:
    counts: dict[int, Counter[str]] = {}
    for count in (10, 30):
        prefix = f"proj-{secrets.token_hex(3)}"
        direct = open_store(f"s3://{BUCKET}/{prefix}")
        for i in range(count):
            _settled_run(direct, i)
        proxy, proxied = _counted_store(moto_endpoint, prefix)
        try:
            api = lh.Api(proxied)
            first = api.history(PROJECT)  # run by run, then publishes the dataset
            run_by_run = proxy.total
            proxy.reset()
            again = api.history(PROJECT)
            counts[count] = Counter()
            for key, n in proxy.snapshot().items():
                counts[count][key.split()[0]] += n  # by method: the keys differ by prefix
            pd.testing.assert_frame_equal(again, first)
            assert first["run"].nunique() == count
            assert run_by_run > 5 * count
        finally:
            proxy.close()
    # four listings (an empty one costs s3fs two more), the manifest, one segment: whatever the number of runs
    assert counts[10] == counts[30]
    assert sum(counts[30].values()) <= 8, counts[30]


def test_compact_project_builds_the_dataset_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "store")
    settled = [_settled_run(store, i) for i in range(2)]
    assert cli_main(["--store", store, "compact", "--project", PROJECT]) == 0
    assert "holds 2 settled runs" in capsys.readouterr().out
    assert _vouched(lh.Api(store).store) == set(settled)
    assert os.path.isdir(Path(store) / project_history_prefix(PROJECT) / "segments")
    assert _project.BUILD_AFTER > 2  # so the read above would not have built it by itself


@pytest.mark.slow
def test_many_runs_pivot_in_one_pass_exactly_as_run_by_run() -> None:
    import numpy as np
    import pyarrow as pa

    from launchhelm._api._project import ProjectRun
    from launchhelm._metrics._project import project_frame
    from launchhelm._metrics._segments import points_schema
    from launchhelm._types import Rewind

    rng = np.random.default_rng(7)
    runs = []
    for i in range(40):
        n = int(rng.integers(3, 60))
        step = rng.integers(0, 12, n)
        attempt = np.sort(rng.integers(0, 3, n)).astype(np.int32)  # attempts arrive in order
        names = rng.choice(["loss", "acc", "lr", f"k{i % 4}", "eval/x"], n)
        names[:3] = rng.permutation(["loss", "acc", "lr"])  # every run logs these, first in its own order
        value = np.where(rng.random(n) < 0.05, np.nan, rng.normal(size=n))
        table = pa.Table.from_arrays(
            [
                pa.array(step),
                pa.array(attempt),
                pa.array(1.7e9 + rng.random(n) * 1e4),
                pa.array(names),
                pa.array(value),
            ],
            schema=points_schema(),
        )
        rewinds = [
            Rewind(to_step=int(rng.integers(0, 10)), reached=12, cause="t", checkpoint=None, attempt=a)
            for a in (1, 2)
            if i % 3 and (attempt >= a).any()
        ]
        runs.append(ProjectRun(f"r{i:02d}", "n", float(i), "closed", 1, rewinds, table))
    for keys in (None, ["lr", "loss", "nope"], "acc"):
        for duplicates in ("all", "last"):
            parts = [(r.run_id, r.points, [(w.attempt, w.to_step) for w in r.rewinds]) for r in runs]
            fast = project_frame(parts, keys, duplicates)
            slow = _project_frame([(r.run_id, r.frame(keys, duplicates)) for r in runs])
            pd.testing.assert_frame_equal(fast, slow)
    # a run with nothing to show: concat's own rules for empty frames apply, so the caller goes run by run
    assert project_frame([("a", runs[0].points, []), ("b", runs[1].points.slice(0, 0), [])]) is None
