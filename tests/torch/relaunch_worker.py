"""One rank of a job that torchrun's elastic agent relaunches (``test_relaunch.py``): the relaunch guide's
script, with no run id anywhere.

    python -m torch.distributed.run --nproc-per-node 2 --max-restarts 2 --rdzv-backend c10d ... \
        relaunch_worker.py --store URL --out DIR [--fsdp] [--kill-rank R --kill-step S] [--no-load]
        [--stuck-rank R --stuck-step S --hang-timeout T]

``lht.init(..., auto_resume=True)`` finds the run from torchelastic's run id, ``load_checkpoint("resume")`` is
the load line of every launch. On the first launch (``TORCHELASTIC_RESTART_COUNT`` 0) rank R SIGKILLs itself
right after step S; torchrun restarts every worker. At the end rank 0 writes the full model and optimizer state
to ``DIR/final.pt`` and each rank ``DIR/rank<r>.json`` (its launches, steps and the run id).
``--no-load`` is the negative control: the relaunch skips the load line. ``--stuck-rank``: on the first launch
rank R blocks in ``stuck_here()`` after step S, and the hang watchdogs end the attempt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

import launchhelm.torch as lht

STEPS = 24
EVERY = 5


def build(fsdp: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)  # the same weights on every rank and every launch
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4))
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model[0])
        fully_shard(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.5)
    return model, optimizer, scheduler


def stuck_here() -> None:
    """A rank that blocks (a stuck data loader, a deadlock): the others wait for it in their next collective."""
    time.sleep(3600)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--project", default="relaunch")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=-1)
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--stuck-rank", type=int, default=-1)
    parser.add_argument("--stuck-step", type=int, default=-1)
    parser.add_argument("--hang-timeout", type=float, default=None)
    args = parser.parse_args()
    # the relaunch guide's process group: keys of its own per restart (torchrun's env:// init can read the
    # previous attempt's addresses: pytorch#167288) and a finite first connect, so a failure is retried
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"restart-{restart}", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=60),
    )
    rank = dist.get_rank()
    out = Path(args.out)
    model, optimizer, scheduler = build(args.fsdp)
    hang = {"hang_timeout": args.hang_timeout} if args.hang_timeout is not None else {}
    tr = lht.init(args.project, store=args.store, auto_resume=True, system_metrics=False, capture_console=False, **hang)
    tr.watch(model, optimizer, scheduler)
    if not (args.no_load and restart > 0):
        tr.load_checkpoint("resume")  # nothing on the first launch; the newest checkpoint on a relaunch
    start = tr.global_step
    for i in range(start, STEPS):
        g = torch.Generator().manual_seed(1000 * i + rank)
        x = torch.randn(6, 8, generator=g)
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        tr.log({"loss": float(loss.detach())})
        if tr.global_step % EVERY == 0:
            tr.save_checkpoint()
        if restart == 0 and rank == args.kill_rank and tr.global_step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if restart == 0 and rank == args.stuck_rank and tr.global_step == args.stuck_step:
            stuck_here()
    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    record = {"run": tr.id, "restart": restart, "start": start, "end": tr.global_step, "resumed": tr.resumed}
    tr.finish()
    if rank == 0:
        torch.save({"model": msd, "optimizer": osd}, out / "final.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
