"""What the checkpoint-loading tests share: a small model with a bf16 layer, a few steps of training,
and the bitwise comparison of a model's and optimizer's state before and after a load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import launchhelm as lh


def build_model(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Linear(16, 32), ReLU, Linear(32, 4) in bf16 (bytes are bytes), with AdamW."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model[2].to(torch.bfloat16)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, n: int) -> None:
    """``n`` optimizer steps of :func:`build_model`'s model on random inputs."""
    for _ in range(n):
        optimizer.zero_grad()
        x = model[0](torch.randn(8, 16)).relu()
        model[2](x.to(torch.bfloat16)).float().pow(2).mean().backward()
        optimizer.step()


def snapshot_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Copies of every tensor of the model's and the optimizer's state, in state-dict order."""
    tensors = [t.detach().clone() for t in model.state_dict().values()]
    for entries in optimizer.state_dict()["state"].values():
        tensors += [t.clone() for t in entries.values() if isinstance(t, torch.Tensor)]
    return tensors


def same_tensors(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bitwise equal, dtypes included."""
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))


def payload_path(store_url: str, run: lh.Run, artifact: str) -> Path:
    """The ``.pt`` file of checkpoint ``artifact`` in a local store."""
    return Path(store_url) / "runs" / run.id / "artifacts" / artifact / f"{artifact}.pt"


def _flat(state: Any, path: str = "") -> dict[str, Any]:
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in _flat(value, f"{path}/{key}").items()}
    if isinstance(state, (list, tuple)):
        return {k: v for i, value in enumerate(state) for k, v in _flat(value, f"{path}/{i}").items()}
    return {path: state}


def bitwise_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two saved training states (nested dicts of tensors and plain values) are equal bit for bit."""
    fa, fb = _flat(a), _flat(b)
    if set(fa) != set(fb):
        return False
    for key, x in fa.items():
        y = fb[key]
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape):
                return False
            if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
                return False
        elif x != y:
            return False
    return True
