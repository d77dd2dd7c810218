"""Checkpoints in and out of LaunchHelm: ``launchhelm export`` and ``launchhelm import dcp``.

Export writes a published checkpoint (format /1, /2 or /3) as one
``torch.save`` file or as a ``torch.distributed.checkpoint`` (DCP) folder,
holding the consolidated state (shards of a /3 checkpoint are read whole and
verified against their CRC64NVME, as ``lht.load_weights`` does).

Import reads a DCP folder (one ``__<rank>_<n>.distcp`` per writer plus a
pickled ``.metadata``) and records it as a format /3 checkpoint of a run,
which LaunchHelm's sharded loader then restores on any number of ranks. DCP's
``.metadata`` is a pickle: it is read with an unpickler that admits only DCP's
metadata classes and a few inert built-ins, and the non-tensor values are
read with ``torch.load(weights_only=True)``; anything else is refused, never
executed. See ``docs/guides/checkpoints.md`` ("Export and import").
"""

from __future__ import annotations

import io
import math
import os
import pickle
import re
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict, cast

import torch

from launchhelm._exceptions import (
    AlreadyExistsError,
    CheckpointError,
    InvalidArgumentError,
    PathNotFoundError,
    SourceReadError,
)
from launchhelm.storage import LocalStore, Store
from launchhelm.storage._checksum import file_checksums, mismatches, verifying_algorithms
from launchhelm.torch._formats import _FORMATS
from launchhelm.torch._loader import _target
from launchhelm.torch._manifest import (
    FORMAT_SHARDED,
    MANIFEST_NAME,
    decode_value,
    dtype_name,
    encode_value,
    object_name,
    validate_manifest,
)
from launchhelm.torch._sharded._load import _plain, read_full
from launchhelm.torch._sharded._reads import _Source
from launchhelm.torch._sharded._save import SaveContext, _publish, _write_object

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import ReadItem
    from typing_extensions import NotRequired

    from launchhelm._api import RunHandle
    from launchhelm._run import Run
    from launchhelm._types import JSONValue
    from launchhelm.torch._records import Offer, RankRecord

__all__ = ["EXPORT_FORMATS", "export_checkpoint", "import_dcp_checkpoint", "read_dcp_metadata"]

#: What ``launchhelm export --format`` writes.
EXPORT_FORMATS = ("torch", "dcp")
#: DCP top-level keys (torchtitan's) and where an import puts them; other keys are model tensors or refused.
OPTIMIZER_KEYS = ("optimizer", "optim")
SCHEDULER_KEYS = ("lr_scheduler", "scheduler")
EXTRA_KEYS = ("train_state", "dataloader")
_DATA_FILE = re.compile(r"__(\d+)_(\d+)\.distcp")
_METADATA = ".metadata"
_MAX_METADATA_BYTES = 1 << 30


class Exported(TypedDict):
    """What ``export_checkpoint`` wrote."""

    path: str
    checkpoint: str
    step: int
    format: str


class Mapped(TypedDict):
    """Where an import put a DCP checkpoint's parts: tensor and parameter counts, and extra's keys."""

    model: int
    optimizer: int
    scheduler: bool
    extra: list[str]


class Imported(TypedDict):
    """What ``import_dcp_checkpoint`` recorded, or found already recorded (``skipped``)."""

    run_id: str
    checkpoint: str
    step: int
    skipped: bool
    mapped: NotRequired[Mapped]


class _OptimizerState(TypedDict):
    """An optimizer state in torch's distributed form (keyed by parameter name)."""

    state: dict[str, dict[str, object]]
    param_groups: list[dict[str, object]]


# -- export ----------------------------------------------------------------------------------
def export_checkpoint(
    store: Store, run_id: str, checkpoint: str, *, format: str, out: str | os.PathLike[str]
) -> Exported:
    """Write a run's checkpoint as a ``torch.save`` file or a DCP folder at ``out``; what was written.

    The state written is ``{"model", "optimizer", "step"}`` plus
    ``"scheduler"`` and ``"scaler"`` when the checkpoint holds them: plain
    tensors, whole. The optimizer state is as saved: ``optimizer.state_dict()``
    (keyed by parameter index) for /1 and /2, torch's distributed form
    (``get_optimizer_state_dict``, keyed by parameter name) for /3.

    Raises
    ------
    InvalidArgumentError
        ``format`` is not ``torch`` or ``dcp``.
    AlreadyExistsError
        ``out`` exists (nothing is overwritten).
    RunNotFoundError, CheckpointError
        No such run, no such checkpoint, or it is not a torch checkpoint or is damaged.
    """
    if format not in EXPORT_FORMATS:
        raise InvalidArgumentError(f"--format {format!r}: choose one of {', '.join(EXPORT_FORMATS)}")
    target = Path(os.fspath(out)).expanduser().absolute()
    if target.exists() or target.is_symlink():
        raise AlreadyExistsError(f"{target} already exists: give a new path to --out (nothing is overwritten)")
    if not target.parent.is_dir():
        raise PathNotFoundError(f"{target.parent} is not a folder: create it first, or give another --out")
    from launchhelm._api import Api

    handle = Api(store).run(run_id)  # RunNotFoundError
    event = _checkpoint_event(handle, checkpoint)
    where = f"checkpoint {event['checkpoint']} of run {handle.id}"
    if event["format"] == FORMAT_SHARDED:
        state = _consolidated(store, event, where)
    elif event["format"] in _FORMATS:
        state = _bundle(store, event, where)
    else:
        raise CheckpointError(
            f"{where} has format {event['format']!r}: only LaunchHelm torch checkpoints (save_checkpoint) export",
            run_id=handle.id,
        )
    if format == "torch":
        _write_torch(state, target)
    else:
        _write_dcp(state, target)
    step = state["step"]
    assert isinstance(step, int)  # _state made it one
    return {"path": str(target), "checkpoint": str(event["checkpoint"]), "step": step, "format": format}


def _checkpoint_event(handle: RunHandle, checkpoint: str) -> Mapping[str, object]:
    state = handle._state()
    if checkpoint in ("latest", "resume"):
        event = state.latest_checkpoint if checkpoint == "latest" else state.resume_checkpoint
    else:
        event = state.checkpoint(checkpoint)
    if event is None:
        known = [c.id for c in handle.checkpoints()]
        listed = ", ".join(known[-5:]) if known else "none: it has saved no checkpoint"
        raise CheckpointError(
            f"run {handle.id} has no checkpoint {checkpoint!r}; its newest are: {listed} "
            "(`launchhelm show RUN` lists them all)",
            run_id=handle.id,
        )
    return event


def _bundle(store: Store, event: Mapping[str, object], where: str) -> dict[str, object]:
    """A /1 or /2 bundle, its size and checksums verified, read with ``torch.load(weights_only=True)``."""
    target = _target(event)
    with tempfile.TemporaryDirectory(prefix="launchhelm-export-") as tmp:
        if isinstance(store, LocalStore):
            local = store.root / target["key"]
        else:
            local = store.download(target["key"], Path(tmp) / Path(target["key"]).name)
        if not local.is_file() or local.stat().st_size != target["size"]:
            raise CheckpointError(f"{where}: its file is missing or not {target['size']} bytes: truncated or removed")
        expected = target["checksums"]
        if expected and mismatches(expected, file_checksums(local, verifying_algorithms(expected))):
            raise CheckpointError(f"{where} does not match its recorded checksum: the file is corrupted")
        try:
            bundle = torch.load(local, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
            raise CheckpointError(f"{where} is not a readable torch checkpoint: {exc}") from None
    if not isinstance(bundle, dict) or not isinstance(bundle.get("model"), dict):
        raise CheckpointError(f"{where} holds no model state")
    return _state(
        bundle["model"], bundle.get("optimizer"), bundle["step"], bundle.get("scheduler"), bundle.get("scaler")
    )


def _consolidated(store: Store, event: Mapping[str, object], where: str) -> dict[str, object]:
    """A /3 checkpoint's state, every tensor whole: read by ranges from the store and verified."""
    from launchhelm.storage._checksum import CRC64NVME, crc64nvme

    target = _target(event)
    source = _Source.at(store, target["key"].rsplit("/", 1)[0])
    raw = source.whole(MANIFEST_NAME)
    expected = target["checksums"].get(CRC64NVME)
    if len(raw) != target["size"] or (expected is not None and f"{crc64nvme(raw):016x}" != expected):
        raise CheckpointError(f"{where}: its manifest does not match its record: corrupted")
    files = target["files"] or []
    manifest = validate_manifest(raw, expected_objects={f["name"]: int(f["size"]) for f in files[1:]}, where=where)
    full = read_full(source, manifest, list(manifest["tensors"]), where)

    def tensor(key: str) -> torch.Tensor:
        if key not in full:
            raise CheckpointError(f"{where}: its state refers to an unknown tensor {key!r}")
        return full[key]

    saved = manifest["state"]
    decoded = {name: _plain(decode_value(saved.get(name), tensor, where)) for name in saved}
    return _state(
        cast("Mapping[str, object]", decoded.get("model")),  # validate_manifest found a state
        decoded.get("optimizer"),
        manifest["step"],
        decoded.get("scheduler"),
        decoded.get("scaler"),
    )


def _state(
    model: Mapping[str, object], optimizer: object, step: int, scheduler: object, scaler: object
) -> dict[str, object]:
    state: dict[str, object] = {"model": dict(model), "step": int(step)}
    if optimizer:
        state["optimizer"] = optimizer
    if scheduler is not None:
        state["scheduler"] = scheduler
    if scaler is not None:
        state["scaler"] = scaler
    return state


def _write_torch(state: dict[str, object], target: Path) -> None:
    tmp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        torch.save(state, tmp)
        os.link(tmp, target)  # fails if taken meanwhile: never overwrites
    except FileExistsError:
        raise AlreadyExistsError(f"{target} appeared while exporting: nothing was overwritten") from None
    finally:
        tmp.unlink(missing_ok=True)


def _write_dcp(state: dict[str, object], target: Path) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    tmp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            save(state, storage_writer=FileSystemWriter(tmp), no_dist=True)
        if target.exists():
            raise AlreadyExistsError(f"{target} appeared while exporting: nothing was overwritten")
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# -- reading DCP's metadata: a pickle, so only what DCP's metadata is made of -------------------
def _allowed() -> dict[tuple[str, str], object]:
    import collections
    import pathlib

    from torch.distributed.checkpoint import metadata

    from launchhelm.torch._torch_private import dcp_metadata_private_globals

    allowed: dict[tuple[str, str], object] = {
        ("torch", "Size"): torch.Size,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("pathlib", "PosixPath"): pathlib.PosixPath,
        ("pathlib", "WindowsPath"): pathlib.PurePosixPath,  # a name only: never touches the file system here
        ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
        ("pathlib", "PureWindowsPath"): pathlib.PureWindowsPath,
        **dcp_metadata_private_globals(),  # torch's private names the pickle holds: behind the door
    }
    for name in (
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
    ):
        if hasattr(metadata, name):
            allowed[("torch.distributed.checkpoint.metadata", name)] = getattr(metadata, name)
    for name in ("set", "frozenset", "slice", "complex", "bytearray", "range"):
        allowed[("builtins", name)] = getattr(__import__("builtins"), name)
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    """Admits DCP's metadata classes, torch dtypes and sizes, and inert built-ins: nothing that runs code."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self._allowed = _allowed()

    def find_class(self, module: str, name: str) -> object:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's checkpoint metadata") from None

    def persistent_load(self, pid: object) -> NoReturn:
        raise pickle.UnpicklingError("persistent ids are not part of DCP's checkpoint metadata")


def read_dcp_metadata(raw: bytes, where: str) -> Metadata:
    """DCP's ``Metadata`` from a ``.metadata`` file's bytes, unpickled with the allow-list above.

    Raises :class:`SourceReadError` naming what was refused; nothing it names is imported or called.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(raw).load()
    except pickle.UnpicklingError as exc:
        raise SourceReadError(
            f"{where}/.metadata was refused: {exc}. LaunchHelm reads DCP metadata with an unpickler that admits "
            "only DCP's metadata classes, so nothing in it was executed; if this checkpoint comes from a source "
            "you do not trust, do not load it with torch.distributed.checkpoint either"
        ) from None
    except Exception as exc:  # a damaged pickle: EOFError, ValueError, TypeError from a class given bad state
        raise SourceReadError(f"{where}/.metadata is not readable DCP metadata ({type(exc).__name__}: {exc})") from None
    if not isinstance(metadata, Metadata) or not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
        raise SourceReadError(f"{where}/.metadata holds a {type(metadata).__name__}, not DCP checkpoint metadata")
    return metadata


# -- import ----------------------------------------------------------------------------------
def _dcp_readers() -> tuple[type, type]:
    """A storage reader whose metadata goes through the allow-list, and a planner whose non-tensor
    values load with ``weights_only=True`` (DCP's own use ``pickle.load`` and ``weights_only=False``)."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    from launchhelm.torch._torch_private import dcp_fsspec_reader

    base: type = dcp_fsspec_reader() or FileSystemReader

    class SafeReader(base):  # type: ignore[misc]
        where = ""

        def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
            path = self.fs.concat_path(self.path, _METADATA)
            with self.fs.create_stream(path, "rb") as f:
                raw = f.read(_MAX_METADATA_BYTES + 1)
            metadata = read_dcp_metadata(raw, self.where)
            metadata.storage_meta = None
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        refused: str | None = None

        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            try:
                self.state_dict[fqn] = torch.load(value, map_location="cpu", weights_only=True)
            except Exception as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                for line in str(exc).splitlines():
                    if "Unsupported global" in line or "WeightsUnpickler error" in line:
                        reason = line.strip()
                self.refused = f"{fqn!r} holds an object torch.load(weights_only=True) refuses ({reason})"
                raise

    return SafeReader, SafePlanner


def _read_dcp(path: str, storage_options: Mapping[str, object] | None) -> tuple[dict[str, object], Metadata, int]:
    """Every value of a DCP checkpoint, whole, by its flat key; its metadata; how many ranks wrote it."""
    import fsspec
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    fs, root = fsspec.core.url_to_fs(path, **dict(storage_options or {}))
    root = root.rstrip("/")
    try:
        listing = {Path(e["name"]).name: int(e.get("size") or 0) for e in fs.ls(root, detail=True)}
    except (FileNotFoundError, NotADirectoryError):
        raise SourceReadError(f"{path} is not a folder: give the DCP checkpoint's folder") from None
    if _METADATA not in listing:
        raise SourceReadError(
            f"{path} holds no .metadata: not a torch.distributed.checkpoint folder (or its save did not finish)"
        )
    if listing[_METADATA] > _MAX_METADATA_BYTES:
        raise SourceReadError(f"{path}/.metadata is {listing[_METADATA]} bytes: more than DCP metadata may be")
    reader_type, planner_type = _dcp_readers()
    reader = reader_type(path, **dict(storage_options or {}))
    reader.where = path
    metadata = reader.read_metadata()
    storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
    for info in storage.values():  # DCP reads each item from the file its metadata names: only this folder's
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not _DATA_FILE.fullmatch(name) or name not in listing:
            raise SourceReadError(
                f"{path}: its metadata points at {name!r}, not one of the folder's __<rank>_<n>.distcp files"
            )
    data_bytes = sum(size for name, size in listing.items() if _DATA_FILE.fullmatch(name))
    writers = 1 + max((int(m.group(1)) for n in listing if (m := _DATA_FILE.fullmatch(n))), default=0)
    flat: dict[str, object] = {}
    claimed = 0
    for key, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            shape = tuple(int(d) for d in md.size)
            dtype = md.properties.dtype
            if not isinstance(dtype, torch.dtype) or any(d < 0 for d in shape):
                raise SourceReadError(f"{path}: {key!r} has no valid shape and dtype in its metadata")
            claimed += math.prod(shape) * dtype.itemsize
            if claimed > data_bytes:  # before any allocation: the files must hold what the metadata claims
                raise SourceReadError(
                    f"{path}: its metadata claims more tensor bytes than its .distcp files hold ({data_bytes}): "
                    "damaged or not this checkpoint's metadata"
                )
            flat[key] = torch.empty(shape, dtype=dtype)
        elif isinstance(md, BytesStorageMetadata):
            flat[key] = None
        else:
            raise SourceReadError(f"{path}: {key!r} has metadata of type {type(md).__name__}, which DCP does not write")
    planner = planner_type(flatten_state_dict=False, flatten_sharded_tensors=False)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            load(flat, storage_reader=reader, planner=planner, no_dist=True)
    except BaseException as exc:
        if planner.refused is not None:
            raise SourceReadError(
                f"{path}: {planner.refused}. LaunchHelm never runs pickled code from a checkpoint: save that "
                "value as tensors or plain numbers, strings, lists and dicts, or leave it out"
            ) from None
        if not isinstance(exc, Exception):
            raise
        raise SourceReadError(f"{path}: its .distcp files could not be read ({type(exc).__name__}: {exc})") from None
    return flat, metadata, writers


def _nest(flat: dict[str, object], metadata: Metadata, where: str) -> dict[str, object]:
    """The state dict DCP flattened, nested again along the paths its save recorded (``planner_data``)."""
    paths = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    root: dict[str | int, object] = {}
    for key, value in flat.items():
        path = paths.get(key, (key,))
        if not isinstance(path, tuple) or not path or not all(isinstance(p, (str, int)) for p in path):
            raise SourceReadError(f"{where}: the path recorded for {key!r} is not a tuple of names")
        node = root
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SourceReadError(f"{where}: {key!r} lies inside another value")
            node = child
        node[path[-1]] = value
    return cast("dict[str, object]", _lists(root))  # the top level is keyed by names


def _lists(node: object) -> object:
    """Dicts keyed 0..n-1 by ints (DCP's paths through lists) back into lists."""
    if not isinstance(node, dict):
        return node
    items = {k: _lists(v) for k, v in node.items()}
    if items and all(type(k) is int for k in items) and sorted(items) == list(range(len(items))):
        return [items[i] for i in range(len(items))]
    return items


def _optimizer(value: object, where: str) -> _OptimizerState:
    """An optimizer state in torch's distributed form: ``{"state": {name: {...}}, "param_groups": [...]}``.

    Accepts that form, or its flattened one (``StateDictOptions(flatten_optimizer_state_dict=True)``,
    torchtitan's): ``state.<param>.<name>`` and ``param_groups.<param>.<hyperparameter>`` keys,
    regrouped here by equal hyperparameters.
    """
    if not isinstance(value, dict):
        raise SourceReadError(f"{where}: its optimizer entry is a {type(value).__name__}, not an optimizer state")
    state: object
    groups: object
    if set(value) <= {"state", "param_groups"}:
        state, groups = value.get("state", {}), value.get("param_groups", [])
    elif all(isinstance(k, str) and (k.startswith("state.") or k.startswith("param_groups.")) for k in value):
        by_state: dict[str, dict[str, object]] = {}
        by_param: dict[str, dict[str, object]] = {}
        for key, item in value.items():
            kind, _, rest = key.partition(".")
            param, _, name = rest.rpartition(".")
            if not param or not name:
                raise SourceReadError(f"{where}: optimizer key {key!r} is not <state|param_groups>.<param>.<name>")
            (by_state if kind == "state" else by_param).setdefault(param, {})[name] = item
        regrouped: list[dict[str, object]] = []
        for param, hyper in by_param.items():
            same = next((g for g in regrouped if _equal({k: v for k, v in g.items() if k != "params"}, hyper)), None)
            if same is None:
                regrouped.append({**hyper, "params": [param]})
            else:
                cast("list[str]", same["params"]).append(param)
        state, groups = by_state, regrouped
    else:
        raise SourceReadError(
            f"{where}: its optimizer entry has keys {sorted(map(str, value))[:5]}: not the state of "
            "torch.distributed.checkpoint.state_dict.get_optimizer_state_dict (nested or flattened)"
        )
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in state.items()):
        raise SourceReadError(
            f"{where}: its optimizer state is not keyed by parameter name (an optimizer.state_dict() keyed by "
            "index cannot be matched to a model without it); save it with get_optimizer_state_dict"
        )
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise SourceReadError(f"{where}: its optimizer param_groups is not a list of groups")
    return {"state": state, "param_groups": groups}


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _map(
    tree: dict[str, object], step: int | None, where: str
) -> tuple[dict[str, object], _OptimizerState | None, object, dict[str, object] | None, int]:
    """model, optimizer, scheduler, extra and step of a DCP state dict (see the guide for the mapping)."""
    tree = dict(tree)
    optimizer = next((tree.pop(k) for k in OPTIMIZER_KEYS if k in tree), None)
    scheduler = next((tree.pop(k) for k in SCHEDULER_KEYS if k in tree), None)
    extra = {k: tree.pop(k) for k in EXTRA_KEYS if k in tree}
    found = tree.pop("step", None)
    model: dict[str, object]
    if "model" in tree:
        entry = tree.pop("model")
        if not isinstance(entry, dict):
            raise SourceReadError(f"{where}: its model entry is a {type(entry).__name__}, not a state dict")
        model = entry
    else:  # torchtitan: the model's tensors at the top level
        model = {k: tree.pop(k) for k in list(tree) if isinstance(tree[k], torch.Tensor)}
    if tree:
        key = next(iter(tree))
        raise SourceReadError(
            f"{where}: top-level entry {key!r} ({type(tree[key]).__name__}) is neither a model tensor nor one of "
            f"{', '.join(('model', *OPTIMIZER_KEYS, *SCHEDULER_KEYS, *EXTRA_KEYS, 'step'))}; LaunchHelm does not guess "
            "where it belongs: leave it out of the saved state, or load this checkpoint with DCP yourself"
        )
    bad = [k for k, v in model.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise SourceReadError(f"{where}: model entry {bad[0]!r} is not a tensor")
    if not model:
        raise SourceReadError(f"{where}: no model tensors found")
    if scheduler is not None and not isinstance(scheduler, dict):
        raise SourceReadError(f"{where}: its lr_scheduler entry is a {type(scheduler).__name__}, not a state dict")
    if step is None:
        train_state = extra.get("train_state")
        if found is None and isinstance(train_state, dict):
            found = train_state.get("step")
        if isinstance(found, torch.Tensor) and found.numel() == 1 and not found.is_floating_point():
            found = int(found.item())
        if type(found) is not int or found < 0:
            raise InvalidArgumentError(
                f"{where} records no step (no integer 'step' nor 'train_state'/'step'): give it with --step N"
            )
        step = found
    optim = _optimizer(optimizer, where) if optimizer is not None else None
    return model, optim, scheduler, extra or None, step


class _Writer:
    """The importing run as format /3's publishing sees it (a ``_link.Publisher``), with the DCP's world size."""

    def __init__(self, run: Run, world: int) -> None:
        self._run, self.run_id, self.store, self.world = run, run.id, run.store, world

    def publish(self, artifact_id: str, **kwargs: Any) -> object:
        return self._run._publish_checkpoint(artifact_id, **kwargs)


def import_dcp_checkpoint(
    path: str | os.PathLike[str],
    project: str,
    *,
    run_id: str,
    name: str | None = None,
    step: int | None = None,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
) -> Imported:
    """Record the DCP checkpoint at ``path`` as the format /3 checkpoint of run ``run_id`` (created).

    A run ``run_id`` that already has a checkpoint is left as it is
    (``{"skipped": True}``); one without (an import killed part-way) gets it.
    Returns the run id, checkpoint id, step and what was mapped where.
    """
    import launchhelm as lh
    from launchhelm._api import Api
    from launchhelm._exceptions import RunNotFoundError
    from launchhelm._runlog._checkpoints import artifact_prefix, new_artifact_id

    if step is not None and (type(step) is not int or step < 0):
        raise InvalidArgumentError(f"--step {step!r}: give the step as an integer >= 0")
    source = os.fspath(path)
    if "://" not in source:
        source = str(Path(source).expanduser().absolute())
    api = Api(store)
    try:
        existing = api.run(run_id)
    except RunNotFoundError:
        existing = None
    if existing is not None and existing.checkpoints():
        ck = existing.checkpoints()[-1]
        return {"run_id": run_id, "checkpoint": ck.id, "step": ck.step, "skipped": True}
    flat, metadata, writers = _read_dcp(source, storage_options)
    model, optimizer, scheduler, extra, step = _map(_nest(flat, metadata, source), step, source)
    del flat
    state: dict[str, object] = {
        "model": model,
        "optimizer": optimizer if optimizer is not None else {"state": {}, "param_groups": []},
        "scheduler": scheduler,
        "scaler": None,
    }
    tensors: dict[str, torch.Tensor] = {}

    def keep(key: str, t: torch.Tensor) -> str:
        tensors[key] = t.detach().cpu().contiguous()
        return key

    encoded: dict[str, JSONValue] = {
        "model": encode_value(state["model"], keep, "model"),
        "optimizer": encode_value(state["optimizer"], keep, "optimizer"),
        "scheduler": encode_value(scheduler) if scheduler is not None else None,
        "scaler": None,
    }
    encode_value(extra)  # refused now, if at all, before any run exists (it is encoded again when published)
    offers: list[Offer] = [
        (k, dtype_name(t.dtype), list(t.shape), [0] * t.dim(), list(t.shape), t.numel() * t.element_size())
        for k, t in tensors.items()
    ]
    if existing is not None:
        run = lh.init(project, resume=run_id, store=api.store, system_metrics=False, capture_console=False)
    else:
        run = lh.init(
            project,
            name=name,
            config={"imported_from": "torch.distributed.checkpoint", "source": source},
            store=api.store,
            run_id=run_id,
            system_metrics=False,
            capture_console=False,
        )
    try:
        writer = _Writer(run, writers)
        artifact = new_artifact_id(step)
        prefix = artifact_prefix(run.id, artifact)
        chunks = [(k, ((0,) * t.dim(), tuple(t.shape)), t) for k, t in tensors.items() if t.numel()]
        stored = [_write_object(writer.store, f"{prefix}/{object_name(0)}", chunks)]
        # an import has no RNG state nor placement to record: the manifest holds {"rank": r} and null
        records = cast(
            "list[RankRecord]", [{"rank": r, "rng": {}, "extra": extra, "placement": None} for r in range(writers)]
        )
        context: SaveContext = {
            "step": step,
            "control": {"seq": run._control_seq, "paused": False},
            "tunables": {},
            "state": encoded,
            "records": records,
            "meta": offers,
        }
        _publish(writer, artifact, prefix, stored, context)
    finally:
        run.finish(close_run=False)
    mapped: Mapped = {
        "model": len(model),
        "optimizer": len(optimizer["state"]) if optimizer is not None else 0,
        "scheduler": scheduler is not None,
        "extra": sorted(extra) if extra else [],
    }
    return {"run_id": run.id, "checkpoint": artifact, "step": step, "skipped": False, "mapped": mapped}
