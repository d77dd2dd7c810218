"""The store reached through a process of its own (issue 40, docs/storage.md "The store's client in the helper").

Each test starts the real server process (``HelperStore.start``) on a real backend (a local folder,
moto S3 over HTTP) and checks the client behaves as the store itself does: same bytes, same error
classes, many requests in flight, files rather than bytes for transfers, and a server that is gone
answered by an error, never a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from lhtest import BUCKET, child_env, helper_pids, make_store_url, store_processes

from launchhelm import AlreadyExistsError, ObjectNotFoundError, StoreUnreachableError
from launchhelm.storage import open_store
from launchhelm.storage._remote import HelperStore, helper_store_wanted


@pytest.fixture(
    params=["local", "s3", pytest.param("gcs", marks=pytest.mark.slow), pytest.param("azure", marks=pytest.mark.slow)]
)
def remote(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    url = make_store_url(request.param, tmp_path, request)
    store = HelperStore.start(url)
    yield store, url
    store.close()


def test_every_operation_answers_as_the_store_itself(remote, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store, url = remote
    direct = open_store(url)
    assert (store.protocol, store.atomic_create) == (direct.protocol, direct.atomic_create)
    blob = bytes(range(256)) * 64
    store.create("a/one.bin", blob)
    assert direct.read("a/one.bin") == blob and store.read("a/one.bin") == blob
    with pytest.raises(AlreadyExistsError):
        store.create("a/one.bin", b"second")
    assert direct.read("a/one.bin") == blob  # the first writer's object is kept
    store.put("a/two.json", b"{}")
    store.put("a/two.json", b'{"v": 2}')
    assert store.read("a/two.json") == b'{"v": 2}'
    assert store.read_range("a/one.bin", 256, 260) == bytes(range(4))
    assert store.exists("a/one.bin") and not store.exists("a/none")
    assert store.list("a") == direct.list("a") == ["one.bin", "two.json"]
    infos = store.list_info("a")
    assert [(i.key, i.size) for i in infos] == [("one.bin", len(blob)), ("two.json", 8)]
    assert [i.version for i in infos] == [i.version for i in direct.list_info("a")]
    many = store.read_many(["a/one.bin", "a/none", "a/two.json"])
    assert many == {"a/one.bin": blob, "a/none": None, "a/two.json": b'{"v": 2}'}
    with pytest.raises(ObjectNotFoundError, match="a/none"):
        store.read("a/none")
    with pytest.raises(ObjectNotFoundError):
        direct.read("a/none")  # the same class the store raises itself
    store.delete("a/two.json")
    store.delete_many(["a/one.bin"])
    assert direct.list("a") == []


def test_transfers_name_files_and_stream_every_byte(remote, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store, url = remote
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(3 << 20) * 4)  # 12 MiB
    store.upload("ckpt/big.bin", source)
    with pytest.raises(AlreadyExistsError):
        store.upload("ckpt/big.bin", source)
    back = store.download("ckpt/big.bin", tmp_path / "out" / "big.bin")
    assert back.read_bytes() == source.read_bytes()
    store.staging = str(tmp_path)
    with store.writer("ckpt/streamed.bin", size=5 << 20) as f:
        for _ in range(5):
            f.write(b"\x07" * (1 << 20))
    assert open_store(url).read("ckpt/streamed.bin") == b"\x07" * (5 << 20)
    assert not list(tmp_path.glob(".launchhelm-put-*"))  # the staged file is gone
    with pytest.raises(RuntimeError, match="in the block"), store.writer("ckpt/failed.bin") as f:
        f.write(b"partial")
        raise RuntimeError("in the block")
    assert not open_store(url).exists("ckpt/failed.bin")  # a failed block leaves no object
    with pytest.raises(ObjectNotFoundError):
        store.download("ckpt/none.bin", tmp_path / "none.bin")
    assert not (tmp_path / "none.bin").exists()


def test_many_threads_have_requests_in_flight_at_once(remote) -> None:  # type: ignore[no-untyped-def]
    store, url = remote
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for i in range(20):
                store.create(f"race/{i:03d}", f"{w}".encode())  # one winner per key among 8 writers
        except AlreadyExistsError:
            pass
        except BaseException as exc:  # anything else fails the test
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(20):
                store.list("race")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    keys = open_store(url).list("race")
    assert keys, keys  # at least the first writer's keys, each written once
    assert all(len(open_store(url).read(f"race/{k}")) == 1 for k in keys)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_server_that_is_gone_leaves_the_requests_to_this_process(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    url = make_store_url(backend, tmp_path, request)
    store = HelperStore.start(url)
    store.create("x", b"1")
    assert store.process is not None
    os.kill(store.process.pid, signal.SIGKILL)
    store.process.wait(10)
    with caplog.at_level("WARNING", logger="launchhelm"):
        assert store.read("x") == b"1"  # made here now: nothing lost, no error to the caller
        store.create("y", b"2")
        with pytest.raises(AlreadyExistsError):
            store.create("y", b"other")  # a plain refusal stays one
        assert sorted(store.list("")) == ["x", "y"]
    gone = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
    assert len(gone) == 1 and "reaches the store itself" in gone[0], gone  # one line, not one per request
    assert open_store(url).read("y") == b"2"
    store.close()


def test_a_schedulers_notices_leave_the_store_process_serving(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SLURM signals every process of a job step: the training process's preemption save still needs the store."""
    store = HelperStore.start(str(tmp_path / "store"))
    assert store.process is not None
    for notice in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
        os.kill(store.process.pid, notice)
    time.sleep(0.5)
    with caplog.at_level("WARNING", logger="launchhelm"):
        store.create("after", b"notices")
    assert store.process.poll() is None and not caplog.records, caplog.records  # served there, not here
    store.close()
    assert store.process.returncode == 0 and (tmp_path / "store" / "after").read_bytes() == b"notices"


def test_a_request_the_dead_process_may_have_done_is_found_to_be_ours(tmp_path: Path) -> None:
    """A create in hand when the process died: its retry here finds the object; the same bytes are ours (as a
    store's own retries decide after a lost answer), other bytes are another writer's."""
    url = str(tmp_path / "store")
    store = HelperStore.start(url)
    assert store.process is not None
    os.kill(store.process.pid, signal.SIGKILL)
    store.process.wait(10)
    open_store(url).create("mine", b"sent")  # what the dead process did before its answer was lost
    open_store(url).create("theirs", b"another writer's")
    assert store._elsewhere({"op": "create", "key": "mine"}, b"sent", ambiguous=True) == ({}, b"")
    with pytest.raises(AlreadyExistsError):
        store._elsewhere({"op": "create", "key": "theirs"}, b"sent", ambiguous=True)
    with pytest.raises(AlreadyExistsError):  # not in flight when it died: a refusal is a refusal
        store._elsewhere({"op": "create", "key": "mine"}, b"sent", ambiguous=False)
    source = tmp_path / "ckpt.bin"
    source.write_bytes(b"\x01" * 1000)
    open_store(url).upload("ckpt/a1.bin", source)
    assert store._elsewhere({"op": "upload", "key": "ckpt/a1.bin", "path": str(source)}, b"", ambiguous=True) == (
        {},
        b"",
    )
    store.close()


def test_a_store_that_cannot_be_reached_fails_the_start_with_the_same_error(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(StoreUnreachableError) as direct:
        open_store(f"s3://{BUCKET}/x")
    with pytest.raises(StoreUnreachableError) as through:
        HelperStore.start(f"s3://{BUCKET}/x")
    assert str(through.value) == str(direct.value)


def test_closing_ends_the_servers_process(tmp_path: Path) -> None:
    store = HelperStore.start(str(tmp_path / "store"))
    process = store.process
    assert process is not None and process.poll() is None
    store.close()
    assert process.returncode == 0


_NO_CLIENT = textwrap.dedent(
    """
    import sys
    from launchhelm.storage._remote import HelperStore
    store = HelperStore.start(sys.argv[1])
    store.create("k", b"v")
    assert store.read("k") == b"v" and store.list("") == ["k"]
    store.close()
    print(sorted(m for m in ("s3fs", "aiobotocore", "botocore", "aiohttp", "gcsfs", "adlfs") if m in sys.modules))
    """
)


def test_the_client_process_imports_no_object_store_client(moto_endpoint: str) -> None:
    url = f"s3://{BUCKET}/noclient-{os.urandom(3).hex()}"
    out = subprocess.run(
        [sys.executable, "-c", _NO_CLIENT, url], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert open_store(url).read("k") == b"v"


def test_only_object_stores_are_reached_through_a_process_and_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LAUNCHHELM_HELPER_STORE", raising=False)
    assert not helper_store_wanted("s3://b/p")
    monkeypatch.setenv("LAUNCHHELM_HELPER_STORE", "1")
    assert helper_store_wanted("s3://b/p") and helper_store_wanted("gs://b/p") and helper_store_wanted("az://c/p")
    assert not helper_store_wanted("/home/me/.launchhelm") and not helper_store_wanted("file:///x")
    assert not helper_store_wanted("memory://x")


def test_an_init_that_fails_ends_the_stores_process(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import launchhelm as lh

    monkeypatch.setenv("LAUNCHHELM_HELPER_STORE", "1")

    def serving() -> set[int]:  # a store's process, or (LAUNCHHELM_HELPER_STORE=1) the session's helper serving it
        return set(store_processes(os.getpid())) | set(helper_pids(os.getpid()))

    before = serving()
    with pytest.raises(lh.RunNotFoundError):
        lh.init("p", store=f"s3://{BUCKET}/failed-{os.urandom(3).hex()}", resume="nosuchrun0")
    deadline = time.monotonic() + 10
    while serving() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not serving() - before, "the store's process outlived the init that failed"
