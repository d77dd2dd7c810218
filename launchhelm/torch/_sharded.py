"""Sharded checkpoints (format /3): every rank writes its shards, any number of ranks reads them.

The design, the manifest and what a crash at each moment leaves are in
``docs/storage.md`` ("Sharded checkpoints"). In short: each rank writes the
chunks of the state dict it was assigned as raw bytes into one object of its
own, with a CRC64NVME per block; rank 0 writes a JSON manifest and publishes
the ``checkpoint`` event, which is the commit. A load plans, from the
manifest, the byte ranges that overlap the tensors this rank holds now, reads
them concurrently, checks every block it read, and applies nothing until
every rank has. From local files the checked bytes are not kept: once every
rank agrees they are read again, straight into the live shards, so a load
holds no second copy of the state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from launchhelm._exceptions import CheckpointError
from launchhelm.runlog._checkpoints import artifact_prefix, new_artifact_id
from launchhelm.storage import LocalStore, Store
from launchhelm.storage._checksum import CRC64NVME, combine_crc64nvme, crc64nvme
from launchhelm.torch import _dist
from launchhelm.torch._manifest import (
    BLOCK_SIZE,
    FORMAT_SHARDED,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    decode_value,
    dtype_name,
    dtype_named,
    encode_value,
    object_name,
    validate_manifest,
)
from launchhelm.torch._records import LoadTarget, RankRecord
from launchhelm.torch._rng import restore_rng, validate_rng

if TYPE_CHECKING:
    from launchhelm.torch._run import TorchRun

__all__ = ["FORMAT_SHARDED", "Survey", "has_dtensors", "load", "save", "survey"]

_log = logging.getLogger("launchhelm")
_READ_THREADS = 8
#: Blocks (of BLOCK_SIZE) one read request covers: large enough to stream, small enough to spread
#: a shard's reads over the threads (and an object store's connections).
_PIECE_BLOCKS = 4

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (global offset, shape) of a chunk


# -- torch's distributed state dicts: the one door to them ----------------------------------
def _dtensor_type() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor


def has_dtensors(model: torch.nn.Module) -> bool:
    """Whether any parameter is a DTensor (FSDP2, tensor parallel): such models save sharded."""
    if not torch.distributed.is_available():
        return False
    dtensor = _dtensor_type()
    return any(isinstance(p, dtensor) for p in model.parameters())


def _box(t: torch.Tensor) -> tuple[Box, torch.Tensor]:
    """The box of the global tensor this rank holds, and its local tensor."""
    dtensor = _dtensor_type()
    if not isinstance(t, dtensor):
        return ((0,) * t.dim(), tuple(t.shape)), t.detach()
    from torch.distributed.tensor import Partial

    from launchhelm.torch._torch_private import dtensor_local_box

    if any(isinstance(p, Partial) for p in t.placements):
        raise CheckpointError("a DTensor with Partial placements cannot be saved: reduce it first")
    local = t.to_local().detach()
    offset, shape = dtensor_local_box(t)
    if shape != tuple(local.shape):
        raise CheckpointError(f"a DTensor's local shard is {tuple(local.shape)}, its placements say {shape}")
    return (offset, shape), local


@contextlib.contextmanager
def _run_hooks_off(run: TorchRun, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """torch's ``get_state_dict`` steps a stateless optimizer once (lr 0) to make its state:
    that step is not a training step, so the run's step hooks must not see it."""
    for handle in run._hooks:
        handle.remove()
    try:
        yield
    finally:
        run._hooks = [
            optimizer.register_step_pre_hook(run._before_optimizer_step),
            optimizer.register_step_post_hook(run._after_optimizer_step),
        ]


def _state_dicts(run: TorchRun, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    with _run_hooks_off(run, optimizer):
        return get_state_dict(model, optimizer)


def _collect(tree: Any, root: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """``tree`` encoded as JSON with its tensors as keys, and those tensors by key."""
    found: dict[str, torch.Tensor] = {}

    def keep(path: str, t: torch.Tensor) -> str:
        found[path] = t
        return path

    return encode_value(tree, keep, root), found


# -- saving ----------------------------------------------------------------------------------
def _plan(offers: list[list[list[Any]]]) -> dict[tuple[str, Box], int]:
    """Which rank writes each distinct non-empty chunk: one of its holders, the least loaded.

    Deterministic from what every rank gathered, so every rank computes the same plan.
    """
    holders: dict[tuple[str, Box], list[int]] = {}
    sizes: dict[tuple[str, Box], int] = {}
    for rank, offer in enumerate(offers):
        for key, _dtype, _shape, offset, shape, nbytes in offer:
            if nbytes == 0:
                continue
            chunk = (key, (tuple(offset), tuple(shape)))
            holders.setdefault(chunk, []).append(rank)
            sizes[chunk] = nbytes
    load = [0] * len(offers)
    writer: dict[tuple[str, Box], int] = {}
    for chunk in sorted(holders, key=lambda c: (-sizes[c], c[0], c[1])):
        rank = min(holders[chunk], key=lambda r: (load[r], r))
        writer[chunk] = rank
        load[rank] += sizes[chunk]
    return writer


def _bytes_of(local: torch.Tensor) -> memoryview:
    flat = local.detach().to("cpu").contiguous().reshape(-1)
    view: memoryview = flat.view(torch.uint8).numpy().data
    return view.cast("B")


def _write_object(run: TorchRun, key: str, chunks: list[tuple[str, Box, torch.Tensor]]) -> dict[str, Any]:
    """Stream the chunks into one object; its record with each chunk's place and block CRCs."""
    records: list[dict[str, Any]] = []
    position, whole = 0, 0
    with run._store.writer(key) as out:
        for name, (offset, shape), local in chunks:
            view = _bytes_of(local)
            crcs = []
            for start in range(0, len(view), BLOCK_SIZE):
                block = view[start : start + BLOCK_SIZE]
                crc = crc64nvme(block)
                out.write(block)
                whole = combine_crc64nvme(whole, crc, len(block))
                crcs.append(f"{crc:016x}")
            records.append(
                {
                    "key": name,
                    "offset": list(offset),
                    "shape": list(shape),
                    "start": position,
                    "nbytes": len(view),
                    CRC64NVME: crcs,
                }
            )
            position += len(view)
    return {"name": key.rsplit("/", 1)[-1], "size": position, CRC64NVME: f"{whole:016x}", "chunks": records}


@dataclass
class Survey:
    """What one rank holds to save: taken before the save's one gather, which carries :meth:`shared`."""

    offer: list[list[Any]]  # [key, dtype, global shape, offset, local shape, nbytes] per tensor
    problem: str | None
    artifact: str | None  # rank 0's new id; None elsewhere
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    state: Any = None

    def shared(self) -> tuple[list[list[Any]], str | None, str | None]:
        return self.offer, self.problem, self.artifact


def survey(run: TorchRun, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Survey:
    """This rank's state dicts and what it offers to write; never raises (a problem is reported)."""
    problem: str | None = None
    offer: list[list[Any]] = []
    tensors: dict[str, torch.Tensor] = {}
    state: Any = None
    try:
        msd, osd = _state_dicts(run, model, optimizer)
        model_state, model_tensors = _collect(msd, "model")
        optim_state, optim_tensors = _collect(osd, "optimizer")
        tensors = {**model_tensors, **optim_tensors}
        state = {
            "model": model_state,
            "optimizer": optim_state,
            "scheduler": encode_value(run._scheduler.state_dict()) if run._scheduler is not None else None,
            "scaler": encode_value(run._scaler.state_dict()) if run._scaler is not None else None,
        }
        for key, t in tensors.items():
            (offset, shape), _local = _box(t)
            nbytes = math.prod(shape) * t.element_size()
            offer.append([key, dtype_name(t.dtype), list(t.shape), list(offset), list(shape), nbytes])
    except Exception as exc:
        problem = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    artifact = new_artifact_id(run._step) if run._rank == 0 else None
    return Survey(offer, problem, artifact, tensors, state)


def save(
    run: TorchRun,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    records: list[RankRecord],
    blocking: bool = True,
    surveyed: Survey | None = None,
) -> str | None:
    """Save a sharded checkpoint: called on every rank by ``save_checkpoint`` after its barrier.

    ``surveyed``: this rank's :func:`survey`, taken before ``records`` were
    gathered, each record carrying its rank's ``Survey.shared()`` as
    ``"shards"``; without it the survey is taken and gathered here.

    ``blocking=False``: each rank copies its chunks into host buffers reused
    from save to save and returns; a thread per rank writes them and commits
    (one save in flight: the next save waits for it).
    """
    rank, world = run._rank, run._world
    mine_survey = surveyed if surveyed is not None else survey(run, model, optimizer)
    tensors, state = mine_survey.tensors, mine_survey.state
    gathered: list[tuple[list[list[Any]], str | None, str | None]]
    if surveyed is not None:
        gathered = [r["shards"] for r in records]
    else:
        gathered = _dist.all_gather(mine_survey.shared(), world)
    artifact = gathered[0][2]
    failed = [f"rank {r}: {g[1]}" for r, g in enumerate(gathered) if g[1]]
    if not failed:
        failed = _disagreements([g[0] for g in gathered])
    if failed:
        raise CheckpointError(f"checkpoint at step {run._step} was not saved: " + "; ".join(failed), run_id=run.id)
    writer = _plan([g[0] for g in gathered])
    mine = []
    for key, t in tensors.items():
        box, local = _box(t)
        if writer.get((key, box)) == rank:
            mine.append((key, box, local))
    # what the manifest records is taken now: training may change it while a non-blocking save writes
    context = {
        "step": run._step,
        "control": {"seq": run._control_seq, "paused": run._paused},
        "tunables": encode_value(dict(run.tunables)),
        "state": state,
        "records": records,
        "meta": gathered[0][0],
    }
    if blocking:
        outcome = _commit(run, str(artifact), mine, context, None)
        if outcome[1] is not None:
            raise CheckpointError(f"checkpoint at step {context['step']} was not saved: {outcome[1]}", run_id=run.id)
        return outcome[0] if rank == 0 else None
    group = _save_group(run)
    copies = run._snapshots.snapshot([local for _key, _box_, local in mine])  # the one copy training waits for
    staged = [(key, box, copy) for (key, box, _local), copy in zip(mine, copies, strict=True)]

    def work() -> None:
        try:
            _artifact, error = _commit(run, str(artifact), staged, context, group)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            failure = CheckpointError(
                f"background save of checkpoint {artifact} (step {context['step']}) failed on some rank: {error}; "
                "the next optimizer step raises this error (clear_checkpoint_error() to train on)",
                run_id=run.id,
                step=context["step"],
            )
            run._save_error = failure
            # every rank learns the outcome; the step hooks make it every rank's pending error at one step
            run._save_failed = failure

    run._save_thread = threading.Thread(target=work, name=f"launchhelm-save-{artifact}", daemon=False)
    run._save_thread.start()
    return artifact if rank == 0 else None


def _save_group(run: TorchRun) -> Any:
    """A gloo group of all ranks for background saves, created once, together, in the foreground.

    The commit's collectives run on the save thread while training runs its
    own (FSDP2's all-gathers) on the default group; sharing one group would
    interleave them.
    """
    group = getattr(run, "_sharded_save_group", None)
    if group is None and run._world > 1:
        group = torch.distributed.new_group(backend="gloo")
        run._sharded_save_group = group  # type: ignore[attr-defined]
    return group


def _gather(value: Any, world: int, group: Any) -> list[Any]:
    if group is None:
        return _dist.all_gather(value, world)
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, value, group=group)
    return out


def _broadcast(value: Any, world: int, group: Any) -> Any:
    if group is None:
        return _dist.broadcast(value, world)
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _commit(
    run: TorchRun, artifact: str, mine: list[tuple[str, Box, torch.Tensor]], context: dict[str, Any], group: Any
) -> tuple[str | None, str | None]:
    """Every rank: store its object; rank 0 then writes the manifest and publishes. (id, error) on every rank."""
    rank, world = run._rank, run._world
    prefix = artifact_prefix(run.id, artifact)
    stored: dict[str, Any] | None = None
    error: str | None = None
    if mine:
        try:
            stored = _write_object(run, f"{prefix}/{object_name(rank)}", mine)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    results = _gather((stored, error), world, group)
    outcome: tuple[str | None, str | None] = (None, None)
    if rank == 0:
        errors = [f"rank {r}: {e}" for r, (_s, e) in enumerate(results) if e]
        if errors:
            outcome = (None, "; ".join(errors))
        else:
            try:
                _publish(run, artifact, prefix, [s for s, _e in results if s is not None], context)
                outcome = (artifact, None)
            except Exception as exc:
                outcome = (None, f"{type(exc).__name__}: {exc}")
    result: tuple[str | None, str | None] = _broadcast(outcome, world, group)
    return result


def _disagreements(offers: list[list[list[Any]]]) -> list[str]:
    """Ranks whose state dicts differ in keys, dtypes or global shapes from rank 0's."""
    first = {o[0]: (o[1], o[2]) for o in offers[0]}
    out = []
    for rank, offer in enumerate(offers[1:], start=1):
        theirs = {o[0]: (o[1], o[2]) for o in offer}
        if theirs != first:
            differ = sorted(set(first).symmetric_difference(theirs)) or sorted(
                k for k in first if first[k] != theirs.get(k)
            )
            out.append(f"rank {rank}'s state differs from rank 0's at {differ[:3]}")
    return out


def _publish(
    run: TorchRun,
    artifact: str,
    prefix: str,
    stored: list[dict[str, Any]],
    context: dict[str, Any],
) -> None:
    meta = {o[0]: (o[1], o[2]) for o in context["meta"]}
    records = context["records"]
    tensors: dict[str, dict[str, Any]] = {k: {"dtype": d, "shape": s, "chunks": []} for k, (d, s) in meta.items()}
    for index, obj in enumerate(stored):
        for chunk in obj["chunks"]:
            entry = {k: v for k, v in chunk.items() if k != "key"}
            tensors[chunk["key"]]["chunks"].append({**entry, "object": index})
    manifest = {
        "format": FORMAT_SHARDED,
        "run_id": run.id,
        "step": context["step"],
        "saved_at": time.time(),
        "world_size": run._world,
        "torch_version": str(torch.__version__),
        "byteorder": sys.byteorder,
        "block_size": BLOCK_SIZE,
        "objects": [{"name": o["name"], "size": o["size"], CRC64NVME: o[CRC64NVME]} for o in stored],
        "tensors": tensors,
        "state": context["state"],
        "tunables": context["tunables"],
        "control": context["control"],
        "rng_by_rank": [encode_value({"rank": r["rank"], **r["rng"]}) for r in records],
        "extra_by_rank": [encode_value(r["extra"]) for r in records],
        "placement_by_rank": [r["placement"] for r in records],
    }
    raw = json.dumps(manifest, separators=(",", ":"), allow_nan=False).encode()
    run._store.create(f"{prefix}/{MANIFEST_NAME}", raw)
    sums = {CRC64NVME: f"{crc64nvme(raw):016x}"}
    files: list[dict[str, Any]] = [{"name": MANIFEST_NAME, "size": len(raw), **sums}]
    files += [{"name": o["name"], "size": o["size"], CRC64NVME: o[CRC64NVME]} for o in stored]
    run._publish_checkpoint(
        artifact,
        step=context["step"],
        fmt=FORMAT_SHARDED,
        files=files,
        checksums=sums,
        size=sum(f["size"] for f in files),
        world_size=run._world,
        control_seq=context["control"]["seq"],
    )


# -- loading ---------------------------------------------------------------------------------
class _Source:
    """Where a checkpoint's objects are read: a store prefix, or a local folder.

    Local files (a folder, or a ``LocalStore``) are read with ``preadv`` straight into
    the memory that keeps the bytes; other stores answer ranged GETs, copied in once.
    """

    def __init__(self, run: TorchRun | None, target: LoadTarget | None, folder: Path | None = None) -> None:
        self.store = run._store if run is not None else None
        self.prefix = str(target.get("key", "")).rsplit("/", 1)[0] if target is not None else ""
        if folder is None and target is not None and target.get("path"):
            folder = Path(str(target["path"]))
        if folder is None and isinstance(self.store, LocalStore):
            folder = self.store.root / self.prefix
        self.folder = folder
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, name: str) -> int:
        with self._lock:
            fd = self._fds.get(name)
            if fd is None:
                assert self.folder is not None
                fd = self._fds[name] = os.open(self.folder / name, os.O_RDONLY)
            return fd

    @classmethod
    def at(cls, store: Store, prefix: str) -> _Source:
        """A checkpoint's objects under ``prefix`` of ``store``, with no run (export, consolidation)."""
        source = cls(None, None)
        source.store, source.prefix = store, prefix
        if isinstance(store, LocalStore):
            source.folder = store.root / prefix
        return source

    def read_into(self, name: str, start: int, view: memoryview) -> int:
        """Fill ``view`` with the object's bytes from ``start``; how many there were."""
        if self.folder is not None:
            fd, done = self._fd(name), 0
            while done < len(view):
                n = os.preadv(fd, [view[done:]], start + done)
                if n == 0:
                    break
                done += n
            return done
        assert self.store is not None
        data = self.store.read_range(f"{self.prefix}/{name}", start, start + len(view))
        view[: len(data)] = data
        return len(data)

    def whole(self, name: str) -> bytes:
        if self.folder is not None:
            path = self.folder / name
            if path.stat().st_size > MAX_MANIFEST_BYTES:
                raise CheckpointError(f"{path} is larger than a manifest may be")
            return path.read_bytes()
        assert self.store is not None
        return self.store.read(f"{self.prefix}/{name}")

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


@dataclass
class _Read:
    """One ranged read: a saved chunk's blocks covering its overlap with this rank's box."""

    obj: str
    start: int  # in the object
    end: int
    crcs: list[str]  # of the blocks read, in order
    block: int
    first: int  # byte of the overlap's first element, from `start`
    overlap: tuple[int, ...]
    strides: tuple[int, ...]  # of the saved chunk, in elements
    dtype: torch.dtype
    dest: torch.Tensor  # the view of the new local tensor it fills


@dataclass
class _Prepared:
    """What a verified load applies."""

    bundle: dict[str, Any]
    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    scaler: Any = None
    rng: dict[str, Any] = field(default_factory=dict)
    extra: Any = None
    #: Reads already verified that fill live tensors in place once every rank agrees (local files only).
    in_place: list[_Read] = field(default_factory=list)
    reader: _Reader | None = None


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))


def _plan_reads(entry: dict[str, Any], objects: list[str], block: int, box: Box, dest: torch.Tensor) -> list[_Read]:
    offset, shape = box
    dtype = dest.dtype
    reads = []
    for chunk in entry["chunks"]:
        c_off, c_shape = tuple(chunk["offset"]), tuple(chunk["shape"])
        lo = tuple(max(a, b) for a, b in zip(offset, c_off, strict=True))
        hi = tuple(min(a + s, b + t) for a, s, b, t in zip(offset, shape, c_off, c_shape, strict=True))
        if any(h <= low for low, h in zip(lo, hi, strict=True)) or math.prod(c_shape) == 0:
            continue
        strides = _row_major(c_shape)
        first = sum((a - b) * s for a, b, s in zip(lo, c_off, strides, strict=True))
        last = sum((h - 1 - b) * s for h, b, s in zip(hi, c_off, strides, strict=True))
        size = dtype.itemsize
        b0, b1 = first * size // block, -(-(last + 1) * size // block)
        start = chunk["start"] + b0 * block
        end = chunk["start"] + min(b1 * block, chunk["nbytes"])
        view = dest[tuple(slice(a - o, h - o) for a, h, o in zip(lo, hi, offset, strict=True))]
        reads.append(
            _Read(
                obj=objects[chunk["object"]],
                start=start,
                end=end,
                crcs=chunk[CRC64NVME][b0:b1],
                block=block,
                first=first * size - b0 * block,
                overlap=tuple(h - low for low, h in zip(lo, hi, strict=True)),
                strides=strides,
                dtype=dtype,
                dest=view,
            )
        )
    return reads


def _bytes_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable, without a copy."""
    if t.numel() == 0:
        return memoryview(bytearray())
    view: memoryview = t.view(-1).view(torch.uint8).numpy().data
    return view.cast("B")


class _Reader:
    """Runs planned reads in pieces on a thread pool, each block checked against its CRC64NVME.

    Where the overlap a read fills is one contiguous run of both the saved chunk and
    the destination (a shard that equals, or lies along the first dimension of, a saved
    chunk: FSDP2's case, at any world size), its whole blocks are read straight into the
    destination tensor and checked there; only a block that straddles the overlap's ends
    goes through a block-sized scratch buffer. Any other overlap is read into one buffer
    and copied out with its strides.
    """

    def __init__(self, source: _Source, where: str) -> None:
        self.source = source
        self.where = where
        self._local = threading.local()

    def _fill(self, obj: str, start: int, view: memoryview) -> None:
        if self.source.read_into(obj, start, view) != len(view):
            raise CheckpointError(f"{self.where}: object {obj} is shorter than its record (truncated)")

    def _check(self, read: _Read, index: int, data: memoryview) -> None:
        if f"{crc64nvme(data):016x}" != read.crcs[index]:
            at = read.start + index * read.block
            raise CheckpointError(
                f"{self.where}: object {read.obj} does not match its crc64nvme at bytes {at}..{at + len(data)}: "
                "corrupted"
            )

    @staticmethod
    def _blocks(read: _Read) -> list[tuple[int, int, int]]:
        """(index, start, end) in the object of each block ``read`` covers."""
        return [
            (i, read.start + i * read.block, min(read.start + (i + 1) * read.block, read.end))
            for i in range(len(read.crcs))
        ]

    def tasks(self, read: _Read) -> list[Any]:
        """Callables that together read, check and place ``read``."""
        size = read.dtype.itemsize
        numel = math.prod(read.overlap)
        count = read.strides[0] * (read.overlap[0] - 1) + 1 if read.overlap else 1
        for stride, extent in zip(read.strides[1:], read.overlap[1:], strict=True):
            count += stride * (extent - 1)
        blocks = self._blocks(read)
        if numel and count == numel and read.dest.is_contiguous():
            return self._direct(read, blocks, numel * size)
        return self._strided(read, blocks, count * size)

    def _direct(self, read: _Read, blocks: list[tuple[int, int, int]], nbytes: int) -> list[Any]:
        out = _bytes_view(read.dest)
        lo = read.start + read.first  # where the destination's bytes start in the object
        hi = lo + nbytes
        tasks: list[Any] = []
        run: list[tuple[int, int, int]] = []

        def direct(group: list[tuple[int, int, int]]) -> None:
            first, last = group[0][1], group[-1][2]
            target = out[first - lo : last - lo]
            self._fill(read.obj, first, target)
            for index, b0, b1 in group:
                self._check(read, index, target[b0 - first : b1 - first])

        def edge(index: int, b0: int, b1: int) -> None:
            scratch = memoryview(bytearray(b1 - b0))
            self._fill(read.obj, b0, scratch)
            self._check(read, index, scratch)
            a, b = max(b0, lo), min(b1, hi)
            out[a - lo : b - lo] = scratch[a - b0 : b - b0]

        for index, b0, b1 in blocks:
            if lo <= b0 and b1 <= hi:
                run.append((index, b0, b1))
                if len(run) == _PIECE_BLOCKS:
                    tasks.append(lambda g=run: direct(g))
                    run = []
                continue
            if run:
                tasks.append(lambda g=run: direct(g))
                run = []
            tasks.append(lambda i=index, b0=b0, b1=b1: edge(i, b0, b1))
        if run:
            tasks.append(lambda g=run: direct(g))
        return tasks

    def _strided(self, read: _Read, blocks: list[tuple[int, int, int]], span: int) -> list[Any]:
        scratch = torch.empty(read.end - read.start, dtype=torch.uint8)
        data = _bytes_view(scratch)
        pieces = [blocks[i : i + _PIECE_BLOCKS] for i in range(0, len(blocks), _PIECE_BLOCKS)]
        left = [len(pieces)]
        lock = threading.Lock()

        def piece(group: list[tuple[int, int, int]]) -> None:
            first, last = group[0][1], group[-1][2]
            target = data[first - read.start : last - read.start]
            self._fill(read.obj, first, target)
            for index, b0, b1 in group:
                self._check(read, index, target[b0 - first : b1 - first])
            with lock:
                left[0] -= 1
                done = left[0] == 0
            if done and read.dest.numel():  # the last piece in places the overlap
                flat = scratch[read.first : read.first + span]
                read.dest.copy_(flat.view(read.dtype).as_strided(read.overlap, read.strides))

        return [lambda g=group: piece(g) for group in pieces]

    def _verify(self, read: _Read) -> list[Any]:
        """Tasks that read ``read``'s blocks into a scratch buffer of their thread and check them, keeping nothing."""
        blocks = self._blocks(read)

        def piece(group: list[tuple[int, int, int]]) -> None:
            first, last = group[0][1], group[-1][2]
            scratch = getattr(self._local, "scratch", None)
            if scratch is None or scratch.numel() < last - first:
                scratch = self._local.scratch = torch.empty(last - first, dtype=torch.uint8)
            target = _bytes_view(scratch)[: last - first]
            self._fill(read.obj, first, target)
            for index, b0, b1 in group:
                self._check(read, index, target[b0 - first : b1 - first])

        return [lambda g=blocks[i : i + _PIECE_BLOCKS]: piece(g) for i in range(0, len(blocks), _PIECE_BLOCKS)]

    def run(self, reads: list[_Read], verify: list[_Read] | None = None) -> None:
        """Read, check and place ``reads``; only read and check ``verify``. Raises CheckpointError."""
        tasks = [task for read in reads for task in self.tasks(read)]
        tasks += [task for read in verify or () for task in self._verify(read)]
        try:
            if len(tasks) <= 1:
                for task in tasks:
                    task()
                return
            with ThreadPoolExecutor(max_workers=min(_READ_THREADS, len(tasks))) as pool:
                futures = [pool.submit(task) for task in tasks]
                try:
                    for future in futures:
                        future.result()
                finally:
                    for future in futures:
                        future.cancel()
        except FileNotFoundError as exc:
            raise CheckpointError(f"{self.where}: object {Path(str(exc.filename)).name} is missing") from None
        finally:
            self.source.close()


def _fits_in_place(local: torch.Tensor, dtype: torch.dtype, box: Box) -> bool:
    """Whether a live local tensor can take a local file's bytes as they are (no cast, no device copy)."""
    return (
        local.device.type == "cpu"
        and local.dtype == dtype
        and local.layout == torch.strided
        and local.is_contiguous()
        and tuple(local.shape) == tuple(box[1])
    )


def _choose_per_rank(run: TorchRun, manifest: dict[str, Any], strict: bool, where: str) -> int:
    """Which saved rank's RNG and ``extra`` this rank restores (see docs/storage.md)."""
    saved = int(manifest["world_size"])
    if saved == run._world:
        _check_placement(run, manifest["placement_by_rank"], where)
        return run._rank
    if strict:
        raise CheckpointError(
            f"checkpoint {where} was saved by {saved} rank(s) and is loaded on {run._world}: model and optimizer "
            "reshard exactly, but per-rank RNG and extra cannot be redistributed; pass strict=False to restore "
            f"those of saved rank (rank mod {saved}) on each rank"
        )
    if run._rank == 0:
        _log.warning(
            "checkpoint %s was saved by %d rank(s), loaded on %d: each rank r restores the RNG and extra of saved "
            "rank r mod %d",
            where,
            saved,
            run._world,
            saved,
        )
    return run._rank % saved


def _check_placement(run: TorchRun, saved: Any, where: str) -> None:
    """Refuse a same-size restore where this rank sits at another local rank than at the save (as /2 does)."""
    if not isinstance(saved, list) or len(saved) != run._world or not isinstance(saved[run._rank], dict):
        return
    then, now = saved[run._rank], _dist.placement(run._rank)
    if then.get("local_rank") != now["local_rank"]:
        raise CheckpointError(
            f"checkpoint {where}: rank {run._rank} was local rank {then.get('local_rank')} on {then.get('host')} "
            f"when it was saved and is local rank {now['local_rank']} on {now['host']} now (a swapped rank "
            "mapping: each rank would restore another device's RNG streams); restore with the same rank mapping"
        )


def prepare(
    run: TorchRun, target: LoadTarget, model: torch.nn.Module, optimizer: torch.optim.Optimizer, strict: bool
) -> _Prepared:
    """Read, verify and decode everything this rank restores; nothing is applied."""
    where = target.get("checkpoint") or target.get("path") or "checkpoint"
    source = _Source(run, target)
    try:
        raw = source.whole(MANIFEST_NAME)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {where}: its {MANIFEST_NAME} is missing") from None
    if target.get("size") is not None and len(raw) != target["size"]:
        raise CheckpointError(f"checkpoint {where}: its manifest is {len(raw)} bytes, recorded as {target['size']}")
    expected = (target.get("checksums") or {}).get(CRC64NVME)
    if expected is not None and f"{crc64nvme(raw):016x}" != expected:
        raise CheckpointError(f"checkpoint {where}: its manifest does not match its crc64nvme: corrupted")
    files = target.get("files")
    recorded = {f["name"]: int(f["size"]) for f in files[1:]} if files else None
    manifest = validate_manifest(raw, expected_objects=recorded, where=f"checkpoint {where}")
    source_rank = _choose_per_rank(run, manifest, strict, where)
    msd, osd = _state_dicts(run, model, optimizer)
    _, live = _collect({"model": msd, "optimizer": osd}, "")
    live = {k.removeprefix("/"): t for k, t in live.items()}
    saved = manifest["tensors"]
    if set(live) != set(saved):
        missing, unexpected = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
        raise CheckpointError(
            f"checkpoint {where} does not match the watched model and optimizer: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}; nothing was read"
        )
    objects = [o["name"] for o in manifest["objects"]]
    reads: list[_Read] = []
    in_place: list[_Read] = []
    fresh: dict[str, tuple[torch.Tensor, torch.Tensor, Box]] = {}
    kept: dict[str, torch.Tensor] = {}
    for key, t in live.items():
        entry = saved[key]
        if list(entry["shape"]) != list(t.shape):
            raise CheckpointError(
                f"checkpoint {where}: {key} is {tuple(entry['shape'])} there and {tuple(t.shape)} in the live "
                "state; nothing was read"
            )
        box, local = _box(t)
        dtype = dtype_named(entry["dtype"], key)
        if source.folder is not None and _fits_in_place(local, dtype, box):
            kept[key] = t
            in_place += _plan_reads(entry, objects, manifest["block_size"], box, local)
            continue
        dest = torch.empty(box[1], dtype=dtype)
        fresh[key] = (t, dest, box)
        reads += _plan_reads(entry, objects, manifest["block_size"], box, dest)
    reader = _Reader(source, f"checkpoint {where}")
    reader.run(reads, verify=in_place)

    def tensor(key: str) -> Any:
        if key in kept:  # filled in place when applied
            return kept[key]
        if key not in fresh:
            raise CheckpointError(f"checkpoint {where}: state refers to an unknown tensor {key!r}")
        live_t, dest, _unused = fresh[key]
        dtensor = _dtensor_type()
        if isinstance(live_t, dtensor):
            local = dest.to(device=live_t.to_local().device, dtype=live_t.dtype)
            return dtensor.from_local(
                local,
                live_t.device_mesh,
                live_t.placements,
                run_check=False,
                shape=live_t.shape,
                stride=live_t.stride(),
            )
        return dest.to(device=live_t.device, dtype=live_t.dtype)

    state = manifest["state"]
    prepared = _Prepared(
        bundle={
            "step": manifest["step"],
            "tunables": decode_value(manifest.get("tunables")),
            "control": manifest.get("control"),
        },
        model=decode_value(state.get("model"), tensor, f"checkpoint {where}"),
        optimizer=decode_value(state.get("optimizer"), tensor, f"checkpoint {where}"),
        scheduler=decode_value(state.get("scheduler")),
        scaler=decode_value(state.get("scaler")),
        in_place=in_place,
        reader=reader,
    )
    if isinstance(prepared.bundle["tunables"], dict):
        prepared.bundle["tunables"] = dict(prepared.bundle["tunables"])
    rng = decode_value(manifest["rng_by_rank"][source_rank], None, f"checkpoint {where} rng")
    if isinstance(rng, dict) and set(rng) == {"rank"}:  # imported (launchhelm import dcp): no RNG state to restore
        rng = {}
    else:
        validate_rng(rng, f"checkpoint {where} rng_by_rank[{source_rank}]")
    prepared.rng = dict(rng)
    prepared.extra = _plain(decode_value(manifest["extra_by_rank"][source_rank]))
    for name, obj in (("scheduler", run._scheduler), ("scaler", run._scaler)):
        if obj is not None and getattr(prepared, name) is None:
            raise CheckpointError(f"checkpoint {where} holds no {name} state, but a {name} is watched")
    return prepared


def _plain(value: Any) -> Any:
    """OrderedDicts from decoding as the plain dicts that were saved."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def apply(run: TorchRun, prepared: _Prepared, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """Put a verified load's state into the model, optimizer, scheduler, scaler and RNG; its ``extra``."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    if prepared.in_place and prepared.reader is not None:
        # every rank verified these bytes in prepare(); read again (and checked again) into the live shards
        prepared.reader.run(prepared.in_place)
    with _run_hooks_off(run, optimizer):
        set_state_dict(model, optimizer, model_state_dict=prepared.model, optim_state_dict=prepared.optimizer)
    if run._scheduler is not None:
        run._scheduler.load_state_dict(_plain(prepared.scheduler))
    if run._scaler is not None:
        run._scaler.load_state_dict(_plain(prepared.scaler))
    if prepared.rng:
        restore_rng(prepared.rng)
    return prepared.extra


def load(
    run: TorchRun, target: LoadTarget, model: torch.nn.Module, optimizer: torch.optim.Optimizer, strict: bool
) -> tuple[dict[str, Any], Any]:
    """Every rank: prepare, agree, apply, agree (the fail-together rule); the bundle's step etc. and ``extra``."""
    prepared: _Prepared | None = None
    problem = None
    try:
        prepared = prepare(run, target, model, optimizer, strict)
    except Exception as exc:
        problem = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    run._agree(problem, "was not restored (nothing was applied)")
    assert prepared is not None
    problem = None
    extra = None
    try:
        extra = apply(run, prepared, model, optimizer)
    except Exception as exc:
        problem = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    run._agree(problem, "failed part-way while being applied; training state is mixed", pending=True)
    return prepared.bundle, extra


# -- one process, no process group -----------------------------------------------------------
def load_weights(model: torch.nn.Module, path: str | os.PathLike[str]) -> torch.nn.Module:
    """Load the model part of any LaunchHelm checkpoint into a module, in one process.

    For evaluation workers and notebooks: no process group, no run. Shards of
    a sharded checkpoint are consolidated (each verified against its
    CRC64NVME); bundles load with ``torch.load(weights_only=True)``.

    Parameters
    ----------
    model:
        A plain module with the architecture that was saved (a DDP wrapper is
        unwrapped).
    path:
        A checkpoint file (formats /1, /2), a sharded checkpoint's folder or
        its ``manifest.json`` (format /3), or a folder holding one ``.pt``
        bundle (what ``EvaluationContext.download_to`` gives).

    Returns
    -------
    torch.nn.Module
        ``model``, its weights loaded.

    Raises
    ------
    CheckpointError
        Not a checkpoint, damaged, or its tensors do not fit ``model``.

    Examples
    --------
    >>> model = lht.load_weights(build_model(), ctx.download_to("checkpoints"))  # doctest: +SKIP
    """
    from launchhelm._exceptions import InvalidTypeError

    if not isinstance(model, torch.nn.Module):
        raise InvalidTypeError(f"load_weights() takes a torch.nn.Module first, not {type(model).__name__}")
    folder = Path(os.fspath(path)).expanduser()
    if folder.name == MANIFEST_NAME and folder.is_file():
        folder = folder.parent
    bundles = sorted(folder.glob("*.pt")) if folder.is_dir() and not (folder / MANIFEST_NAME).is_file() else []
    if len(bundles) == 1:
        folder = bundles[0]
    inner = getattr(model, "module", None)
    target = inner if isinstance(inner, torch.nn.Module) else model
    if folder.is_file():
        import pickle

        try:
            bundle = torch.load(folder, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
            raise CheckpointError(f"{folder} is not a readable LaunchHelm checkpoint: {exc}") from None
        if not isinstance(bundle, dict) or not isinstance(bundle.get("model"), dict):
            raise CheckpointError(f"{folder} holds no model state: not a LaunchHelm checkpoint")
        target.load_state_dict(bundle["model"])
        return model
    if not (folder / MANIFEST_NAME).is_file():
        raise CheckpointError(
            f"no checkpoint at {str(path)!r}: not a checkpoint file nor a folder with {MANIFEST_NAME}"
        )
    where = str(folder)
    manifest = validate_manifest((folder / MANIFEST_NAME).read_bytes(), where=where)
    saved = {k: e for k, e in manifest["tensors"].items() if k.startswith("model/")}
    live = {f"model/{k}": v for k, v in target.state_dict().items()}
    if set(live) != set(saved):
        missing, unexpected = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
        raise CheckpointError(
            f"checkpoint {where} does not match the module: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for key, entry in saved.items():
        shape = tuple(entry["shape"])
        if shape != tuple(live[key].shape):
            raise CheckpointError(f"checkpoint {where}: {key} is {shape} there and {tuple(live[key].shape)} here")
    full = read_full(_Source(None, None, folder), manifest, list(saved), where)
    target.load_state_dict({k.removeprefix("model/"): v for k, v in full.items()})
    return model


def read_full(source: _Source, manifest: dict[str, Any], keys: list[str], where: str) -> dict[str, torch.Tensor]:
    """The tensors ``keys`` of a validated manifest, each whole: its chunks read and verified (consolidation)."""
    objects = [o["name"] for o in manifest["objects"]]
    reads: list[_Read] = []
    full: dict[str, torch.Tensor] = {}
    for key in keys:
        entry = manifest["tensors"][key]
        shape = tuple(entry["shape"])
        full[key] = torch.empty(shape, dtype=dtype_named(entry["dtype"], key))
        reads += _plan_reads(entry, objects, manifest["block_size"], ((0,) * len(shape), shape), full[key])
    _Reader(source, f"checkpoint {where}").run(reads)
    return full
