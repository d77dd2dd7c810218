"""The training job of ``quickstart.ipynb``: a small PyTorch classifier that crashes for real, then resumes.

    python train_quickstart.py STORE --crash-at 110      # SIGKILLs itself once step 110 is stored
    python train_quickstart.py STORE --hold-at 110       # waits at step 110 for the notebook to SIGKILL it
    python train_quickstart.py STORE --resume RUN_ID     # load_checkpoint("resume"), train to the end

The notebook resumes in its own kernel instead, with :func:`build` and
:func:`train` from here and ``tr.load_checkpoint("resume")`` in a cell.

A checkpoint every 40 steps. ``--crash-at`` ends the process the way an OOM
killer or a lost node does (SIGKILL: no exception, no cleanup), so the run
is left "stopped without ending its session". ``--resume`` reopens it and
restores the checkpoint chosen in the notebook's "Resume…" picker (else the
newest), then trains to ``--steps`` and closes the run.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import time

import torch

import launchhelm.torch as lht

PROJECT = "quickstart"


def two_moons(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A two-class toy data set: two interleaved half circles."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=generator)
    angle = torch.rand(n, generator=generator) * math.pi
    x = torch.stack([torch.cos(angle) + labels, torch.sin(angle) * (1 - 2 * labels) + 0.3 * labels], dim=1)
    return x + 0.1 * torch.randn(x.shape, generator=generator), labels.float()


def build() -> torch.nn.Module:
    """The model (the notebook's evaluation worker builds the same one)."""
    return torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(((model(x).squeeze(1) > 0).float() == y).float().mean())


def train(
    tr: lht.TorchRun, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, crash_at: int = 0, hold_at: int = 0
) -> None:
    """Train until step ``steps``, a checkpoint every 40 steps.

    At ``crash_at`` the process SIGKILLs itself; at ``hold_at`` it waits (stored up to there) to be killed.
    """
    x, y = two_moons(1024, seed=1)
    batches = torch.Generator().manual_seed(tr.global_step)
    while tr.global_step < steps:
        idx = torch.randint(0, len(x), (64,), generator=batches)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x[idx]).squeeze(1), y[idx])
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        tr.log({"train/loss": loss, "train/accuracy": accuracy(model, x, y), "lr": optimizer.param_groups[0]["lr"]})
        if tr.global_step % 40 == 0:
            tr.save_checkpoint()
        if tr.global_step == crash_at:
            tr.flush()
            print(f"crashing at step {tr.global_step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if tr.global_step == hold_at:
            # everything up to here is stored: wait for the notebook to kill this process
            tr.flush()
            print(f"holding at step {tr.global_step}", flush=True)
            time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--hold-at", type=int, default=0)
    parser.add_argument("--resume")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    tr = lht.init(PROJECT, store=args.store, resume=args.resume, config={"model": "mlp-32"}, tunables={"lr": 0.3})
    tr.watch(model, optimizer)  # the lr tunable drives the optimizer's learning rate
    print("run", tr.id, flush=True)
    if args.resume:
        tr.load_checkpoint("resume")
        print(f"restored step {tr.global_step}", flush=True)
    train(tr, model, optimizer, args.steps, crash_at=args.crash_at, hold_at=args.hold_at)
    tr.finish()
    print(f"finished at step {tr.global_step}", flush=True)


if __name__ == "__main__":
    main()
