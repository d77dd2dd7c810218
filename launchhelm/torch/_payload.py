"""What may go into a checkpoint: only what ``torch.load(weights_only=True)`` loads.

Checked at save time, so a bad ``extra`` fails where it was written, with the
key path that holds the offending value, not at resume hours later.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from launchhelm._exceptions import CheckpointError

__all__ = ["check_payload"]

_SCALARS = (type(None), bool, int, float, str, bytes)
_TORCH_VALUES = (torch.Size, torch.dtype, torch.device)
_CONTAINERS = (dict, OrderedDict)
_SEQUENCES = (list, tuple, set)
_HINTS = {
    "numpy": "convert it with .item() for a scalar or torch.from_numpy() for an array",
    "pathlib": "store str(path)",
    "datetime": "store a float timestamp or an ISO string",
    "collections": "convert it to a plain dict or list",
}


def _describe(value: object) -> str:
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def check_payload(value: Any, where: str, *, _depth: int = 0) -> None:
    """Raise :class:`CheckpointError` naming the first value that would not load.

    Allowed: None, bool, int, float, str, bytes, tensors, ``torch.Size``,
    ``torch.dtype``, ``torch.device``, and plain dict, OrderedDict, list,
    tuple and set of those. Everything else (numpy values, ``Path``,
    ``datetime``, dataclasses, ``defaultdict``, named tuples, generators,
    arbitrary objects) is refused.
    """
    if _depth > 200:
        raise CheckpointError(f"{where} is nested more than 200 levels deep; is it self-referencing?")
    kind = type(value)
    if kind in _SCALARS or kind in _TORCH_VALUES or isinstance(value, torch.Tensor):
        if isinstance(value, torch.Tensor) and type(value) not in (torch.Tensor, torch.nn.Parameter):
            raise CheckpointError(
                f"{where} is a tensor subclass {_describe(value)}, which torch.load(weights_only=True) "
                "refuses; save a plain tensor (x.as_subclass(torch.Tensor))"
            )
        return
    if kind in _CONTAINERS:
        for key, item in value.items():
            check_payload(key, f"{where} key {key!r}", _depth=_depth + 1)
            check_payload(item, f"{where}[{key!r}]", _depth=_depth + 1)
        return
    if kind in _SEQUENCES:
        for i, item in enumerate(value):
            check_payload(item, f"{where}[{i}]", _depth=_depth + 1)
        return
    root = kind.__module__.split(".")[0]
    hint = _HINTS.get(root, "convert it to tensors, numbers, strings, lists or dicts")
    raise CheckpointError(
        f"{where} is a {_describe(value)}, which torch.load(weights_only=True) refuses, so this "
        f"checkpoint could not be restored; {hint}"
    )
