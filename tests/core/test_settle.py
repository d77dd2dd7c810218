"""A project's first read costs what its second does: each run's helper settles it when its session ends.

If these fail, the first ``Api.runs()`` / ``Api.history(project)`` after a
sweep finished reads every run one by one again (seconds per hundred runs on
S3), a run goes missing from the table's index when several finish at once,
or a helper whose store stopped answering outlives its training process.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from http_proxy import RequestCounter
from lhtest import BUCKET, ROOT, child_env

import launchhelm as lh
from launchhelm._metrics._project import ProjectReader, list_project
from launchhelm._runlog._summary import run_rows
from launchhelm._runlog._table import read_index, table_listing
from launchhelm.storage import Store, open_store


@pytest.fixture(autouse=True)
def _settling_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settling by the helper is off by default (``LAUNCHHELM_SETTLE_TIMEOUT``): these tests turn it on."""
    monkeypatch.setenv("LAUNCHHELM_SETTLE_TIMEOUT", "30")


PROJECT = "settle"

#: A training process: init, a few points, the helper's pid, then finish() when told (all at once).
_TRAINER = """
import json, sys, time
import launchhelm as lh
store, options, i = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
run = lh.init("settle", store=store, storage_options=options, config={"i": i}, flush_interval=3600,
              system_metrics=False)
for step in range(1, 6 + i % 3):
    run.global_step = step
    run.log({"loss": 1.0 / step + i, **({"acc": step / 100} if i % 2 else {})})
deadline = time.monotonic() + 30
while run._helper is None and time.monotonic() < deadline:
    time.sleep(0.01)
print(run._helper.process.pid if run._helper is not None else -1, flush=True)
sys.stdin.readline()
run.finish(close_run=bool(i % 2))
print("finished", run.id, flush=True)
"""


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.05)


def _finish_at_once(
    store: str, count: int, at_once: int, options: dict[str, object] | None = None, **env: str
) -> tuple[list[str], list[int]]:
    """``count`` runs finished by real processes, ``at_once`` of them released together; their ids and helpers."""
    ids: list[str] = []
    helpers: list[int] = []
    for start in range(0, count, at_once):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(_TRAINER), store, json.dumps(options or {}), str(i)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=child_env(**env),
                cwd=ROOT,
            )
            for i in range(start, min(count, start + at_once))
        ]
        try:
            for proc in procs:
                assert proc.stdout is not None
                helpers.append(int(proc.stdout.readline() or -1))
            assert all(pid > 0 for pid in helpers), "a training process without a helper"
            for proc in procs:  # released together: their finish() and their helpers race
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            for proc in procs:
                out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err
                ids.append(out.split()[-1])
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    return ids, helpers


def _per_run(api: lh.Api) -> pd.DataFrame:
    """The slow path's answer: each run's own history, newest first."""
    handles = sorted((api.run(r) for r in api.run_ids(PROJECT)), key=lambda h: h.created, reverse=True)
    parts = []
    for handle in handles:
        frame = handle.history()
        frame.insert(0, "run", handle.id)
        parts.append(frame)
    return pd.concat(parts, ignore_index=True, sort=False)


def _slow_rows(store: Store, ids: list[str]) -> pd.DataFrame:
    """The slow path's runs table: every row from its run's summary and log (no index)."""
    frame = lh.Api(store).runs(PROJECT)
    rows = {row["id"]: row for row in run_rows(store, ids)}
    for column in ("status", "step", "sessions", "rewinds", "name"):
        assert [rows[r][column] for r in frame["id"]] == frame[column].tolist(), column
    return frame


def _fell_out(store: Store, ids: list[str]) -> tuple[set[str], set[str]]:
    """Runs missing from the newest runs index, and from the newest history generation."""
    _markers, indexes = table_listing(store, PROJECT)
    index = read_index(store, PROJECT, indexes[-1] if indexes else None)
    vouched = ProjectReader(store, PROJECT).vouched(list_project(store, PROJECT))
    return set(ids) - set(index), set(ids) - set(vouched)


@pytest.mark.slow
def test_a_fresh_reader_of_runs_finished_by_other_processes_pays_few_requests(moto_endpoint: str) -> None:
    prefix = f"settle-{secrets.token_hex(3)}"
    url = f"s3://{BUCKET}/{prefix}"
    ids, helpers = _finish_at_once(url, 12, 3)
    for pid in helpers:  # each settled its run, then exited: none is left
        _wait(lambda pid=pid: not _running(pid), 35, f"helper {pid} exited")
    store = open_store(url)
    assert _fell_out(store, ids) == (set(), set())
    segments = ProjectReader(store, PROJECT)._generation(list_project(store, PROJECT))
    assert segments is not None and len(segments.segments) <= 4, segments  # merged, not one a run

    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    try:
        counted = open_store(url, {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
        runs = lh.Api(counted).runs(PROJECT)
        first_runs = proxy.total
        proxy.reset()
        history = lh.Api(counted).history(PROJECT)
        first_history = proxy.total
        proxy.reset()
        lh.Api(counted).runs(PROJECT)
        second_runs = proxy.total
        proxy.reset()
        lh.Api(counted).history(PROJECT)
        second_history = proxy.total
    finally:
        proxy.close()
    # the first read is the second: listings, the newest index; the four listings, a manifest, its segments
    # (the store's client asks once whether the bucket exists: a HEAD the second read does not repeat)
    assert first_runs <= second_runs + 1 and second_runs <= 4, (first_runs, second_runs)
    assert first_history <= second_history + 1 and second_history <= 12, (first_history, second_history)
    assert sorted(runs["id"]) == sorted(ids)
    pd.testing.assert_frame_equal(runs, _slow_rows(store, ids))
    pd.testing.assert_frame_equal(history, _per_run(lh.Api(store)))


@pytest.mark.slow
def test_runs_finishing_at_once_all_reach_the_index_and_the_dataset(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    ids, helpers = _finish_at_once(url, 8, 8)
    for pid in helpers:
        _wait(lambda pid=pid: not _running(pid), 35, f"helper {pid} exited")
    store = open_store(url)
    out_of_index, out_of_dataset = _fell_out(store, ids)
    print(f"of 8 runs finished at once: {len(out_of_index)} out of the index, {len(out_of_dataset)} of the dataset")
    assert not out_of_index, f"{len(out_of_index)} of 8 rows fell out of the runs index"
    assert len(out_of_dataset) <= 2, f"{len(out_of_dataset)} of 8 runs fell out of the history dataset"
    # and whatever fell out is read from the run itself: the answers are the slow path's
    pd.testing.assert_frame_equal(lh.Api(store).runs(PROJECT), _slow_rows(store, ids))
    pd.testing.assert_frame_equal(lh.Api(store).history(PROJECT), _per_run(lh.Api(store)))


@pytest.mark.slow
def test_a_helper_whose_store_stops_answering_exits_within_its_bound(moto_endpoint: str) -> None:
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]), latency=0.2)
    url = f"s3://{BUCKET}/settle-{secrets.token_hex(3)}"
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}}
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_TRAINER), url, json.dumps(options), "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(LAUNCHHELM_SETTLE_TIMEOUT="3"),
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        helper = int(proc.stdout.readline() or -1)
        assert helper > 0
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("finished")
        proxy.blackhole()  # the helper is settling through 200 ms requests: now none answers
        hung = time.monotonic()
        assert _running(helper), "the helper was done before the store stopped answering: the test shows nothing"
        _wait(lambda: not _running(helper), 10, "the helper exited although its store hangs")
        assert time.monotonic() - hung < 6
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
        proxy.close()
