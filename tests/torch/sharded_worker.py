"""One rank of a real FSDP2 (gloo, CPU) job, run by ``test_sharded.py`` through torchrun.

    python -m torch.distributed.run --nproc_per_node N ... sharded_worker.py MODE --store URL --out DIR ...

Every rank writes what it saw to ``DIR/rank<r>.json``; the tests judge it.

Modes:
  save     train two steps, write the full state (``DIR/full.pt``, rank 0), save (per-rank extra);
           ``--nonblocking``: save with blocking=False and train on while it writes
  load     for each ``--load RUN:CKPT:FULL``: build the model on this world size, resume RUN, load
           CKPT, compare every model and optimizer tensor bitwise to FULL (the saver's full state)
  damaged  load a checkpoint the test damaged; record the error; then try an optimizer step
  train    FSDP2 training with dropout and periodic checkpoints; ``--hang-at`` stops after a step
           (to be SIGKILLed), ``--resume`` restores the latest checkpoint and continues;
           ``--reseed-after-load`` is the negative control; ``--final`` writes the final full state;
           ``--control CKPT:PATH``: then load CKPT again, re-seed, train again and write that full
           state to PATH (the negative control, in the resumed job itself)
  soak     train and save a checkpoint every step (blocking and non-blocking by turns), printing
           ``save``/``saved`` lines, ``--saves`` times (a parent SIGKILLs a rank at random moments);
           ``--resume`` loads ``latest`` first and prints what it restored
  poison   a blocking save, then a non-blocking one whose write fails on rank 1 only (its file size
           limit set to a few bytes); record what the next steps, save_checkpoint and finish raise
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard

import launchhelm.torch as lht
from launchhelm import CheckpointError

EVERY = 3
STEPS = 10


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def build(seed: int, dropout: float = 0.0) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """Uneven shapes: 3 rows on 4 ranks leaves rank 3 an empty shard."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(3, 5), torch.nn.Linear(5, 2)
    )
    model.register_buffer("scale", torch.arange(3.0) + seed)
    for layer in (model[0], model[3], model[4]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, i: int, rank: int) -> float:
    g = torch.Generator().manual_seed(1000 * i + rank)
    x = torch.randn(6, 4, generator=g)
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    scheduler.step()
    return float(loss.detach())


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": msd, "optimizer": osd}


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
        return [] if ok else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path} keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path} length"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}/{i}")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def count_tensors(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(count_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(count_tensors(v) for v in value)
    return 0


def mode_save(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    model, optimizer, scheduler = build(0)
    tr = lht.init(args.project, store=args.store)
    tr.watch(model, optimizer, scheduler)
    for i in range(2):
        step(model, optimizer, scheduler, i, rank)
    full = full_state(model, optimizer)
    if rank == 0:
        torch.save(full, Path(args.out) / "full.pt")
    torch.manual_seed(500 + rank)
    extra = {"rank": rank, "pos": torch.tensor([rank, 7])}
    out["artifact"] = tr.save_checkpoint(extra=extra, blocking=not args.nonblocking)
    out.update(run_id=tr.id, step=tr.global_step, sharded=tr._checkpointer.watched.sharded)
    if args.nonblocking:  # training goes on (and changes every tensor) while the save writes
        for i in range(2, 4):
            step(model, optimizer, scheduler, i, rank)
    tr.finish(close_run=False)


def mode_load(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    results = []
    for spec in args.load:
        run_id, ckpt, full_path = spec.split(":", 2)
        model, optimizer, scheduler = build(7)  # other weights than the saver's
        tr = lht.init(args.project, store=args.store, resume=run_id)
        tr.watch(model, optimizer, scheduler)
        torch.manual_seed(900)
        extra = tr.load_checkpoint(ckpt, strict=args.strict)
        mine = full_state(model, optimizer)
        saved = torch.load(full_path, weights_only=True)
        record: dict[str, Any] = {
            "step": tr.global_step,
            "extra": {"rank": extra["rank"], "pos": extra["pos"].tolist()},
            "lr": optimizer.param_groups[0]["lr"],
            "scheduler_epoch": scheduler.last_epoch,
            "rng": torch.rand(2).tolist(),
        }
        if mine["model"]:  # cpu_offload: the full state is on rank 0
            record["differences"] = differences(mine, saved)
            record["tensors"] = count_tensors(mine)
        step(model, optimizer, scheduler, 5, rank)  # the restored state trains
        tr.finish(close_run=False)
        results.append(record)
    out["results"] = results


def mode_damaged(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    model, optimizer, scheduler = build(7)
    tr = lht.init(args.project, store=args.store, resume=args.resume)
    tr.watch(model, optimizer, scheduler)
    try:
        tr.load_checkpoint(args.ckpt or "latest", strict=args.strict)
        out["load_error"] = None
    except CheckpointError as exc:
        out["load_error"] = str(exc)
    try:
        step(model, optimizer, scheduler, 0, rank)
        out["step_error"] = None
    except CheckpointError as exc:
        out["step_error"] = str(exc)
    tr.finish(close_run=False)


def mode_train(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    model, optimizer, scheduler = build(0, dropout=0.3)
    tr = lht.init(args.project, store=args.store, resume=args.resume)
    tr.watch(model, optimizer, scheduler)
    torch.manual_seed(42 + rank)
    say(f"run {tr.id}")
    say(f"pid {rank} {os.getpid()}")
    start = 0
    if args.resume:
        extra = tr.load_checkpoint(args.ckpt or "latest")
        start = int(extra["next"])
        out["restored_step"] = tr.global_step
        if args.reseed_after_load:
            torch.manual_seed(12345)
    losses = {}
    for i in range(start, STEPS):
        losses[i] = step(model, optimizer, scheduler, i, rank)
        if tr.global_step % EVERY == 0:
            tr.save_checkpoint(extra={"next": i + 1})
        if args.hang_at is not None and tr.global_step == args.hang_at:
            dist.barrier()
            say(f"ready {args.hang_at}")
            time.sleep(600)
    out["losses"] = losses
    out["step"] = tr.global_step
    full = full_state(model, optimizer)
    if rank == 0 and args.final:
        torch.save(full, args.final)
    if args.control:  # the negative control: the same restore, then a re-seed
        ckpt, path = args.control.split(":", 1)
        extra = tr.load_checkpoint(ckpt)
        torch.manual_seed(12345)
        for i in range(int(extra["next"]), STEPS):
            step(model, optimizer, scheduler, i, rank)
        full = full_state(model, optimizer)
        if rank == 0:
            torch.save(full, path)
    tr.finish(close_run=False)


def mode_soak(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    model, optimizer, scheduler = build(0)
    tr = lht.init(args.project, store=args.store, resume=args.resume)
    tr.watch(model, optimizer, scheduler)
    say(f"run {tr.id}")
    say(f"pid {rank} {os.getpid()}")
    if args.resume:
        extra = tr.load_checkpoint("latest")  # every block of every shard this rank holds is CRC-checked
        finite = all(bool(torch.isfinite(v).all()) for v in full_state(model, optimizer)["model"].values())
        say(f"loaded {rank} {tr.global_step} {extra['step']} {extra['rank']} {int(finite)}")
    for _ in range(args.saves):
        step(model, optimizer, scheduler, tr.global_step, rank)
        now = tr.global_step
        how = "blocking" if now % 2 == 0 else "nonblocking"
        if rank == 0:
            say(f"save {now} {how}")
        tr.save_checkpoint(extra={"step": now, "rank": rank}, blocking=how == "blocking")
        if rank == 0:
            say(f"saved {now} {how}")
    tr.finish(close_run=False)


def mode_poison(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    model, optimizer, scheduler = build(0)
    tr = lht.init(args.project, store=args.store)
    tr.watch(model, optimizer, scheduler)
    out["run_id"] = tr.id
    for i in range(2):
        step(model, optimizer, scheduler, i, rank)
    out["good"] = tr.save_checkpoint()
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    if rank == 1:  # a real write error on one rank only: EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16, limits[1]))
    out["failed"] = tr.save_checkpoint(blocking=False)
    out["failed_step"] = tr.global_step
    # train on as fast as it goes: every rank must raise at the same step, else FSDP2's collectives hang
    out["raised_at"] = None
    for i in range(2, 40):
        try:
            step(model, optimizer, scheduler, i, rank)
            # a real step takes longer than this model's: the write fails a few ms after the save, and must
            # be known at the next boundary or the one after, however loaded the machine (CI saw it at 4)
            time.sleep(0.5)
        except CheckpointError as exc:
            out["raised_at"], out["step_error"] = i, str(exc)
            break
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    out["step_after"] = tr.global_step
    errors = []
    for _ in range(2):  # the error stays until cleared: the next step and save raise it again
        try:
            step(model, optimizer, scheduler, 99, rank)
            errors.append(None)
        except CheckpointError as exc:
            errors.append(str(exc))
    try:
        tr.save_checkpoint()
        errors.append(None)
    except CheckpointError as exc:
        errors.append(str(exc))
    out["later_errors"] = errors
    out["cleared"] = str(tr.clear_checkpoint_error())
    step(model, optimizer, scheduler, 3, rank)  # training goes on once cleared; a save works again
    out["recovered"] = tr.save_checkpoint(blocking=False)
    tr.wait_for_checkpoint()
    tr.finish(close_run=False)


MODES = {
    "save": mode_save,
    "load": mode_load,
    "damaged": mode_damaged,
    "train": mode_train,
    "soak": mode_soak,
    "poison": mode_poison,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--store", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--project", default="sharded")
    parser.add_argument("--load", nargs="*", default=[])
    parser.add_argument("--resume")
    parser.add_argument("--ckpt")
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--nonblocking", action="store_true")
    parser.add_argument("--hang-at", type=int)
    parser.add_argument("--reseed-after-load", action="store_true")
    parser.add_argument("--final")
    parser.add_argument("--control")
    parser.add_argument("--saves", type=int, default=0)
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {"rank": rank, "world": world}
    try:
        MODES[args.mode](args, rank, world, out)
    finally:
        (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()
    # gloo's threads outlive destroy_process_group in torch 2.13 and now and then abort a rank at
    # interpreter teardown (see ddp_worker.py): run the exit hooks, then leave without it
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
