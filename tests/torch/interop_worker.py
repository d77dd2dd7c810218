"""One rank of a real gloo job for ``test_interop.py``, run through torchrun.

    python -m torch.distributed.run --nproc_per_node N ... interop_worker.py MODE --store URL --out DIR ...

Every rank writes what it saw to ``DIR/rank<r>.json``.

Modes:
  make    (2 ranks) a DDP run saved in format /2 (rank 0 writes its state to ``DIR/ddp.pt``); an FSDP2 run
          saved in format /3 (``DIR/full.pt``: its full state); the same FSDP2 state written by ``dcp.save``
          the way torchtitan lays it out (model tensors at the top level, the optimizer flattened,
          ``lr_scheduler``, ``train_state``, per-rank ``dataloader``) into ``DIR/dcp``
  resume  resume the imported run ``--resume``, ``load_checkpoint("resume")``, compare the full state to
          ``--full`` bitwise, train a step; ``--dcp PATH``: also ``dcp.load`` the exported folder PATH into
          the sharded state dict of a fresh FSDP2 model and compare that too
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from sharded_worker import build, count_tensors, differences, full_state, step
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

import launchhelm.torch as lht


def mode_make(args: argparse.Namespace, rank: int, out: dict[str, Any]) -> None:
    torch.manual_seed(3)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    tr = lht.init(args.project, store=args.store)
    tr.watch(model, optimizer)
    for i in range(2):
        optimizer.zero_grad()
        model(torch.randn(5, 4, generator=torch.Generator().manual_seed(i * 10 + rank))).pow(2).mean().backward()
        optimizer.step()
    out["ddp"] = {"run_id": tr.id, "artifact": tr.save_checkpoint()}
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, Path(args.out) / "ddp.pt")
    tr.finish(close_run=False)

    model, optimizer, scheduler = build(0)
    tr = lht.init(args.project, store=args.store)
    tr.watch(model, optimizer, scheduler)
    for i in range(2):
        step(model, optimizer, scheduler, i, rank)
    full = full_state(model, optimizer)
    if rank == 0:
        torch.save({**full, "scheduler": scheduler.state_dict()}, Path(args.out) / "full.pt")
    out["fsdp"] = {"run_id": tr.id, "artifact": tr.save_checkpoint(), "sharded": tr._checkpointer.watched.sharded}
    tr.finish(close_run=False)
    # torchtitan's layout: its ModelWrapper puts the model's tensors at the top level, its
    # OptimizersContainer saves flatten_optimizer_state_dict=True, each rank its own dataloader state
    state = {
        **get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True)
        ),
        "lr_scheduler": scheduler.state_dict(),
        "train_state": {"step": torch.tensor(2, dtype=torch.int32), "ntokens_seen": torch.tensor(60)},
        "dataloader": {f"dp_rank_{rank}": f"position of rank {rank}".encode()},
    }
    dcp.save(state, checkpoint_id=Path(args.out) / "dcp")


def mode_resume(args: argparse.Namespace, rank: int, out: dict[str, Any]) -> None:
    saved = torch.load(args.full, weights_only=True)
    model, optimizer, scheduler = build(7)  # other weights than the saver's
    tr = lht.init(args.project, store=args.store, resume=args.resume)
    tr.watch(model, optimizer, scheduler)
    extra = tr.load_checkpoint("resume")
    mine = full_state(model, optimizer)
    out["step"] = tr.global_step
    out["scheduler"] = scheduler.state_dict() == saved["scheduler"]
    out["extra"] = {
        "train_state": {k: v.tolist() for k, v in extra["train_state"].items()},
        "dataloader": {k: v.decode() for k, v in extra["dataloader"].items()},
    }
    if mine["model"]:  # cpu_offload: the full state is on rank 0
        out["differences"] = differences(mine, {"model": saved["model"], "optimizer": saved["optimizer"]})
        out["tensors"] = count_tensors(mine)
    step(model, optimizer, scheduler, 5, rank)  # the restored state trains
    tr.finish(close_run=False)
    if args.dcp:
        model, optimizer, scheduler = build(11)
        step(model, optimizer, scheduler, 0, rank)  # optimizer state to load into
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optimizer": osd, "step": 0}
        dcp.load(state, checkpoint_id=args.dcp)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        loaded = full_state(model, optimizer)
        out["dcp_step"] = state["step"]
        if loaded["model"]:
            out["dcp_differences"] = differences(loaded, {"model": saved["model"], "optimizer": saved["optimizer"]})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--store", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--project", default="interop")
    parser.add_argument("--resume")
    parser.add_argument("--full")
    parser.add_argument("--dcp")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank, "world": dist.get_world_size()}
    try:
        {"make": mode_make, "resume": mode_resume}[args.mode](args, rank, out)
    finally:
        (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()
    # as sharded_worker.py: gloo's threads can abort a rank at interpreter teardown in torch 2.13
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
