"""A training process steered from outside (tests/torch/test_steering.py).

    python steer_worker.py STORE [--resume RUN --load latest|resume] [--save-at 5,9]

Prints ``RUN <id>`` first, then one line per event the test waits for:
``STEP <step> <lr>``, ``TUNED <step> <json>``, ``LOADED <step> <lr> <grad_clip>``,
``STOPPED <step>``, ``DONE <step>``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import launchhelm as lh
import launchhelm.torch as lht


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--resume", default=None)
    parser.add_argument("--load", default=None)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    parser.add_argument("--save-at", default="")
    parser.add_argument("--close", action="store_true")
    args = parser.parse_args()
    save_at = {int(s) for s in args.save_at.split(",") if s}

    torch.manual_seed(0)
    tr = lht.init(
        "steer",
        tunables={"lr": 0.1, "grad_clip": 1.0},
        resume=args.resume,
        store=args.store,
        control_interval=0.2,
        flush_interval=0.1,
        heartbeat_interval=0.3,
        heartbeat_timeout=5.0,
    )
    print("RUN", tr.id, flush=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=tr.tunables["lr"])
    tr.watch(model, optimizer)

    @tr.on_tunables_change
    def tuned(changes: dict[str, object]) -> None:
        print("TUNED", tr.global_step, json.dumps(changes, sort_keys=True, separators=(",", ":")), flush=True)

    if args.load:
        tr.load_checkpoint(args.load)
        print("LOADED", tr.global_step, optimizer.param_groups[0]["lr"], tr.tunables["grad_clip"], flush=True)
    try:
        while tr.global_step < args.steps:
            loss = model(torch.randn(8, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tr.tunables["grad_clip"])
            optimizer.step()  # a step boundary: control requests apply here
            lr = optimizer.param_groups[0]["lr"]
            tr.log({"loss": loss.item(), "lr": lr, "grad_clip": tr.tunables["grad_clip"]})
            print("STEP", tr.global_step, lr, flush=True)
            if tr.global_step in save_at:
                tr.save_checkpoint(extra={"step": tr.global_step})
            time.sleep(args.step_sleep)
    except lh.RunStopped as stopped:
        print("STOPPED", stopped.step, flush=True)
        raise
    tr.finish(close_run=args.close)
    print("DONE", tr.global_step, flush=True)


if __name__ == "__main__":
    main()
