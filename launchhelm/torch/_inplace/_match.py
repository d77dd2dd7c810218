"""Matching saved tensors to the live ones they load into: the model's, the optimizer's state."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from launchhelm.torch._inplace._plan import _Planned, _PlannedStorage, _walk
from launchhelm.torch._inplace._reads import InPlaceLoad
from launchhelm.torch._torch_private import optimizer_state_pairs, stock_targets

#: The live tensors a load writes into: plain tensors and parameters. A tensor subclass (a DTensor,
#: a quantized parameter) may keep its bytes elsewhere than ``data_ptr`` says: it loads the usual way.
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _take(saved: object, live: Any, taken: list[tuple[int, int, _PlannedStorage]]) -> None:
    """Plan the saved tensor's bytes into the live one where they can go as they lie in the file:
    the saved tensor is its storage's bytes in order and the only tensor on it, and the live one
    a plain contiguous tensor on the CPU or CUDA with the same shape and dtype."""
    if type(saved) is not _Planned or not saved.whole:
        return
    storage = saved.storage
    if storage.views != 1 or storage.target is not None:
        return  # shared storage (tied weights, views): load it fresh, load_state_dict copies
    if (
        type(live) not in _PLAIN
        or live.dtype is not saved.dtype
        or live.shape != saved.shape
        or live.layout is not torch.strided
        or not live.is_contiguous()
        or not (live.is_cpu or live.is_cuda)
    ):
        return
    storage.target = live
    if storage.nbytes:
        taken.append((live.data_ptr(), storage.nbytes, storage))


def _match(
    meta: Mapping[str, object], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], bool]:
    """Set each saved storage's ``target`` (:func:`_take`): the model's tensor of the same key, the
    optimizer's state tensor of the same name of the parameter its saved index stands for (as
    ``Optimizer.load_state_dict`` maps them: the saved groups' indices, in order, onto the live
    groups' parameters). Returns the live tensors by key (:func:`stock_targets` where the model
    loads the stock way, else its state dict: its own tensors, ``keep_vars``) and whether it does."""
    taken: list[tuple[int, int, _PlannedStorage]] = []
    saved_model = meta.get("model")
    live_model: dict[str, torch.Tensor] = {}
    stock = None
    if isinstance(saved_model, dict):
        stock = stock_targets(model)
        live_model = model.state_dict(keep_vars=True) if stock is None else stock
        get = live_model.get
        for key, saved in saved_model.items():
            _take(saved, get(key), taken)
    for saved, live in optimizer_state_pairs(optimizer, meta.get("optimizer")):
        _take(saved, live, taken)
    # Live tensors whose memory overlaps (views of one buffer) would see the file's bytes in an
    # order load_state_dict does not promise: those load the usual way.
    taken.sort(key=_address)
    end, last = 0, None
    for start, nbytes, storage in taken:
        if start < end:
            storage.target = None
            if last is not None:
                last.target = None
        if start + nbytes > end:
            end, last = start + nbytes, storage
    return live_model, stock is not None


def _address(entry: tuple[int, int, _PlannedStorage]) -> int:
    return entry[0]


def plan_in_place(
    path: Path,
    meta: Mapping[str, object],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    match: bool = True,
    storages: list[_PlannedStorage] | None = None,
) -> InPlaceLoad:
    """Match the bundle's tensors (from :func:`load_plan`, or :func:`plan_from_meta` of a
    ``map_location="meta"`` load; ``storages``: its storage records, else found in ``meta``) to
    live ones.

    ``match=False`` plans every tensor into fresh memory (verified before
    anything is applied).
    """
    if storages is None:
        storages = list({id(t.storage): t.storage for t in _walk(meta)}.values())
    for storage in storages:  # a plan of its own, whatever planned these records before
        storage.target = storage.fresh = None
    live_model, stock = _match(meta, model, optimizer) if match else ({}, False)
    plan = InPlaceLoad(path, meta, storages, path.stat().st_size)
    saved_model = meta.get("model")
    plan.model_in_place = (
        stock
        and bool(live_model)
        and isinstance(saved_model, dict)
        and saved_model.keys() == live_model.keys()
        and all(type(t) is _Planned and t.storage.target is live_model[k] for k, t in saved_model.items())
    )
    return plan
