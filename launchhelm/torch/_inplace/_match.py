"""Matching saved tensors to the live ones they load into: the model's, the optimizer's state."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import torch

from launchhelm.torch._inplace._plan import _Planned, _PlannedStorage, _walk
from launchhelm.torch._inplace._reads import InPlaceLoad

#: The live tensors a load writes into: plain tensors and parameters. A tensor subclass (a DTensor,
#: a quantized parameter) may keep its bytes elsewhere than ``data_ptr`` says: it loads the usual way.
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _take(saved: Any, live: Any, taken: list[tuple[int, int, _PlannedStorage]]) -> None:
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


def _match(
    meta: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], bool]:
    """Set each saved storage's ``target`` (:func:`_take`): the model's tensor of the same key, the
    optimizer's state tensor of the same name of the parameter its saved index stands for (as
    ``Optimizer.load_state_dict`` maps them: the saved groups' indices, in order, onto the live
    groups' parameters). Returns the live tensors by key (:func:`stock_targets` where the model
    loads the stock way, else its state dict: its own tensors, ``keep_vars``) and whether it does."""
    taken: list[tuple[int, int, _PlannedStorage]] = []
    saved_model = meta.get("model")
    live_model: dict[str, Any] = {}
    stock = None
    if isinstance(saved_model, dict):
        stock = stock_targets(model)
        live_model = model.state_dict(keep_vars=True) if stock is None else stock
        get = live_model.get
        for key, saved in saved_model.items():
            _take(saved, get(key), taken)
    saved_optimizer = meta.get("optimizer")
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
                by_index: dict[Any, Any] = {}
                for saved, live in zip(saved_groups, live_groups):  # noqa: B905
                    by_index.update(zip(saved["params"], live["params"]))  # noqa: B905
                live_state = optimizer.state
                for index, entries in saved_state.items():
                    param = by_index.get(index)
                    live_entries = live_state.get(param) if param is not None else None
                    if isinstance(entries, dict) and isinstance(live_entries, dict):
                        for name, saved in entries.items():
                            _take(saved, live_entries.get(name), taken)
            except TypeError:  # an unhashable index: load_state_dict says what is wrong
                pass
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


def load_optimizer_in_place(optimizer: torch.optim.Optimizer, saved: Any) -> bool:
    """Do what ``optimizer.load_state_dict(saved)`` does, where each of the saved state tensors
    already is the live one it would become (read in place into it); return False, having
    changed nothing, where that is not so or the optimizer does not load the stock way: the
    caller then calls ``load_state_dict``.

    ``Optimizer.load_state_dict`` deep-copies the saved groups and passes each state value
    through ``_process_value_according_to_param_policy``, which looks its parameter up by a scan
    of every group and returns the tensor itself when its dtype and device already are the
    ones it would cast to: ~2.5 µs a value here, 1.1 ms for GPT-2's 444. Here the same
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
    by_index: dict[Any, tuple[torch.Tensor, bool]] = {}
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
        state: collections.defaultdict[torch.Tensor, dict[Any, Any]] = collections.defaultdict(dict)
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


def plan_in_place(
    path: Path,
    meta: dict[str, Any],
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
