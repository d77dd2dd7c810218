"""The training job of ``tunables.ipynb``: a small PyTorch regression that a notebook steers while it trains.

    python train_tunables.py STORE [--steps 100000]

Its ``lr`` tunable drives the optimizer's learning rate (``tr.watch``); a
change made from the notebook (the Details tab, ``RunHandle.set_tunables``)
is applied at the next step boundary, as are pause, resume and "checkpoint
now" (``RunHandle.control``); ``control("stop")`` ends the session at a step
boundary (the run stays resumable) and this job exits. Each step sleeps a little, so a person (or the
notebook) has time to act while it trains.
"""

from __future__ import annotations

import argparse
import time

import torch

import launchhelm as lh
import launchhelm.torch as lht


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-seconds", type=float, default=0.01)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(512, 1)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tr = lht.init("tunables", store=args.store, config={"model": "linear-8"}, tunables={"lr": 0.1})
    tr.watch(model, optimizer)  # the lr tunable drives the optimizer's learning rate
    print("run", tr.id, flush=True)
    try:
        while tr.global_step < args.steps:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()  # a step boundary: tunable changes, pause, resume, checkpoint and stop apply here
            tr.log({"train/loss": loss, "lr": optimizer.param_groups[0]["lr"]})
            time.sleep(args.step_seconds)
    except lh.RunStopped:
        print(f"stopped from the notebook at step {tr.global_step}; the run stays resumable", flush=True)
        return
    tr.finish()
    print(f"finished at step {tr.global_step}", flush=True)


if __name__ == "__main__":
    main()
