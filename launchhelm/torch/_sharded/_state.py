"""The one door to torch's distributed state dicts and DTensors, for saving and loading."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from launchhelm._exceptions import CheckpointError
from launchhelm.torch._manifest import encode_value

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import OptimizerStateType, ValueType
    from torch.distributed.tensor import DTensor

    from launchhelm._types import JSONValue
    from launchhelm.torch._link import RunLink

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (global offset, shape) of a chunk


def _dtensor_type() -> type[DTensor]:
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


def _state_dicts(
    link: RunLink, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, ValueType], OptimizerStateType]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    # get_state_dict steps a stateless optimizer once (lr 0) to make its state: that step is
    # not a training step, so the run's step hooks must not see it
    with link.step_hooks_off(optimizer):
        return get_state_dict(model, optimizer)


def _collect(tree: object, root: str) -> tuple[JSONValue, dict[str, torch.Tensor]]:
    """``tree`` encoded as JSON with its tensors as keys, and those tensors by key."""
    found: dict[str, torch.Tensor] = {}

    def keep(path: str, t: torch.Tensor) -> str:
        found[path] = t
        return path

    return encode_value(tree, keep, root), found
