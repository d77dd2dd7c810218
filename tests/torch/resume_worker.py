"""A small real training job for the resume tests (run as a script).

Dropout, AdamW, a StepLR schedule and a shuffled DataLoader whose position is
kept in ``extra`` (the sampler's and loader's generator states at epoch
start, plus the batch index), so a resumed run can replay exactly.

    python resume_worker.py STORE --steps N --save-every K [--resume RUN_ID] [--out FINAL.pt]
        [--which latest|resume] [--reseed-after-load]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

import launchhelm.torch as lht


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--resume")
    parser.add_argument("--which", default="latest")
    parser.add_argument("--out")
    parser.add_argument("--reseed-after-load", action="store_true")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    data_gen = torch.Generator().manual_seed(123)
    dataset = TensorDataset(torch.randn(96, 6, generator=data_gen), torch.randn(96, 1, generator=data_gen))
    sampler_gen = torch.Generator().manual_seed(7)
    loader_gen = torch.Generator().manual_seed(8)
    loader = DataLoader(
        dataset, batch_size=16, sampler=RandomSampler(dataset, generator=sampler_gen), generator=loader_gen
    )
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)

    tr = lht.init("resume-test", store=args.store, resume=args.resume)
    tr.watch(model, optimizer, scheduler)
    print(f"run {tr.id}", flush=True)
    epoch, skip = 0, 0
    if args.resume:
        extra = tr.load_checkpoint(args.which)
        if args.reseed_after_load:
            torch.manual_seed(999)  # negative control: throw the restored RNG away
        epoch, skip = extra["epoch"], extra["batch"]
        sampler_gen.set_state(extra["sampler_state"])
        loader_gen.set_state(extra["loader_state"])
        print(f"restored {tr.global_step}", flush=True)
    while tr.global_step < args.steps:
        sampler_state, loader_state = sampler_gen.get_state(), loader_gen.get_state()
        for batch, (x, y) in enumerate(loader):
            if batch < skip:
                continue
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            tr.log({"loss": loss, "lr": scheduler.get_last_lr()[0]})
            print(f"step {tr.global_step}", flush=True)
            time.sleep(args.step_sleep)
            if tr.global_step % args.save_every == 0:
                tr.save_checkpoint(
                    extra={
                        "epoch": epoch,
                        "batch": batch + 1,
                        "sampler_state": sampler_state,
                        "loader_state": loader_state,
                    }
                )
            if tr.global_step >= args.steps:
                break
        epoch, skip = epoch + 1, 0
    if args.out:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, args.out)
    tr.finish(close_run=False)
    print("done", flush=True)


if __name__ == "__main__":
    main()
