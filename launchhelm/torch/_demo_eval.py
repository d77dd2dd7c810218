"""The evaluation worker ``launchhelm demo`` runs on its run's checkpoints.

    launchhelm evaluate launchhelm.torch._demo_eval:score --stop-when-idle

Loads each checkpoint with plain ``torch.load(weights_only=True)``, rebuilds
the demo's classifier and scores it on held-out two-moons data (the same
worker as ``examples/evaluate_checkpoints.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch

import launchhelm as lh
from launchhelm.torch._demo_train import _moons, build_model

# held out: drawn from another seed than the training data
_X, _Y = _moons(512, torch.Generator().manual_seed(7))


def load(path: Path) -> torch.nn.Module:
    bundle = torch.load(path, weights_only=True, map_location="cpu")
    model = build_model()
    model.load_state_dict(bundle["model"])
    return model.eval()


@lh.evaluate(project="demo", poll_interval=0.5)
def score(ctx: lh.EvaluationContext) -> dict[str, float]:
    model = load(ctx.download_to())
    with torch.no_grad():
        logits = model(_X).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, _Y)
        accuracy = ((logits > 0).float() == _Y).float().mean()
    return {"loss": float(loss), "accuracy": float(accuracy)}
