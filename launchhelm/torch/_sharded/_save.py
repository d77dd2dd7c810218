"""Saving a sharded checkpoint: every rank writes its chunks, rank 0 the manifest and the commit."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import torch

from launchhelm._exceptions import CheckpointError
from launchhelm._runlog._checkpoints import artifact_prefix, new_artifact_id
from launchhelm.storage._checksum import CRC64NVME, combine_crc64nvme, crc64nvme
from launchhelm.torch import _dist
from launchhelm.torch._manifest import (
    BLOCK_SIZE,
    FORMAT_SHARDED,
    MANIFEST_NAME,
    ChunkRecord,
    Manifest,
    ObjectRecord,
    TensorEntry,
    dtype_name,
    encode_value,
    object_name,
)
from launchhelm.torch._records import ControlState, Offer, RankRecord, Shared
from launchhelm.torch._sharded._state import Box, _box, _collect, _state_dicts

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from launchhelm._types import JSONValue
    from launchhelm.storage import Store
    from launchhelm.torch._checkpointer import Checkpointer
    from launchhelm.torch._link import Publisher, RunLink, Watched

_T = TypeVar("_T")


class WrittenChunk(TypedDict):
    """A chunk as its writer stored it: the manifest's record of it, less the object, plus its tensor's key."""

    key: str
    offset: list[int]
    shape: list[int]
    start: int
    nbytes: int
    crc64nvme: list[str]


class StoredObject(TypedDict):
    """One rank's shard object once written: what the manifest records of it and of its chunks."""

    name: str
    size: int
    crc64nvme: str
    chunks: list[WrittenChunk]


class SaveContext(TypedDict):
    """What the manifest records besides the objects, taken when the save was called."""

    step: int
    control: ControlState
    tunables: JSONValue
    state: dict[str, JSONValue]
    records: list[RankRecord]
    meta: list[Offer]


def _plan(offers: list[list[Offer]]) -> dict[tuple[str, Box], int]:
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


def _write_object(store: Store, key: str, chunks: list[tuple[str, Box, torch.Tensor]]) -> StoredObject:
    """Stream the chunks into one object; its record with each chunk's place and block CRCs."""
    records: list[WrittenChunk] = []
    position, whole = 0, 0
    size = sum(local.numel() * local.element_size() for _, _, local in chunks)
    with store.writer(key, size=size) as out:  # S3: one PUT under 50 MiB, as s3fs itself would
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
                WrittenChunk(
                    key=name, offset=list(offset), shape=list(shape), start=position, nbytes=len(view), crc64nvme=crcs
                )
            )
            position += len(view)
    return StoredObject(name=key.rsplit("/", 1)[-1], size=position, crc64nvme=f"{whole:016x}", chunks=records)


@dataclass
class Survey:
    """What one rank holds to save: taken before the save's one gather, which carries :meth:`shared`."""

    offer: list[Offer]
    problem: str | None
    artifact: str | None  # rank 0's new id; None elsewhere
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    state: dict[str, JSONValue] | None = None

    def shared(self) -> Shared:
        return self.offer, self.problem, self.artifact


def survey(
    link: RunLink, watched: Watched, swap_model: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> Survey:
    """This rank's state dicts and what it offers to write; never raises (a problem is reported).

    ``swap_model`` may swap entries of the model's state dict (a preemption's save: the buffers as of
    the step it follows)."""
    problem: str | None = None
    offer: list[Offer] = []
    tensors: dict[str, torch.Tensor] = {}
    state: dict[str, JSONValue] | None = None
    scheduler, scaler = watched.scheduler, watched.scaler
    try:
        msd, osd = _state_dicts(link, watched.model, watched.optimizer)
        if swap_model is not None:
            msd = swap_model(msd)
        model_state, model_tensors = _collect(msd, "model")
        optim_state, optim_tensors = _collect(osd, "optimizer")
        tensors = {**model_tensors, **optim_tensors}
        state = {
            "model": model_state,
            "optimizer": optim_state,
            "scheduler": encode_value(scheduler.state_dict()) if scheduler is not None else None,
            "scaler": encode_value(scaler.state_dict()) if scaler is not None else None,
        }
        for key, t in tensors.items():
            (offset, shape), _local = _box(t)
            nbytes = math.prod(shape) * t.element_size()
            offer.append((key, dtype_name(t.dtype), list(t.shape), list(offset), list(shape), nbytes))
    except Exception as exc:
        problem = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    artifact = new_artifact_id(link.step) if link.rank == 0 else None
    return Survey(offer, problem, artifact, tensors, state)


def save(
    checkpointer: Checkpointer,
    watched: Watched,
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
    link = checkpointer.link
    rank, world = link.rank, link.world
    mine_survey = surveyed if surveyed is not None else survey(link, watched)
    tensors, state = mine_survey.tensors, mine_survey.state
    gathered: list[Shared]
    if surveyed is not None:
        gathered = [r["shards"] for r in records]
    else:
        gathered = _dist.all_gather(mine_survey.shared(), world)
    artifact = gathered[0][2]
    failed = [f"rank {r}: {g[1]}" for r, g in enumerate(gathered) if g[1]]
    if not failed:
        failed = _disagreements([g[0] for g in gathered])
    if failed:
        raise CheckpointError(f"checkpoint at step {link.step} was not saved: " + "; ".join(failed), run_id=link.run_id)
    assert state is not None  # a rank whose survey failed reported its problem above
    writer = _plan([g[0] for g in gathered])
    mine = []
    for key, t in tensors.items():
        box, local = _box(t)
        if writer.get((key, box)) == rank:
            mine.append((key, box, local))
    # what the manifest records is taken now: training may change it while a non-blocking save writes
    context: SaveContext = {
        "step": link.step,
        "control": link.control(),
        "tunables": encode_value(dict(link.tunables())),
        "state": state,
        "records": records,
        "meta": gathered[0][0],
    }
    if blocking:
        outcome = _commit(link, str(artifact), mine, context, None)
        if outcome[1] is not None:
            raise CheckpointError(
                f"checkpoint at step {context['step']} was not saved: {outcome[1]}", run_id=link.run_id
            )
        return outcome[0] if rank == 0 else None
    group = checkpointer.save_group()
    copies = checkpointer.snapshots.snapshot([local for _key, _box_, local in mine])  # the one copy training waits for
    staged = [(key, box, copy) for (key, box, _local), copy in zip(mine, copies, strict=True)]

    def work() -> None:
        try:
            _artifact, error = _commit(link, str(artifact), staged, context, group)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            failure = CheckpointError(
                f"background save of checkpoint {artifact} (step {context['step']}) failed on some rank: {error}; "
                "the next optimizer step raises this error (clear_checkpoint_error() to train on)",
                run_id=link.run_id,
                step=context["step"],
            )
            # every rank learns the outcome; the step hooks make it every rank's pending error at one step
            checkpointer.background_failed(failure, every_rank=True)

    checkpointer.start_background(str(artifact), work)
    return artifact if rank == 0 else None


def _gather(value: _T, world: int, group: ProcessGroup | None) -> list[_T]:
    if group is None:
        return _dist.all_gather(value, world)
    out: list[_T | None] = [None] * world
    torch.distributed.all_gather_object(out, value, group=group)
    return out  # type: ignore[return-value]  # every slot filled by the gather


def _broadcast(value: _T, world: int, group: ProcessGroup | None) -> _T:
    if group is None:
        return _dist.broadcast(value, world)
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _commit(
    link: RunLink,
    artifact: str,
    mine: list[tuple[str, Box, torch.Tensor]],
    context: SaveContext,
    group: ProcessGroup | None,
) -> tuple[str | None, str | None]:
    """Every rank: store its object; rank 0 then writes the manifest and publishes. (id, error) on every rank."""
    rank, world = link.rank, link.world
    prefix = artifact_prefix(link.run_id, artifact)
    stored: StoredObject | None = None
    error: str | None = None
    if mine:
        try:
            stored = _write_object(link.store, f"{prefix}/{object_name(rank)}", mine)
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
                _publish(link, artifact, prefix, [s for s, _e in results if s is not None], context)
                outcome = (artifact, None)
            except Exception as exc:
                outcome = (None, f"{type(exc).__name__}: {exc}")
    return _broadcast(outcome, world, group)


def _disagreements(offers: list[list[Offer]]) -> list[str]:
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
    publisher: Publisher,
    artifact: str,
    prefix: str,
    stored: list[StoredObject],
    context: SaveContext,
) -> None:
    meta = {o[0]: (o[1], o[2]) for o in context["meta"]}
    records = context["records"]
    tensors = {k: TensorEntry(dtype=d, shape=s, chunks=[]) for k, (d, s) in meta.items()}
    for index, obj in enumerate(stored):
        for chunk in obj["chunks"]:
            tensors[chunk["key"]]["chunks"].append(
                ChunkRecord(
                    offset=chunk["offset"],
                    shape=chunk["shape"],
                    start=chunk["start"],
                    nbytes=chunk["nbytes"],
                    crc64nvme=chunk["crc64nvme"],
                    object=index,
                )
            )
    manifest: Manifest = {
        "format": FORMAT_SHARDED,
        "run_id": publisher.run_id,
        "step": context["step"],
        "saved_at": time.time(),
        "world_size": publisher.world,
        "torch_version": str(torch.__version__),
        "byteorder": sys.byteorder,
        "block_size": BLOCK_SIZE,
        "objects": [ObjectRecord(name=o["name"], size=o["size"], crc64nvme=o["crc64nvme"]) for o in stored],
        "tensors": tensors,
        "state": context["state"],
        "tunables": context["tunables"],
        "control": context["control"],
        "rng_by_rank": [encode_value({"rank": r["rank"], **r["rng"]}) for r in records],
        "extra_by_rank": [encode_value(r["extra"]) for r in records],
        "placement_by_rank": [r["placement"] for r in records],
    }
    raw = json.dumps(manifest, separators=(",", ":"), allow_nan=False).encode()
    publisher.store.create(f"{prefix}/{MANIFEST_NAME}", raw)
    sums = {CRC64NVME: f"{crc64nvme(raw):016x}"}
    files: list[dict[str, Any]] = [{"name": MANIFEST_NAME, "size": len(raw), **sums}]
    files += [{"name": o["name"], "size": o["size"], CRC64NVME: o["crc64nvme"]} for o in stored]
    publisher.publish(
        artifact,
        step=context["step"],
        fmt=FORMAT_SHARDED,
        files=files,
        checksums=sums,
        size=sum(f["size"] for f in files),
        world_size=publisher.world,
        control_seq=context["control"]["seq"],
    )
