"""The storage surface every backend must honour (local, memory, moto S3, fake-gcs-server, Azurite).

If these fail, users lose data or two processes both "win" a coordination
step: a run resumed twice, a score logged twice.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
from pathlib import Path

import pytest

import launchhelm as lh
from launchhelm.storage import (
    AlreadyExistsError,
    CoordinationUnsupportedError,
    LocalStore,
    ObjectNotFoundError,
    Store,
    open_store,
)


def test_create_then_read_roundtrips_every_byte(store_url: str) -> None:
    store = open_store(store_url)
    data = bytes(range(256)) * 17
    store.create("runs/r1/events/00000000000000000001.json", data)
    assert store.read("runs/r1/events/00000000000000000001.json") == data
    assert store.exists("runs/r1/events/00000000000000000001.json")


def test_create_refuses_an_existing_key_and_keeps_the_first_object(store_url: str) -> None:
    store = open_store(store_url)
    store.create("a/key", b"first")
    with pytest.raises(AlreadyExistsError) as info:
        store.create("a/key", b"second")
    assert isinstance(info.value, FileExistsError)
    assert "a/key" in str(info.value) and info.value.url is not None
    assert store.read("a/key") == b"first"


def test_read_of_a_missing_key_names_the_url(store_url: str) -> None:
    store = open_store(store_url)
    with pytest.raises(ObjectNotFoundError) as info:
        store.read("nope/missing.json")
    assert isinstance(info.value, FileNotFoundError)
    assert "nope/missing.json" in str(info.value)
    assert not store.exists("nope/missing.json")


def test_list_is_recursive_relative_and_sorted(store_url: str) -> None:
    store = open_store(store_url)
    for key in ["p/b/2", "p/a/1", "p/c", "q/x"]:
        store.create(key, b"x")
    assert store.list("p") == ["a/1", "b/2", "c"]
    assert store.list("p/") == ["a/1", "b/2", "c"]
    assert store.list("p/a") == ["1"]
    assert store.list("absent") == []
    assert store.list("") == ["p/a/1", "p/b/2", "p/c", "q/x"]


def test_put_replaces_and_delete_removes(store_url: str) -> None:
    store = open_store(store_url)
    store.put("s/heartbeat.json", b"1")
    store.put("s/heartbeat.json", b"2")
    assert store.read("s/heartbeat.json") == b"2"
    store.delete("s/heartbeat.json")
    assert not store.exists("s/heartbeat.json")
    store.delete("s/heartbeat.json")  # deleting what is gone is fine


def test_upload_and_download_stream_large_files(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url)
    src = tmp_path / "payload.bin"
    data = os.urandom(12 * 2**20 + 123)
    src.write_bytes(data)
    store.upload("artifacts/ck1/payload.bin", src)
    out = store.download("artifacts/ck1/payload.bin", tmp_path / "dl" / "payload.bin")
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert sorted(p.name for p in out.parent.iterdir()) == ["payload.bin"]  # no .part left behind
    src.write_bytes(b"other")
    with pytest.raises(AlreadyExistsError):
        store.upload("artifacts/ck1/payload.bin", src)
    assert len(store.read("artifacts/ck1/payload.bin")) == len(data)


def test_download_of_missing_key_leaves_no_file(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url)
    with pytest.raises(ObjectNotFoundError):
        store.download("absent.bin", tmp_path / "x.bin")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "../escape", "a/../b", "a/./b", "trailing/"])
def test_malformed_keys_are_refused_before_any_io(store_url: str, key: str) -> None:
    store = open_store(store_url)
    with pytest.raises(ValueError, match="invalid store key"):
        store.create(key, b"x")
    assert store.list("") == []


def test_atomic_backends_allow_coordination(store_url: str) -> None:
    store = open_store(store_url)
    assert store.atomic_create
    store.require_coordination("evaluation workers")


def test_a_backend_without_put_if_absent_is_refused_for_coordination() -> None:
    # fsspec's DirFileSystem has no conditional write: LaunchHelm must say so
    store = open_store("dir::memory://lh-no-cas")
    assert not store.atomic_create
    with pytest.raises(CoordinationUnsupportedError, match="evaluation workers needs a store with atomic"):
        store.require_coordination("evaluation workers")
    # a single writer can still keep runs there
    run = lh.init("plain", store=store)
    run.log({"x": 1.0})
    run.finish(close_run=False)
    assert lh.Api(store).run(run.id).history()["x"].tolist() == [1.0]
    with pytest.raises(CoordinationUnsupportedError, match="resuming a run"):
        lh.init("plain", resume=run.id, store=store)


def test_local_store_stages_inside_its_root_and_hides_staging(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    assert isinstance(store, LocalStore)
    store.create("k", b"v")
    assert (tmp_path / "s" / ".staging").is_dir()
    assert list((tmp_path / "s" / ".staging").iterdir()) == []  # no temp files left
    assert store.list("") == ["k"]


def test_store_urls_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAUNCHHELM_STORE", str(tmp_path / "env"))
    assert isinstance(open_store(), LocalStore) and open_store().url == str(tmp_path / "env")
    monkeypatch.delenv("LAUNCHHELM_STORE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert open_store().url == str(tmp_path / "home" / ".launchhelm")
    file_store = open_store(f"file://{tmp_path}/f")
    assert isinstance(file_store, LocalStore) and file_store.root == tmp_path / "f"
    same: Store = open_store("memory://x")
    assert open_store(same) is same
    with pytest.raises(lh.StorageError, match="nosuchproto"):
        open_store("nosuchproto://bucket")


# -- the race -----------------------------------------------------------

ROUNDS = 100
WRITERS = 8


def _payload(writer: int, round_: int) -> bytes:
    body = f"{writer}:{round_}:".encode() + os.urandom(48 * 1024)
    return hashlib.sha256(body).digest() + body


def _check(blob: bytes) -> int:
    """The writer of an intact payload; raises on a torn or partial one."""
    digest, body = blob[:32], blob[32:]
    if hashlib.sha256(body).digest() != digest:
        raise AssertionError(f"partial or torn object of {len(blob)} bytes")
    return int(body.split(b":", 1)[0])


def _writer(
    url: str, writer: int, barrier: threading.Barrier, results: list[tuple[int, int, int]] | None, queue: object = None
) -> None:
    store = open_store(url)
    wins = []
    for r in range(ROUNDS):
        blob = _payload(writer, r)
        barrier.wait(timeout=60)
        try:
            store.create(f"race/{r:04d}", blob)
            wins.append((r, writer, len(blob)))
        except AlreadyExistsError:
            pass
    if queue is not None:
        queue.put(wins)  # type: ignore[attr-defined]
    else:
        assert results is not None
        results.extend(wins)


def _reader(url: str, stop: object, queue: object) -> None:
    store = open_store(url)
    seen = 0
    bad = []
    while not stop.is_set():  # type: ignore[attr-defined]
        for name in store.list("race"):
            try:
                _check(store.read(f"race/{name}"))
                seen += 1
            except AssertionError as exc:
                bad.append(f"{name}: {exc}")
    queue.put((seen, bad))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_eight_writers_race_for_each_key_and_exactly_one_wins(store_url: str) -> None:
    store = open_store(store_url)
    if store_url.startswith("memory://"):
        # memory:// lives in one process: race threads instead of processes
        tbarrier = threading.Barrier(WRITERS)
        results: list[tuple[int, int, int]] = []
        threads = [threading.Thread(target=_writer, args=(store_url, w, tbarrier, results)) for w in range(WRITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        reads, bad = len(results), []
    else:
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(WRITERS)
        queue = ctx.Queue()
        stop = ctx.Event()
        reader_queue = ctx.Queue()
        reader = ctx.Process(target=_reader, args=(store_url, stop, reader_queue))
        procs = [ctx.Process(target=_writer, args=(store_url, w, barrier, None, queue)) for w in range(WRITERS)]
        reader.start()
        for p in procs:
            p.start()
        results = [win for _ in procs for win in queue.get(timeout=240)]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        stop.set()
        reads, bad = reader_queue.get(timeout=60)
        reader.join(30)
    winners: dict[int, list[int]] = {}
    for r, w, _ in results:
        winners.setdefault(r, []).append(w)
    assert sorted(winners) == list(range(ROUNDS)), "some rounds had no winner"
    doubles = {r: ws for r, ws in winners.items() if len(ws) != 1}
    assert not doubles, f"rounds with more than one winner: {doubles}"
    for r, ws in winners.items():
        assert _check(store.read(f"race/{r:04d}")) == ws[0], f"round {r} holds another writer's object"
    assert not bad, f"a reader saw partial objects: {bad[:5]}"
    assert reads > 0
