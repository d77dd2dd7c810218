"""One rank of a real ``torch.distributed`` (gloo) job, run by ``test_ddp.py`` through torchrun.

    python -m torch.distributed.run --nproc_per_node N --master_port P ddp_worker.py MODE --store URL --out DIR ...

Every rank writes what it saw to ``DIR/rank<r>.json`` (and prints a few
handshake lines on stdout); the test judges it. A ``CheckpointError`` a rank
is expected to catch is recorded there, never swallowed silently.

Modes:
  roundtrip   save with a per-rank ``extra``, draw, train a step, load "latest", draw again
  worldsize   resume a run and try to load its latest checkpoint; then start a new run,
              train a step, save, and end the session keeping the run resumable
  errors      save, wait for the test to damage the file (``DIR/go``), try to load, step,
              clear the error, step; then save (rank 1 with a bad extra, then a good one),
              rank 1 watches a model of another shape, load, step, save
  steer       train until stopped from outside (test_steering.py), recording each step's lr
  mapping     save a checkpoint, or (``--resume``) try to load it and step: the test launches
              the ranks itself, to swap which local rank each global rank gets
  train       DDP training with dropout, a shuffling DistributedSampler, a StepLR scheduler
              and periodic checkpoints; ``--hang-at`` stops after a step (to be SIGKILLed),
              ``--resume`` restores a checkpoint and continues from its data position
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import launchhelm as lh
import launchhelm.torch as lht
from launchhelm import CheckpointError


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def draws() -> dict[str, Any]:
    """One draw from each process-global RNG a checkpoint restores."""
    return {"torch": torch.rand(3).tolist(), "python": random.random(), "numpy": float(np.random.rand())}


def plain(value: Any) -> Any:
    """``value`` with tensors as lists, for JSON."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def sgd_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    x = torch.linspace(-1, 1, 4 * model.in_features).reshape(4, model.in_features)  # type: ignore[operator]
    model(x).pow(2).mean().backward()
    optimizer.step()


def caught(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def say(line: str) -> None:
    """One line on stdout in one write, so lines of different ranks never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        time.sleep(0.02)


# -- modes ------------------------------------------------------------------------
def roundtrip(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tr = lht.init(args.project, name="ddp-roundtrip", config={"lr": 0.1}, store=args.store)
    out.update(run_id=tr.id, rank=tr.rank, world_size=tr.world_size)
    tr.watch(model, optimizer)
    seed_everything(100 + rank)  # every rank its own streams
    sgd_step(model, optimizer)
    saved_params = snapshot(model)
    extra = {"rank": rank, "name": f"rank-{rank}", "position": torch.tensor([rank, 10 * rank])}
    out["artifact"] = tr.save_checkpoint(extra=extra)
    out["step_at_save"] = tr.global_step
    out["after_save"] = draws()
    sgd_step(model, optimizer)  # move away from the checkpoint
    out["moved"] = not same(saved_params, snapshot(model))
    back = tr.load_checkpoint("latest")
    out["after_load"] = draws()
    out["extra_back"] = plain(back)
    out["params_restored"] = same(saved_params, snapshot(model))
    out["step_after_load"] = tr.global_step
    tr.finish()


def worldsize(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    """Resume ``--resume`` (a 1-process run) and try to load its checkpoint; then save one of a new run."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tr = lht.init(args.project, resume=args.resume, store=args.store)
    out.update(resumed_id=tr.id)
    tr.watch(model, optimizer)
    before = snapshot(model)
    try:
        out["extra_back"] = plain(tr.load_checkpoint("latest"))
    except CheckpointError as exc:
        out["load_error"] = caught(exc)
    out["params_untouched"] = same(before, snapshot(model))
    tr.finish(close_run=False)

    tr = lht.init(args.project, store=args.store)
    out.update(run_id=tr.id)
    tr.watch(model, optimizer)
    seed_everything(100 + rank)
    sgd_step(model, optimizer)
    out["artifact"] = tr.save_checkpoint(extra={"rank": rank})
    tr.finish(close_run=False)


def errors(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    """Two failures in one run: a corrupted file (every rank sees it), then a failure on rank 1 only."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tr = lht.init(args.project, store=args.store)
    out.update(run_id=tr.id)
    tr.watch(model, optimizer)
    seed_everything(100 + rank)
    sgd_step(model, optimizer)

    # 1. the published file is damaged between save and load
    corrupt: dict[str, Any] = {"artifact": tr.save_checkpoint(extra={"rank": rank})}
    out["corrupt"] = corrupt
    if rank == 0:
        say(f"saved {tr.id} {corrupt['artifact']}")
    wait_for(Path(args.out) / "go")  # the test damages the file now
    dist.barrier()
    sgd_step(model, optimizer)
    before, step_before = snapshot(model), tr.global_step
    try:
        tr.load_checkpoint("latest")
    except CheckpointError as exc:
        corrupt["load_error"] = caught(exc)
        say(f"corrupt: rank {rank} caught {type(exc).__name__}: {exc}")
    corrupt["params_untouched"] = same(before, snapshot(model))
    corrupt["step_untouched"] = tr.global_step == step_before
    # the error was caught, yet the next step must raise it: the model is not the checkpoint's
    before, step_before = snapshot(model), tr.global_step
    try:
        sgd_step(model, optimizer)
        corrupt["trained_on"] = True
    except CheckpointError as exc:
        corrupt["step_error"] = caught(exc)
    corrupt["params_untouched_by_step"] = same(before, snapshot(model))
    corrupt["step_untouched_by_step"] = tr.global_step == step_before
    # the user decides to go on from the weights they have
    corrupt["cleared"] = caught(tr.clear_checkpoint_error())  # type: ignore[arg-type]
    sgd_step(model, optimizer)
    corrupt["step_after_clear"] = tr.global_step

    # 2. failures on rank 1 only
    one: dict[str, Any] = {}
    out["one_fails"] = one
    try:  # rank 1 alone passes an extra that torch.load(weights_only=True) would refuse
        tr.save_checkpoint(extra={"rank": rank, "where": Path("/data") if rank == 1 else "/data"})
        one["saved_bad_extra"] = True
    except CheckpointError as exc:
        one["bad_extra_error"] = caught(exc)
    one["artifact"] = tr.save_checkpoint(extra={"rank": rank})
    if rank == 1:  # rank 1 alone cannot take the saved weights: another architecture
        model = torch.nn.Linear(4, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        tr.watch(model, optimizer)
    try:
        tr.load_checkpoint("latest")
    except CheckpointError as exc:
        one["load_error"] = caught(exc)
        say(f"one-fails: rank {rank} caught {type(exc).__name__}: {exc}")
    before, step_before = snapshot(model), tr.global_step
    try:
        sgd_step(model, optimizer)
        one["trained_on"] = True
    except CheckpointError as exc:
        one["step_error"] = caught(exc)
    one["params_untouched_by_step"] = same(before, snapshot(model))
    one["step_untouched_by_step"] = tr.global_step == step_before
    try:
        tr.save_checkpoint()
        one["saved_mixed_state"] = True
    except CheckpointError as exc:
        one["save_error"] = caught(exc)
    tr.finish(close_run=False)


def mapping(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    """Save a checkpoint (no ``--resume``), or resume ``--resume`` and try to load its latest."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tr = lht.init(args.project, resume=args.resume, store=args.store)
    out.update(run_id=tr.id, local_rank=os.environ.get("LOCAL_RANK"))
    tr.watch(model, optimizer)
    if args.resume is None:
        seed_everything(100 + rank)
        sgd_step(model, optimizer)
        out["artifact"] = tr.save_checkpoint(extra={"rank": rank})
    else:
        before = snapshot(model)
        try:
            out["extra_back"] = plain(tr.load_checkpoint("latest"))
        except CheckpointError as exc:
            out["load_error"] = caught(exc)
            try:
                sgd_step(model, optimizer)
                out["trained_on"] = True
            except CheckpointError as again:
                out["step_error"] = caught(again)
        out["params_untouched"] = same(before, snapshot(model))
    tr.finish(close_run=False)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def train(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    g = torch.Generator().manual_seed(1234)
    data = TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    # A DataLoader draws a base seed from the *global* torch RNG on every iter()
    # unless it has its own generator; that draw would not replay on a mid-epoch resume.
    loader = DataLoader(data, batch_size=4, sampler=sampler, generator=torch.Generator())
    torch.manual_seed(0)  # identical initial weights (DDP would broadcast rank 0's anyway)
    net = Net()
    model = DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # the lr changes every other step, so a resume that missed the scheduler's state would show
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    tr = lht.init(args.project, config={"epochs": args.epochs}, resume=args.resume, store=args.store)
    out.update(run_id=tr.id, resumed=tr.resumed)
    if rank == 0:
        say(f"run {tr.id}")
    say(f"pid {rank} {os.getpid()}")
    tr.watch(model, optimizer, scheduler)
    rewinds: list[dict[str, Any]] = []
    tr.on_rewind(lambda r: rewinds.append({"to_step": r.to_step, "reached": r.reached, "attempt": r.attempt}))
    seed_everything(1000 + rank)  # dropout masks differ per rank
    epoch0, batch0 = 0, 0
    if args.resume:
        extra = tr.load_checkpoint(args.ckpt)
        out["extra_back"] = plain(extra)
        out["step_after_load"] = tr.global_step
        epoch0, batch0 = int(extra["epoch"]), int(extra["batch"])
        if args.reseed_after_load:  # the negative control: throws the restored streams away
            torch.manual_seed(999)
    out["rewinds"] = rewinds
    for epoch in range(epoch0, args.epochs):
        sampler.set_epoch(epoch)
        for batch, (x, y) in enumerate(loader):
            if epoch == epoch0 and batch < batch0:
                continue  # done before the checkpoint
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()  # watched: advances tr.global_step
            scheduler.step()
            tr.log({"loss": loss.item(), "lr": scheduler.get_last_lr()[0]})
            step = tr.global_step
            if step % args.every == 0:
                nxt = (epoch, batch + 1) if batch + 1 < len(loader) else (epoch + 1, 0)
                tr.save_checkpoint(extra={"epoch": nxt[0], "batch": nxt[1], "step": step})
            if step == args.hang_at:
                dist.barrier()  # every rank has finished this step
                tr.flush()
                if rank == 0:
                    say(f"ready {step}")
                time.sleep(600)  # until SIGKILL
    out["final_step"] = tr.global_step
    out["attempt"] = tr.attempt
    if rank == 0 and args.final:
        final = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        torch.save(final, args.final)
    tr.finish(close_run=False)


def steer(args: argparse.Namespace, rank: int, world: int, out: dict[str, Any]) -> None:
    """Train until the test stops the run from outside, recording each step's lr."""
    tr = lht.init(
        args.project,
        name="ddp-steer",
        tunables={"lr": 0.1},
        store=args.store,
        control_interval=0.1,
        flush_interval=0.1,
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=tr.tunables["lr"])
    tr.watch(model, optimizer)
    if rank == 0:
        say(f"run {tr.id}")
    lr_by_step: dict[int, float] = {}
    out["lr_by_step"] = lr_by_step
    out["stopped_at"] = None
    try:
        for _ in range(5000):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()  # control requests apply here, on every rank at once
            lr_by_step[tr.global_step] = optimizer.param_groups[0]["lr"]
            tr.log({"lr": optimizer.param_groups[0]["lr"]})
            time.sleep(0.01)
    except lh.RunStopped as stopped:
        out["stopped_at"] = stopped.step
    out["tunables"] = dict(tr.tunables)


MODES = {
    "roundtrip": roundtrip,
    "worldsize": worldsize,
    "errors": errors,
    "train": train,
    "steer": steer,
    "mapping": mapping,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--store", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--project", default="ddp")
    parser.add_argument("--resume", default=None)
    parser.add_argument("--ckpt", default="latest")
    parser.add_argument("--reseed-after-load", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--final", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {"rank": rank, "world": world}
    try:
        MODES[args.mode](args, rank, world, out)
    finally:
        Path(args.out, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()
    # torch 2.13 keeps gloo's threads alive past destroy_process_group once an optimizer exists
    # (measured: threads pt_gloo_runloop and gloo_tcp_loop remain, with or without launchhelm), and
    # their teardown during interpreter finalization now and then aborts a rank ("terminate called
    # without an active exception", pytorch/pytorch#190489's symptom), failing the torchrun job after
    # every record was written. Run the exit hooks, then leave without that teardown.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
