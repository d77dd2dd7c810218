"""`launchhelm gc` and media: what no index row references goes after the grace period, nothing else.

What a user would notice if this failed: a store that grows with the
pictures of killed sessions nobody can see (gc never deletes them), or worse,
a picture, thumbnail or table image the Media tab shows that gc deleted (a
broken image), or one a live session is about to index.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest
from lhtest import make_store_url, spawn

import launchhelm as lh
from launchhelm._gc import MEDIA, collect_garbage
from launchhelm.storage import open_store
from launchhelm.storage._keys import media_index_prefix, media_objects_prefix

#: Logs and indexes a small image and a table with an image cell, then logs a big image and never flushes it.
DOOMED = """
import sys, time
import numpy as np
import launchhelm as lh

run = lh.init("media-gc", store=sys.argv[1], flush_interval=3600)
print(run.id, flush=True)
small = np.arange(20 * 30 * 3, dtype=np.uint32).reshape(20, 30, 3).astype(np.uint8)
cell = np.full((8, 8, 3), 7, dtype=np.uint8)
run.log({"img": lh.Image(small), "t": lh.Table(columns=["a", "pic"], rows=[["x", lh.Image(cell)]])}, step=1)
run.flush()
big = np.random.default_rng(1).integers(0, 256, (600, 500, 3), dtype=np.uint8)
run.log({"img": lh.Image(big)}, step=2)  # stored by the media thread; its index row waits for a flush
print("logged", flush=True)
time.sleep(600)
"""

LATER = time.time() + 25 * 3600  # past the default 24 h window


def _objects(store: str, run_id: str) -> set[str]:
    return {i.key for i in open_store(store).list_info(media_objects_prefix(run_id))}


@pytest.mark.parametrize(
    "backend", ["local", pytest.param("s3", marks=pytest.mark.slow)]
)  # the object stores: not in --quick
def test_gc_deletes_media_a_killed_session_stored_and_never_indexed(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url(backend, tmp_path, request)
    # no helper process: its media thread is what stores an object and dies before indexing it (with a
    # helper, the helper indexes what it stores at once, and drains the rest after the kill)
    proc = spawn(DOOMED, store, LAUNCHHELM_SPOOL="off")
    assert proc.stdout is not None
    try:
        run_id = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "logged", proc.stderr.read() if proc.stderr else ""
        # small + table + cell (their own thumbnails) are 3 objects; the big image and its thumbnail 2 more
        deadline = time.monotonic() + 60
        while len(_objects(store, run_id)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_objects(store, run_id)) == 5
    finally:
        proc.send_signal(signal.SIGKILL)  # a real SIGKILL: the big image's index row never leaves the process
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    handle = lh.Api(store).run(run_id)
    assert [(i.key, i.step) for i in handle.media()] == [("img", 1), ("t", 1)]
    before = _objects(store, run_id)
    kept_pixels = handle.media("img")[0].load()
    kept_cell = handle.media("t")[0].load()["pic"][0]

    young = collect_garbage(store)  # within the 24 h window: a live session could still index them
    assert [a for a in young.actions if a.kind == MEDIA] == []
    assert any("2 unreferenced media object(s)" in line for line in young.too_young)
    dry = collect_garbage(store, now=LATER, dry_run=True)
    doomed = [a for a in dry.actions if a.kind == MEDIA]
    assert len(doomed) == 2 and all(a.run_id == run_id for a in doomed)
    assert any(line.startswith("would delete unreferenced media: runs/") for line in dry.lines())
    assert _objects(store, run_id) == before  # a dry run changes nothing

    report = collect_garbage(store, now=LATER)
    gone = {key.rsplit("/", 1)[1] for a in report.actions if a.kind == MEDIA for key in a.keys}
    assert gone == {a.keys[0].rsplit("/", 1)[1] for a in doomed}
    assert _objects(store, run_id) == before - gone
    handle = lh.Api(store).run(run_id)
    items = handle.media()
    assert [(i.key, i.step) for i in items] == [("img", 1), ("t", 1)]
    np.testing.assert_array_equal(items[0].load(), kept_pixels)
    np.testing.assert_array_equal(items[0].load_thumbnail(), kept_pixels)  # small: its own thumbnail
    np.testing.assert_array_equal(items[1].load()["pic"][0], kept_cell)
    np.testing.assert_array_equal(kept_cell, np.full((8, 8, 3), 7, dtype=np.uint8))
    assert [a for a in collect_garbage(store, now=LATER).actions if a.kind == MEDIA] == []


def test_gc_leaves_a_live_sessions_unindexed_media_whatever_their_age(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = lh.init("media-gc", store=store, flush_interval=3600)
    pixels = np.full((10, 12, 3), 200, dtype=np.uint8)
    run.log({"img": lh.Image(pixels)}, step=1)
    run.flush()
    # what the media thread leaves between storing an object and the next flush (or a re-log of old bytes)
    waiting = f"{media_objects_prefix(run.id)}/{'0' * 64}.png"
    open_store(store).create(waiting, b"not indexed yet")
    report = collect_garbage(store, now=LATER)
    assert [a for a in report.actions if a.kind == MEDIA] == []
    assert any("a session of the run is alive" in line for line in report.lines())
    assert open_store(store).exists(waiting)
    run.finish()
    report = collect_garbage(store, now=LATER)
    assert [a.keys for a in report.actions if a.kind == MEDIA] == [[waiting]]
    assert not open_store(store).exists(waiting)
    np.testing.assert_array_equal(lh.Api(store).run(run.id).media("img")[0].load(), pixels)


def test_index_rows_past_a_fence_reference_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launchhelm._start import _mark_fence

    monkeypatch.setenv("LAUNCHHELM_SPOOL", "off")  # the session's own index chunks 0 and 1: no helper numbers them
    store = str(tmp_path / "store")
    run = lh.init("media-gc", store=store, flush_interval=3600)
    first, second = np.full((4, 4, 3), 1, dtype=np.uint8), np.full((4, 4, 3), 2, dtype=np.uint8)
    run.log({"img": lh.Image(first)}, step=1)
    run.flush()  # index chunk 0
    run.log({"img": lh.Image(second)}, step=2)
    run.flush()  # index chunk 1: past the fence below
    run.finish()
    session = open_store(store).list(media_index_prefix(run.id))[0].split("/")[0]
    # a newer attempt fenced this session after its chunk 0, as a relaunch does
    _mark_fence(open_store(store), run.id, session, {"metrics": 10**6, "console": 10**6, "media": 0})
    handle = lh.Api(store).run(run.id)
    assert [i.step for i in handle.media()] == [1]
    report = collect_garbage(store, now=LATER)
    assert len([a for a in report.actions if a.kind == MEDIA]) == 1  # the second image (its own thumbnail)
    assert len(_objects(store, run.id)) == 1
    np.testing.assert_array_equal(lh.Api(store).run(run.id).media()[0].load(), first)


def test_retention_keeps_every_media_item(tmp_path: Path) -> None:
    """keep_last drops old checkpoints only: pictures of every step stay, as the metrics do (docs/storage.md)."""
    store = str(tmp_path / "store")
    run = lh.init("media-gc", store=store)
    payload = tmp_path / "ckpt.bin"
    pictures = {}
    for step in (1, 2, 3):
        payload.write_bytes(bytes([step]) * 100)
        pictures[step] = np.full((5, 5, 3), step * 10, dtype=np.uint8)
        run.log({"img": lh.Image(pictures[step])}, step=step)
        run.checkpoint(payload, step=step)
    run.finish()
    report = collect_garbage(store, keep_last=1, now=LATER)
    assert len([a for a in report.actions if a.kind == "retention"]) == 2
    assert [a for a in report.actions if a.kind == MEDIA] == []
    handle = lh.Api(store).run(run.id)
    assert len(handle.checkpoints()) == 1
    items = handle.media("img")
    assert [i.step for i in items] == [1, 2, 3]
    for item in items:
        np.testing.assert_array_equal(item.load(), pictures[item.step])


def test_the_documented_duckdb_query_reads_the_index_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb comes with the dev extras")
    # past the grace period (here: none), the merged-away index objects are gone and the query reads each row once
    monkeypatch.setenv("LAUNCHHELM_COMPACTION_GRACE", "0")
    store = tmp_path / "store"
    run = lh.init("media-gc", store=str(store), flush_interval=3600)
    for step in range(3):
        run.log({"img": lh.Image(np.full((3, 3, 3), step, dtype=np.uint8), caption=f"s{step}")}, step=step)
        run.flush()
    run.log({"h": lh.Histogram([1.0, 2.0], bins=2)}, step=3)
    run.finish()
    docs = (Path(__file__).parents[2] / "docs" / "storage.md").read_text()
    query = "SELECT * FROM read_parquet('runs/<run>/media/index/*/*.parquet', filename = true)"
    assert query in docs  # the query a user copies from the docs is the one tested
    sql = query.replace("runs/<run>", f"{store}/runs/{run.id}")
    rows = duckdb.sql(f"SELECT key, step, kind, caption, object FROM ({sql}) ORDER BY step").fetchall()
    expected = [(i.key, i.step, i.kind, i.caption, i.object) for i in lh.Api(str(store)).run(run.id).media()]
    assert rows == sorted(expected, key=lambda r: r[1])
    assert [r[2] for r in rows] == ["image"] * 3 + ["histogram"]
