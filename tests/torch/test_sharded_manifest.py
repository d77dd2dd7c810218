"""Sharded checkpoints in one process: the manifest's checks, and what a load plans to read.

A hostile or damaged manifest must be refused before a single shard byte is
read or a tensor allocated; these tests save a real /3 checkpoint
(``watch(..., sharded=True)`` in a single process), rewrite its manifest, and
load the folder by path (a folder carries no record, so the manifest's own
checks are all that stands between it and the model).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

import launchhelm as lh

torch = pytest.importorskip("torch")
lht = pytest.importorskip("launchhelm.torch")

from launchhelm.torch import _manifest, _sharded  # noqa: E402
from launchhelm.torch._checkpointer import Checkpointer  # noqa: E402
from launchhelm.torch._sharded._reads import _plan_reads  # noqa: E402


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _train(model: Any, optimizer: Any) -> None:
    optimizer.zero_grad()
    model(torch.linspace(-1, 1, 8).reshape(2, 4)).pow(2).sum().backward()
    optimizer.step()


@pytest.fixture
def saved(tmp_path: Path) -> tuple[str, Path, dict[str, Any]]:
    """A single-process /3 checkpoint on a local store: (store url, its folder, its manifest)."""
    url = str(tmp_path / "store")
    model, optimizer = _model()
    tr = lht.init("sharded", store=url)
    tr.watch(model, optimizer, sharded=True)
    _train(model, optimizer)
    ckpt = tr.save_checkpoint(extra={"pos": (3, 4), "t": torch.arange(3)})
    tr.finish()
    folder = Path(url) / "runs" / tr.id / "artifacts" / str(ckpt)
    return url, folder, json.loads((folder / "manifest.json").read_text())


def test_a_single_process_run_saves_sharded_when_asked_and_restores_exactly(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    model, optimizer = _model()
    tr = lht.init("sharded", store=url)
    tr.watch(model, optimizer, sharded=True)
    _train(model, optimizer)
    ckpt = tr.save_checkpoint(extra={"pos": (3, 4), "t": torch.arange(3), "f": float("nan")})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt_before = {k: v.clone() for k, v in optimizer.state[model[0].weight].items()}
    _train(model, optimizer)
    extra = tr.load_checkpoint("latest")
    assert extra["pos"] == (3, 4) and torch.equal(extra["t"], torch.arange(3)) and extra["f"] != extra["f"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(opt_before[k], v) for k, v in optimizer.state[model[0].weight].items())
    assert tr.global_step == 1
    tr.finish()
    [record] = lh.Api(url).run(tr.id).checkpoints()
    assert record.id == ckpt and record.format == lht.FORMAT_SHARDED
    assert set(record.files) == {"manifest.json", "shard-00000.bin"}
    assert record.size == sum(record.files.values())


def _load_folder(url: str, folder: Path) -> str:
    """Load ``folder`` by path into a fresh run; the CheckpointError's message."""
    model, optimizer = _model()
    tr = lht.init("other", store=url)
    tr.watch(model, optimizer, sharded=True)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(lh.CheckpointError) as caught:
        tr.load_checkpoint(folder)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())  # nothing applied
    with pytest.raises(lh.CheckpointError):  # and training does not go on from it
        _train(model, optimizer)
    tr.clear_checkpoint_error()
    tr.finish()
    return str(caught.value)


def _first_chunk(m: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in m["tensors"].values() if e["chunks"])["chunks"][0]


HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "range past its object": (lambda m: _first_chunk(m).update(start=10**6), "outside its object"),
    "shape not matching bytes": (lambda m: _first_chunk(m).update(nbytes=_first_chunk(m)["nbytes"] + 4), "bytes for"),
    "key outside the prefix": (lambda m: m["objects"][0].update(name="../../run.json"), "shard-<rank>.bin"),
    "terabyte shape": (
        lambda m: next(iter(m["tensors"].values())).update(shape=[2**40, 2**10]),
        "elements",
    ),
    "terabyte chunk": (
        lambda m: _first_chunk(m).update(shape=[2**20, 2**20], nbytes=2**42),
        "outside",
    ),
    "unknown dtype": (lambda m: next(iter(m["tensors"].values())).update(dtype="object"), "unknown dtype"),
    "overlapping chunks": (
        lambda m: (lambda e: e["chunks"].append(dict(e["chunks"][0])))(next(iter(m["tensors"].values()))),
        "overlaps",
    ),
    "missing block crc": (lambda m: _first_chunk(m).update(crc64nvme=[]), "crc64nvme per"),
    "wrong format": (lambda m: m.update(format="launchhelm.torch.checkpoint/9"), "format"),
    "negative size": (lambda m: m["objects"][0].update(size=-1), "size"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_manifest_is_refused_before_any_shard_is_read(
    saved: tuple[str, Path, dict[str, Any]], tmp_path: Path, case: str
) -> None:
    url, folder, manifest = saved
    damage, expected = HOSTILE[case]
    copy = tmp_path / "copy" / folder.name
    shutil.copytree(folder, copy)
    (copy / "shard-00000.bin").unlink()  # a read would fail differently: nothing may be read
    damage(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    message = _load_folder(url, copy)
    assert expected in message, message
    assert "No such file" not in message and "FileNotFoundError" not in message, message


def test_an_intact_folder_loads_by_path_and_a_flipped_shard_byte_is_refused(
    saved: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    url, folder, _ = saved
    copy = tmp_path / "copy" / folder.name
    shutil.copytree(folder, copy)
    model, optimizer = _model()
    tr = lht.init("other", store=url)
    tr.watch(model, optimizer, sharded=True)
    assert tr.load_checkpoint(copy / "manifest.json")["pos"] == (3, 4)
    data = bytearray((copy / "shard-00000.bin").read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / "shard-00000.bin").write_bytes(bytes(data))
    with pytest.raises(lh.CheckpointError, match="does not match its crc64nvme"):
        tr.load_checkpoint(copy)
    tr.clear_checkpoint_error()
    tr.finish()


def test_a_model_with_dtensors_cannot_opt_out_of_sharded_checkpoints() -> None:
    model, optimizer = _model()
    assert not _sharded.has_dtensors(model)
    run = lht.TorchRun.__new__(lht.TorchRun)  # watch() needs no store: only its argument checks run
    run._hooks = []
    run._checkpointer = Checkpointer(cast(Any, None))  # nor a link: it only records what is watched
    run.watch(model, optimizer)
    assert run._checkpointer.watched is not None and run._checkpointer.watched.sharded is False
    run.watch(model, optimizer, sharded=True)
    assert run._checkpointer.watched.sharded is True


def _planned(saved_boxes: list[tuple[list[int], list[int]]], live: tuple[list[int], list[int]]) -> list[Any]:
    shape = [7, 3]
    chunks, start = [], 0
    for offset, size in saved_boxes:
        nbytes = size[0] * size[1] * 4
        chunks.append(
            {"offset": offset, "shape": size, "object": 0, "start": start, "nbytes": nbytes, "crc64nvme": ["0" * 16]}
        )
        start += nbytes
    entry = {"dtype": "float32", "shape": shape, "chunks": chunks}
    dest = torch.empty(live[1])
    box = (tuple(live[0]), tuple(live[1]))
    return _plan_reads(entry, ["shard-00000.bin"], 4096, box, dest)


def test_a_load_reads_only_the_chunks_that_overlap_its_shard() -> None:
    saved = [([0, 0], [2, 3]), ([2, 0], [2, 3]), ([4, 0], [2, 3]), ([6, 0], [1, 3])]  # 7 rows on 4 ranks
    reads = _planned(saved, ([2, 0], [3, 3]))  # rows 2..4 of a 3-rank load
    assert [(r.overlap, r.first) for r in reads] == [((2, 3), 0), ((1, 3), 0)]
    assert [r.obj for r in reads] == ["shard-00000.bin"] * 2
    assert _planned(saved, ([7, 0], [0, 3])) == []  # an empty shard reads nothing


def test_manifest_values_round_trip_exactly() -> None:
    value = {
        "t": (1, 2.5, None),
        "s": {3},
        "b": b"\x00\xff",
        "nan": float("inf"),
        1: "int key",
        "__odd": torch.tensor([1.5, -0.0], dtype=torch.bfloat16),
        "d": torch.float16,
    }
    raw = json.dumps(_manifest.encode_value(value), allow_nan=False)
    back = _manifest.decode_value(json.loads(raw))
    assert back["t"] == (1, 2.5, None) and back["s"] == {3} and back["b"] == b"\x00\xff"
    assert back["nan"] == float("inf") and back[1] == "int key" and back["d"] is torch.float16
    assert torch.equal(back["__odd"].view(torch.int16), value["__odd"].view(torch.int16))


def test_load_weights_reads_a_sharded_folder_and_a_bundle_file_into_a_plain_module(
    saved: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    url, folder, _ = saved
    model, optimizer = _model()
    _train(model, optimizer)  # the weights the fixture saved
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    for path in (folder, folder / "manifest.json"):
        fresh, _ = _model()
        torch.nn.init.zeros_(fresh[0].weight)
        assert lht.load_weights(fresh, path) is fresh
        assert all(torch.equal(expected[k], v) for k, v in fresh.state_dict().items())
    # format /1: a bundle file, and a folder holding one (what download_to gives)
    tr = lht.init("bundle", store=url)
    tr.watch(model, optimizer)
    ckpt = tr.save_checkpoint()
    tr.finish()
    bundle_dir = Path(url) / "runs" / tr.id / "artifacts" / str(ckpt)
    for path in (bundle_dir / f"{ckpt}.pt", bundle_dir):
        fresh, _ = _model()
        torch.nn.init.zeros_(fresh[0].weight)
        lht.load_weights(fresh, path)
        assert all(torch.equal(expected[k], v) for k, v in fresh.state_dict().items())
    with pytest.raises(lh.CheckpointError, match="does not match the module"):
        lht.load_weights(torch.nn.Linear(4, 3), folder)
    with pytest.raises(lh.CheckpointError, match="no checkpoint"):
        lht.load_weights(torch.nn.Linear(4, 3), tmp_path)


def test_gc_and_retention_delete_every_object_of_a_sharded_checkpoint(tmp_path: Path) -> None:
    from launchhelm._gc import collect_garbage
    from launchhelm.storage import open_store

    url = str(tmp_path / "store")
    model, optimizer = _model()
    tr = lht.init("sharded", store=url)
    tr.watch(model, optimizer, sharded=True)
    _train(model, optimizer)
    old = tr.save_checkpoint()
    _train(model, optimizer)
    new = tr.save_checkpoint()
    artifacts = Path(url) / "runs" / tr.id / "artifacts"
    # what a save killed before its manifest leaves: a shard object under a prefix no event names
    with open_store(url).writer(f"runs/{tr.id}/artifacts/ckpt-00000009-deadbeef/shard-00000.bin") as f:
        f.write(b"\0" * 64)
    tr.finish(close_run=False)
    collect_garbage(url, older_than=0, keep_last=1)
    assert sorted(p.name for p in artifacts.iterdir()) == [new]
    assert not (artifacts / str(old)).exists()
    assert sorted(p.name for p in (artifacts / str(new)).iterdir()) == ["manifest.json", "shard-00000.bin"]
    tr2 = lht.init("sharded", store=url, resume=tr.id)
    tr2.watch(*_model(), sharded=True)
    tr2.load_checkpoint("latest")
    assert tr2.global_step == 2
    tr2.finish()


def test_a_non_blocking_sharded_save_holds_the_state_of_the_moment_it_was_called(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    model, optimizer = _model()
    tr = lht.init("sharded", store=url)
    tr.watch(model, optimizer, sharded=True)
    _train(model, optimizer)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt = tr.save_checkpoint(extra={"at": 1}, blocking=False)
    _train(model, optimizer)  # training goes on while the save writes from its own copy
    _train(model, optimizer)
    tr.wait_for_checkpoint()
    assert [c.id for c in lh.Api(url).run(tr.id).checkpoints()] == [ckpt]
    assert tr.load_checkpoint("latest") == {"at": 1} and tr.global_step == 1
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    tr.finish()
