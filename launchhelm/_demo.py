"""``launchhelm demo``: a small real training run on the local store.

It fits a logistic-regression classifier to a synthetic two-moons-like data
set with minibatch SGD in numpy, logging loss, accuracy and learning rate each
step, then prints the run as the query API reads it back.
"""

from __future__ import annotations

import os

import numpy as np

import launchhelm as lh

__all__ = ["run_demo"]


def _data(rng: np.random.Generator, n: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, 2, n)
    angle = rng.uniform(0, np.pi, n)
    x = np.stack([np.cos(angle) + labels, np.sin(angle) * (1 - 2 * labels) + 0.3 * labels], axis=1)
    x += rng.normal(0, 0.15, x.shape)
    # polynomial features make the classes separable by a linear model
    feats = np.concatenate([x, x**2, x[:, :1] * x[:, 1:], x**3, np.ones((n, 1))], axis=1)
    return feats, labels.astype(np.float64)


def run_demo(store: str | os.PathLike[str] | None = None, steps: int = 200) -> int:
    """Train, log every step, finish, then print what was stored."""
    if steps < 1:
        raise ValueError(f"steps={steps}: give at least 1 step")
    rng = np.random.default_rng(0)
    x, y = _data(rng)
    w = np.zeros(x.shape[1])
    base_lr, batch_size = 0.5, 64
    config = {"lr": base_lr, "batch_size": batch_size, "steps": steps, "model": "logistic-regression"}
    run = lh.init("demo", config=config, store=store)
    print(f"run {run.id} ({run.name}) in store {run.store.url}")
    for step in range(1, steps + 1):
        lr = base_lr * 0.5 * (1 + np.cos(np.pi * step / steps))  # cosine decay
        idx = rng.integers(0, len(x), batch_size)
        p = 1 / (1 + np.exp(-(x[idx] @ w)))
        w -= lr * x[idx].T @ (p - y[idx]) / len(idx)
        p_all = 1 / (1 + np.exp(-(x @ w)))
        loss = -np.mean(y * np.log(p_all + 1e-12) + (1 - y) * np.log(1 - p_all + 1e-12))
        acc = np.mean((p_all > 0.5) == y)
        run.global_step = step
        run.log({"train/loss": loss, "train/accuracy": acc, "lr": lr})
    run.finish()

    handle = lh.Api(run.store).run(run.id)
    history = handle.history()
    print(f"status: {handle.status}; {len(history)} steps logged; furthest step {handle.step}")
    shown = history.drop(columns=["time"])
    print(shown.iloc[:: max(1, len(shown) // 10)].to_string(index=False))
    final = history.iloc[-1]
    print(f"final loss {final['train/loss']:.4f}, accuracy {final['train/accuracy']:.3f}")
    print(f"see it again with: launchhelm --store {run.store.url} show {run.id}")
    return 0
