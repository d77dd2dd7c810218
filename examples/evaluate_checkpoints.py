"""The product page's evaluation worker: score each checkpoint as it is saved.

    launchhelm demo                                      # a run of project "demo", with the rule on
    python examples/evaluate_checkpoints.py              # serve until Ctrl-C
    python examples/evaluate_checkpoints.py --stop-when-idle

The store is $LAUNCHHELM_STORE, else ~/.launchhelm. With the project's rule
on (``lh.Api().project("demo").evaluate_every_checkpoint(True)``, which
``launchhelm demo`` turns on), each checkpoint that finishes uploading is
queued; for one saved before, ``lh.Api().run(run_id).evaluate(checkpoint_id)``.
Each number ``score`` returns is logged to the training run as
``eval/<name>`` at the checkpoint's step. Run several of these at once:
they share the queue, one evaluation each at a time.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

import launchhelm as lh


def build() -> torch.nn.Module:
    """The classifier the demo trains (launchhelm/torch/_demo_train.py)."""
    return torch.nn.Sequential(
        torch.nn.Linear(2, 64),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )


def held_out_moons(n: int = 512, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed evaluation data: two interleaved half circles, as the demo learns."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g)
    angle = torch.rand(n, generator=g) * math.pi
    x = torch.stack([torch.cos(angle) + labels, torch.sin(angle) * (1 - 2 * labels) + 0.3 * labels], dim=1)
    return x + 0.1 * torch.randn(x.shape, generator=g), labels.float()


X, Y = held_out_moons()


def load(path: Path) -> torch.nn.Module:
    # a launchhelm.torch checkpoint is one file that plain torch.load reads safely
    bundle = torch.load(path, weights_only=True, map_location="cpu")
    model = build()
    model.load_state_dict(bundle["model"])
    return model.eval()


@torch.no_grad()
def accuracy(model: torch.nn.Module) -> float:
    return float(((model(X).squeeze(1) > 0).float() == Y).float().mean())


@torch.no_grad()
def loss(model: torch.nn.Module) -> float:
    return float(torch.nn.functional.binary_cross_entropy_with_logits(model(X).squeeze(1), Y))


@lh.evaluate(project="demo")
def score(ctx: lh.EvaluationContext) -> dict[str, float]:
    model = load(ctx.download_to("checkpoints"))
    print(f"scoring {ctx.checkpoint.id} of run {ctx.run.id} at step {ctx.step}", flush=True)
    return {"accuracy": accuracy(model), "loss": loss(model)}


if __name__ == "__main__":
    score.serve(stop_when_idle="--stop-when-idle" in sys.argv)
