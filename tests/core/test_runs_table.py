"""A big project's runs table in a few requests, and never a stale row.

If these fail, the runs table of a real project takes one round trip per run
again, or shows a run as it was before someone resumed it.
"""

from __future__ import annotations

import os
import signal

import pandas as pd
import pytest
from http_proxy import RequestCounter
from lhtest import BUCKET, spawn, wait_for_helpers

import launchhelm as lh
from launchhelm._runlog._table import INDEX_AFTER, table_prefix
from launchhelm.storage import open_store


def _proxied(moto_endpoint: str, prefix: str) -> tuple[RequestCounter, lh.storage.Store]:
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    store = open_store(f"s3://{BUCKET}/{prefix}", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
    return proxy, store


def _settled_runs(store: lh.storage.Store, count: int) -> list[str]:
    ids = []
    for i in range(count):
        run = lh.init("table", store=store, config={"seed": i}, flush_interval=3600)
        run.log({"loss": 1.0 / (i + 1)})
        run.finish(close_run=bool(i % 2))
        ids.append(run.id)
    wait_for_helpers()  # each adds its run to the index: the reads below count requests
    return ids


@pytest.mark.slow
def test_settled_runs_come_from_the_index_in_three_requests(moto_endpoint: str) -> None:
    prefix = f"table-{os.urandom(3).hex()}"
    direct = open_store(f"s3://{BUCKET}/{prefix}")
    ids = _settled_runs(direct, INDEX_AFTER + 4)
    proxy, store = _proxied(moto_endpoint, prefix)
    try:
        first = lh.Api(store).runs("table")
        assert sorted(first["id"]) == sorted(ids)
        assert set(first["status"]) == {"resumable", "closed"}
        assert [n for n in store.list(table_prefix("table")) if n.startswith("index-")]  # by the helpers, or that read
        proxy.reset()
        again = lh.Api(store).runs("table")
        # the run markers' listing, the table's listing (row markers and indexes), the newest index
        assert proxy.total == 3, proxy.snapshot()
        pd.testing.assert_frame_equal(again, first)
    finally:
        proxy.close()


def test_a_run_resumed_after_the_index_was_written_shows_as_it_is_now(tmp_path: object) -> None:
    store = open_store(f"memory://table-{os.urandom(3).hex()}")
    ids = _settled_runs(store, INDEX_AFTER + 1)
    lh.Api(store).runs("table")  # writes the index
    target = ids[0]  # left resumable
    again = lh.init("table", store=store, resume=target)
    row = lh.Api(store).runs("table").set_index("id").loc[target]
    assert row["status"] == "running"
    assert row["sessions"] == 2
    again.global_step = 7
    again.log({"loss": 0.01})
    again.finish()
    row = lh.Api(store).runs("table").set_index("id").loc[target]
    assert row["status"] == "closed"
    assert row["step"] == 7
    assert row["metric.loss"] == 0.01
    # and an index written now has the new row, which later reads take as it is
    lh.Api(store).runs("table")
    assert lh.Api(store).runs("table").set_index("id").loc[target, "status"] == "closed"


@pytest.mark.slow
def test_a_session_killed_right_after_it_marked_its_row_is_read_from_the_log(tmp_path: object) -> None:
    store_url = str(tmp_path) + "/store"  # type: ignore[operator]
    store = open_store(store_url)
    ids = _settled_runs(store, INDEX_AFTER + 1)
    lh.Api(store).runs("table")
    child = spawn(
        """
        import sys, launchhelm as lh
        run = lh.init("table", store=sys.argv[1], resume=sys.argv[2])
        run.global_step = 3
        run.log({"loss": 0.5})
        run.flush()
        print("ready", flush=True)
        import time; time.sleep(600)
        """,
        store_url,
        ids[0],
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    assert lh.Api(store).runs("table").set_index("id").loc[ids[0], "status"] == "running"
    child.send_signal(signal.SIGKILL)
    child.wait()
    row = lh.Api(store).runs("table").set_index("id").loc[ids[0]]
    assert row["status"] == "stopped"
    assert row["sessions"] == 2
