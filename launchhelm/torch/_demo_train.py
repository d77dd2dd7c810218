"""The training job ``launchhelm demo`` runs, crashes and resumes.

    python -m launchhelm.torch._demo_train STORE --steps 150 --save-every 40 [--resume RUN_ID]

A small MLP learns a two-moons classification with AdamW, dropout and a
cosine schedule; each step prints ``step N`` so the demo can kill it.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import launchhelm.torch as lht


def _moons(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 2, (n,), generator=generator)
    angle = torch.rand(n, generator=generator) * math.pi
    x = torch.stack([torch.cos(angle) + labels, torch.sin(angle) * (1 - 2 * labels) + 0.3 * labels], dim=1)
    return x + 0.1 * torch.randn(x.shape, generator=generator), labels.float()


def build_model() -> torch.nn.Module:
    """The demo's classifier (the evaluation worker rebuilds it to load a checkpoint)."""
    return torch.nn.Sequential(
        torch.nn.Linear(2, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--save-every", type=int, default=40)
    parser.add_argument("--resume")
    parser.add_argument("--step-sleep", type=float, default=0.01)
    args = parser.parse_args()

    torch.manual_seed(0)
    x, y = _moons(1024, torch.Generator().manual_seed(1))
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    tr = lht.init("demo", store=args.store, resume=args.resume, config={"steps": args.steps, "lr": 0.02})
    tr.watch(model, optimizer, scheduler)
    print(f"run {tr.id}", flush=True)
    if args.resume:
        extra = tr.load_checkpoint("latest")
        print(f"restored {tr.global_step} {extra['note']}", flush=True)
    batches = torch.Generator().manual_seed(2)
    while tr.global_step < args.steps:
        idx = torch.randint(0, len(x), (64,), generator=batches)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x[idx]).squeeze(1), y[idx])
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            accuracy = ((model(x).squeeze(1) > 0).float() == y).float().mean()
        tr.log({"train/loss": loss, "train/accuracy": accuracy, "lr": scheduler.get_last_lr()[0]})
        if tr.global_step % args.save_every == 0:
            tr.save_checkpoint(extra={"note": f"saved at step {tr.global_step}", "batches": batches.get_state()})
        tr.flush()  # only so the demo can kill it at an exact step: the store knows each step at once
        print(f"step {tr.global_step}", flush=True)
        time.sleep(args.step_sleep)
    tr.finish()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
