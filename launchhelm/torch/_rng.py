"""Process-global RNG state as tensors and plain values (weights_only-safe).

Captured: Python's ``random``, torch's CPU generator, every CUDA device's
generator when CUDA is initialised, and numpy's global MT19937 when numpy is
importable. ``np.random.get_state()`` holds an ndarray (refused by
``weights_only``), so its key travels as an int64 tensor (the values exceed
2**31) and is range-checked on restore: ``set_state`` accepts garbage silently.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from types import ModuleType
from typing import cast

import torch

from launchhelm._exceptions import CheckpointError
from launchhelm.torch._records import RngRecord

__all__ = ["capture_rng", "restore_rng", "validate_rng"]

_MT_WORDS = 624


def _numpy() -> ModuleType | None:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def capture_rng() -> RngRecord:
    """This process's global RNG states."""
    version, words, gauss = random.getstate()
    record: RngRecord = {
        "python": (int(version), torch.tensor(words, dtype=torch.int64), gauss),
        "torch": torch.get_rng_state(),
        "cuda": [],
        "numpy": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        record["cuda"] = list(torch.cuda.get_rng_state_all())
    np = _numpy()
    if np is not None:
        name, key, pos, has_gauss, cached = np.random.get_state()
        if name == "MT19937":
            record["numpy"] = {
                "key": torch.from_numpy(key.astype(np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            }
    return record


def validate_rng(record: object, where: str) -> None:
    """Check an RNG record's shape before anything is applied."""
    if not isinstance(record, dict):
        raise CheckpointError(f"{where} is a {type(record).__name__}, not an RNG record")
    python = record.get("python")
    if not (
        isinstance(python, tuple)
        and len(python) == 3
        and isinstance(python[1], torch.Tensor)
        and python[1].numel() == _MT_WORDS + 1
    ):
        raise CheckpointError(f"{where}['python'] is not a Python random state (version, 625 words, gauss)")
    state = record.get("torch")
    if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8):
        raise CheckpointError(f"{where}['torch'] is not a torch CPU RNG state (uint8 tensor)")
    numpy_state = record.get("numpy")
    if numpy_state is not None:
        key = numpy_state.get("key") if isinstance(numpy_state, dict) else None
        if not (isinstance(key, torch.Tensor) and key.numel() == _MT_WORDS):
            raise CheckpointError(f"{where}['numpy'] is not an MT19937 state (624-word key)")
        if bool((key < 0).any()) or bool((key >= 2**32).any()):
            raise CheckpointError(f"{where}['numpy'] key holds values outside 0..2**32-1: corrupted")
        if not 0 <= int(numpy_state.get("pos", -1)) <= _MT_WORDS:
            raise CheckpointError(f"{where}['numpy'] position is outside 0..624: corrupted")


def restore_rng(checked: Mapping[str, object]) -> None:
    """Set this process's global RNGs from a record :func:`validate_rng` accepted."""
    record = cast("RngRecord", checked)
    version, words, gauss = record["python"]
    random.setstate((int(version), tuple(int(w) for w in words.tolist()), gauss))  # setstate needs a tuple
    torch.set_rng_state(record["torch"])
    cuda = record.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    numpy_state = record.get("numpy")
    np = _numpy()
    if numpy_state is not None and np is not None:
        np.random.set_state(
            (
                "MT19937",
                numpy_state["key"].numpy().astype(np.uint32),
                int(numpy_state["pos"]),
                int(numpy_state["has_gauss"]),
                float(numpy_state["cached_gaussian"]),
            )
        )
