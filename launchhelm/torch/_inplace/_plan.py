"""Step 1 of an in-place load: the plan, from the pickle alone (see the package docstring)."""

from __future__ import annotations

import collections
import contextlib
import io
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from launchhelm.torch._inplace._pagecache import _headers_prefetched
from launchhelm.torch._inplace._zip import _sequential_layout
from launchhelm.torch._torch_private import REBUILD_TENSOR, checkpoint_offset, file_reader, storage_dtype


# -- step 1: the plan, from the pickle alone ------------------------------------
class _Refused(pickle.UnpicklingError):
    """Something the planning unpickler does not take: the caller plans with torch.load instead."""


class _Sealed:
    """What the planning unpickler's ``find_class`` hands out: callable, but closed to ``BUILD``
    (which would otherwise set attributes on it) and with no ``__dict__``."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        raise _Refused("BUILD on a global")


class _StorageName(_Sealed):
    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class _PlannedStorage(_Sealed):
    """A storage record of the file as the plan sees it: its dtype, its size in bytes and where
    its bytes lie in the file (no torch object is made for it); once planned
    (:func:`plan_in_place`), where its bytes go: a live tensor, or fresh memory."""

    __slots__ = ("dtype", "fresh", "header", "itemsize", "nbytes", "offset", "record", "target", "views")

    def __init__(self, dtype: torch.dtype, nbytes: int, offset: int, header: int = -1, record: bytes = b"") -> None:
        self.dtype, self.nbytes, self.offset, self.itemsize = dtype, nbytes, offset, dtype.itemsize
        #: its local zip header's offset and the record name that header must carry, where
        #: ``offset`` came from the layout and the load checks the header (-1: ``offset`` is what
        #: torch read from the header itself)
        self.header, self.record = header, record
        #: saved tensors made on it: more than one (tied weights, views) never goes in place
        self.views = 0
        self.target: torch.Tensor | None = None  # the live tensor its bytes go into, when matched
        self.fresh: torch.UntypedStorage | None = None  # else: fresh CPU memory (read_rest)


class _Planned(_Sealed):
    """A saved tensor as the plan sees it: a view (element offset, shape, stride) of a
    :class:`_PlannedStorage`. What ``torch.load(map_location="meta")`` makes costs several torch
    calls a tensor (a meta storage, an empty tensor, ``set_``) and as much again to inspect and
    free; this is a plain object, and a plan handles hundreds of them. ``whole``: it is its
    storage's bytes in order (offset 0, contiguous, every byte), which a load in place needs."""

    __slots__ = ("dtype", "offset", "shape", "storage", "stride", "whole")

    def __init__(
        self, storage: _PlannedStorage, offset: int, shape: tuple[int, ...], stride: tuple[int, ...], whole: bool
    ) -> None:
        self.storage, self.dtype, self.offset, self.shape, self.stride = storage, storage.dtype, offset, shape, stride
        self.whole = whole
        storage.views += 1

    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    def is_contiguous(self) -> bool:
        """As ``torch.Tensor.is_contiguous``: dimensions of size 1 may have any stride."""
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size == 0:
                return True
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


def _geometry(storage: _PlannedStorage, offset: object, size: object, stride: object) -> bool | None:
    """None where a tensor's geometry from the pickle is malformed or reaches past its storage
    (what ``set_`` refuses on a real tensor); else whether the tensor is the whole storage's bytes
    in order (offset 0, contiguous as ``torch.Tensor.is_contiguous`` says, every byte).

    Scalars, vectors and matrices (nearly every tensor of a model and its optimizer) are checked
    without a loop, the common case made cheap."""
    if type(offset) is not int or type(size) is not tuple or type(stride) is not tuple or offset < 0:
        return None
    dims = len(size)
    if dims != len(stride):
        return None
    if dims == 2:
        n0, n1 = size
        s0, s1 = stride
        if type(n0) is not int or type(n1) is not int or type(s0) is not int or type(s1) is not int:
            return None
        if n0 < 0 or n1 < 0 or s0 < 0 or s1 < 0:
            return None
        numel, last = n0 * n1, offset + (n0 - 1) * s0 + (n1 - 1) * s1
        contiguous = (n1 == 1 or s1 == 1) and (n0 == 1 or s0 == n1)
    elif dims == 1:
        (n0,), (s0,) = size, stride
        if type(n0) is not int or type(s0) is not int or n0 < 0 or s0 < 0:
            return None
        numel, last, contiguous = n0, offset + (n0 - 1) * s0, n0 == 1 or s0 == 1
    elif dims == 0:
        numel, last, contiguous = 1, offset, True
    else:
        last, numel, expected, contiguous = offset, 1, 1, True
        for n, step in zip(reversed(size), reversed(stride)):  # noqa: B905 (lengths checked above)
            if type(n) is not int or type(step) is not int or n < 0 or step < 0:
                return None
            last += (n - 1) * step
            numel *= n
            if n != 1 and step != expected:
                contiguous = False
            expected *= n
    if numel == 0:  # empty: it fits anywhere, and is whole only of an empty storage
        return offset == 0 and storage.nbytes == 0
    itemsize = storage.itemsize
    if (last + 1) * itemsize > storage.nbytes:
        return None
    return contiguous and offset == 0 and numel * itemsize == storage.nbytes


def _geometry_fits(storage: _PlannedStorage, offset: object, size: object, stride: object) -> bool:
    """Whether a tensor's geometry from the pickle is well formed and lies inside its storage."""
    return _geometry(storage, offset, size, stride) is not None


class _TensorRecord(_Sealed):
    """``torch._utils._rebuild_tensor_v2`` as the planning unpickler hands it out: it makes a
    :class:`_Planned` (one Python call a tensor, the checks inline)."""

    __slots__ = ()

    def __call__(
        self,
        storage: object,
        offset: int,
        size: tuple[int, ...],
        stride: tuple[int, ...],
        requires_grad: object,
        hooks: object,
        *metadata: object,
    ) -> _Planned:
        # offset, size and stride as a well-formed pickle gives them: _geometry refuses any other
        if type(storage) is not _PlannedStorage or requires_grad is not False or hooks or any(metadata):
            raise _Refused("tensor")
        whole = _geometry(storage, offset, size, stride)
        if whole is None:
            raise _Refused("tensor geometry")
        return _Planned(storage, offset, size, stride, whole)


_TENSOR_RECORD = _TensorRecord()


class _PlanningUnpickler(pickle.Unpickler):
    """The C unpickler, given only the three globals a bundle's state dicts need, each one of
    LaunchHelm's own harmless callables (never the real torch function): ``_rebuild_tensor_v2``
    makes a :class:`_Planned`, ``OrderedDict`` is itself, ``torch.<X>Storage`` names a dtype.
    Anything else (any other global, ``BUILD`` on a global, out-of-band buffers, a tensor with
    hooks or ``requires_grad``) is refused, and :func:`meta_load` says None: the caller then
    plans with ``torch.load(map_location="meta", weights_only=True)`` as before, and its rules
    decide. Nothing from the file is ever called but these."""

    def __init__(
        self,
        data: bytes,
        offset_of: Callable[[str], int],
        layout: tuple[bytes, dict[str, tuple[int, int, int]]] | None = None,
    ) -> None:
        # A stream with ``peek``: the C unpickler then takes the pickle in one prefetch and reads
        # its opcodes from its own buffer; from a bare BytesIO it calls ``read`` for each opcode.
        super().__init__(io.BufferedReader(io.BytesIO(data), buffer_size=max(1, len(data))), encoding="utf-8")
        self._offset_of = offset_of
        self._folder, self._layout = layout or (b"", {})
        self.storages: dict[str, _PlannedStorage] = {}

    def find_class(self, module: str, name: str) -> object:
        if (module, name) == REBUILD_TENSOR:
            return _TENSOR_RECORD
        if module == "collections" and name == "OrderedDict":
            # the real class: it only ever makes a dict of what the pickle holds, and BUILD on the
            # class itself fails (an immutable type); each tensor's empty hooks are one, so a
            # wrapper of ours would cost a Python call a tensor
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage") and name != "UntypedStorage":
            try:
                return _StorageName(storage_dtype(name))
            except Exception:
                raise _Refused(f"storage type {name}") from None
        raise _Refused(f"global {module}.{name}")

    def persistent_load(self, pid: object) -> _PlannedStorage:
        if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage":
            raise _Refused("persistent id")
        _, kind, key, location, numel = pid
        if type(kind) is not _StorageName or type(key) is not str or type(location) is not str:
            raise _Refused("persistent id")
        storage = self.storages.get(key)
        if storage is None:
            if type(numel) is not int or numel < 0:
                raise _Refused("storage size")
            name = f"data/{key}"
            placed = self._layout.get(name)
            if placed is None:
                storage = _PlannedStorage(kind.dtype, numel * kind.dtype.itemsize, self._offset_of(name))
            else:
                record = self._folder + name.encode()  # the name its local header must carry
                storage = _PlannedStorage(kind.dtype, numel * kind.dtype.itemsize, placed[1], placed[0], record)
            self.storages[key] = storage
        elif storage.dtype is not kind.dtype:
            raise _Refused("one storage, two dtypes")
        return storage


def meta_load(path: Path) -> object | None:
    """What ``torch.load(path, map_location="meta", weights_only=True)`` gives for a LaunchHelm
    bundle, each tensor a :class:`_Planned` (its geometry, dtype and file offset) instead of a
    meta tensor: many times faster per tensor (the C unpickler, see :class:`_PlanningUnpickler`,
    and no torch object per tensor); None where it does not take the file, and the caller asks
    torch.load, then :func:`planned_from_meta`."""
    planned = load_plan(path)
    return None if planned is None else planned[0]


def load_plan(path: Path) -> tuple[object, list[_PlannedStorage]] | None:
    """:func:`meta_load`'s bundle, and its storage records (for :func:`plan_in_place`).

    A file laid out as torch writes one (:func:`_sequential_layout`) is planned from its own
    bytes: the ``byteorder``, ``version`` and ``data.pkl`` records read where the central
    directory puts them (each checked by the whole-file CRC64NVME as the load reads the file).
    Opening torch's zip reader costs more than that (it parses the directory again).
    Every other file goes through torch's reader, whose rules and errors decide."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            layout = _sequential_layout(fd)
            records = _small_records(fd, layout) if layout is not None else None
        finally:
            os.close(fd)
        reader: Any = None  # torch._C.PyTorchFileReader: its stubs lack has_record, get_record_offset
        if records is None:
            reader = file_reader(path)
            if not reader.has_record("byteorder"):
                return None
            records = {"byteorder": reader.get_record("byteorder"), "data.pkl": reader.get_record("data.pkl")}
        if records["byteorder"].decode() != sys.byteorder:
            return None  # a byte-swapping load: torch's own path

        def offset_of(name: str) -> int:  # a storage the layout does not place: torch's reader finds it
            nonlocal reader
            if reader is None:
                reader = file_reader(path)
            return int(reader.get_record_offset(name))

        # laid out as torch writes: no local header is read before the data (nothing to prefetch)
        with _headers_prefetched(path) if layout is None else contextlib.nullcontext():
            unpickler = _PlanningUnpickler(records["data.pkl"], offset_of, layout)
            return unpickler.load(), list(unpickler.storages.values())
    except Exception:  # refused, truncated, not a zip...: torch.load decides, with its own message
        return None


#: The archive versions (its ``version`` record) whose files the plan reads without torch's
#: reader: those this torch writes and reads (torch's reader refuses others with its own error).
_VERSIONS = frozenset((b"1", b"2", b"3"))
#: The most bytes :func:`_small_records` reads for a pickle (a bigger one goes through torch's reader).
_PICKLE_MAX = 64 * 2**20


def _small_records(fd: int, layout: tuple[bytes, dict[str, tuple[int, int, int]]]) -> dict[str, bytes] | None:
    """The ``byteorder`` and ``data.pkl`` records, read where the layout puts them, where the
    archive's ``version`` is one this torch reads; None otherwise (torch's reader then decides)."""
    placed = layout[1]
    version = placed.get(".data/version") or placed.get("version")
    pickle_at = placed.get("data.pkl")
    order = placed.get("byteorder")
    if version is None or pickle_at is None or order is None or pickle_at[2] > _PICKLE_MAX or order[2] > 16:
        return None
    if os.pread(fd, min(version[2], 16), version[1]).strip() not in _VERSIONS:
        return None
    found = {"byteorder": os.pread(fd, order[2], order[1]), "data.pkl": os.pread(fd, pickle_at[2], pickle_at[1])}
    if len(found["byteorder"]) != order[2] or len(found["data.pkl"]) != pickle_at[2]:
        return None
    return found


def planned_from_meta(meta: object) -> object | None:
    """``torch.load(map_location="meta")``'s bundle with each meta tensor as a :class:`_Planned`
    (tensors sharing a storage share one :class:`_PlannedStorage`); None if this torch gives no
    storage offsets (``_checkpoint_offset``)."""
    planned = plan_from_meta(meta)
    return None if planned is None else planned[0]


def plan_from_meta(meta: object) -> tuple[object, list[_PlannedStorage]] | None:
    """:func:`planned_from_meta`'s bundle, and its storage records (for :func:`plan_in_place`)."""
    storages: dict[int, _PlannedStorage] = {}
    missing = False

    def planned(t: torch.Tensor) -> torch.Tensor | _Planned:
        nonlocal missing
        untyped = t.untyped_storage()
        offset = checkpoint_offset(untyped)
        if not isinstance(offset, int):
            missing = True
            return t
        storage = storages.get(offset)
        if storage is None:
            storage = storages[offset] = _PlannedStorage(t.dtype, int(untyped.nbytes()), offset)
        shape, stride, at = tuple(t.shape), tuple(t.stride()), int(t.storage_offset())
        return _Planned(storage, at, shape, stride, bool(_geometry(storage, at, shape, stride)))

    converted = _rebuild(meta, planned)
    return None if missing else (converted, list(storages.values()))


def _walk(value: object) -> Iterator[_Planned]:
    if isinstance(value, _Planned):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            yield from _walk(item)


def _rebuild(value: object, replace: Callable[[Any], object]) -> object:
    """``value`` with each tensor (a :class:`_Planned` or a ``torch.Tensor``) replaced. A dict
    subclass keeps its attributes: a state dict's ``_metadata`` (each module's version, which
    ``load_state_dict`` hands to ``_load_from_state_dict``) is one."""
    if isinstance(value, (_Planned, torch.Tensor)):
        return replace(value)
    if isinstance(value, dict):
        rebuilt = {k: _rebuild(v, replace) for k, v in value.items()}
        if type(value) is dict:
            return rebuilt
        out = type(value)(rebuilt)
        attributes = getattr(value, "__dict__", None)
        if attributes:
            out.__dict__.update(attributes)
        return out
    if isinstance(value, list):
        return [_rebuild(v, replace) for v in value]
    if isinstance(value, tuple):
        return tuple(_rebuild(v, replace) for v in value)
    if isinstance(value, set):
        return {_rebuild(v, replace) for v in value}
    return value
