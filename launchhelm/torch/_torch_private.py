"""Every use LaunchHelm makes of torch's private names, behind one gate.

The in-place checkpoint load (:mod:`launchhelm.torch._inplace`) leans on
parts of torch outside its public API: the global its pickles name to
rebuild a tensor (``torch._utils._rebuild_tensor_v2``), its zip reader
(``torch._C.PyTorchFileReader``), the storage type names of its pickles, the
file offset ``torch.load`` leaves on each storage (``_checkpoint_offset``),
how ``torch.nn.Module`` keeps its parameters, buffers and load hooks, and
what ``Optimizer.load_state_dict`` does with saved state. Sharded checkpoints
and ``launchhelm import dcp`` need a few more on every torch (a DTensor's local
box, DCP's fsspec reader and the private globals of DCP's metadata pickle).
A hang's record reads torch's flight recorder
(``torch._C._distributed_c10d._dump_fr_trace_json``: :func:`flight_recorder_json`,
gated by :func:`flight_recorder_on`). They are used here and nowhere else in
LaunchHelm (a test checks it).

:func:`fast_path_available` is the one gate: True only on a torch release
series in :data:`TESTED` that has every name this module needs. Anywhere
else a load takes torch's own path (``torch.load(weights_only=True)``, then
``load_state_dict``), its CRC64NVME checked first: slower, and correct on
any torch that loads the file.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = [
    "REBUILD_TENSOR",
    "TESTED",
    "checkpoint_offset",
    "dcp_fsspec_reader",
    "dcp_metadata_private_globals",
    "dtensor_local_box",
    "fast_path_available",
    "file_reader",
    "flight_recorder_json",
    "flight_recorder_on",
    "flight_recorder_size",
    "load_optimizer_in_place",
    "missing_names",
    "optimizer_state_pairs",
    "stock_targets",
    "storage_dtype",
    "zip_crc32_skipped",
]

#: The torch release series (major.minor) the fast path was tested with; any other takes torch's own loader.
TESTED = ("2.13",)
#: The running torch's version (a test sets another to close the gate).
TORCH_VERSION = str(torch.__version__)
#: The global torch's pickles name to rebuild a tensor, as (module, name).
REBUILD_TENSOR = ("torch._utils", "_rebuild_tensor_v2")
#: The private names the fast path calls or reads, as (importable path, attribute).
REQUIRED: tuple[tuple[str, str], ...] = (
    REBUILD_TENSOR,
    ("torch._C", "PyTorchFileReader"),
    ("torch.serialization", "StorageType"),
    ("torch.nn.Module", "_load_from_state_dict"),
    ("torch.optim.Optimizer", "__setstate__"),
    ("torch.__future__", "get_swap_module_params_on_conversion"),
    ("torch.utils.serialization", "config"),
)
#: What every ``torch.nn.Module`` holds that :func:`stock_targets` reads.
_MODULE_FIELDS = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")


def fast_path_available() -> bool:
    """Whether loads may read tensor bytes in place: this torch's series is one in :data:`TESTED`
    and it has every name in :data:`REQUIRED`; else loads go through ``torch.load`` and
    ``load_state_dict``."""
    return _series(TORCH_VERSION) in TESTED and not missing_names() and _module_fields_present()


#: The flight recorder's size, as torch 2.13 reads it: the first of these variables that is set, else
#: its default (on: torch keeps the ring whatever LaunchHelm does; 0 turns it off).
RECORDER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
RECORDER_DEFAULT_ENTRIES = 2000


def flight_recorder_size(environ: Mapping[str, str]) -> int:
    """The entries torch's flight recorder keeps, read from ``environ`` as torch 2.13 reads it."""
    entries = RECORDER_DEFAULT_ENTRIES
    for name in reversed(RECORDER_VARIABLES):  # as torch reads them: the first one set wins
        with contextlib.suppress(KeyError, ValueError):  # a value torch cannot read leaves the one before
            entries = int(environ[name])
    return entries


def flight_recorder_on() -> bool:
    """Whether a hang's record can read torch's flight recorder here: ``torch.distributed`` is initialised
    in this process, on a tested torch that has the dump, and the recorder's size leaves it on."""
    import torch.distributed as dist

    if _series(TORCH_VERSION) not in TESTED or not (dist.is_available() and dist.is_initialized()):
        return False
    if not hasattr(torch._C, "_distributed_c10d") or not hasattr(torch._C._distributed_c10d, "_dump_fr_trace_json"):
        return False
    return flight_recorder_size(os.environ) > 0


def flight_recorder_json() -> bytes:
    """torch's flight recorder of this process as JSON (every process group's last collectives)."""
    return bytes(torch._C._distributed_c10d._dump_fr_trace_json())  # type: ignore[attr-defined]  # not in its stubs


def _series(version: str) -> str:
    """``"2.13"`` of ``"2.13.0+cpu"``."""
    return ".".join(version.split("+")[0].split(".")[:2])


def missing_names() -> list[str]:
    """The names of :data:`REQUIRED` this torch lacks (empty: all there)."""
    return list(_missing(REQUIRED))


@functools.cache  # asked on every load and save; torch does not change while the process runs
def _missing(required: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    missing = []
    for path, name in required:
        owner: object = None
        module, _, attribute = path.rpartition(".")
        for candidate in (path, module):  # a module, or a class in one
            try:
                owner = importlib.import_module(candidate)
            except ImportError:
                continue
            if candidate == module:
                owner = getattr(owner, attribute, None)
            break
        if owner is None or not hasattr(owner, name):
            missing.append(f"{path}.{name}")
    return tuple(missing)


@functools.cache
def _module_fields_present() -> bool:
    module = torch.nn.Module()
    return all(hasattr(module, name) for name in _MODULE_FIELDS)


def storage_dtype(name: str) -> torch.dtype:
    """The dtype of a storage type named in a pickle (``FloatStorage``...); raises for any other name."""
    from torch.serialization import StorageType

    dtype: torch.dtype = StorageType(name).dtype  # type: ignore[no-untyped-call]
    return dtype


def file_reader(path: Path) -> torch._C.PyTorchFileReader:
    """torch's own zip reader of a checkpoint file."""
    return torch._C.PyTorchFileReader(str(path))


def checkpoint_offset(storage: torch.UntypedStorage) -> int | None:
    """Where a storage's bytes start in the file, as ``torch.load(map_location="meta")`` records
    it on the storage; None where this torch does not."""
    offset = getattr(storage, "_checkpoint_offset", None)
    return offset if isinstance(offset, int) else None


@contextlib.contextmanager
def zip_crc32_skipped() -> Iterator[None]:
    """``torch.save`` without the zip CRC32s while it lasts, on a tested torch (elsewhere it computes them)."""
    if not fast_path_available():
        yield
        return
    from torch.utils.serialization import config as serialization_config

    with serialization_config.patch({"save.compute_crc32": False}):  # type: ignore[attr-defined]
        yield


def stock_targets(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """Where ``model.load_state_dict`` copies each key's tensor, when that is all it does: every
    module loads the stock way (``torch.nn.Module``'s own ``load_state_dict``,
    ``_load_from_state_dict`` and ``set_extra_state``, no load hooks, no swapping of tensors on
    load through ``torch.__future__``), so the key ``prefix + name`` goes into the module's
    parameter or persistent buffer ``name``, as ``_load_from_state_dict`` finds it. None where
    any module loads otherwise (batch norm's old versions, quantized modules, hooks). One walk of
    the modules, as ``load_state_dict``'s own (a module reached twice is loaded under both names),
    instead of ``state_dict(keep_vars=True)`` and a second walk to check the modules."""
    base = torch.nn.Module
    if type(model).load_state_dict is not base.load_state_dict:
        return None
    if torch.__future__.get_swap_module_params_on_conversion():
        return None
    targets: dict[str, torch.Tensor] = {}
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        kind = type(module)
        if (
            kind._load_from_state_dict is not base._load_from_state_dict
            or kind.set_extra_state is not base.set_extra_state
            or getattr(module, "_load_state_dict_pre_hooks", True)  # absent: not torch's Module as we know it
            or getattr(module, "_load_state_dict_post_hooks", True)
        ):
            return None
        for name, param in module._parameters.items():
            if param is not None:
                targets[prefix + name] = param
        transient = module._non_persistent_buffers_set
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in transient:
                targets[prefix + name] = buffer
        stack.extend((f"{prefix}{name}.", child) for name, child in module._modules.items() if child is not None)
    return targets


def optimizer_state_pairs(optimizer: torch.optim.Optimizer, saved_optimizer: object) -> list[tuple[object, object]]:
    """Each saved optimizer state value with the live one of the same name that
    ``Optimizer.load_state_dict`` would put it in place of: the state of the parameter its saved
    index stands for (the saved groups' indices, in order, onto the live groups' parameters).
    Empty where the optimizer does not load the stock way (a subclass's own ``load_state_dict``,
    load pre-hooks) or the saved groups do not line up with the live ones; where an index is
    unhashable, the pairs found before it (``load_state_dict`` then says what is wrong)."""
    pairs: list[tuple[object, object]] = []
    if (
        isinstance(saved_optimizer, dict)
        and type(optimizer).load_state_dict is torch.optim.Optimizer.load_state_dict
        and not getattr(optimizer, "_optimizer_load_state_dict_pre_hooks", True)
        and isinstance(getattr(optimizer, "state", None), dict)
    ):
        saved_state, saved_groups = saved_optimizer.get("state"), saved_optimizer.get("param_groups")
        live_groups = optimizer.param_groups
        if (
            isinstance(saved_state, dict)
            and isinstance(saved_groups, list)
            and len(saved_groups) == len(live_groups)
            and all(
                isinstance(saved, dict)
                and isinstance(saved.get("params"), list)
                and len(saved["params"]) == len(live["params"])
                for saved, live in zip(saved_groups, live_groups)  # noqa: B905 (lengths checked)
            )
        ):
            try:
                by_index: dict[object, torch.Tensor] = {}
                for saved, live in zip(saved_groups, live_groups):  # noqa: B905
                    by_index.update(zip(saved["params"], live["params"]))  # noqa: B905
                live_state = optimizer.state
                for index, entries in saved_state.items():
                    param = by_index.get(index)
                    live_entries = live_state.get(param) if param is not None else None
                    if isinstance(entries, dict) and isinstance(live_entries, dict):
                        for name, saved in entries.items():
                            pairs.append((saved, live_entries.get(name)))
            except TypeError:  # an unhashable index: load_state_dict says what is wrong
                pass
    return pairs


def load_optimizer_in_place(optimizer: torch.optim.Optimizer, saved: object) -> bool:
    """Do what ``optimizer.load_state_dict(saved)`` does, where each of the saved state tensors
    already is the live one it would become (read in place into it); return False, having
    changed nothing, where that is not so or the optimizer does not load the stock way: the
    caller then calls ``load_state_dict``.

    ``Optimizer.load_state_dict`` deep-copies the saved groups and passes each state value
    through ``_process_value_according_to_param_policy``, which looks its parameter up by a scan
    of every group and returns the tensor itself when its dtype and device already are the
    ones it would cast to, a cost per value that adds up over a model's state. Here the same
    conditions are checked (each ``.to()`` would return the tensor itself), then the same
    ``__setstate__`` is called with the state (the saved per-parameter dicts) and the saved
    groups holding the live parameters."""
    base = torch.optim.Optimizer
    if (
        type(optimizer).load_state_dict is not base.load_state_dict
        or getattr(optimizer, "_optimizer_load_state_dict_pre_hooks", True)
        or getattr(optimizer, "_optimizer_load_state_dict_post_hooks", True)
        or not isinstance(saved, dict)
    ):
        return False
    saved_groups, saved_state = saved.get("param_groups"), saved.get("state")
    groups = optimizer.param_groups
    if not (isinstance(saved_groups, list) and isinstance(saved_state, dict) and len(saved_groups) == len(groups)):
        return False
    by_index: dict[object, tuple[torch.Tensor, bool]] = {}
    count = 0
    try:
        for group, saved_group in zip(groups, saved_groups):  # noqa: B905 (lengths checked)
            indices = saved_group.get("params") if isinstance(saved_group, dict) else None
            if not isinstance(indices, list) or len(indices) != len(group["params"]):
                return False
            # fused or capturable: torch moves "step" to the parameter's device as float32
            special = bool(saved_group.get("fused", False) or saved_group.get("capturable", False))
            by_index.update((index, (param, special)) for index, param in zip(indices, group["params"]))  # noqa: B905
            count += len(indices)
        if len(by_index) != count:
            return False  # an index in two groups (torch's scan would take the first): malformed, let torch say
        live_state = optimizer.state
        state: collections.defaultdict[torch.Tensor, dict[object, object]] = collections.defaultdict(dict)
        for index, entries in saved_state.items():
            found = by_index.get(index)
            if found is None or type(entries) is not dict:
                return False  # an entry of no parameter: torch keeps it as it is
            param, special = found
            live = live_state.get(param)
            if not isinstance(live, dict) or live.keys() != entries.keys():
                return False
            if not (param.is_cpu or param.is_cuda):
                return False
            floating, device = param.is_floating_point(), param.get_device()  # -1: the CPU
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    if value is not live[key]:  # so it is on the CPU or CUDA (plan_in_place takes no other)
                        return False
                    if key == "step":
                        if special and (value.dtype is not torch.float32 or value.get_device() != device):
                            return False
                    elif value.get_device() != device or (floating and value.dtype is not param.dtype):
                        return False
                elif value is not None and type(value) not in (int, float, bool):
                    return False  # torch would copy it piece by piece: let it
            state[param] = entries
    except TypeError:  # an unhashable index: load_state_dict says what is wrong
        return False
    param_groups = []
    for group, saved_group in zip(groups, saved_groups):  # noqa: B905
        new_group = dict(saved_group)  # the bundle's own: nothing else holds it
        new_group["params"] = group["params"]
        if "param_names" in group and "param_names" not in new_group:
            new_group["param_names"] = group["param_names"]
        param_groups.append(new_group)
    optimizer.__setstate__({"state": state, "param_groups": param_groups})
    return True


def dtensor_local_box(t: DTensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The (global offset, local shape) of the shard a DTensor holds on this rank.

    Sharded checkpoints (:mod:`launchhelm.torch._sharded`) need it for any
    placement (uneven and empty shards, several mesh dimensions); torch computes
    it only in a private helper, so it is reached here, on every torch version
    (no public equivalent exists to fall back to).
    """
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return tuple(int(o) for o in offset), tuple(int(s) for s in shape)


def dcp_fsspec_reader() -> type | None:
    """``torch.distributed.checkpoint``'s fsspec storage reader, or None where this torch lacks it.

    ``launchhelm import dcp`` reads a DCP folder at any fsspec URL with it; torch
    does not export it, so without it the import takes the public local-folder
    reader (local paths only).
    """
    try:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    except ImportError:
        return None
    return FsspecReader


def dcp_metadata_private_globals() -> dict[tuple[str, str], object]:
    """The private globals of torch's that a DCP ``.metadata`` pickle names, as (module, name) to
    the object an allow-listing unpickler (``launchhelm import dcp``) may hand back for each.

    DCP pickles its metadata with private classes in it (``_StorageInfo``, ``_MEM_FORMAT_ENCODING``)
    and layouts as calls to ``torch.serialization._get_layout``; reading any DCP folder needs them,
    on every torch version (there is no public form of that file). ``_get_layout`` itself is not
    handed out: :func:`_layout_by_name` stands in for it, limited to torch's layouts by name.
    """
    from torch.distributed.checkpoint import filesystem, metadata

    found: dict[tuple[str, str], object] = {("torch.serialization", "_get_layout"): _layout_by_name}
    if hasattr(filesystem, "_StorageInfo"):
        found[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = filesystem._StorageInfo
    if hasattr(metadata, "_MEM_FORMAT_ENCODING"):
        found[("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING")] = metadata._MEM_FORMAT_ENCODING
    return found


def _layout_by_name(name: object) -> torch.layout:
    """What ``torch.serialization._get_layout`` returns for a layout's name, for torch's layouts only."""
    for value in vars(torch).values():
        if isinstance(value, torch.layout) and str(value) == name:
            return value
    raise pickle.UnpicklingError(f"unknown torch layout {name!r}")
