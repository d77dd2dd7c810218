"""Loading a sharded checkpoint: prepare on every rank, agree, apply; and the one-process readers."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from launchhelm._exceptions import CheckpointError
from launchhelm.storage._checksum import CRC64NVME, crc64nvme
from launchhelm.torch import _dist
from launchhelm.torch._manifest import MANIFEST_NAME, decode_value, dtype_named, validate_manifest
from launchhelm.torch._records import LoadTarget, Restored
from launchhelm.torch._rng import restore_rng, validate_rng
from launchhelm.torch._sharded._reads import _plan_reads, _Read, _Reader, _Source
from launchhelm.torch._sharded._state import Box, _box, _collect, _dtensor_type, _state_dicts

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import OptimizerStateType, ValueType

    from launchhelm.storage import Store
    from launchhelm.torch._checkpointer import Checkpointer
    from launchhelm.torch._link import RunLink, Watched
    from launchhelm.torch._manifest import Manifest

_log = logging.getLogger("launchhelm")


@dataclass
class _Prepared:
    """What a verified load applies."""

    bundle: Restored
    model: dict[str, ValueType] = field(default_factory=dict)
    optimizer: OptimizerStateType = field(default_factory=dict)
    scheduler: object = None
    scaler: object = None
    rng: dict[str, object] = field(default_factory=dict)
    extra: object = None
    #: Reads already verified that fill live tensors in place once every rank agrees (local files only).
    in_place: list[_Read] = field(default_factory=list)
    reader: _Reader | None = None


def _fits_in_place(local: torch.Tensor, dtype: torch.dtype, box: Box) -> bool:
    """Whether a live local tensor can take a local file's bytes as they are (no cast, no device copy)."""
    return (
        local.device.type == "cpu"
        and local.dtype == dtype
        and local.layout == torch.strided
        and local.is_contiguous()
        and tuple(local.shape) == tuple(box[1])
    )


def _choose_per_rank(link: RunLink, manifest: Manifest, strict: bool, where: str) -> int:
    """Which saved rank's RNG and ``extra`` this rank restores (see docs/storage.md)."""
    saved = int(manifest["world_size"])
    if saved == link.world:
        _check_placement(link, manifest["placement_by_rank"], where)
        return link.rank
    if strict:
        raise CheckpointError(
            f"checkpoint {where} was saved by {saved} rank(s) and is loaded on {link.world}: model and optimizer "
            "reshard exactly, but per-rank RNG and extra cannot be redistributed; pass strict=False to restore "
            f"those of saved rank (rank mod {saved}) on each rank"
        )
    if link.rank == 0:
        _log.warning(
            "checkpoint %s was saved by %d rank(s), loaded on %d: each rank r restores the RNG and extra of saved "
            "rank r mod %d",
            where,
            saved,
            link.world,
            saved,
        )
    return link.rank % saved


def _check_placement(link: RunLink, saved: object, where: str) -> None:
    """Refuse a same-size restore where this rank sits at another local rank than at the save (as /2 does)."""
    if not isinstance(saved, list) or len(saved) != link.world:
        return
    then, now = saved[link.rank], _dist.placement(link.rank)
    if not isinstance(then, dict):
        return
    if then.get("local_rank") != now["local_rank"]:
        raise CheckpointError(
            f"checkpoint {where}: rank {link.rank} was local rank {then.get('local_rank')} on {then.get('host')} "
            f"when it was saved and is local rank {now['local_rank']} on {now['host']} now (a swapped rank "
            "mapping: each rank would restore another device's RNG streams); restore with the same rank mapping"
        )


def _source(store: Store, target: LoadTarget) -> _Source:
    """Where ``target``'s objects are read: the folder it names, else its prefix of the store."""
    if target.get("path"):
        return _Source(None, target)
    return _Source.at(store, str(target.get("key", "")).rsplit("/", 1)[0])


def prepare(link: RunLink, target: LoadTarget, watched: Watched, strict: bool) -> _Prepared:
    """Read, verify and decode everything this rank restores; nothing is applied."""
    model, optimizer = watched.model, watched.optimizer
    where = target.get("checkpoint") or target.get("path") or "checkpoint"
    source = _source(link.store, target)
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
    source_rank = _choose_per_rank(link, manifest, strict, where)
    msd, osd = _state_dicts(link, model, optimizer)
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

    def tensor(key: str) -> torch.Tensor:
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
        # the state dicts as get_state_dict gave them at the save, live tensors in place of stored ones
        model=cast("dict[str, ValueType]", decode_value(state.get("model"), tensor, f"checkpoint {where}")),
        optimizer=cast("OptimizerStateType", decode_value(state.get("optimizer"), tensor, f"checkpoint {where}")),
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
    prepared.rng = dict(cast("dict[str, object]", rng))  # checked by validate_rng
    prepared.extra = _plain(decode_value(manifest["extra_by_rank"][source_rank]))
    for name, obj in (("scheduler", watched.scheduler), ("scaler", watched.scaler)):
        if obj is not None and getattr(prepared, name) is None:
            raise CheckpointError(f"checkpoint {where} holds no {name} state, but a {name} is watched")
    return prepared


def _plain(value: object) -> object:
    """OrderedDicts from decoding as the plain dicts that were saved."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def apply(link: RunLink, prepared: _Prepared, watched: Watched) -> object:
    """Put a verified load's state into the model, optimizer, scheduler, scaler and RNG; its ``extra``."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model, optimizer = watched.model, watched.optimizer
    if prepared.in_place and prepared.reader is not None:
        # every rank verified these bytes in prepare(); read again (and checked again) into the live shards
        prepared.reader.run(prepared.in_place)
    # as around get_state_dict (see _state_dicts): torch's own optimizer steps are no training steps
    with link.step_hooks_off(optimizer):
        set_state_dict(model, optimizer, model_state_dict=prepared.model, optim_state_dict=prepared.optimizer)
    if watched.scheduler is not None:
        watched.scheduler.load_state_dict(cast("dict[str, object]", _plain(prepared.scheduler)))
    if watched.scaler is not None:
        watched.scaler.load_state_dict(cast("dict[str, object]", _plain(prepared.scaler)))
    if prepared.rng:
        restore_rng(prepared.rng)
    return prepared.extra


def load(checkpointer: Checkpointer, target: LoadTarget, watched: Watched, strict: bool) -> tuple[Restored, object]:
    """Every rank: prepare, agree, apply, agree (the fail-together rule); the bundle's step etc. and ``extra``."""
    link = checkpointer.link
    prepared: _Prepared | None = None
    problem = None
    try:
        prepared = prepare(link, target, watched, strict)
    except Exception as exc:
        problem = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    checkpointer.agree(problem, "was not restored (nothing was applied)")
    assert prepared is not None
    problem = None
    extra: object = None
    try:
        extra = apply(link, prepared, watched)
    except Exception as exc:
        problem = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    checkpointer.agree(problem, "failed part-way while being applied; training state is mixed", pending=True)
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


def read_full(source: _Source, manifest: Manifest, keys: list[str], where: str) -> dict[str, torch.Tensor]:
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
