"""The runs table a person scans: rows, times as people read them, sort, filter, pick columns, tick to compare.

If these fail, the table shows raw timestamps, sorts numbers as text, hides
a run a filter should keep, loses a tunable's value, or ticking runs does
not compare them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rewound_runs import BACK_TO, REACHED, rewound_run
from widget_runs import StoppedRun

import launchhelm as lh
from launchhelm._views._humanize import ago, duration, local_time, status_sentence
from launchhelm._views._runs import filter_rows, readable_runs, sort_rows, table_rows
from launchhelm.widgets import RunsTable

pytest.importorskip("torch")


@pytest.mark.slow
def test_the_table_reads_the_same_rows_on_every_store_and_ticking_two_compares_them(store_url: str) -> None:
    a = rewound_run(store_url, "table", "alpha", 0.1)
    b = rewound_run(store_url, "table", "beta", 0.01, close=False, tunables={"clip": 0.5})
    table = RunsTable("table", store=store_url)
    try:
        rows = {r["name"]: r for r in table.rows()}
        assert set(rows) == {"alpha", "beta"}
        alpha, beta = rows["alpha"], rows["beta"]
        assert (alpha["status"], beta["status"]) == ("closed", "resumable")
        assert alpha["sentence"] == "finish() closed it; it cannot be resumed"
        assert (alpha["step"], alpha["rewinds"]) == (50, 1)
        assert alpha["values"]["config.lr"] == 0.1 and beta["values"]["tunable.clip"] == 0.5
        assert alpha["values"]["metric.acc"] == 0.5  # the latest value of each metric
        assert 0 <= alpha["duration"] < 120 and abs(alpha["created"] - time.time()) < 300
        kinds = {c["id"]: c["kind"] for c in table.columns()}
        assert kinds["metric.train/loss"] == "metric" and kinds["config.lr"] == "config"
        assert kinds["tunable.clip"] == "tunable"
        table.select([a, b])
        assert table.compare.runs == [a, b]  # the ticks drive the comparison
        points = table.compare.points()
        assert points.groupby("run")["key"].nunique().to_dict() == {a: 2, b: 2}
        assert [(r["run_id"], r["to_step"], r["reached"]) for r in table.compare.rewinds()] == [
            (a, BACK_TO, REACHED),
            (b, BACK_TO, REACHED),
        ]
        assert [d["key"] for d in table.compare.diff()] == ["config.lr", "tunable.clip"]
        saved = table._repr_mimebundle_()["text/html"]  # a saved notebook: the table, then the comparison
        assert "Runs of project table (2 of 2 shown)" in saved and "<svg" in saved and "tunable.clip" in saved
        table.select([b])
        assert table.compare.runs == [b] and table.compare.diff() == []
    finally:
        table.close()


def test_sorting_filtering_and_statuses_keep_what_a_person_asks_for(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ids = {
        "alpha": rewound_run(store, "table", "alpha", 0.1),
        "beta": rewound_run(store, "table", "beta", 0.01, close=False),
        "gamma": rewound_run(store, "table", "gamma", 0.001, end=30),
    }
    table = RunsTable("table", store=store)
    try:
        names = lambda: [r["name"] for r in table.visible_rows()]  # noqa: E731
        assert names() == ["gamma", "beta", "alpha"]  # newest first by default
        table.sort("name")
        assert names() == ["alpha", "beta", "gamma"]
        table.sort("config.lr")  # numbers as numbers: 0.001 < 0.01 < 0.1
        assert names() == ["gamma", "beta", "alpha"]
        table.sort("step", descending=True)
        assert names()[-1] == "gamma"  # 30 < 50
        table.filter("lr=0.01")  # a config value, by its short name
        assert names() == ["beta"]
        table.filter("ALPHA")  # case-insensitive, on the name
        assert names() == ["alpha"]
        table.filter(ids["gamma"])  # or the id
        assert names() == ["gamma"]
        table.filter("", statuses=["closed"])
        assert sorted(names()) == ["alpha", "gamma"]
        table.filter("model=linear", statuses=["resumable", "closed"])
        assert sorted(names()) == ["alpha", "beta", "gamma"]
        with pytest.raises(
            lh.InvalidArgumentError, match="one of running, hung, stopped, restart loop, resumable, closed"
        ):
            table.filter("", statuses=["crashed"])
        with pytest.raises(lh.InvalidArgumentError, match="no such column"):
            table.sort("metric.nope")
        with pytest.raises(lh.InvalidArgumentError, match="not in project 'table'"):
            table.select(["zzzzzzzz"])
    finally:
        table.close()


def test_missing_cells_sort_last_and_text_sorts_as_text() -> None:
    rows = [
        {"id": "a", "name": "b", "values": {"metric.loss": 2.0, "config.opt": "sgd"}},
        {"id": "b", "name": "a", "values": {"metric.loss": None, "config.opt": "Adam"}},
        {"id": "c", "name": "c", "values": {"metric.loss": 10.0}},
    ]
    assert [r["id"] for r in sort_rows(rows, "metric.loss")] == ["a", "c", "b"]
    assert [r["id"] for r in sort_rows(rows, "metric.loss", descending=True)] == ["c", "a", "b"]
    assert [r["id"] for r in sort_rows(rows, "config.opt")] == ["b", "a", "c"]
    assert [r["id"] for r in filter_rows(rows, "opt=sgd")] == ["a"]
    assert [r["id"] for r in filter_rows(rows, "loss=10")] == ["c"]


@pytest.mark.slow
def test_a_killed_run_reads_stopped_with_its_sentence_and_times_read_as_people_read_them(
    stopped_run: StoppedRun,
) -> None:
    table = RunsTable("plain", store=stopped_run.store)
    try:
        (row,) = table.rows()
        assert row["status"] == "stopped"
        assert row["sentence"].startswith("stopped without ending its session (crashed or killed); resume it")
        now = table.table.state["now"]  # when the rows were read
        # then how its last attempt ended: the killed process's helper ended it (the fixture waits for that,
        # so the heartbeat is seconds old, and the sentence's clock may be a second off the state's "now")
        beat = row["last_heartbeat"]
        said = {f"; last heartbeat {ago(beat, now + d)}; its last attempt ended crashed (" for d in (-1, 0, 1)}
        assert any(s in row["sentence"] for s in said), (row["sentence"], said)
        html = table.static_html(now=now)
        assert "stopped: stopped without ending its session" in html
        assert f"{local_time(row['created'])} ({ago(row['created'], now)})" in html  # never raw nanoseconds
        assert "Runs of project plain (1 of 1 shown)" in html
    finally:
        table.close()
    frame = lh.Api(stopped_run.store).runs("plain")
    shown = readable_runs(frame, now)
    assert shown.loc[0, "created"] == f"{local_time(row['created'])} ({ago(row['created'], now)})"
    assert shown.loc[0, "last_heartbeat"] == ago(row["last_heartbeat"], now) and shown.columns[5] == "duration"
    assert shown.loc[0, "step"] == 30  # everything else as Api.runs has it


def test_many_metrics_bring_the_column_picker(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    with lh.init("wide", store=store, config={"lr": 0.1}, flush_interval=3600) as run:
        run.log({f"m{i:02d}": float(i) for i in range(15)}, step=1)
    table = RunsTable("wide", store=store, extra_columns=6)
    try:
        assert table.table.state["picker"] is True
        shown = [c["id"] for c in table.columns() if c["kind"] != "base"]
        assert shown == [f"metric.m{i:02d}" for i in range(6)]  # metrics first, the rest picked by hand
        assert len(table.table.hidden) == 10  # 9 metrics and config.lr
        table.table.hidden = [h for h in table.table.hidden if h != "config.lr"]  # ticked in "Columns…"
        assert "config.lr" in [c["id"] for c in table.columns()]
    finally:
        table.close()
    with pytest.raises(lh.InvalidArgumentError, match="extra_columns=-1"):
        RunsTable("wide", store=store, extra_columns=-1)


def test_the_table_is_live_and_reattaches(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    first = lh.init("live", name="first", store=store)
    try:
        table = RunsTable("live", store=store, interval=0.2)
        try:
            assert [r["status"] for r in table.rows()] == ["running"]
            assert table.table.is_active()  # a run is running: polled at full speed
            assert RunsTable("live", store=store, interval=0.2) is table  # re-running the cell
            second = lh.init("live", name="second", store=store)
            second.finish()
            table.refresh()
            assert [r["name"] for r in table.rows()] == ["second", "first"]
            assert table.rows()[0]["status"] == "closed"
        finally:
            table.close()
    finally:
        first.finish()


def test_human_times() -> None:
    assert [duration(s) for s in (0.4, 42, 75, 3600, 4320, 90061)] == [
        "0 s",
        "42 s",
        "1 min 15 s",
        "1 h",
        "1 h 12 min",
        "1 d 1 h",
    ]
    assert duration(None) == "-" and duration(float("nan")) == "-"
    now = 1_800_000_000.0
    assert [ago(now - d, now) for d in (1, 42, 180, 7300, 200_000)] == [
        "just now",
        "42 s ago",
        "3 min ago",
        "2 h ago",
        "2 d ago",
    ]
    assert ago(None) == "never" and ago(now + 60, now) == "just now"  # another host's clock ahead
    assert local_time(now) == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    assert status_sentence("stopped", now - 180, now).endswith("; last heartbeat 3 min ago")
    assert status_sentence("closed", now - 180, now) == "finish() closed it; it cannot be resumed"


def test_rows_of_an_empty_project_and_bad_names(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    lh.init("empty", store=store).finish()
    assert table_rows(lh.Api(store).runs("nothing")) == []
    with pytest.raises(lh.InvalidArgumentError):
        RunsTable("bad/name", store=store)
    with pytest.raises(lh.InvalidTypeError):
        RunsTable(3, store=store)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_tables_poll_reads_the_row_index_not_every_run(moto_endpoint: str) -> None:
    import os

    from http_proxy import RequestCounter
    from lhtest import BUCKET, wait_for_helpers

    from launchhelm._runlog._table import INDEX_AFTER
    from launchhelm.storage import open_store

    prefix = f"runs-widget-{os.urandom(3).hex()}"
    direct = open_store(f"s3://{BUCKET}/{prefix}")
    for i in range(INDEX_AFTER + 1):
        run = lh.init("big", store=direct, config={"seed": i}, tunables={"lr": 0.1}, flush_interval=3600)
        run.log({"loss": 1.0 / (i + 1)})
        run.finish(close_run=bool(i % 2))
    wait_for_helpers()  # each adds its run to the index: the poll below counts requests
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    store = open_store(f"s3://{BUCKET}/{prefix}", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
    try:
        table = RunsTable("big", store=store)  # the helpers wrote the index of settled rows (or this read does)
        try:
            assert len(table.rows()) == INDEX_AFTER + 1
            proxy.reset()
            table.refresh()  # what the poller does every few seconds
            # the run markers' listing, the table's listing (row markers and indexes), the newest index
            assert proxy.total == 3, proxy.snapshot()
            assert {r["values"]["tunable.lr"] for r in table.rows()} == {0.1}
        finally:
            table.close()
    finally:
        proxy.close()


MAGIC_WITHOUT_A_KERNEL = """
import sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "launchhelm")
shown = shell.run_line_magic("launchhelm", f"runs plain --store {sys.argv[1]}")
print(type(shown).__name__)
print(shown.loc[0, "created"])
print(shown.loc[0, "duration"])
print(shown.loc[0, "status"])
"""


@pytest.mark.slow
def test_the_magic_without_a_kernel_prints_a_table_with_readable_times(stopped_run: StoppedRun) -> None:
    from lhtest import run_python

    done = run_python(MAGIC_WITHOUT_A_KERNEL, stopped_run.store)
    assert done.returncode == 0, done.stderr
    kind, created, spent, status = done.stdout.strip().splitlines()[-4:]
    assert kind == "DataFrame" and status == "stopped"
    when = lh.Api(stopped_run.store).run(stopped_run.id).created
    assert created.startswith(f"{local_time(when)} (") and created.endswith(("ago)", "(just now)"))
    assert spent.endswith(" s") or "min" in spent
