"""Compacted metrics: a long run's history opens in a few requests, and no point is lost or read twice.

If these fail, a 24-hour run's chart does not open on S3 (43,000 GETs), or
compaction racing a reader, another compactor or a SIGKILL loses points or
shows them twice.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from http_proxy import RequestCounter
from lhtest import BUCKET, child_env

import launchhelm as lh
from launchhelm._metrics._compact import FANOUT, Compactor, compact_run
from launchhelm._metrics._layout import list_metrics, read_manifest
from launchhelm._metrics._points import chunk_key, encode_chunk
from launchhelm._metrics._read import PointReader, read_points
from launchhelm.storage import open_store


def _write_chunks(store: lh.storage.Store, run_id: str, session: str, first: int, count: int, per: int = 3) -> None:
    """``count`` chunks of ``per`` points each at steps first.., values unique (= step)."""
    for n in range(count):
        steps = range(first + n * per, first + (n + 1) * per)
        rows = [(s, 0, 1e9 + s, {"x": float(s)}) for s in steps]
        number = (first + n * per) // per
        store.create(chunk_key(run_id, session, number, steps[0], steps[-1]), encode_chunk(rows))


def _values(store: lh.storage.Store, run_id: str) -> list[float]:
    return [float(v) for v in read_points(store, run_id).column("value").to_pylist()]


def _session(i: int = 0) -> str:
    return f"{int(time.time() * 1000) + i:012x}{os.urandom(4).hex()}"


@pytest.mark.slow
def test_compaction_keeps_history_exactly_and_covers_every_chunk(store_url: str) -> None:
    run = lh.init("compaction", store=store_url, flush_interval=3600)
    for step in range(1, 41):
        run.global_step = step
        run.log({"loss": 1.0 / step, "lr": 0.1 * step})
        if step % 4 == 0:
            run.flush()  # ten chunks
    run.flush()
    api = lh.Api(store_url)
    before = api.run(run.id).history()
    result = compact_run(run.store, run.id)
    assert result is not None and result.chunks == 10
    listing = list_metrics(run.store, run.id)
    manifest = read_manifest(run.store, run.id, listing.newest_manifest)
    assert listing.uncovered(manifest) == []
    assert [s.level for s in manifest.segments] == [0]
    assert manifest.max_step == 40
    after = api.run(run.id).history()  # a fresh handle: segments, no chunks
    assert after.drop(columns="time").equals(before.drop(columns="time"))
    assert (after["time"] == before["time"]).all()
    run.finish()
    assert api.run(run.id).history().drop(columns="time").equals(before.drop(columns="time"))


@pytest.mark.slow
def test_a_rewound_run_keeps_both_attempts_through_compaction(store_url: str) -> None:
    run = lh.init("compaction", store=store_url, flush_interval=3600)
    for step in range(1, 21):
        run.global_step = step
        run.log({"loss": float(step)})
        run.flush()
    run._record_rewind(10, None, "test", 20)
    run._attempt = 1
    for step in range(11, 16):
        run.global_step = step
        run.log({"loss": -float(step)})
    run.finish()  # finish compacts every chunk
    assert list_metrics(run.store, run.id).newest_manifest >= 1
    frame = lh.Api(store_url).run(run.id).history()
    redone = frame[frame["step"] == 12]
    assert redone["attempt"].tolist() == [0, 1]
    assert redone["loss"].tolist() == [12.0, -12.0]
    assert redone["abandoned"].tolist() == [True, False]
    last = lh.Api(store_url).run(run.id).history(duplicates="last")
    assert last.set_index("step").loc[12, "loss"] == -12.0


@pytest.mark.slow
def test_segments_merge_in_levels_so_their_number_stays_logarithmic(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    session = _session()
    compactor = Compactor(store, "levels0", by="test")
    for i in range(FANOUT**2 + 3):
        _write_chunks(store, "levels0", session, first=i * 3, count=1)
        compactor.compact(collect=False)
    manifest = read_manifest(store, "levels0", list_metrics(store, "levels0").newest_manifest)
    assert [s.level for s in manifest.segments] == [2, 0, 0, 0]
    assert sum(s.rows for s in manifest.segments) == (FANOUT**2 + 3) * 3
    assert _values(store, "levels0") == [float(s) for s in range((FANOUT**2 + 3) * 3)]


def test_garbage_goes_only_after_the_grace_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(tmp_path / "store")
    session = _session()
    _write_chunks(store, "grace000", session, 0, 5)
    monkeypatch.setenv("LAUNCHHELM_COMPACTION_GRACE", "3600")
    compactor = Compactor(store, "grace000", by="test")
    for i in range(FANOUT):
        _write_chunks(store, "grace000", session, 15 + i * 3, 1)
        compactor.compact()
    listing = list_metrics(store, "grace000")
    assert len(listing.chunks) == 5 + FANOUT  # covered, still there for readers that listed before
    assert len(listing.manifests) == FANOUT
    # an orphan: a segment a killed compactor wrote without a manifest
    store.create("runs/grace000/metrics/segments/L0-orphan.parquet", b"not read by anyone")
    monkeypatch.setenv("LAUNCHHELM_COMPACTION_GRACE", "0")
    deleted = compactor.collect(list_metrics(store, "grace000"), now=time.time() + 1)
    listing = list_metrics(store, "grace000")
    manifest = read_manifest(store, "grace000", listing.newest_manifest)
    assert listing.chunks == []
    assert list(listing.manifests) == [manifest.seq]
    assert set(listing.segments) == {s.key for s in manifest.segments}  # merged inputs and the orphan are gone
    # chunks, manifests before the newest, the merged L0s (the eighth went straight into the merge), the orphan
    assert deleted == (5 + FANOUT) + (FANOUT - 1) + (FANOUT - 1) + 1
    assert _values(store, "grace000") == [float(s) for s in range(15 + FANOUT * 3)]


@pytest.mark.slow
def test_a_store_written_before_compaction_reads_and_is_compacted_by_the_command(
    shared_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # layout 1: chunks only, no manifest (what every earlier version wrote)
    _session_that_never_compacts(monkeypatch)
    store_url = shared_store_url
    store = open_store(store_url)
    run = lh.init("compaction", store=store, flush_interval=3600)
    for step in range(1, 31):
        run.global_step = step
        run.log({"loss": float(step)})
        run.flush()
    run._compact = lambda **_: None  # type: ignore[method-assign]  # an old session: it never compacts
    run.finish(close_run=False)
    assert list_metrics(store, run.id).newest_manifest == 0
    before = lh.Api(store).run(run.id).history()
    assert before["loss"].tolist() == [float(s) for s in range(1, 31)]
    out = subprocess.run(
        [sys.executable, "-m", "launchhelm._cli", "--store", store_url, "compact", run.id],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "compacted 30 chunks" in out.stdout
    assert list_metrics(store, run.id).newest_manifest == 1
    after = lh.Api(store).run(run.id).history()
    assert after.drop(columns="time").equals(before.drop(columns="time"))


@pytest.mark.slow
def test_racing_compactors_and_a_writer_never_show_a_point_twice_or_lose_one(store_url: str) -> None:
    store = open_store(store_url)
    run_id = f"race{os.urandom(3).hex()}"
    session = _session()
    written = [0]  # chunks written so far
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for n in range(60):
                _write_chunks(store, run_id, session, n * 3, 1)
                written[0] = n + 1
                time.sleep(0.005)
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    def compactor(name: str) -> None:
        c = Compactor(store, run_id, by=name)
        try:
            while not stop.is_set():
                c.compact()
        except BaseException as exc:
            errors.append(exc)

    os.environ["LAUNCHHELM_COMPACTION_GRACE"] = "0.5"  # collect while the reader reads
    try:
        threads = [
            threading.Thread(target=writer),
            *(threading.Thread(target=compactor, args=(f"c{i}",)) for i in range(2)),
        ]
        for t in threads:
            t.start()
        reads = 0
        reader = PointReader(store, run_id)
        while not stop.is_set() or reads < 3:
            floor = written[0]
            values = [float(v) for v in reader.read().column("value").to_pylist()]
            assert len(values) == len(set(values)), "a point read twice"
            assert values[: floor * 3] == [float(s) for s in range(floor * 3)][: len(values)], "a point missing"
            assert len(values) >= floor * 3
            reads += 1
        for t in threads:
            t.join()
    finally:
        os.environ.pop("LAUNCHHELM_COMPACTION_GRACE", None)
    assert not errors, errors
    compact_run(store, run_id)
    assert _values(store, run_id) == [float(s) for s in range(180)]


@pytest.mark.slow
def test_a_poll_reads_only_what_is_new_and_sees_every_point_once(store_url: str) -> None:
    store = open_store(store_url)
    run_id = f"poll{os.urandom(3).hex()}"
    session = _session()
    _write_chunks(store, run_id, session, 0, 40)
    compactor = Compactor(store, run_id, by="test")
    compactor.compact()
    reader = PointReader(store, run_id)
    seen = [float(v) for v in reader.read().column("value").to_pylist()]
    for round_ in range(4):
        _write_chunks(store, run_id, session, 120 + round_ * 6, 2)
        if round_ == 2:
            compactor.compact()  # a manifest between polls covers chunks this reader read directly
        new = reader.poll()
        assert new is not None
        seen += [float(v) for v in new.column("value").to_pylist()]
    assert seen == [float(s) for s in range(144)]
    assert reader.poll() is not None and reader.poll().num_rows == 0  # type: ignore[union-attr]


_KILLED_COMPACTOR = textwrap.dedent(
    """
    import sys
    from launchhelm._metrics._compact import Compactor
    from launchhelm.storage import open_store
    store = open_store(sys.argv[1])
    c = Compactor(store, sys.argv[2], by="doomed")
    print("ready", flush=True)
    while True:
        c.compact()
    """
)


@pytest.mark.slow
def test_sigkill_at_random_moments_of_compaction_loses_nothing(shared_store_url: str) -> None:
    store = open_store(shared_store_url)
    run_id = f"kill{os.urandom(3).hex()}"
    session = _session()
    rng = random.Random(11)
    total = 0
    env = child_env(LAUNCHHELM_COMPACTION_GRACE="0")
    for trial in range(8):
        _write_chunks(store, run_id, session, total * 3, 12)
        total += 12
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILLED_COMPACTOR, shared_store_url, run_id],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        # keep writing and reading while it compacts, so the kill lands mid-merge, mid-manifest or
        # mid-collection, and every read in between sees each point exactly once
        deadline = time.monotonic() + rng.uniform(0.05, 0.6)
        while time.monotonic() < deadline:
            _write_chunks(store, run_id, session, total * 3, 1)
            total += 1
            assert _values(store, run_id) == [float(s) for s in range(total * 3)], f"trial {trial}: read mid-compaction"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        values = _values(store, run_id)
        assert values == [float(s) for s in range(total * 3)], f"trial {trial}: points lost or doubled"
    compact_run(store, run_id)
    listing = list_metrics(store, run_id)
    assert listing.uncovered(read_manifest(store, run_id, listing.newest_manifest)) == []
    assert _values(store, run_id) == [float(s) for s in range(total * 3)]
    assert np.all(np.diff(_values(store, run_id)) == 1)


def _session_that_never_compacts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests below play a session that ended without compacting (an older version, a killed one) by
    stubbing ``run._compact``: that stub only holds where the training process writes its chunks."""
    monkeypatch.setenv("LAUNCHHELM_HELPER_FLUSH", "0")


def _counted(moto_endpoint: str, prefix: str) -> tuple[RequestCounter, lh.storage.Store]:
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    store = open_store(f"s3://{BUCKET}/{prefix}", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
    return proxy, store


@pytest.mark.slow
def test_a_long_runs_history_and_live_poll_cost_a_few_requests_on_s3(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _session_that_never_compacts(monkeypatch)
    prefix = f"reqs-{os.urandom(3).hex()}"
    direct = open_store(f"s3://{BUCKET}/{prefix}")
    run = lh.init("compaction", store=direct, flush_interval=3600)
    run.log({"x": -1.0})
    run.flush()
    run._compact = lambda **_: None  # type: ignore[method-assign]
    run.finish(close_run=False)
    session = run.session_id
    compactor = Compactor(direct, run.id, by="test")
    for batch in range(20):
        _write_chunks(direct, run.id, session, 3 + batch * 30, 10)
        compactor.compact()  # 20 compactions: merged into levels, 2 + 4 segments left
    _write_chunks(direct, run.id, session, 603, 7)  # an uncovered tail of 7 chunks
    proxy, store = _counted(moto_endpoint, prefix)
    try:
        handle = lh.Api(store).run(run.id)
        proxy.reset()
        frame = handle.history()
        assert frame["x"].tolist() == [-1.0, *(float(s) for s in range(3, 624))]
        segments = len(read_manifest(direct, run.id, list_metrics(direct, run.id).newest_manifest).segments)
        counts = proxy.snapshot()
        gets = sum(n for what, n in counts.items() if what.startswith("GET /"))
        # events: 1 listing + 3 events; metrics: 1 listing + the manifest + its segments + 7 chunks
        assert proxy.total <= 1 + 3 + 1 + 1 + segments + 7, counts
        assert gets >= 1 + segments + 7
        # a live poll: one more flush costs the listings and that chunk, nothing else
        _write_chunks(direct, run.id, session, 624, 1)
        proxy.reset()
        view = handle.poll()
        assert view.history["x"].iloc[-1] == 626.0
        assert view.summary["step"] == 626
        assert proxy.total <= 5, proxy.snapshot()
    finally:
        proxy.close()


def test_gc_compacts_what_a_dead_session_left_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launchhelm._gc import collect_garbage

    _session_that_never_compacts(monkeypatch)
    store = open_store(tmp_path / "store")
    run = lh.init("compaction", store=store, flush_interval=3600)
    for step in range(1, 13):
        run.global_step = step
        run.log({"x": float(step)})
        run.flush()
    run._compact = lambda **_: None  # type: ignore[method-assign]  # killed before it could compact
    run.finish(close_run=False)
    dry = collect_garbage(store, dry_run=True)
    assert dry.compacted == [(run.id, 12, 0)]
    assert any("would compact 12 metric chunk(s)" in line for line in dry.lines())
    assert list_metrics(store, run.id).newest_manifest == 0
    done = collect_garbage(store)
    assert done.compacted == [(run.id, 12, 0)]
    assert list_metrics(store, run.id).newest_manifest == 1
    assert lh.Api(store).run(run.id).history()["x"].tolist() == [float(s) for s in range(1, 13)]
    assert collect_garbage(store).compacted == []  # nothing left to do


def test_a_damaged_chunk_or_a_foreign_file_is_skipped_with_a_warning_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _session_that_never_compacts(monkeypatch)
    store = open_store(tmp_path / "store")
    run = lh.init("compaction", store=store, flush_interval=3600)
    for step in range(1, 4):
        run.global_step = step
        run.log({"x": float(step)})
        run.flush()
    run._compact = lambda **_: None  # type: ignore[method-assign]
    run.finish(close_run=False)
    chunks = list_metrics(store, run.id).chunks
    good = store.read(chunks[1].key)
    path = tmp_path / "store" / chunks[1].key
    path.write_bytes(good[: len(good) // 2])  # truncated
    (tmp_path / "store" / "runs" / run.id / "metrics" / "notes.txt").write_text("someone's notes")
    (tmp_path / "store" / "runs" / run.id / "metrics" / chunks[0].dir / "README").write_text("foreign")
    with pytest.warns(UserWarning, match=rf"skipped metric chunk .*{chunks[1].key.rsplit('/', 1)[1]}.*damaged"):
        frame = lh.Api(store).run(run.id).history()
    assert frame["x"].tolist() == [1.0, 3.0]


@pytest.mark.slow
def test_the_live_sessions_compaction_sends_two_requests_and_one_batched_delete(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its first (listing) compaction, a live session lists nothing: a PUT of the segment,
    the create of the manifest and, once covered chunks age past the grace period, one delete."""
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    store = open_store(
        f"s3://{BUCKET}/live-{os.urandom(3).hex()}",
        {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}},
    )
    try:
        run_id, session, per, rounds = "live0001", _session(), 2, 20
        compactor = Compactor(store, run_id, by=session)
        clock = [1e9]
        monkeypatch.setattr("launchhelm._metrics._compact.time.time", lambda: clock[0])
        costs, deleted = [], []
        number = 0
        for _round in range(rounds):
            for _ in range(32):  # one compaction's worth of the session's own chunks
                steps = range(number * per, (number + 1) * per)
                key = chunk_key(run_id, session, number, steps[0], steps[-1])
                blob = encode_chunk([(s, 0, 1e9 + s, {"x": float(s)}) for s in steps])
                store.create(key, blob)
                compactor.known[key] = blob
                number += 1
            proxy.reset()
            result = compactor.compact_live(only_if_due=False)
            costs.append(proxy.snapshot())
            assert result is not None and result.chunks == 32
            deleted.append(result.deleted)
            clock[0] += 300.0  # two compactions per grace period (600 s)
        # the first compaction lists; every later one sends no LIST and no GET
        assert any(what.startswith("GET") for what in costs[0])
        for cost in costs[1:]:
            assert not any(what.startswith(("GET", "HEAD")) for what in cost), cost
            puts = sum(n for what, n in cost.items() if what.startswith("PUT"))
            others = sum(n for what, n in cost.items() if not what.startswith("PUT"))
            # a merge writes only the merged segment: the L0 it folded in at once never reaches the store
            assert puts == 2 and others <= 1, cost  # others: the one batched delete (POST)
        assert sum(deleted) > 0
        # exactly what a reader sees: every point once, in order, and no covered chunk left past the grace
        values = _values(store, run_id)
        assert values == [float(s) for s in range(number * per)]
        listing = list_metrics(store, run_id)
        newest = read_manifest(store, run_id, listing.newest_manifest)
        assert not [c for c in listing.chunks if newest.covers(c) and c.number < number - 3 * 32]
        assert len(listing.manifests) <= 4  # the aged manifests were deleted
        named = {s.key for s in newest.segments}
        # segments no longer named wait for the next aged manifest: named by the newest aged one or later
        waiting = {s.key for m in [compactor._base, *(m for _, m, _ in compactor._published)] for s in m.segments}
        assert set(listing.segments) - named <= waiting
        assert len(set(listing.segments) - named) < 2 * FANOUT
    finally:
        proxy.close()


@pytest.mark.slow
def test_another_compactor_makes_the_live_session_list_again(store_url: str) -> None:
    store = open_store(store_url)
    run_id, session = "live0002", _session()
    compactor = Compactor(store, run_id, by=session)
    number = 0

    def write(count: int) -> None:
        nonlocal number
        for _ in range(count):
            key = chunk_key(run_id, session, number, number, number)
            blob = encode_chunk([(number, 0, 1e9 + number, {"x": float(number)})])
            store.create(key, blob)
            compactor.known[key] = blob
            number += 1

    write(40)
    compactor.compact_live(only_if_due=False)
    write(40)
    other = compact_run(store, run_id, by="compact")  # `launchhelm compact` meanwhile: manifest N+1 is theirs
    assert other is not None and other.chunks == 40
    write(40)
    with pytest.raises(lh.LaunchHelmError):
        compactor.compact_live(only_if_due=False)  # its create of N+1 loses: the live view is dropped
    assert compactor.compact_live(only_if_due=False) is not None  # lists, and covers the rest
    assert _values(store, run_id) == [float(s) for s in range(number)]
    listing = list_metrics(store, run_id)
    assert listing.uncovered(read_manifest(store, run_id, listing.newest_manifest)) == []
