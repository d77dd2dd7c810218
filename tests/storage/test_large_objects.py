"""Large objects: streamed in parts, retried part by part, all or nothing.

If these fail, a multi-GB checkpoint save holds GBs of memory, a flaky
network loses a save, a failed or killed save leaves a half object (or an
open S3 multipart upload billed forever), or two uploads of one key both win.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
from gcs_finalize_proxy import GcsFinalizeProxy
from lhtest import BUCKET, ROOT, FaultyS3Proxy, child_env, make_store_url

from launchhelm.storage import AlreadyExistsError, ObjectStore, StorageError, Store, open_store
from launchhelm.storage._transfer import PART_SIZE

OBJECT_BACKENDS = ["s3", "gcs", "azure"]


@pytest.fixture(params=OBJECT_BACKENDS)
def object_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return make_store_url(request.param, tmp_path, request)


def _multipart_uploads(store: Store) -> list[dict[str, object]]:
    """Open S3 multipart uploads under the store's prefix, asked of moto directly."""
    import boto3

    assert isinstance(store, ObjectStore)
    prefix = store.root.split("/", 1)[1]
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    return list(client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix + "/").get("Uploads", []))


def _blocks(n: int, seed: int = 0, at_least: int = 0) -> list[bytes]:
    """Writes of awkward sizes, as torch.save makes them (small records, big tensors)."""
    rng = __import__("random").Random(seed)
    sizes = [rng.choice([7, 4096, 100_000, 3 * 2**20, 9 * 2**20 + 5]) for _ in range(n)]
    while sum(sizes) <= at_least:
        sizes.append(rng.choice([4096, 9 * 2**20 + 5]))
    return [os.urandom(s) for s in sizes]


def _part_bytes(store: Store) -> int:
    """The size of this store's upload parts (32 MiB GCS chunks, else 8 MiB)."""
    upload = store._part_upload("probe") if isinstance(store, ObjectStore) else None
    return int(upload.part_bytes) if upload is not None else PART_SIZE


@pytest.mark.slow
def test_writer_streams_parts_and_the_object_appears_only_at_the_end(store_url: str) -> None:
    store = open_store(store_url)
    part = _part_bytes(store)
    blocks = _blocks(12, at_least=3 * part)
    digest = hashlib.sha256()
    with store.writer("runs/r/artifacts/a/model.pt") as f:
        for block in blocks:
            f.write(block)
            digest.update(block)
            if not store_url.startswith("gs://"):  # fake-gcs-server shows resumable uploads early
                assert not store.exists("runs/r/artifacts/a/model.pt")
    data = store.read("runs/r/artifacts/a/model.pt")
    assert len(data) == sum(map(len, blocks)) > 3 * part
    assert hashlib.sha256(data).digest() == digest.digest()
    with pytest.raises(AlreadyExistsError), store.writer("runs/r/artifacts/a/model.pt") as f:
        f.write(b"late")
    assert store.read("runs/r/artifacts/a/model.pt") == data


def test_an_exception_inside_the_writer_leaves_no_object(store_url: str) -> None:
    store = open_store(store_url)
    with pytest.raises(RuntimeError, match=r"torch\.save failed"), store.writer("a/model.pt") as f:
        for block in _blocks(6, seed=1):
            f.write(block)
        raise RuntimeError("torch.save failed")
    assert not store.exists("a/model.pt")
    assert store.list("a") == []
    if store_url.startswith("s3://"):
        assert _multipart_uploads(store) == []  # aborted, not leaked
    store.create("a/model.pt", b"the key is still free")


def test_small_objects_skip_multipart(object_store_url: str) -> None:
    store = open_store(object_store_url)
    with store.writer("small.bin") as f:
        f.write(b"x" * 1000)
    assert store.read("small.bin") == b"x" * 1000
    if object_store_url.startswith("s3://"):
        assert _multipart_uploads(store) == []


# GCS: fake-gcs-server ignores ifGenerationMatch on resumable uploads; the test below puts a
# proxy in front of it that ends each resumable session with a conditional multipart upload.
@pytest.mark.parametrize("object_store_url", ["s3", "azure"], indirect=True)
def test_a_lost_race_at_commit_keeps_the_winner_and_leaks_nothing(object_store_url: str) -> None:
    store = open_store(object_store_url)
    azure = object_store_url.startswith("az://")
    with pytest.raises(AlreadyExistsError), store.writer("k/model.pt") as f:
        if azure:
            # Azurite refuses a put-if-absent while our staged blocks hold the name, so
            # the other writer must land before our first block to win (race seen in CI)
            store.create("k/model.pt", b"the other writer won")
        f.write(os.urandom(PART_SIZE + 10))
        if not azure:
            store.create("k/model.pt", b"the other writer won")  # lands while our parts are in flight
        f.write(os.urandom(PART_SIZE))
    assert store.read("k/model.pt") == b"the other writer won"
    if object_store_url.startswith("s3://"):
        assert _multipart_uploads(store) == []
    else:
        assert store.incomplete_uploads() == []


@pytest.mark.slow
def test_gcs_a_lost_race_at_the_last_chunk_keeps_the_winner_and_ends_the_session(gcs_endpoint: str) -> None:
    # fake-gcs-server checks the precondition of the whole upload when the last chunk arrives,
    # as GCS does, through GcsFinalizeProxy (gcs_finalize_proxy.py); a real bucket needs no proxy
    proxy = GcsFinalizeProxy(int(gcs_endpoint.rsplit(":", 1)[1]))
    prefix = f"finalize-{os.urandom(3).hex()}"
    try:
        store = open_store(f"gs://{BUCKET}/{prefix}", {"endpoint_url": proxy.endpoint, "token": "anon"})
        chunk = _part_bytes(store)
        data = os.urandom(2 * chunk + 5)
        with store.writer("k/alone.pt") as f:  # uncontested: three chunks, one session
            f.write(data)
        assert store.read("k/alone.pt") == data
        assert proxy.started == [(f"{prefix}/k/alone.pt", "0")] and proxy.finals == [200]

        direct = open_store(f"gs://{BUCKET}/{prefix}")  # the other writer, straight to the emulator
        with pytest.raises(AlreadyExistsError, match=r"k/model\.pt"), store.writer("k/model.pt") as f:
            f.write(os.urandom(chunk + 10))  # the first chunk goes out
            direct.create("k/model.pt", b"the other writer won")
            f.write(os.urandom(chunk))
        assert proxy.started[-1] == (f"{prefix}/k/model.pt", "0")  # create-only from the start
        assert proxy.finals == [200, 412]  # refused when it ended
        assert direct.read("k/model.pt") == b"the other writer won"
        assert proxy.open_sessions() == []
        with pytest.raises(AlreadyExistsError):  # and a later small create is refused too
            store.create("k/model.pt", b"late")
    finally:
        proxy.close()


def test_list_info_reports_sizes_and_recent_times(store_url: str) -> None:
    store = open_store(store_url)
    before = time.time() - 120
    store.create("p/a", b"12345")
    with store.writer("p/b/c") as f:
        f.write(b"x" * 70_000)
    infos = store.list_info("p")
    assert [(i.key, i.size) for i in infos] == [("a", 5), ("b/c", 70_000)]
    for info in infos:
        if info.modified is not None or not store_url.startswith("memory://"):
            assert info.modified is not None and before < info.modified < time.time() + 120


@pytest.mark.slow
def test_download_in_parallel_ranges_restores_every_byte(object_store_url: str, tmp_path: Path) -> None:
    store = open_store(object_store_url)
    data = os.urandom(3 * PART_SIZE + 999)  # downloads come in 8 MiB ranges on every backend
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    store.upload("big.bin", src)
    out = store.download("big.bin", tmp_path / "back" / "big.bin")
    assert out.read_bytes() == data


# -- S3: failed parts --------------------------------------------------------------
def _through_proxy(moto_endpoint: str, prefix: str, **faults: object) -> tuple[FaultyS3Proxy, Store]:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    proxy = FaultyS3Proxy(port, **faults)  # type: ignore[arg-type]
    store = open_store(
        f"s3://{BUCKET}/{prefix}",
        {
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"},
            "config_kwargs": {"retries": {"max_attempts": 1}},
        },
    )
    return proxy, store


@pytest.mark.slow
def test_a_failed_part_is_sent_again(moto_endpoint: str) -> None:
    proxy, store = _through_proxy(
        moto_endpoint,
        f"part-retry-{os.urandom(3).hex()}",
        status=503,
        code="SlowDown",
        failures=2,
        match="partNumber=2",
    )
    try:
        data = os.urandom(3 * PART_SIZE + 1)
        with store.writer("m.pt") as f:
            f.write(data)
        assert proxy.injected == 2
        assert store.read("m.pt") == data
        assert _multipart_uploads(store) == []
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_part_that_keeps_failing_aborts_the_upload(moto_endpoint: str) -> None:
    proxy, store = _through_proxy(
        moto_endpoint,
        f"part-fail-{os.urandom(3).hex()}",
        status=500,
        code="InternalError",
        failures=10**6,
        match="partNumber=2",
    )
    try:
        with pytest.raises(StorageError, match=r"m\.pt"), store.writer("m.pt") as f:
            for _ in range(4):
                f.write(os.urandom(PART_SIZE))
        assert proxy.injected >= 3
        assert not store.exists("m.pt")
        assert _multipart_uploads(store) == []  # aborted: nothing billed, nothing for gc
    finally:
        proxy.close()


@pytest.mark.serial  # its proxy times parts out: under a loaded machine it timed out
def test_an_upload_sends_no_more_parts_at_once_than_it_was_allowed(moto_endpoint: str, tmp_path: Path) -> None:
    """The compactor uploads with two parts in flight: its memory budget counts them."""
    proxy, store = _through_proxy(
        moto_endpoint,
        f"part-limit-{os.urandom(3).hex()}",
        status=500,
        code="InternalError",
        failures=0,
        match="partNumber=",
    )
    try:
        proxy.hold_puts_s = 0.3  # long enough that parts sent together are seen together
        data = os.urandom(6 * PART_SIZE + 1)
        (tmp_path / "seg.parquet").write_bytes(data)
        store.upload("limited.bin", tmp_path / "seg.parquet", max_concurrency=2)
        assert proxy.most_puts_in_flight == 2
        proxy.most_puts_in_flight = 0
        store.upload("default.bin", tmp_path / "seg.parquet")
        assert proxy.most_puts_in_flight > 2  # the backend's own (4), which the limit lowered
        assert store.read("limited.bin") == data
        assert store.read("default.bin") == data
        assert _multipart_uploads(store) == []
    finally:
        proxy.close()


@pytest.mark.slow
def test_an_upload_holds_no_copy_of_a_part_beyond_the_parts_themselves(object_store_url: str, tmp_path: Path) -> None:
    """Parts go to aiohttp as files: given bytes, it copied each part twice more while in flight.

    On S3 through s3fs, on GCS through gcsfs's resumable PUTs, on Azure through the SDK's
    ``stage_block`` (whose ``bytes(bytearray)`` made a third).
    """
    import tracemalloc

    store = open_store(object_store_url)
    assert isinstance(store, ObjectStore)
    part = _part_bytes(store)
    upload = store._part_upload("probe")
    assert upload is not None
    in_flight = min(2, upload.concurrency)
    (tmp_path / "seg.parquet").write_bytes(os.urandom(6 * part + 1))
    store.upload("warm.bin", tmp_path / "seg.parquet", max_concurrency=2)  # imports and connections first
    tracemalloc.start()
    try:
        store.upload("seg.bin", tmp_path / "seg.parquet", max_concurrency=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the parts in flight, one waiting for a slot, one being filled; with the copies it was
    # 7-8 parts on S3 and Azure (2 in flight) and 4.9 on GCS (1 in flight)
    assert peak < (in_flight + 3) * part, peak / part
    assert store.read("seg.bin") == (tmp_path / "seg.parquet").read_bytes()


# -- leftovers of killed uploads ------------------------------------------------------
def test_incomplete_uploads_are_listed_and_aborted(object_store_url: str) -> None:
    store = open_store(object_store_url)
    assert isinstance(store, ObjectStore)
    upload = store._part_upload("runs/r/artifacts/x/model.pt")
    upload.begin()
    upload.put_part(1, 0, os.urandom(PART_SIZE))
    found = store.incomplete_uploads()
    if object_store_url.startswith("gs://"):
        assert found == []  # GCS sessions cannot be listed; they expire and are never objects
        upload.abort()
        return
    assert [u.key for u in found] == ["runs/r/artifacts/x/model.pt"]
    assert found[0].started is not None
    if not object_store_url.startswith("s3://"):  # moto reports every upload as initiated in 2010
        assert abs(found[0].started - time.time()) < 600
    store.abort_upload(found[0])
    assert store.incomplete_uploads() == []
    assert not store.exists("runs/r/artifacts/x/model.pt")


def test_local_staging_leftovers_count_as_incomplete_uploads(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    store.create("k", b"v")
    (tmp_path / "s" / ".staging" / "123-dead.tmp").write_bytes(b"half")
    found = store.incomplete_uploads()
    assert [u.upload_id for u in found] == ["123-dead.tmp"]
    store.abort_upload(found[0])
    assert store.incomplete_uploads() == []


# -- progress bars ------------------------------------------------------------------------
def test_progress_in_a_log_is_one_line_per_long_transfer_and_can_be_silenced(
    store_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """stderr is a file here (pytest's capture), as in a batch job: never a bar's ``\\r`` states. A large
    transfer nobody waited on writes nothing; one that lasted the delay writes one line when it ends; a
    small, a failed or a silenced one nothing. (The bar itself, on a terminal: tests/torch/test_progress_bars.py.)
    """
    monkeypatch.setenv("LAUNCHHELM_PROGRESS_MIN_MB", "1")  # "large" = 1 MB here
    monkeypatch.delenv("LAUNCHHELM_PROGRESS", raising=False)
    # a transfer over before the delay (2 s by default; a minute here, whatever the machine's load) says nothing
    monkeypatch.setenv("LAUNCHHELM_PROGRESS_DELAY", "60")
    store = open_store(store_url)
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(3 * 2**20))
    store.upload("big", src)
    store.download("big", tmp_path / "back.bin")
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("LAUNCHHELM_PROGRESS_DELAY", "0")  # from here every transfer counts as waited on
    store.upload("big2", src)
    store.download("big", tmp_path / "back2.bin")
    with store.writer("streamed/model.pt") as f:
        f.write(os.urandom(2 * 2**20))
    err = capfd.readouterr().err
    assert "\r" not in err, err
    lines = err.splitlines()
    assert [line.split(": ")[1] for line in lines] == ["upload payload.bin", "download back2.bin", "save model.pt"]
    assert lines[0].startswith("launchhelm: upload payload.bin: 3.0 MiB in ") and lines[0].endswith("/s"), lines
    assert "save model.pt: 2.0 MiB in " in lines[2], lines
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 1000)
    store.upload("small", small)  # under the size
    store.upload("quiet", src, progress=False)
    with pytest.raises(RuntimeError), store.writer("failed/model.pt") as f:
        f.write(os.urandom(2 * 2**20))
        raise RuntimeError("the caller's block failed: the error says so, not a line about bytes")
    monkeypatch.setenv("LAUNCHHELM_PROGRESS", "0")
    store.download("big", tmp_path / "again.bin")
    with store.writer("streamed2") as f:
        f.write(os.urandom(2 * 2**20))
    assert capfd.readouterr().err == ""
    quiet = open_store(store_url, progress=False)
    monkeypatch.delenv("LAUNCHHELM_PROGRESS")
    quiet.download("big", tmp_path / "third.bin")
    assert capfd.readouterr().err == ""
    # True: every transfer, whatever its size and however short, still one line in a log
    store.download("small", tmp_path / "small-back.bin", progress=True)
    assert capfd.readouterr().err.splitlines()[0].startswith("launchhelm: download small-back.bin: 1000 B in ")


def _cell(client: object, code: str) -> list[dict[str, object]]:
    """Execute ``code`` in a real kernel; return the messages the cell sent to the notebook."""
    msg_id = client.execute(code)  # type: ignore[attr-defined]
    sent = []
    while True:
        msg = client.get_iopub_msg(timeout=60)  # type: ignore[attr-defined]
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            raise AssertionError("\n".join(msg["content"]["traceback"]))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return sent
        if msg["msg_type"] not in ("status", "execute_input"):
            sent.append(msg)


@pytest.mark.slow
def test_in_a_notebook_a_long_transfer_shows_a_widget_bar_and_a_short_one_nothing(tmp_path: Path) -> None:
    """A real Jupyter kernel (its stderr is ipykernel's stream, no terminal): tqdm's widget for a transfer
    that lasted the delay, nothing at all for one that did not."""
    manager_module = pytest.importorskip("jupyter_client.manager")
    pytest.importorskip("ipywidgets", reason="tqdm draws its notebook bar with ipywidgets")
    env = child_env(LAUNCHHELM_PROGRESS_MIN_MB="1")
    env.pop("LAUNCHHELM_PROGRESS", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    manager, client = manager_module.start_new_kernel(kernel_name="python3", env=env, cwd=str(ROOT))
    try:
        _cell(
            client,
            "import os\nfrom launchhelm.storage import open_store\n"
            f"store = open_store({str(tmp_path / 'store')!r})\n"
            f"src = {str(tmp_path / 'payload.bin')!r}\n"
            "open(src, 'wb').write(os.urandom(3 * 2**20))",
        )
        quick = _cell(client, "os.environ['LAUNCHHELM_PROGRESS_DELAY'] = '60'\nstore.upload('quick', src)")
        visible = [m for m in quick if m["msg_type"] in ("display_data", "stream")]
        assert visible == [], visible  # over before the delay: nothing shows in the notebook
        waited = _cell(client, "os.environ['LAUNCHHELM_PROGRESS_DELAY'] = '0'\nstore.upload('waited', src)")
        shown = [m for m in waited if m["msg_type"] == "display_data"]
        assert shown and "application/vnd.jupyter.widget-view+json" in shown[0]["content"]["data"], waited
        described = [m for m in waited if "payload.bin" in str(m["content"])]
        assert described, waited  # the widget's label ("upload payload.bin"), sent as its state
        assert not [m for m in waited if m["msg_type"] == "stream"], waited  # no text bar, no log line
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


STREAMER = """
import os, sys
from launchhelm.storage import open_store

def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

store = open_store(sys.argv[1])
block = os.urandom(4 * 2**20)
with store.writer("warm-up/model.pt") as f:  # client, threads and imports exist before the measure
    for _ in range(6):
        f.write(block)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
before = rss_kb("VmRSS")
with store.writer("big/model.pt") as f:
    for _ in range(64):  # 256 MiB, written the way torch.save writes a large tensor
        f.write(block)
print((rss_kb("VmHWM") - before) * 1024)
"""


@pytest.mark.slow
def test_streaming_a_large_object_keeps_memory_flat(moto_endpoint: str) -> None:
    from lhtest import run_python

    url = f"s3://{BUCKET}/rss-{os.urandom(3).hex()}"
    done = run_python(STREAMER, url, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    growth = int(done.stdout.split()[-1])
    # parts in flight (4) + the one filling, 8 MiB each: far below the 256 MiB written
    assert growth < 80 * 2**20, f"peak RSS grew by {growth / 2**20:.0f} MiB while streaming 256 MiB"
    assert len(open_store(url).read("big/model.pt")) == 256 * 2**20


# -- checksums sent with the upload ---------------------------------------------------------
def _crc64_b64(data: bytes) -> str:
    from launchhelm.storage._checksum import CRC64NVME, crc64nvme, header_value

    return header_value(CRC64NVME, crc64nvme(data))


@pytest.mark.slow
def test_s3_uploads_carry_a_crc64nvme_that_matches_the_bytes_sent(moto_endpoint: str) -> None:
    """Each part, the commit and a one-request object say their CRC64NVME, so S3 refuses a corrupted upload."""
    import boto3

    proxy, store = _through_proxy(
        moto_endpoint, f"crc-{os.urandom(3).hex()}", status=500, code="x", failures=0, match="-"
    )
    try:
        data = os.urandom(3 * PART_SIZE + 12345)
        with store.writer("big.pt") as f:
            for start in range(0, len(data), 3 * 2**20):
                f.write(data[start : start + 3 * 2**20])
        with store.writer("small.pt") as f:
            f.write(b"x" * 1000)
        parts = [(p, sums, crc) for m, p, sums, crc in proxy.forwarded if m == "PUT" and "partNumber=" in p]
        assert len(parts) == 4
        for _, sums, body_crc in parts:
            assert sums["x-amz-checksum-crc64nvme"] == body_crc  # what went out is what was checksummed
        (complete,) = [sums for m, p, sums, _ in proxy.forwarded if m == "POST" and "uploadId=" in p]
        assert complete["x-amz-checksum-crc64nvme"] == _crc64_b64(data)  # the whole object's, from the parts'
        assert complete.get("x-amz-checksum-type") == "FULL_OBJECT"
        (single,) = [sums for m, p, sums, _ in proxy.forwarded if m == "PUT" and p.split("?")[0].endswith("small.pt")]
        assert single["x-amz-checksum-crc64nvme"] == _crc64_b64(b"x" * 1000)
        client = boto3.client("s3", endpoint_url=moto_endpoint)
        assert isinstance(store, ObjectStore)
        head = client.head_object(Bucket=BUCKET, Key=f"{store.root.split('/', 1)[1]}/big.pt", ChecksumMode="ENABLED")
        assert head["ChecksumCRC64NVME"] == _crc64_b64(data) and head["ChecksumType"] == "FULL_OBJECT"
    finally:
        proxy.close()


@pytest.mark.slow
def test_moto_keeps_a_part_corrupted_in_transit_so_refusal_needs_a_real_bucket(moto_endpoint: str) -> None:
    """What the emulator enforces: moto 5.2 stores a part whose bytes do not match its CRC64NVME header.

    Real S3 answers such a part with 400 BadDigest (README: what needs a real
    bucket). If this starts failing, moto enforces it: test the refusal here.
    """
    proxy, store = _through_proxy(
        moto_endpoint, f"crc-bad-{os.urandom(3).hex()}", status=500, code="x", failures=0, match="partNumber=1"
    )
    proxy.corrupt_puts = 1
    try:
        data = os.urandom(2 * PART_SIZE + 1)
        with store.writer("m.pt") as f:
            f.write(data)
        sent = [sums for m, p, sums, _ in proxy.forwarded if "partNumber=1" in p]
        assert sent[0]["x-amz-checksum-crc64nvme"] == _crc64_b64(data[:PART_SIZE])  # the header was right
        assert store.read("m.pt") != data  # and moto kept the flipped byte anyway
    finally:
        proxy.close()


@pytest.mark.serial  # a large upload through the emulator: it timed out beside 6 workers
def test_gcs_uploads_carry_the_crc32c_of_their_bytes(gcs_endpoint: str) -> None:
    """fake-gcs-server computes its own CRC32C and ignores the one sent (tested: a wrong one is
    stored anyway), so the proxy checks what went out; real GCS refuses a mismatch (README)."""
    import base64
    import json

    from launchhelm.storage._checksum import CRC32C, crc32c, header_value

    port = int(os.environ["STORAGE_EMULATOR_HOST"].rsplit(":", 1)[1])
    proxy = FaultyS3Proxy(port, status=500, code="x", failures=0, match="-")
    try:
        store = open_store(
            f"gs://{BUCKET}/crc-{os.urandom(3).hex()}", {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}
        )
        part = _part_bytes(store)
        data = os.urandom(2 * part + 777)
        with store.writer("big.pt") as f:
            f.write(data)
        with store.writer("small.pt") as f:
            f.write(b"y" * 500)
        hashes = [sums.get("x-goog-hash") for m, _, sums, _ in proxy.forwarded if m == "PUT"]
        assert hashes[-1] == f"crc32c={header_value(CRC32C, crc32c(data))}"  # with the last chunk only
        assert [h for h in hashes[:-1] if h] == []
        (head,) = [
            h
            for (m, p, _, _), h in zip(proxy.forwarded, proxy.body_heads, strict=True)
            if m == "POST" and "uploadType=multipart" in p
        ]
        metadata = json.loads(head.split(b"\n\n", 1)[1].split(b"\n--==0==", 1)[0])
        assert metadata["crc32c"] == base64.b64encode(crc32c(b"y" * 500).to_bytes(4, "big")).decode()
        assert store.read("big.pt") == data and store.read("small.pt") == b"y" * 500
    finally:
        proxy.close()


def test_azure_refuses_a_block_damaged_in_transit(azurite_endpoint: str) -> None:
    """Each block goes with its Content-MD5 (Azure's per-request check); Azurite enforces it."""
    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    blob_endpoint = conn.split("BlobEndpoint=", 1)[1].split(";")[0]
    port = int(blob_endpoint.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    proxy = FaultyS3Proxy(port, status=500, code="x", failures=0, match="comp=block")
    proxy.corrupt_puts = 1
    try:
        proxied = conn.replace(f":{port}/", f":{proxy.port}/")
        store = open_store(f"az://{BUCKET}/md5-{os.urandom(3).hex()}", {"connection_string": proxied})
        with pytest.raises(StorageError, match=r"m\.pt"), store.writer("m.pt") as f:
            f.write(os.urandom(2 * PART_SIZE + 1))
        assert not store.exists("m.pt")
        md5s = [p for m, p, _, _ in proxy.forwarded if m == "PUT" and "comp=block" in p]
        assert md5s  # blocks were sent (and the damaged one refused)
        with store.writer("ok.pt") as f:  # undamaged: the same path works
            f.write(b"z" * 100)
        assert store.read("ok.pt") == b"z" * 100
    finally:
        proxy.close()


def test_fake_gcs_server_keeps_an_upload_whose_crc32c_does_not_match(gcs_endpoint: str, tmp_path: Path) -> None:
    """What the emulator enforces: nothing; it computes its own CRC32C. Real GCS answers 400 (README).

    If this starts failing, fake-gcs-server checks the CRC32C sent: test the refusal here.
    """
    from launchhelm.storage._backends import GCSPartUpload, gcs_create
    from launchhelm.storage._checksum import CRC32C, crc32c, header_value

    store = open_store(f"gs://{BUCKET}/crc-bad-{os.urandom(3).hex()}")
    assert isinstance(store, ObjectStore)
    data = os.urandom(1000)
    gcs_create(store.fs, store._path("small"), data, crc32c=header_value(CRC32C, crc32c(data) ^ 1))
    assert store.read("small") == data  # accepted with a wrong CRC32C
    upload = GCSPartUpload(store.fs, store._path("big"))
    upload.begin()
    chunk = os.urandom(upload.part_bytes)
    upload.put_part(1, 0, chunk)
    upload._crc32c ^= 1  # the last chunk then says a wrong whole-object CRC32C
    upload.finish([], 2, len(chunk), b"tail", len(chunk) + 4)
    assert store.read("big") == chunk + b"tail"


@pytest.mark.slow
def test_an_object_of_a_known_size_under_50_mib_goes_to_s3_as_one_put_with_its_crc64nvme(moto_endpoint: str) -> None:
    """s3fs's own threshold: a sharded checkpoint's objects under it cost one request each, not four."""
    import base64

    import boto3
    from http_proxy import RequestCounter

    from launchhelm.storage._checksum import crc64nvme

    prefix = f"one-put-{os.urandom(3).hex()}"
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    store = open_store(f"s3://{BUCKET}/{prefix}", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
    try:
        data = os.urandom(2 * PART_SIZE + 12_345)  # past a part: without the size, a multipart upload
        proxy.reset()
        with store.writer("known.bin", size=len(data)) as f:
            for start in range(0, len(data), 1 << 20):
                f.write(data[start : start + (1 << 20)])
        methods = {request.split()[0] for request in proxy.snapshot()}
        assert "POST" not in methods and proxy.snapshot()[f"PUT /{BUCKET}/{prefix}"] == 1, proxy.snapshot()
        assert proxy.total == 1, proxy.snapshot()  # no look first: the conditional PUT is the check
        with pytest.raises(AlreadyExistsError, match=r"known\.bin"), store.writer("known.bin", size=3) as f:
            f.write(b"new")  # the key is taken: refused by the PUT, the object kept
        assert store.read("known.bin") == data
        head = boto3.client("s3", endpoint_url=moto_endpoint).head_object(
            Bucket=BUCKET, Key=f"{prefix}/known.bin", ChecksumMode="ENABLED"
        )
        assert head["ChecksumCRC64NVME"] == base64.b64encode(crc64nvme(data).to_bytes(8, "big")).decode()
        assert store.read("known.bin") == data

        proxy.reset()
        with store.writer("unknown.bin") as f:
            f.write(data)
        assert proxy.snapshot()[f"POST /{BUCKET}/{prefix}"] >= 2, proxy.snapshot()  # create and complete
        assert store.read("unknown.bin") == data

        # a caller that said too little: parts after all, the object still whole and exact
        with store.writer("wrong.bin", size=PART_SIZE // 2) as f:
            f.write(data[:1000])
            f.write(data[1000:])
        assert store.read("wrong.bin") == data
        # and one that wrote less than it said: one PUT of what it wrote
        with store.writer("short.bin", size=len(data)) as f:
            f.write(data[:5000])
        assert store.read("short.bin") == data[:5000]
        assert _multipart_uploads(store) == []
    finally:
        proxy.close()


def test_listing_a_prefix_on_s3_is_one_request_empty_or_not(moto_endpoint: str) -> None:
    """s3fs alone follows an empty listing with a HEAD and a second listing; a store lists once."""
    from http_proxy import RequestCounter

    prefix = f"list-{os.urandom(3).hex()}"
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    store = open_store(f"s3://{BUCKET}/{prefix}", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
    try:
        store.create("rules/a/1.json", b"{}")
        store.create("rules/ab", b"not under rules/a/")
        store.create("rules/a", b"an object named as the prefix: not listed under it")
        assert store.list("warm-up") == []  # the store's first empty answer also checks the bucket, once
        for listed, expected in (("rules/none", []), ("rules/a", ["1.json"])):
            proxy.reset()
            assert store.list(listed) == expected
            assert proxy.total == 1, (listed, proxy.snapshot())
    finally:
        proxy.close()


def _losing_the_last_answer(upload: Any, lost: list[str], removed: bool) -> Any:
    """``upload._put`` whose last chunk reaches GCS but whose answer never comes back (``lost`` says it
    was sent); with ``removed``, the object is gone again before the chunk is sent a second time."""
    import aiohttp

    real_put = upload._put

    def put(offset: int, chunk: bytes, total: str, extra: dict[str, str] | None = None) -> object:
        out = real_put(offset, chunk, total, extra)
        if total != "*" and not lost:  # the last chunk: made the object; its answer never came
            lost.append(total)
            if removed:
                upload.fs.rm(upload.path)
            raise aiohttp.ServerDisconnectedError()
        return out

    return put


def test_a_last_gcs_chunk_sent_again_after_its_answer_was_lost_ends_the_upload(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The last chunk reached GCS and the object was made, but its answer was lost (a reset connection
    under load): sent again, it finds the session gone (404). The upload is done, not failed, when the
    object at the key has the bytes sent; when it has not (removed meanwhile), the upload fails."""
    store = open_store(make_store_url("gcs", tmp_path, request))
    assert isinstance(store, ObjectStore)
    data = os.urandom(2 * _part_bytes(store) + 7)
    (tmp_path / "seg.bin").write_bytes(data)
    for key, removed in (("done.bin", False), ("gone.bin", True)):
        upload = store._part_upload(key)
        assert upload is not None
        lost: list[str] = []
        upload._put = _losing_the_last_answer(upload, lost, removed)  # type: ignore[attr-defined]
        store._part_upload = lambda _key, upload=upload: upload  # type: ignore[method-assign]
        try:
            if removed:
                with pytest.raises(StorageError):
                    store.upload(key, tmp_path / "seg.bin")
            else:
                store.upload(key, tmp_path / "seg.bin")
        finally:
            del store._part_upload
        assert lost == [str(len(data))], "the last chunk was not sent"
        assert store.exists(key) is not removed
        if not removed:
            assert store.read(key) == data
