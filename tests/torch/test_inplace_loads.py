"""Loads that write a checkpoint's tensor bytes straight into the watched model and optimizer.

If these fail, a resume costs several times a read of the file (fresh memory,
then a copy), a checkpoint whose tensors changed shape or dtype no longer
loads, or a corrupted file trains on silently.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import pickle
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch_helpers import build_model, payload_path, same_tensors, snapshot_state, train_steps

import launchhelm as lh
import launchhelm.torch as lht
from launchhelm._runlog._sessions import summary_key
from launchhelm.torch import _inplace, _ranged
from launchhelm.torch._inplace import _pagecache, _plan, _reads, _zip


def _saved_then_trained_on(
    tmp_path: Path, extra: object = None
) -> tuple[str, lht.TorchRun, torch.nn.Module, torch.optim.Optimizer, list[torch.Tensor], str]:
    """A run on a local store that saved a checkpoint (with ``extra``) after 2 steps and trained a
    third: (store, run, model, optimizer, the state saved, the checkpoint's id)."""
    store_url = str(tmp_path / "store")
    model, optimizer = build_model()
    tr = lht.init("inplace", store=store_url)
    tr.watch(model, optimizer)
    train_steps(model, optimizer, 2)
    saved = snapshot_state(model, optimizer)
    artifact = tr.save_checkpoint(extra=extra)
    assert artifact is not None
    train_steps(model, optimizer, 1)
    assert not same_tensors(saved, snapshot_state(model, optimizer))
    return store_url, tr, model, optimizer, saved, artifact


@pytest.fixture
def disk_dir() -> Iterator[Path]:
    """A folder on the repository's disk (not a tmpfs, which nothing can evict), removed afterwards."""
    folder = Path(__file__).resolve().parents[2] / ".pytest-probe" / f"{os.getpid()}-{os.urandom(4).hex()}"
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            folder.parent.rmdir()


@pytest.fixture
def in_place_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read even small test checkpoints in place (large ones always are)."""
    monkeypatch.setattr(_inplace, "IN_PLACE_MIN_BYTES", 0)


@pytest.mark.usefixtures("in_place_always")
def test_a_load_reads_tensor_bytes_into_the_watched_tensors_themselves(store_url: str) -> None:
    model, optimizer = build_model()
    tr = lht.init("inplace", store=store_url)
    tr.watch(model, optimizer)
    train_steps(model, optimizer, 3)
    artifact = tr.save_checkpoint(extra={"position": torch.arange(5)})
    saved = snapshot_state(model, optimizer)
    train_steps(model, optimizer, 2)
    assert not same_tensors(saved, snapshot_state(model, optimizer))
    memory = [p.data_ptr() for p in model.parameters()]
    memory += [t.data_ptr() for st in optimizer.state.values() for t in st.values()]

    extra = tr.load_checkpoint(artifact)
    assert same_tensors(saved, snapshot_state(model, optimizer))  # bitwise, bf16 included
    assert torch.equal(extra["position"], torch.arange(5))
    # the same memory: the parameters and AdamW's moments were written, not replaced
    assert memory == [p.data_ptr() for p in model.parameters()] + [
        t.data_ptr() for st in optimizer.state.values() for t in st.values()
    ]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert tr._checkpointer.loaded_in_place >= 3 * params  # weights and both AdamW moments
    train_steps(model, optimizer, 1)  # and training goes on from there
    tr.finish()


@pytest.mark.usefixtures("in_place_always")
def test_tensors_that_changed_shape_dtype_or_have_no_state_yet_load_the_usual_way(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    model, optimizer = build_model()
    tr = lht.init("inplace", store=store_url)
    tr.watch(model, optimizer)
    train_steps(model, optimizer, 2)
    artifact = tr.save_checkpoint()
    saved_weights = [t.clone() for t in model.state_dict().values()]
    saved = snapshot_state(model, optimizer)

    # a fresh optimizer (no state yet) and a layer now in float64: those go through fresh memory
    fresh, fresh_opt = build_model(seed=1)
    fresh[0].to(torch.float64)
    tr.watch(fresh, fresh_opt)
    tr.load_checkpoint(artifact)
    got = list(fresh.state_dict().values())
    assert got[0].dtype == torch.float64 and torch.equal(got[0], saved_weights[0].double())
    assert all(torch.equal(a, b) for a, b in zip(got[2:], saved_weights[2:], strict=True))
    # optimizer state as load_state_dict gives it: cast to its parameter's dtype (float64 for layer 0)
    restored = snapshot_state(fresh, fresh_opt)[len(saved_weights) :]
    assert all(torch.equal(a.to(b.dtype), b) for a, b in zip(saved[len(saved_weights) :], restored, strict=True))
    assert 0 < tr._checkpointer.loaded_in_place < sum(t.numel() * t.element_size() for t in saved)

    # another architecture: refused by load_state_dict as before, and the next step refuses to train
    other = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    other_opt = torch.optim.AdamW(other.parameters())
    tr.watch(other, other_opt)
    with pytest.raises(lh.CheckpointError, match="size mismatch"):
        tr.load_checkpoint(artifact)
    with pytest.raises(lh.CheckpointError):
        other_opt.step()
    tr.finish()


def _tensor_offset(path: Path, key: str) -> int:
    meta = torch.load(path, map_location="meta", weights_only=True)
    return int(meta["model"][key].untyped_storage()._checkpoint_offset)


def _flip(path: Path, key: str, at: int, bit: int) -> None:
    """Flip ``bit`` of the byte ``at`` bytes into the model tensor ``key``'s bytes in the bundle file."""
    data = bytearray(path.read_bytes())
    data[_tensor_offset(path, key) + at] ^= bit
    path.chmod(0o644)
    path.write_bytes(bytes(data))


@pytest.mark.usefixtures("in_place_always")
def test_a_flipped_byte_in_tensor_bytes_read_in_place_poisons_the_next_step(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    model, optimizer = build_model()
    tr = lht.init("inplace", store=store_url)
    tr.watch(model, optimizer)
    train_steps(model, optimizer, 2)
    artifact = tr.save_checkpoint()
    assert artifact is not None
    _flip(payload_path(store_url, tr, artifact), "0.weight", 10, 0x04)
    step = tr.global_step
    with pytest.raises(lh.CheckpointError, match=r"does not match its crc64nvme.*next optimizer step"):
        tr.load_checkpoint(artifact)
    assert tr.global_step == step  # no step, RNG or tunables were restored from it
    with pytest.raises(lh.CheckpointError, match="crc64nvme"):
        optimizer.step()  # the bytes are in the model: training on them is refused
    tr.finish()


def test_a_flipped_byte_in_the_pickle_is_caught_by_the_crc_and_changes_nothing(tmp_path: Path) -> None:
    """A flip that still unpickles (inside the run id string): only the CRC can tell."""
    store_url = str(tmp_path / "store")
    model, optimizer = build_model()
    tr = lht.init("inplace", store=store_url)
    tr.watch(model, optimizer)
    train_steps(model, optimizer, 2)
    artifact = tr.save_checkpoint()
    assert artifact is not None
    path = payload_path(store_url, tr, artifact)
    data = bytearray(path.read_bytes())
    at = data.index(tr.id.encode())  # the first copy is in data.pkl, before every tensor
    assert at < _tensor_offset(path, "0.weight")
    data[at] = ord("z") if data[at] != ord("z") else ord("y")
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    assert torch.load(path, weights_only=True)["run_id"] != tr.id  # torch.load alone would take it
    train_steps(model, optimizer, 1)
    before = snapshot_state(model, optimizer)
    with pytest.raises(lh.CheckpointError, match=r"nothing was applied.*does not match its crc64nvme"):
        tr.load_checkpoint(artifact)
    assert same_tensors(before, snapshot_state(model, optimizer))  # small file: verified before anything was applied
    with pytest.raises(lh.CheckpointError, match="does not match its crc64nvme"):
        optimizer.step()  # the fail-together rule: no training on after a failed load...
    tr.clear_checkpoint_error()
    optimizer.step()  # ...until told to
    tr.finish()


def test_the_recorded_checksums_are_the_ones_the_store_keeps(store_url: str) -> None:
    """S3 keeps the full-object CRC64NVME the record holds; GCS the CRC32C recorded beside it."""
    from awscrt.checksums import crc32c, crc64nvme

    from launchhelm.storage import ObjectStore, open_store
    from launchhelm.storage._checksum import CRC32C, CRC64NVME, header_value

    model, optimizer = build_model()
    tr = lht.init("sums", store=store_url)
    tr.watch(model, optimizer)
    train_steps(model, optimizer, 1)
    artifact = tr.save_checkpoint()
    (record,) = lh.Api(store_url).run(tr.id).checkpoints()
    store = open_store(store_url)
    data = store.read(f"runs/{tr.id}/artifacts/{artifact}/{artifact}.pt")
    expected = {CRC64NVME: f"{crc64nvme(data):016x}"}
    if store_url.startswith("gs://"):
        expected[CRC32C] = f"{crc32c(data):08x}"
    assert record.checksums == expected
    if isinstance(store, ObjectStore) and store_url.startswith("s3://"):
        import boto3

        bucket, key = store._path(f"runs/{tr.id}/artifacts/{artifact}/{artifact}.pt").split("/", 1)
        head = boto3.client("s3").head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert head["ChecksumCRC64NVME"] == header_value(CRC64NVME, expected[CRC64NVME])
    if isinstance(store, ObjectStore) and store_url.startswith("gs://"):
        info = store.fs.info(store._path(f"runs/{tr.id}/artifacts/{artifact}/{artifact}.pt"))
        assert info["crc32c"] == header_value(CRC32C, expected[CRC32C])
    tr.finish()


@pytest.mark.slow
def test_the_gpu_self_check_skips_cleanly_without_cuda() -> None:
    """benchmarks/gpu_checkpoint_check.py is for GPU machines; elsewhere it says so and succeeds."""
    import subprocess
    import sys

    from lhtest import ROOT, child_env

    script = ROOT / "benchmarks" / "gpu_checkpoint_check.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=child_env())
    assert done.returncode == 0, done.stdout + done.stderr
    expected = "PASS" if torch.cuda.is_available() else "SKIP: no CUDA device"
    assert expected in done.stdout


@pytest.mark.usefixtures("in_place_always")
def test_tensors_read_in_many_pieces_round_trip_and_a_flip_in_a_later_piece_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each piece is CRC'd as it lands and the CRC runs on from piece to piece, chunk to chunk."""
    monkeypatch.setattr(_reads, "_PIECE", 256)  # 0.weight (2 KiB) spans 8 pieces in 2 chunks
    monkeypatch.setattr(_reads, "_CHUNK", 1024)
    store_url, tr, model, optimizer, saved, artifact = _saved_then_trained_on(tmp_path)
    tr.load_checkpoint(artifact)
    assert same_tensors(saved, snapshot_state(model, optimizer))
    assert tr._checkpointer.loaded_in_place > 0

    path = payload_path(store_url, tr, artifact)
    data = bytearray(path.read_bytes())
    data[_tensor_offset(path, "0.weight") + 1024 + 3 * 256 + 7] ^= 0x10  # piece 4 of the second chunk
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(lh.CheckpointError, match=r"does not match its crc64nvme"):
        tr.load_checkpoint(artifact)
    tr.finish()


@pytest.mark.usefixtures("in_place_always")
def test_a_checkpoint_not_in_the_page_cache_is_read_as_one_stream_and_still_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold file (dropped from the page cache, as after a reboot or on another node) is read in big
    requests, each CRC'd on the other thread: the same bytes land, and a flipped byte is still caught."""
    monkeypatch.setattr(_reads, "_STREAM_PIECE", 512)  # 0.weight (2 KiB) is four pieces
    store_url, tr, model, optimizer, saved, artifact = _saved_then_trained_on(tmp_path)
    path = payload_path(store_url, tr, artifact)

    monkeypatch.setattr(_reads, "_cached", lambda fd, ranges: False)  # what the probe says of a cold file
    streams: list[int] = []
    stream = _reads._stream

    def counted(fd: int, pieces: list[_ranged.Piece]) -> list[tuple[int, int, int]]:
        streams.append(sum(len(views) for _, views, _ in pieces))  # the buffers the reads fill
        return stream(fd, pieces)

    monkeypatch.setattr(_reads, "_stream", counted)

    tr.load_checkpoint(artifact)
    assert same_tensors(saved, snapshot_state(model, optimizer))
    assert tr._checkpointer.loaded_in_place > 0
    assert streams and streams[0] >= 6  # every weight, bias and AdamW moment went through the stream

    data = bytearray(path.read_bytes())
    data[_tensor_offset(path, "0.weight") + 3 * 512 + 5] ^= 0x08  # in the fourth piece
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(lh.CheckpointError, match=r"does not match its crc64nvme"):
        tr.load_checkpoint(artifact)
    tr.finish()


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT") or not hasattr(os, "posix_fadvise"), reason="Linux only")
def test_the_page_cache_probe_tells_a_cached_file_from_an_evicted_one(disk_dir: Path) -> None:
    """On a real disk (the repository's, not a tmpfs): a file just written is cached; fsynced and
    dropped with posix_fadvise(DONTNEED) it is not, until it is read again. Asking reads nothing
    (mincore): an evicted file stays evicted however often it is asked about."""
    path = disk_dir / "probe.bin"
    path.write_bytes(os.urandom(4 * 2**20))
    fd = os.open(path, os.O_RDONLY)
    try:
        ranges = [(offset, 2**20) for offset in range(0, 4 * 2**20, 2**20)]
        assert _pagecache._cached(fd, ranges)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert not _pagecache._cached(fd, ranges)
        assert not _pagecache._resident(fd, [0, 2**20, 3 * 2**20])
        time.sleep(0.3)  # a probe that started a read-ahead would have its pages by now
        assert not _pagecache._cached(fd, ranges)
        os.pread(fd, 4 * 2**20, 0)
        assert _pagecache._resident(fd, [0, 2**20, 3 * 2**20])
        assert _pagecache._cached(fd, ranges)
    finally:
        os.close(fd)


def test_a_load_returns_before_its_summary_is_put_and_readers_see_its_rewind_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_url, tr, model, optimizer, saved, _ = _saved_then_trained_on(tmp_path)
    store, key = tr._store, summary_key(tr.id)
    entered, gate = threading.Event(), threading.Event()
    real_put = store.put

    def put(k: str, data: bytes) -> None:
        if k == key and threading.current_thread().name == "launchhelm-summary":
            entered.set()
            assert gate.wait(30)
        real_put(k, data)

    monkeypatch.setattr(store, "put", put)
    try:
        tr.load_checkpoint("latest")  # returns while its summary's put is held
        assert entered.wait(10)
        assert same_tensors(saved, snapshot_state(model, optimizer))
        assert json.loads(store.read(key))["rewinds"] == 0  # the summary is behind the log
        assert lh.Api(store_url).run(tr.id).summary()["rewinds"] == 1  # readers fold the log's tail
    finally:
        gate.set()
    tr._settle_summary()
    assert json.loads(store.read(key))["rewinds"] == 1
    tr.finish()
    assert lh.Api(store_url).run(tr.id).status == "closed"


def _layout(value: object, path: str = "") -> list[tuple[str, object]]:
    """Every node of a planned bundle (meta tensors, or the plan's records of them): containers by type
    and keys, tensors by dtype, geometry, storage size and file offset."""
    if isinstance(value, torch.Tensor):
        assert value.device.type == "meta"
        storage = value.untyped_storage()
        geometry = (value.dtype, tuple(value.shape), value.stride(), value.storage_offset())
        return [(path, ("tensor", *geometry, storage.nbytes(), storage._checkpoint_offset))]  # type: ignore[attr-defined]
    if isinstance(value, _plan._Planned):
        geometry = (value.dtype, value.shape, value.stride, value.offset)
        return [(path, ("tensor", *geometry, value.storage.nbytes, value.storage.offset))]
    if isinstance(value, dict):
        out: list[tuple[str, object]] = [(path, (type(value).__name__, tuple(value)))]
        for key, item in value.items():
            out += _layout(item, f"{path}/{key}")
        return out
    if isinstance(value, (list, tuple)):
        out = [(path, (type(value).__name__, len(value)))]
        for index, item in enumerate(value):
            out += _layout(item, f"{path}/{index}")
        return out
    return [(path, (type(value).__name__, value))]


def test_the_planning_unpickler_gives_what_torch_load_gives_on_meta(tmp_path: Path) -> None:
    """The plan's fast C unpickler makes exactly torch.load(map_location="meta")'s bundle: the same
    containers and values, the same tensors (dtype, shape, stride, storage offset, file offset),
    with a bf16 layer, tied weights, a scheduler and a nested extra."""
    model, optimizer = build_model()
    tied = torch.nn.Linear(3, 3)
    model.append(tied)
    model.register_buffer("tied_view", tied.weight.detach()[1:])  # a view into another tensor's storage
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)
    tr = lht.init("plan", store=str(tmp_path / "store"))
    tr.watch(model, optimizer, scheduler=scheduler)
    train_steps(model, optimizer, 2)
    artifact = tr.save_checkpoint(extra={"epoch": 3, "nested": [1, (2.5, "x"), {"a": None, "b": True}]})
    assert artifact is not None
    path = payload_path(str(tmp_path / "store"), tr, artifact)
    fast = _inplace.meta_load(path)
    assert fast is not None
    meta = torch.load(path, map_location="meta", weights_only=True)
    assert _layout(fast) == _layout(meta)
    assert _layout(_inplace.planned_from_meta(meta)) == _layout(meta)  # torch's plan, as records
    for planned in (fast, _inplace.planned_from_meta(meta)):  # one storage record for the view and its base
        assert planned["model"]["tied_view"].storage is planned["model"]["3.weight"].storage
        assert planned["model"]["tied_view"].offset == 3
    tr.finish()


@pytest.mark.usefixtures("in_place_always")
def test_a_bundle_torch_plans_loads_in_place_all_the_same(tmp_path: Path) -> None:
    """A bundle the fast planner leaves to torch (its extra holds a torch.Size) is planned from
    torch's meta load and still read straight into the model and optimizer, bitwise; a flipped
    byte in a tensor is still caught."""
    extra = {"shape": torch.Size([2, 3])}
    store_url, tr, model, optimizer, saved, artifact = _saved_then_trained_on(tmp_path, extra)
    path = payload_path(store_url, tr, artifact)
    assert _inplace.meta_load(path) is None  # torch plans this one
    weight = model[0].weight
    assert tr.load_checkpoint(artifact) == extra
    assert model[0].weight is weight
    assert tr._checkpointer.loaded_in_place > 0
    assert same_tensors(saved, snapshot_state(model, optimizer))
    _flip(path, "0.weight", 5, 0x10)
    with pytest.raises(lh.CheckpointError, match="does not match its crc64nvme"):
        tr.load_checkpoint(artifact)
    tr.clear_checkpoint_error()
    tr.finish()


class _Exploit:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/launchhelm-plan-pwned-$PPID",))


def test_the_planning_unpickler_calls_nothing_of_the_file_and_leaves_the_rest_to_torch(tmp_path: Path) -> None:
    """Any global but its three, BUILD on one of them, or a tensor with hooks: the fast planner says
    None (torch's weights-only unpickler then decides, as before). A bundle whose extra holds what
    torch allows and the planner does not (a torch.Size, a dtype) loads all the same."""
    marker = Path(f"/tmp/launchhelm-plan-pwned-{os.getpid()}")
    marker.unlink(missing_ok=True)
    evil = tmp_path / "evil.pt"
    torch.save({"format": lht.FORMAT_SINGLE, "model": _Exploit()}, evil)
    assert _inplace.meta_load(evil) is None
    assert not marker.exists(), "a pickled payload was executed"

    def refused(data: bytes) -> bool:
        try:
            _plan._PlanningUnpickler(data, lambda name: 0).load()
        except Exception:  # _Refused, or the C unpickler's own error: meta_load then says None
            return True
        return False

    # BUILD with a slot state {"_fn": 1}, which would setattr on the global handed out
    assert refused(b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nN}X\x03\x00\x00\x00_fnK\x01s\x86b.")
    assert refused(b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n}b.")  # BUILD with a dict state
    assert refused(b"\x80\x02ccollections\nOrderedDict\n(K\x01tR.")  # OrderedDict(1): not iterable
    assert refused(b"\x80\x02ccollections\nOrderedDict\n}X\x01\x00\x00\x00aK\x01sb.")  # BUILD on the class
    assert refused(b"\x80\x02ccollections\nOrderedDict\nN}X\x01\x00\x00\x00aK\x01s\x86b.")  # ... with slots
    assert refused(b"\x80\x02ctorch\nFloatStorage\n)R.")  # calling a storage name
    assert refused(b"\x80\x02cbuiltins\neval\n.")
    assert not refused(b"\x80\x02ccollections\nOrderedDict\n)R.")

    store_url = str(tmp_path / "store")
    model, optimizer = build_model()
    tr = lht.init("plan", store=store_url)
    tr.watch(model, optimizer)
    train_steps(model, optimizer, 1)
    extra = {"shape": torch.Size([2, 3]), "dtype": torch.float16}
    artifact = tr.save_checkpoint(extra=extra)
    assert artifact is not None
    assert _inplace.meta_load(payload_path(store_url, tr, artifact)) is None  # torch.Size: torch plans
    assert tr.load_checkpoint(artifact) == extra
    tr.finish()


def test_the_header_prefetch_reads_every_entry_of_a_zip_and_of_a_zip64(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan asks for every record's local header at once (one WILLNEED each, from the central
    directory) instead of one cold random read per tensor. Its parser finds the same header offsets
    as the standard library's, for a torch bundle and for a zip64 directory (offsets and sizes in the
    zip64 extra field); what it does not follow raises, and the prefetch then quietly does nothing."""
    import zipfile

    def header_offsets(path: Path) -> list[int]:
        fd = os.open(path, os.O_RDONLY)
        try:
            return _zip._header_offsets(fd)
        finally:
            os.close(fd)

    def stdlib(path: Path) -> list[int]:
        with zipfile.ZipFile(path) as archive:
            return [info.header_offset for info in archive.infolist()]

    model, optimizer = build_model()
    train_steps(model, optimizer, 1)
    bundle = tmp_path / "bundle.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, bundle)
    assert len(stdlib(bundle)) > 10
    assert header_offsets(bundle) == stdlib(bundle)

    zip64 = tmp_path / "zip64.zip"
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 64)  # every offset and size past 64 goes to zip64
    with zipfile.ZipFile(zip64, "w", zipfile.ZIP_STORED) as archive:
        for index in range(5):
            archive.writestr(f"data/{index}", os.urandom(100 + index))
    monkeypatch.undo()
    raw = zip64.read_bytes()
    assert b"PK\x06\x06" in raw and b"\xff\xff\xff\xff" in raw  # a zip64 directory, offsets moved out
    assert header_offsets(zip64) == stdlib(zip64)
    assert len(set(header_offsets(zip64))) == 5

    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a zip" * 100)
    with pytest.raises(_zip._Unparsed, match="no end of central directory"):
        header_offsets(junk)
    with _pagecache._headers_prefetched(junk):  # only a hint: nothing raised
        pass
    cut = tmp_path / "cut.pt"
    cut.write_bytes(bundle.read_bytes()[: bundle.stat().st_size - 200])  # the directory's end survives, not its start
    cut.write_bytes(cut.read_bytes() + bundle.read_bytes()[-22:])
    with pytest.raises((_zip._Unparsed, struct.error)):
        header_offsets(cut)
    with _pagecache._headers_prefetched(cut):
        pass


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="Linux only")
def test_planning_a_cold_bundle_prefetches_its_headers_then_leaves_the_file_as_cold_as_it_was(
    disk_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real disk: while a bundle dropped from the page cache is planned, every record's local
    header is resident (asked for at once, not read one by one) and no tensor's middle is; after
    the plan those header pages are gone again (left cached, they would break the read-ahead of the
    cold stream that follows), while pages cached before the plan stay cached."""
    path = disk_dir / "headers.pt"
    torch.save({f"w{index}": torch.randn(2**18) for index in range(6)}, path)  # 1 MiB each
    fd = os.open(path, os.O_RDONLY)
    try:
        headers = _zip._header_offsets(fd)
        middle = [int(offset) + 2**19 for offset in _tensor_offsets(path)]
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert not any(_pagecache._residency(fd, headers))
        with _pagecache._headers_prefetched(path):
            deadline = time.monotonic() + 5
            while not _pagecache._resident(fd, headers) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _pagecache._resident(fd, headers)
            assert not any(_pagecache._residency(fd, middle))
        # the tensors' headers, not those sharing a page with data.pkl or the central directory
        inner = [h for h in headers if 4096 <= h < os.fstat(fd).st_size - 8192]
        assert len(inner) >= 4
        assert not any(_pagecache._residency(fd, inner))
        assert _inplace.meta_load(path) is not None
        assert not any(_pagecache._residency(fd, inner))  # the plan itself leaves them out too

        os.pread(fd, 64, inner[1])  # cached before (with what the kernel read ahead): stays cached
        before = _pagecache._residency(fd, inner)
        assert before[1] and not all(before)
        with _pagecache._headers_prefetched(path):
            pass
        assert _pagecache._residency(fd, inner) == before
        os.pread(fd, os.fstat(fd).st_size, 0)  # all cached: all stay, and the directory is not even read
        parsed: list[int] = []
        real = _zip._header_offsets
        monkeypatch.setattr(_pagecache, "_header_offsets", lambda fd: parsed.append(fd) or real(fd))
        with _pagecache._headers_prefetched(path):
            pass
        assert _pagecache._resident(fd, headers)
        assert parsed == []
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold again: parsed and prefetched
        with _pagecache._headers_prefetched(path):
            pass
        assert len(parsed) == 1
    finally:
        os.close(fd)


def _tensor_offsets(path: Path) -> list[int]:
    reader = torch._C.PyTorchFileReader(str(path))
    return [reader.get_record_offset(name) for name in reader.get_all_records() if name.startswith("data/")]


@pytest.mark.usefixtures("in_place_always")
def test_a_load_runs_with_the_cyclic_collector_paused_and_leaves_it_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a collection due at every allocation, a load triggers none (a full one walks all of
    torch's objects: ~0.1 s here), succeeds bitwise, and leaves the collector on, or off where the
    caller had turned it off, whether the load succeeds or raises."""
    import gc

    store_url, tr, model, optimizer, saved, artifact = _saved_then_trained_on(tmp_path)
    collections: list[str] = []
    loading = threading.Event()  # set while the load does its work (checks done, collector paused)
    load = type(tr)._load

    def watched_load(*args: object) -> object:
        loading.set()
        try:
            return load(*args)  # type: ignore[arg-type]
        finally:
            loading.clear()

    monkeypatch.setattr(type(tr), "_load", watched_load)

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(f"generation {info['generation']}{' during the load' if loading.is_set() else ''}")

    thresholds = gc.get_threshold()
    gc.callbacks.append(seen)
    try:
        gc.set_threshold(1, 1, 1)  # any allocation of a tracked object would collect
        tr.load_checkpoint(artifact)
        during = [c for c in collections if c.endswith("during the load")]
        before = len(collections)
        kept = [[] for _ in range(1000)]  # the collector is on again: these allocations collect
        after = len(collections) - before
        del kept
        gc.disable()
        tr.load_checkpoint(artifact)
        still_off = not gc.isenabled()
        gc.enable()
        path = payload_path(store_url, tr, artifact)
        path.chmod(0o644)
        path.write_bytes(b"not a checkpoint")
        with pytest.raises(lh.CheckpointError):
            tr.load_checkpoint(artifact)
        on_after_error = gc.isenabled()
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(seen)
        gc.enable()
    assert not during, f"{len(during)} collections during the load, e.g. {during[:3]}"
    assert after > 0, "the collector did not come back on after the load"
    assert still_off, "a load turned on a collector the caller had turned off"
    assert on_after_error, "a load that raised left the collector off"
    assert same_tensors(saved, snapshot_state(model, optimizer))
    tr.clear_checkpoint_error()
    tr.finish()


@pytest.mark.usefixtures("in_place_always")
def test_load_state_dict_is_skipped_only_where_it_would_copy_each_tensor_onto_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stock model read wholly in place: ``load_state_dict`` would copy each tensor onto itself,
    so it is not called, the state is bitwise the saved one, and a graph built before the load
    refuses to backpropagate (each tensor's version moved on, as torch's copy does). A load hook,
    a module that loads its own way (batch norm) or an entry that could not go in place: torch's
    ``load_state_dict`` runs as before (the hook sees the state dict)."""
    calls: list[str] = []
    load = torch.nn.Module.load_state_dict

    def counted(self: torch.nn.Module, *args: object, **kwargs: object) -> object:
        calls.append(type(self).__name__)
        return load(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.Module, "load_state_dict", counted)
    store_url, tr, model, optimizer, saved, artifact = _saved_then_trained_on(tmp_path)
    pending = model[0].weight.pow(2).sum()  # a graph that saved 0.weight before the load
    tr.load_checkpoint(artifact)
    assert calls == [] and same_tensors(saved, snapshot_state(model, optimizer))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        pending.backward()  # as after torch's load_state_dict: the weights' versions moved on
    assert _inplace.IN_PLACE_MIN_BYTES == 0

    hooked: list[list[str]] = []
    handle = model[0].register_load_state_dict_pre_hook(lambda _m, sd, prefix, *_: hooked.append(sorted(sd)))
    train_steps(model, optimizer, 1)
    tr.load_checkpoint(artifact)
    assert calls == ["Sequential"] and hooked and "0.weight" in hooked[0]
    assert same_tensors(saved, snapshot_state(model, optimizer))
    handle.remove()
    tr.finish()

    calls.clear()
    torch.manual_seed(1)
    norm = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(norm.parameters(), lr=0.1)
    tr = lht.init("inplace", store=store_url)
    tr.watch(norm, opt)
    norm(torch.randn(8, 4)).sum().backward()
    opt.step()
    before = [t.clone() for t in norm.state_dict().values()]
    artifact = tr.save_checkpoint()
    assert artifact is not None
    norm(torch.randn(8, 4)).sum().backward()  # running stats and weights move on
    opt.step()
    tr.load_checkpoint(artifact)
    assert calls == ["Sequential"], "batch norm loads its own way: torch's load_state_dict must run"
    assert same_tensors(before, list(norm.state_dict().values()))
    tr.finish()


class _StorageMarker:
    """Pickled as a persistent id: a float storage of 4 elements, as torch.save writes one."""


class _TensorRecord:
    def __init__(self, offset: object, size: object, stride: object) -> None:
        self.args = (_StorageMarker(), offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (torch._utils._rebuild_tensor_v2, self.args)


def _tensor_pickle(offset: object, size: object, stride: object) -> bytes:
    class Writer(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return ("storage", torch.FloatStorage, "0", "cpu", 4) if isinstance(obj, _StorageMarker) else None

    out = io.BytesIO()
    Writer(out, protocol=2).dump(_TensorRecord(offset, size, stride))
    return out.getvalue()


def test_the_planner_takes_a_tensor_only_where_it_lies_inside_its_storage() -> None:
    """A tensor whose view reaches past its storage, or whose geometry is not made of
    non-negative ints, is refused by the fast planner (torch.load then decides and refuses it too)."""

    def plan(data: bytes) -> object:
        try:
            return _plan._PlanningUnpickler(data, lambda name: 128).load()
        except Exception:
            return None

    fits = plan(_tensor_pickle(1, (3,), (1,)))
    assert isinstance(fits, _plan._Planned)
    assert (fits.offset, fits.shape, fits.stride, fits.dtype) == (1, (3,), (1,), torch.float32)
    assert (fits.storage.nbytes, fits.storage.offset) == (16, 128)
    assert isinstance(plan(_tensor_pickle(0, (2, 2), (2, 1))), _plan._Planned)
    assert isinstance(plan(_tensor_pickle(4, (0, 7), (7, 1))), _plan._Planned)  # empty: anywhere
    for offset, size, stride in [
        (2, (3,), (1,)),  # ends one element past the storage
        (0, (2, 3), (3, 1)),  # 6 elements of 4
        (0, (3,), (2,)),  # strided past the end
        (-1, (1,), (1,)),
        (0, (-1,), (1,)),
        (0, (2,), (-1,)),
        (0, (2.0,), (1,)),
        (0, (2,), (1, 1)),
        (0, [2], [1]),
    ]:
        assert plan(_tensor_pickle(offset, size, stride)) is None, (offset, size, stride)


@pytest.mark.usefixtures("in_place_always")
def test_a_transformer_shaped_model_loads_wholly_in_place_and_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nested modules as a GPT-2 has them (embeddings, layer norms, attention and MLP linears in
    ModuleDicts, a tied output head): every tensor but the tied one goes in place, the state is
    bitwise the saved one, and with the tie the model is loaded by torch (a shared storage)."""
    nn = torch.nn

    def build(tie: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        width = 8
        model = nn.ModuleDict(
            {
                "wte": nn.Embedding(50, width),
                "wpe": nn.Embedding(16, width),
                "h": nn.ModuleList(
                    nn.ModuleDict(
                        {
                            "ln_1": nn.LayerNorm(width),
                            "attn": nn.ModuleDict({"c_attn": nn.Linear(width, 3 * width)}),
                            "mlp": nn.ModuleDict({"c_fc": nn.Linear(width, 4 * width)}),
                        }
                    )
                    for _ in range(3)
                ),
                "ln_f": nn.LayerNorm(width),
                "head": nn.Linear(width, 50, bias=False),
            }
        )
        if tie:
            model["head"].weight = model["wte"].weight
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()

    calls: list[str] = []
    load = torch.nn.Module.load_state_dict
    monkeypatch.setattr(
        torch.nn.Module, "load_state_dict", lambda self, *a, **k: calls.append("load") or load(self, *a, **k)
    )
    for tie in (False, True):
        model, optimizer = build(tie)
        tr = lht.init("gpt", store=str(tmp_path / f"store-{tie}"))
        tr.watch(model, optimizer)
        step(model, optimizer)
        saved = snapshot_state(model, optimizer)
        artifact = tr.save_checkpoint()
        assert artifact is not None
        step(model, optimizer)
        calls.clear()
        tr.load_checkpoint(artifact)
        assert same_tensors(saved, snapshot_state(model, optimizer)), f"tied={tie}"
        assert calls == (["load"] if tie else []), f"tied={tie}"
        n_tensors = len(saved)
        tensor_bytes = sum(t.numel() * t.element_size() for t in saved)
        shared = model["wte"].weight.numel() * 4 if tie else 0  # the tied weight is saved once, loaded fresh
        assert tr._checkpointer.loaded_in_place == tensor_bytes - (2 * shared if tie else 0), (tie, n_tensors)
        tr.finish()


@pytest.mark.usefixtures("in_place_always")
def test_a_torch_that_gives_no_storage_offsets_loads_the_usual_way_still_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where neither planner gives file offsets (the fast one refused, and torch's meta load carries
    no ``_checkpoint_offset``), the bundle loads with torch.load after its CRC64NVME is checked:
    bitwise, nothing in place, and a flipped byte refused before anything is applied."""
    store_url, tr, model, optimizer, saved, artifact = _saved_then_trained_on(tmp_path)
    original = _inplace.plan_from_meta

    def without_offsets(meta: object) -> object:
        for value in meta["model"].values():  # type: ignore[index]
            storage = value.untyped_storage()
            if hasattr(storage, "_checkpoint_offset"):
                del storage._checkpoint_offset
        return original(meta)

    monkeypatch.setattr(_inplace, "load_plan", lambda path: None)
    monkeypatch.setattr(_inplace, "plan_from_meta", without_offsets)
    tr._checkpointer.loaded_in_place = -1
    tr.load_checkpoint(artifact)
    assert tr._checkpointer.loaded_in_place == -1, "nothing goes through the in-place path"
    assert same_tensors(saved, snapshot_state(model, optimizer))
    train_steps(model, optimizer, 1)
    trained = snapshot_state(model, optimizer)
    _flip(payload_path(store_url, tr, artifact), "0.weight", 3, 0x01)
    with pytest.raises(lh.CheckpointError, match="does not match its crc64nvme"):
        tr.load_checkpoint(artifact)
    assert same_tensors(trained, snapshot_state(model, optimizer)), "a corrupted file changed the model"
    tr.clear_checkpoint_error()
    tr.finish()


class _Versioned(torch.nn.Linear):
    """A layer that says which version of its state it was handed on load (``_metadata``)."""

    _version = 3

    def _load_from_state_dict(
        self, state_dict: dict[str, object], prefix: str, local_metadata: dict[str, object], *args: object
    ) -> None:
        self.loaded_version = local_metadata.get("version")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)  # type: ignore[arg-type]


@pytest.mark.usefixtures("in_place_always")
def test_the_state_dict_keeps_its_module_versions_through_a_planned_load(tmp_path: Path) -> None:
    """``load_state_dict`` hands each module the version it was saved with (the state dict's
    ``_metadata``, as torch.load keeps it); a plan that rebuilt the dict without it would make
    every module see an old, unversioned state."""
    store_url = str(tmp_path / "store")
    model = torch.nn.Sequential(_Versioned(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    tr = lht.init("inplace", store=store_url)
    tr.watch(model, optimizer)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    artifact = tr.save_checkpoint()
    assert artifact is not None
    assert torch.load(payload_path(store_url, tr, artifact), weights_only=True)["model"]._metadata["0"]["version"] == 3
    tr.load_checkpoint(artifact)
    assert model[0].loaded_version == 3
    assert tr._checkpointer.loaded_in_place > 0
    tr.finish()


class _Windows(torch.nn.Module):
    """Two buffers that are views of one flat buffer, side by side: ``p`` (0:4) and ``r`` (6:10)."""

    def __init__(self) -> None:
        super().__init__()
        self.flat = torch.zeros(12)
        self.register_buffer("p", self.flat[0:4])
        self.register_buffer("r", self.flat[6:10])
        self.weight = torch.nn.Parameter(torch.ones(3))


@pytest.mark.usefixtures("in_place_always")
def test_live_tensors_that_share_memory_go_in_place_only_where_they_do_not_overlap(tmp_path: Path) -> None:
    """Views of one buffer side by side each take their own bytes in place. Where live tensors
    overlap (here the optimizer's momentum is a view over ``p``'s memory, and the file holds its
    bytes after ``p``'s), both load the usual way: ``p`` is copied in, the momentum is a tensor of
    its own, exactly as torch's load gives it."""
    store_url = str(tmp_path / "store")
    model = _Windows()
    optimizer = torch.optim.SGD([model.weight], lr=0.1, momentum=0.9)
    tr = lht.init("inplace", store=store_url)
    tr.watch(model, optimizer)
    model.weight.grad = torch.ones(3)
    optimizer.step()
    saved_p, saved_r, saved_momentum = torch.arange(4.0), torch.arange(4.0) + 10, torch.arange(3.0) + 20
    model._buffers["p"], model._buffers["r"] = saved_p.clone(), saved_r.clone()  # saved as tensors of their own
    optimizer.state[model.weight]["momentum_buffer"] = saved_momentum.clone()
    artifact = tr.save_checkpoint()
    assert artifact is not None
    model._buffers["p"], model._buffers["r"] = model.flat[0:4], model.flat[6:10]
    optimizer.state[model.weight]["momentum_buffer"] = model.flat[2:5]  # overlaps p
    model.flat.fill_(-1)
    tr.load_checkpoint(artifact)

    assert torch.equal(model.flat[0:4], saved_p) and torch.equal(model.flat[6:10], saved_r)
    momentum = optimizer.state[model.weight]["momentum_buffer"]
    assert torch.equal(momentum, saved_momentum)
    assert model.r.data_ptr() == model.flat[6:10].data_ptr()  # r: read in place into its window
    assert (
        tr._checkpointer.loaded_in_place == saved_r.nbytes + model.weight.nbytes
    )  # r and the weight; not p nor momentum
    tr.finish()


class _OwnLoading(torch.optim.SGD):
    """An optimizer that loads its state its own way."""

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        self.loaded_by_hand = True
        super().load_state_dict(state_dict)


@pytest.mark.usefixtures("in_place_always")
def test_optimizer_state_goes_in_place_by_the_saved_groups_and_only_for_the_stock_loader(tmp_path: Path) -> None:
    """The optimizer's state tensors are matched as ``Optimizer.load_state_dict`` maps them (each
    group's saved indices onto its live parameters, here two groups, one parameter without state);
    an optimizer that loads its own way gets none of them in place, and both end bitwise."""
    store_url = str(tmp_path / "store")
    tr = lht.init("inplace", store=store_url)
    for kind in (torch.optim.SGD, _OwnLoading):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        groups = [{"params": list(model[2].parameters())}, {"params": list(model[0].parameters())}]
        groups.append({"params": list(model[1].parameters()), "lr": 0.5})
        optimizer = kind(groups, lr=0.1, momentum=0.9)
        tr.watch(model, optimizer)
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            model[1].bias.grad = None  # one parameter never gets momentum
            optimizer.step()
        saved = snapshot_state(model, optimizer)
        artifact = tr.save_checkpoint()
        assert artifact is not None
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        assert not same_tensors(saved, snapshot_state(model, optimizer))
        momentum = [optimizer.state[p]["momentum_buffer"].data_ptr() for p in model[2].parameters()]
        tr.load_checkpoint(artifact)
        assert same_tensors(saved, snapshot_state(model, optimizer))
        weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        if kind is _OwnLoading:
            assert optimizer.loaded_by_hand
            assert tr._checkpointer.loaded_in_place == weights  # the model only
        else:
            assert tr._checkpointer.loaded_in_place == weights + sum(p.numel() * 4 for p in model.parameters()) - 8 * 4
            assert momentum == [optimizer.state[p]["momentum_buffer"].data_ptr() for p in model[2].parameters()]
    tr.finish()


def test_loads_reuse_one_summary_thread_and_the_session_end_joins_it(tmp_path: Path) -> None:
    """A load asks a thread kept for it to put the summary (starting one each time cost a load
    ~0.5 ms); every load's summary is put, and finish() leaves no such thread behind."""
    store_url, tr, model, optimizer, _saved, artifact = _saved_then_trained_on(tmp_path)

    def summary_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "launchhelm-summary"]

    tr.load_checkpoint(artifact)
    first = summary_threads()
    assert len(first) == 1
    for _ in range(3):
        train_steps(model, optimizer, 1)
        tr.load_checkpoint(artifact)
    assert summary_threads() == first
    tr._settle_summary()
    summary = json.loads(tr._store.read(summary_key(tr.id)))
    assert summary["rewinds"] == 4
    tr.finish()
    assert summary_threads() == []
    assert lh.Api(store_url).run(tr.id).summary()["rewinds"] == 4


_OPTIMIZERS = {
    "sgd-momentum": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True),
    "adam-amsgrad": lambda groups: torch.optim.Adam(groups, lr=1e-2, amsgrad=True),
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95)),
    "adamw-tensor-lr": lambda groups: torch.optim.AdamW(groups, lr=torch.tensor(1e-2)),
    "rmsprop-centered": lambda groups: torch.optim.RMSprop(groups, lr=1e-2, momentum=0.5, centered=True),
    "adagrad": lambda groups: torch.optim.Adagrad(groups, lr=0.1),
}


def _two_groups(model: torch.nn.Module) -> list[dict[str, object]]:
    """Layers 0 and 2 in one group, layer 1 in another with a learning rate of its own."""
    return [
        {"params": [*model[0].parameters(), *model[2].parameters()]},
        {"params": list(model[1].parameters()), "lr": 0.05},
    ]


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    torch.manual_seed(seed)
    optimizer.zero_grad()
    model(torch.randn(4, 8)).pow(2).sum().backward()
    model[1].bias.grad = None  # one parameter never gets state
    optimizer.step()


def _optimizer_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = a.state_dict(), b.state_dict()

    def same(x: object, y: object) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.device == y.device and torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return type(x) is type(y) and len(x) == len(y) and all(same(u, v) for u, v in zip(x, y, strict=True))
        return type(x) is type(y) and x == y

    return same(sa, sb) and type(a.state) is type(b.state)


@pytest.mark.usefixtures("in_place_always")
@pytest.mark.parametrize("kind", sorted(_OPTIMIZERS))
def test_the_optimizer_loaded_in_place_is_the_one_load_state_dict_makes(tmp_path: Path, kind: str) -> None:
    """Where every state tensor was read into the live one, the load does load_state_dict's work
    itself: the optimizer ends exactly as torch's load_state_dict leaves one (state, dtypes, the
    saved groups' hyperparameters over live ones changed since), and its next step is bitwise
    the same. With a load hook registered, torch's load_state_dict runs (and calls it)."""
    make = _OPTIMIZERS[kind]
    store_url = str(tmp_path / "store")
    tr = lht.init("inplace", store=store_url)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = make(_two_groups(model))
    tr.watch(model, optimizer)
    for seed in (1, 2):
        _step(model, optimizer, seed)
    del optimizer.param_groups[0]["maximize"]  # as an older torch saved it: the optimizer's __setstate__ fills it in
    artifact = tr.save_checkpoint()
    assert artifact is not None
    optimizer.param_groups[0]["maximize"] = False
    _step(model, optimizer, 3)
    optimizer.param_groups[1]["lr"] = 123.0  # restored from the checkpoint
    tr.load_checkpoint(artifact)
    assert tr._checkpointer.optimizer_in_place

    bundle = torch.load(payload_path(store_url, tr, artifact), weights_only=True)
    torch.manual_seed(5)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    reference_optimizer = make(_two_groups(reference))
    reference.load_state_dict(bundle["model"])
    reference_optimizer.load_state_dict(bundle["optimizer"])
    assert _optimizer_equal(optimizer, reference_optimizer)
    assert optimizer.param_groups[1]["lr"] == 0.05 and optimizer.param_groups[0]["maximize"] is False
    live_params = [[id(p) for p in group["params"]] for group in optimizer.param_groups]
    assert live_params == [[id(p) for p in group["params"]] for group in _two_groups(model)]
    for live, ref in zip(optimizer.param_groups, reference_optimizer.param_groups, strict=True):
        assert live.keys() == ref.keys()
    _step(model, optimizer, 4)
    _step(reference, reference_optimizer, 4)
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values(), strict=True)
    )
    assert _optimizer_equal(optimizer, reference_optimizer)

    seen: list[object] = []
    optimizer.register_load_state_dict_pre_hook(lambda opt, state: seen.append(state))
    tr.load_checkpoint(artifact)
    assert len(seen) == 1 and not tr._checkpointer.optimizer_in_place
    tr.finish()


@pytest.mark.usefixtures("in_place_always")
def test_optimizer_state_that_torch_would_cast_goes_through_load_state_dict(tmp_path: Path) -> None:
    """A live optimizer state tensor in another dtype than its parameter: load_state_dict casts the
    saved one to the parameter's dtype (a new tensor), so the load leaves it that work."""
    _store_url, tr, model, optimizer, _saved, artifact = _saved_then_trained_on(tmp_path)
    tr.load_checkpoint(artifact)
    assert tr._checkpointer.optimizer_in_place
    param = model[2].weight  # bf16
    state = optimizer.state[param]
    state["exp_avg"] = state["exp_avg"].float()  # saved so: the checkpoint holds float32 moments for a bf16 weight
    artifact = tr.save_checkpoint()
    assert artifact is not None
    tr.load_checkpoint(artifact)
    assert not tr._checkpointer.optimizer_in_place
    assert optimizer.state[param]["exp_avg"].dtype == torch.bfloat16  # as load_state_dict casts it
    tr.finish()


def test_the_planners_geometry_check_agrees_with_torch_on_random_views() -> None:
    """For random views (0 to 4 dimensions, offsets and strides that may reach past the storage):
    the planner refuses exactly what ``set_`` refuses, and calls a view whole exactly where torch
    says it is contiguous, starts at 0 and covers its storage."""
    import random

    rng = random.Random(7)
    storage_elements = 24
    storage = _plan._PlannedStorage(torch.float32, storage_elements * 4, 0)
    seen = {True: 0, False: 0, None: 0}
    for _ in range(4000):
        dims = rng.randint(0, 4)
        size = tuple(rng.choice([0, 1, 1, 2, 3, 4, 6, 12, 24]) for _ in range(dims))
        if rng.random() < 0.2:  # a shape of all 24 elements, often
            size = rng.choice([(24,), (2, 12), (4, 6), (24, 1), (2, 3, 4), (1, 4, 6), (2, 3, 2, 2)])
        stride = tuple(rng.choice([0, 1, 2, 3, 4, 6, 12, 24]) for _ in range(len(size)))
        if rng.random() < 0.5:  # the contiguous strides of the size, often
            running, contiguous = 1, []
            for n in reversed(size):
                contiguous.append(running)
                running *= n
            stride = tuple(reversed(contiguous))
        offset = rng.choice([0, 0, 0, 0, 1, 5, 23, 24])
        got = _plan._geometry(storage, offset, size, stride)
        try:
            fixed = torch.frombuffer(bytearray(storage_elements * 4), dtype=torch.uint8).untyped_storage()
            real = torch.empty(0).set_(fixed, offset, size, stride)  # a storage set_ cannot grow
        except RuntimeError:
            assert got is None, (offset, size, stride)
        else:
            whole = real.is_contiguous() and offset == 0 and real.numel() * 4 == storage_elements * 4
            assert got is whole, (offset, size, stride)
        seen[got] += 1
    assert min(seen.values()) > 100, seen  # every outcome was met many times


def test_the_layout_read_from_the_central_directory_is_where_torch_finds_each_record(tmp_path: Path) -> None:
    """For a bundle torch wrote, each record's data offset follows from the central directory alone
    (its next record's header, its size, its data descriptor, 64-byte alignment) and is exactly
    where torch's reader finds it; a zip laid out otherwise (compressed, unaligned) gets no layout,
    and its headers are read one by one as before."""
    import zipfile

    _, tr, _, _, _, artifact = _saved_then_trained_on(tmp_path)
    path = payload_path(str(tmp_path / "store"), tr, artifact)

    def layout(path: Path) -> tuple[bytes, dict[str, tuple[int, int, int]]] | None:
        fd = os.open(path, os.O_RDONLY)
        try:
            return _zip._sequential_layout(fd)
        finally:
            os.close(fd)

    found = layout(path)
    assert found is not None
    folder, records = found
    reader = torch._C.PyTorchFileReader(str(path))
    assert sorted(records) == sorted(reader.get_all_records())
    assert all(records[name][1] == reader.get_record_offset(name) for name in records)
    with zipfile.ZipFile(path) as archive:
        assert {folder.decode() + name: header for name, (header, _, _) in records.items()} == {
            info.filename: info.header_offset for info in archive.infolist()
        }
    assert sum(name.startswith("data/") for name in records) > 10
    tr.finish()

    for compression in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):  # no 64-byte alignment; compressed
        other = tmp_path / f"other-{compression}.zip"
        with zipfile.ZipFile(other, "w", compression) as archive:
            for index in range(4):
                archive.writestr(f"archive/data/{index}", os.urandom(100 + index))
        assert layout(other) is None
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a zip" * 100)
    assert layout(junk) is None


def test_a_bundle_torch_laid_out_is_planned_without_torchs_reader_and_any_other_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle laid out as torch writes one is planned from its own records (byteorder, version,
    pickle read where the central directory puts them): torch's zip reader is never opened, and the
    plan is the one torch's own meta load gives. An archive version this torch does not read goes
    to torch's reader, which refuses it: no plan, and the load is torch's (and so is its error)."""
    _, tr, _, _, _, artifact = _saved_then_trained_on(tmp_path)
    path = payload_path(str(tmp_path / "store"), tr, artifact)
    tr.finish()
    opened: list[str] = []
    real_reader = torch._C.PyTorchFileReader

    def reader(name: str) -> object:
        opened.append(name)
        return real_reader(name)

    monkeypatch.setattr(torch._C, "PyTorchFileReader", reader)
    planned = _inplace.load_plan(path)
    assert planned is not None and opened == []
    meta = torch.load(path, map_location="meta", weights_only=True)
    assert _layout(planned[0]) == _layout(meta)

    fd = os.open(path, os.O_RDONLY)
    try:
        found = _zip._sequential_layout(fd)
    finally:
        os.close(fd)
    assert found is not None
    _, version_at, length = found[1]["version"]
    data = bytearray(path.read_bytes())
    assert data[version_at : version_at + length].strip() in (b"1", b"2", b"3")
    data[version_at : version_at + length] = b"11".ljust(length, b"\n")  # past what this torch reads
    future = tmp_path / "future.pt"
    future.write_bytes(bytes(data))
    opened.clear()
    assert _inplace.load_plan(future) is None
    assert opened == [str(future)]  # torch's reader was asked, and refused it
    with pytest.raises(RuntimeError, match="version"):
        real_reader(str(future))


@pytest.mark.usefixtures("in_place_always")
def test_a_load_checks_each_local_header_where_the_layout_put_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every storage's local header is checked as the load reads it (its record's name, and its data
    where the layout put it). A layout that put two same-sized records' data in each other's place
    passes the CRC (every byte of the file is still read once) and is caught by those checks: the
    load fails, the next step refuses to train, and with the true layout it loads bitwise."""
    store_url, tr, model, optimizer, saved, artifact = _saved_then_trained_on(tmp_path)
    path = payload_path(store_url, tr, artifact)
    checked: list[tuple[int, int]] = []
    real_whole_crc = _inplace.InPlaceLoad._whole_crc

    def whole_crc(self: _inplace.InPlaceLoad) -> int:
        checked.append((self._checked, len(self._headers)))
        return real_whole_crc(self)

    monkeypatch.setattr(_inplace.InPlaceLoad, "_whole_crc", whole_crc)
    tr.load_checkpoint(artifact)
    assert same_tensors(saved, snapshot_state(model, optimizer))
    meta = _inplace.meta_load(path)
    assert meta is not None
    storages = {id(t.storage) for t in _plan._walk(meta)}
    assert checked == [(len(storages), len(storages))]  # every storage's header, once

    real_layout = _zip._sequential_layout

    def swapped(fd: int) -> tuple[bytes, dict[str, tuple[int, int, int]]] | None:
        found = real_layout(fd)
        assert found is not None
        folder, records = found
        moments = meta["optimizer"]["state"][0]  # type: ignore[index]
        by_offset = {data: name for name, (_, data, _) in records.items()}
        first, second = by_offset[moments["exp_avg"].storage.offset], by_offset[moments["exp_avg_sq"].storage.offset]
        records = dict(records)
        records[first], records[second] = records[second], records[first]
        return folder, records

    train_steps(model, optimizer, 1)
    monkeypatch.setattr(_plan, "_sequential_layout", swapped)
    with pytest.raises(lh.CheckpointError, match="is corrupted: the local zip header"):
        tr.load_checkpoint(artifact)
    with pytest.raises(lh.CheckpointError, match="local zip header"):
        optimizer.step()
    tr.clear_checkpoint_error()

    def misplaced(fd: int) -> tuple[bytes, dict[str, tuple[int, int, int]]] | None:
        """The data where it is, the header said to lie inside another record's data: never read as a header."""
        found = real_layout(fd)
        assert found is not None
        folder, records = found
        moments = meta["optimizer"]["state"][0]  # type: ignore[index]
        by_offset = {data: name for name, (_, data, _) in records.items()}
        name = by_offset[moments["exp_avg"].storage.offset]
        records = {**records, name: (moments["exp_avg_sq"].storage.offset + 64, *records[name][1:])}
        return folder, records

    monkeypatch.setattr(_plan, "_sequential_layout", misplaced)
    with pytest.raises(lh.CheckpointError, match="is corrupted: 1 of the storages' local zip headers"):
        tr.load_checkpoint(artifact)
    tr.clear_checkpoint_error()
    monkeypatch.setattr(_plan, "_sequential_layout", real_layout)
    tr.load_checkpoint(artifact)  # the file itself was never wrong
    assert same_tensors(saved, snapshot_state(model, optimizer))
    tr.finish()


def test_the_stock_load_targets_are_the_state_dicts_own_tensors() -> None:
    """Where every module loads the stock way, the targets found in one walk of the modules are
    exactly the state dict's own tensors, key for key: nested containers, a submodule reached
    under two names, a missing bias, a non-persistent buffer, tied weights. Batch norm (its own
    ``_load_from_state_dict``) or a load hook anywhere: no stock targets."""
    shared = torch.nn.Linear(4, 4)
    model = torch.nn.ModuleDict(
        {
            "blocks": torch.nn.ModuleList([torch.nn.Linear(4, 4, bias=False), torch.nn.LayerNorm(4)]),
            "a": shared,
            "b": torch.nn.Sequential(shared),
            "head": torch.nn.Linear(4, 4),
        }
    )
    model["head"].weight = model["a"].weight  # tied
    model.register_buffer("steps", torch.zeros(()))
    model.register_buffer("cache", torch.zeros(3), persistent=False)
    targets = _inplace.stock_targets(model)
    live = model.state_dict(keep_vars=True)
    assert targets is not None
    assert sorted(targets) == sorted(live)
    assert all(targets[key] is live[key] for key in live)
    assert "b.0.weight" in targets and "cache" not in targets and "blocks.0.bias" not in targets

    assert _inplace.stock_targets(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))) is None
    hooked = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert _inplace.stock_targets(hooked) is not None
    hooked[1][0].register_load_state_dict_pre_hook(lambda *args: None)
    assert _inplace.stock_targets(hooked) is None
