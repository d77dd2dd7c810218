"""The ranged reads of sharded loads: straight into the destination, through scratch blocks, strided.

Saved chunks split along one dimension, loaded into boxes split along the same or another, with
a small block size so that block edges fall inside, at and across every overlap's ends.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import launchhelm as lh
from launchhelm.storage._checksum import crc64nvme
from launchhelm.torch._sharded._reads import _plan_reads, _Reader, _Source

BLOCK = 4096
OBJECT = "shard-00000.bin"


def _split(n: int, parts: int, rng: random.Random) -> list[tuple[int, int]]:
    cuts = sorted(rng.randint(0, n) for _ in range(parts - 1))
    bounds = [0, *cuts, n]
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(parts)]


def _box(shape: tuple[int, ...], dim: int, start: int, size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    offset = [0] * len(shape)
    extent = list(shape)
    offset[dim], extent[dim] = start, size
    return tuple(offset), tuple(extent)


def _save(folder: Path, full: torch.Tensor, dim: int, parts: int, rng: random.Random) -> dict:
    chunks, data = [], bytearray()
    for start, size in _split(full.shape[dim], parts, rng):
        offset, extent = _box(tuple(full.shape), dim, start, size)
        part = full[tuple(slice(o, o + e) for o, e in zip(offset, extent, strict=True))].contiguous()
        raw = part.reshape(-1).view(torch.uint8).numpy().tobytes()
        crcs = [f"{crc64nvme(raw[i : i + BLOCK]):016x}" for i in range(0, len(raw), BLOCK)]
        chunks.append(
            {"offset": list(offset), "shape": list(extent), "object": 0, "start": len(data), "nbytes": len(raw)}
            | {"crc64nvme": crcs}
        )
        data += raw
    (folder / OBJECT).write_bytes(bytes(data))
    return {"dtype": "float32", "shape": list(full.shape), "chunks": chunks}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_every_box_reads_bitwise_whatever_the_split(tmp_path: Path, dtype: torch.dtype) -> None:
    rng = random.Random(7)
    for shape in [(300, 41), (5, 7, 300), (2000,)]:
        full = (torch.randn(shape) * 100).to(dtype)
        for saved_dim in range(len(shape)):
            entry = _save(tmp_path, full, saved_dim, 3, rng)
            for live_dim in range(len(shape)):
                for start, size in _split(shape[live_dim], 4, rng):
                    box = _box(shape, live_dim, start, size)
                    dest = torch.full(box[1], 3, dtype=dtype)
                    reads = _plan_reads(entry, [OBJECT], BLOCK, box, dest)
                    _Reader(_Source(None, None, tmp_path), "t").run(reads)
                    expected = full[tuple(slice(o, o + e) for o, e in zip(*box, strict=True))]
                    assert torch.equal(dest.view(torch.uint8), expected.contiguous().view(torch.uint8)), (box, shape)


def test_a_verifying_pass_keeps_nothing_and_catches_a_flipped_byte(tmp_path: Path) -> None:
    full = torch.randn(300, 41)
    entry = _save(tmp_path, full, 0, 2, random.Random(1))
    dest = torch.zeros(150, 41)
    reads = _plan_reads(entry, [OBJECT], BLOCK, ((150, 0), (150, 41)), dest)
    reader = _Reader(_Source(None, None, tmp_path), "checkpoint x")
    reader.run([], verify=reads)
    assert not dest.any()  # checked, not placed
    reader.run(reads)
    assert torch.equal(dest, full[150:])
    data = bytearray((tmp_path / OBJECT).read_bytes())
    data[-5] ^= 0x01
    (tmp_path / OBJECT).write_bytes(bytes(data))
    with pytest.raises(lh.CheckpointError, match="does not match its crc64nvme"):
        reader.run([], verify=reads)
    (tmp_path / OBJECT).write_bytes(bytes(data[:100]))
    with pytest.raises(lh.CheckpointError, match="truncated"):
        reader.run(reads)
    (tmp_path / OBJECT).unlink()
    with pytest.raises(lh.CheckpointError, match="is missing"):
        reader.run(reads)
