"""The JSON manifest of a sharded checkpoint (format /3): encoding, decoding and validation.

Everything a load trusts comes from here, so it is checked before a single
shard byte is read or a tensor allocated (see ``docs/storage.md``, "A hostile
or damaged manifest"). Values that JSON has no form for are tagged objects;
dtypes come from a fixed table, never from ``getattr(torch, name)``.
"""

from __future__ import annotations

import base64
import json
import math
import re
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict, cast

import torch

from launchhelm._exceptions import CheckpointError

if TYPE_CHECKING:
    from launchhelm._types import JSONValue
    from launchhelm.torch._records import ControlState, Placement

__all__ = [
    "BLOCK_SIZE",
    "FORMAT_SHARDED",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "ChunkRecord",
    "Manifest",
    "ObjectRecord",
    "TensorEntry",
    "decode_value",
    "dtype_name",
    "dtype_named",
    "encode_value",
    "object_name",
    "validate_manifest",
]

#: Format of a sharded checkpoint: per-rank shard objects plus a JSON manifest.
FORMAT_SHARDED = "launchhelm.torch.checkpoint/3"
MANIFEST_NAME = "manifest.json"
#: Bytes of a chunk covered by one CRC64NVME: the most a load reads beyond what it needs, per range end.
BLOCK_SIZE = 4 * 2**20
MAX_MANIFEST_BYTES = 256 * 2**20
_MAX_DIMS = 64
_MAX_OBJECT_BYTES = 2**50
_OBJECT_NAME = re.compile(r"shard-(\d{5,7})\.bin")
_HEX16 = re.compile(r"[0-9a-f]{16}")

_DTYPES: dict[str, torch.dtype] = {
    name: dtype
    for name in (
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "complex128",
        "complex64",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "uint16",
        "uint32",
        "uint64",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
    )
    if isinstance(dtype := getattr(torch, name, None), torch.dtype)
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


# -- the manifest's records (docs/storage.md, "Sharded checkpoints") ---------------------------
class ObjectRecord(TypedDict):
    """One shard object: its name under the checkpoint's prefix, size and whole CRC64NVME."""

    name: str
    size: int
    crc64nvme: str


class ChunkRecord(TypedDict):
    """Where one saved chunk of a tensor lies: its box, its bytes in an object, one CRC per block."""

    offset: list[int]
    shape: list[int]
    start: int
    nbytes: int
    crc64nvme: list[str]
    object: int  # index into the manifest's objects


class TensorEntry(TypedDict):
    """One tensor of the state: dtype and global shape, and the chunks that cover it."""

    dtype: str
    shape: list[int]
    chunks: list[ChunkRecord]


class Manifest(TypedDict):
    """A sharded checkpoint's ``manifest.json``, as :func:`validate_manifest` returns it."""

    format: str
    run_id: str
    step: int
    saved_at: float
    world_size: int
    torch_version: str
    byteorder: str
    block_size: int
    objects: list[ObjectRecord]
    tensors: dict[str, TensorEntry]
    #: model, optimizer, scheduler and scaler, encoded by :func:`encode_value`
    state: dict[str, JSONValue]
    tunables: JSONValue
    control: ControlState
    rng_by_rank: list[JSONValue]
    extra_by_rank: list[JSONValue]
    placement_by_rank: list[Placement | None]


def object_name(rank: int) -> str:
    """The shard object a rank writes under the checkpoint's prefix."""
    return f"shard-{rank:05d}.bin"


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _NAMES[dtype]
    except KeyError:
        raise CheckpointError(f"tensors of dtype {dtype} cannot be saved in a sharded checkpoint") from None


def dtype_named(name: object, where: str) -> torch.dtype:
    if not isinstance(name, str) or name not in _DTYPES:
        raise CheckpointError(f"{where}: unknown dtype {name!r}")
    return _DTYPES[name]


# -- values ----------------------------------------------------------------------------------
def _inline(t: torch.Tensor) -> dict[str, JSONValue]:
    t = t.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "data": base64.b64encode(raw).decode()}


def encode_value(value: object, tensors: Callable[[str, torch.Tensor], str] | None = None, path: str = "") -> JSONValue:
    """``value`` as JSON. ``tensors(path, tensor)``, when given, stores a tensor and returns its key;
    without it tensors are inlined (RNG states, ``extra``)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, torch.Tensor):
        if tensors is not None:
            return {"__tensor__": tensors(path, value)}
        return {"__inline__": _inline(value)}
    if isinstance(value, torch.Size):
        return {"__size__": list(value)}
    if isinstance(value, torch.dtype):
        return {"__dtype__": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"__device__": str(value)}
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if isinstance(value, tuple):
        return {"__tuple__": [encode_value(v, tensors, f"{path}/{i}") for i, v in enumerate(value)]}
    if isinstance(value, (set, frozenset)):
        return {"__set__": [encode_value(v, None, path) for v in value]}
    if isinstance(value, list):
        return [encode_value(v, tensors, f"{path}/{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode_value(v, tensors, f"{path}/{k}") for k, v in value.items()}
        return {"__dict__": [[encode_value(k), encode_value(v, tensors, f"{path}/{k}")] for k, v in value.items()]}
    raise CheckpointError(f"{path or 'value'} is a {type(value).__name__}, which a checkpoint cannot hold")


def decode_value(
    value: object, tensors: Callable[[str], object] | None = None, where: str = "manifest", _depth: int = 0
) -> object:
    """The inverse of :func:`encode_value`; ``tensors(key)`` gives a stored tensor back."""
    if _depth > 200:
        raise CheckpointError(f"{where} is nested more than 200 levels deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode_value(v, tensors, where, _depth + 1) for v in value]
    if not isinstance(value, dict):
        raise CheckpointError(f"{where} holds a {type(value).__name__}")
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "__tensor__":
            if tensors is None or not isinstance(inner, str):
                raise CheckpointError(f"{where}: a stored tensor where none may be")
            return tensors(inner)
        if tag == "__inline__":
            return _decode_inline(inner, where)
        if tag == "__float__" and inner in ("nan", "inf", "-inf"):
            return float(inner)
        if tag == "__size__" and isinstance(inner, list) and all(type(d) is int for d in inner):
            return torch.Size(inner)
        if tag == "__dtype__":
            return dtype_named(inner, where)
        if tag == "__device__" and isinstance(inner, str):
            return torch.device(inner)
        if tag == "__bytes__" and isinstance(inner, str):
            return base64.b64decode(inner, validate=True)
        if tag == "__tuple__" and isinstance(inner, list):
            return tuple(decode_value(v, tensors, where, _depth + 1) for v in inner)
        if tag == "__set__" and isinstance(inner, list):
            return {decode_value(v, None, where, _depth + 1) for v in inner}
        if tag == "__dict__" and isinstance(inner, list):
            if not all(isinstance(p, list) and len(p) == 2 for p in inner):
                raise CheckpointError(f"{where}: a malformed __dict__")
            return {
                decode_value(k, None, where, _depth + 1): decode_value(v, tensors, where, _depth + 1) for k, v in inner
            }
    if any(isinstance(k, str) and k.startswith("__") for k in value):
        raise CheckpointError(f"{where}: unknown tagged value {sorted(value)[:3]}")
    return OrderedDict((k, decode_value(v, tensors, where, _depth + 1)) for k, v in value.items())


def _decode_inline(inner: object, where: str) -> torch.Tensor:
    if not isinstance(inner, dict) or not isinstance(inner.get("data"), str):
        raise CheckpointError(f"{where}: a malformed inline tensor")
    dtype = dtype_named(inner.get("dtype"), where)
    shape = _shape(inner.get("shape"), where)
    raw = base64.b64decode(inner["data"], validate=True)
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise CheckpointError(f"{where}: an inline tensor of shape {shape} holds {len(raw)} bytes")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone()


# -- validation ------------------------------------------------------------------------------
def _int(value: object, where: str, low: int = 0, high: int = 2**62) -> int:
    if type(value) is not int or not low <= value <= high:
        raise CheckpointError(f"{where} is {value!r}, not an integer in {low}..{high}")
    return value


def _shape(value: object, where: str) -> list[int]:
    if not isinstance(value, list) or len(value) > _MAX_DIMS:
        raise CheckpointError(f"{where}: shape {value!r} is not a list of at most {_MAX_DIMS} sizes")
    return [_int(d, f"{where} shape", 0, 2**48) for d in value]


def validate_manifest(
    raw: bytes, *, expected_objects: dict[str, int] | None = None, where: str = "checkpoint"
) -> Manifest:
    """The parsed manifest, once every field a load relies on has been checked.

    ``expected_objects``: ``{name: size}`` from the checkpoint event, which
    the manifest's objects must match. Raises :class:`CheckpointError`.
    """
    if len(raw) > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{where}: its manifest is {len(raw)} bytes, more than a manifest may be")
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{where}: its manifest is not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_SHARDED:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointError(f"{where}: its manifest has format {found!r}, not {FORMAT_SHARDED}")
    if manifest.get("byteorder") != sys.byteorder:
        raise CheckpointError(f"{where} was saved on a {manifest.get('byteorder')}-endian machine")
    world = _int(manifest.get("world_size"), f"{where} world_size", 1, 2**20)
    _int(manifest.get("step"), f"{where} step")
    block = _int(manifest.get("block_size"), f"{where} block_size", 4096, 2**30)
    if block % 64:
        raise CheckpointError(f"{where} block_size {block} is not a multiple of 64")
    objects = manifest.get("objects")
    if not isinstance(objects, list) or len(objects) > world:
        raise CheckpointError(f"{where}: objects is not a list of at most one per rank")
    sizes: list[int] = []
    for i, obj in enumerate(objects):
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not _OBJECT_NAME.fullmatch(obj["name"]):
            raise CheckpointError(f"{where}: object {i} is not named shard-<rank>.bin (a key outside the checkpoint)")
        size = _int(obj.get("size"), f"{where} object {obj['name']} size", 0, _MAX_OBJECT_BYTES)
        if not isinstance(obj.get("crc64nvme"), str) or not _HEX16.fullmatch(obj["crc64nvme"]):
            raise CheckpointError(f"{where}: object {obj['name']} has no crc64nvme")
        if expected_objects is not None and expected_objects.get(obj["name"]) != size:
            raise CheckpointError(
                f"{where}: object {obj['name']} is {size} bytes in the manifest and "
                f"{expected_objects.get(obj['name'])} in the checkpoint's record"
            )
        sizes.append(size)
    if len({o["name"] for o in objects}) != len(objects):
        raise CheckpointError(f"{where}: an object is listed twice")
    tensors = manifest.get("tensors")
    if not isinstance(tensors, dict):
        raise CheckpointError(f"{where}: tensors is not an object")
    used = [0] * len(sizes)
    for key, entry in tensors.items():
        _validate_tensor(key, entry, sizes, block, used, f"{where} tensor {key!r}")
    for i, total in enumerate(used):
        if total > sizes[i]:
            raise CheckpointError(f"{where}: chunks claim {total} bytes of object {objects[i]['name']} ({sizes[i]})")
    for name in ("rng_by_rank", "extra_by_rank", "placement_by_rank"):
        if not isinstance(manifest.get(name), list) or len(manifest[name]) != world:
            raise CheckpointError(f"{where}: {name} does not hold one record per saving rank ({world})")
    if not isinstance(manifest.get("state"), dict):
        raise CheckpointError(f"{where}: the manifest has no state")
    return cast("Manifest", manifest)  # every field a load relies on was checked above


def _validate_tensor(key: str, entry: object, sizes: list[int], block: int, used: list[int], where: str) -> None:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where} is not an object")
    dtype = dtype_named(entry.get("dtype"), where)
    shape = _shape(entry.get("shape"), where)
    chunks = entry.get("chunks")
    if not isinstance(chunks, list):
        raise CheckpointError(f"{where}: chunks is not a list")
    boxes: list[tuple[list[int], list[int]]] = []
    covered = 0
    for j, chunk in enumerate(chunks):
        here = f"{where} chunk {j}"
        if not isinstance(chunk, dict):
            raise CheckpointError(f"{here} is not an object")
        offset = _shape(chunk.get("offset"), here)
        size = _shape(chunk.get("shape"), here)
        if len(offset) != len(shape) or len(size) != len(shape):
            raise CheckpointError(f"{here}: offset/shape of {len(offset)}/{len(size)} dims for a {len(shape)}-d tensor")
        if any(o + s > d for o, s, d in zip(offset, size, shape, strict=True)):
            raise CheckpointError(f"{here}: box {offset}+{size} lies outside the tensor's shape {shape}")
        numel = math.prod(size)
        nbytes = _int(chunk.get("nbytes"), f"{here} nbytes", 0, _MAX_OBJECT_BYTES)
        if nbytes != numel * dtype.itemsize:
            raise CheckpointError(f"{here}: {nbytes} bytes for {numel} elements of {dtype}")
        obj = _int(chunk.get("object"), f"{here} object", 0, max(0, len(sizes) - 1)) if sizes else None
        if obj is None:
            raise CheckpointError(f"{here}: there are no objects to hold it")
        start = _int(chunk.get("start"), f"{here} start", 0, _MAX_OBJECT_BYTES)
        if start + nbytes > sizes[obj]:
            raise CheckpointError(
                f"{here}: bytes {start}..{start + nbytes} lie outside its object ({sizes[obj]} bytes)"
            )
        crcs = chunk.get("crc64nvme")
        blocks = -(-nbytes // block)
        if (
            not isinstance(crcs, list)
            or len(crcs) != blocks
            or not all(isinstance(c, str) and _HEX16.fullmatch(c) for c in crcs)
        ):
            raise CheckpointError(f"{here}: not one crc64nvme per {block}-byte block ({blocks})")
        used[obj] += nbytes
        if numel:
            for other_offset, other_size in boxes:
                if all(
                    a < b + t and b < a + s for a, s, b, t in zip(offset, size, other_offset, other_size, strict=True)
                ):
                    raise CheckpointError(f"{here} overlaps another chunk of the same tensor")
            boxes.append((offset, size))
        covered += numel
    if covered != math.prod(shape):
        raise CheckpointError(f"{where}: its chunks hold {covered} of its {math.prod(shape)} elements")
