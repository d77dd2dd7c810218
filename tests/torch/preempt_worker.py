"""A training script that a scheduler preempts, for tests/torch/test_preemption.py.

Single process, or DDP when started with torchrun / RANK+WORLD_SIZE (gloo).
Each rank writes ``rank<r>.json`` once its run is open (pid, run id) and
again when it ends (preempted: the signal, the exit code, the step), and
``rank<r>.step`` after every optimizer step, so the test knows when to send
the notice. ``--resume`` loads the latest checkpoint first and records the
step it restored.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import launchhelm as lh
import launchhelm.torch as lht


def _write(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)  # the test never reads half a record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--checkpoint-at", type=int, default=0, help="a blocking save at this step")
    parser.add_argument("--notice-during-save-at", type=int, default=0, help="a non-blocking save, then SIGTERM")
    parser.add_argument("--control-interval", type=float, default=0.5)
    args = parser.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if world > 1:
        model = DistributedDataParallel(model)
    tr = lht.init(
        "preempt",
        store=args.store,
        resume=args.resume,
        preemption=True,
        preemption_budget=args.budget,
        control_interval=args.control_interval,
        flush_interval=0.5,
        system_metrics=False,
        capture_console=False,
    )
    tr.watch(model, optimizer)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"rank": tr.rank, "pid": os.getpid(), "run_id": tr.id}
    if args.resume:
        tr.load_checkpoint("latest")
        record["loaded_step"] = tr.global_step
    _write(out / f"rank{tr.rank}.json", record)
    step_file = out / f"rank{tr.rank}.step"
    try:
        while tr.global_step < args.steps:
            loss = model(torch.randn(8, 16)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()  # the step boundary: a notice saves, ends the session and raises here
            tr.log({"loss": loss.item()})
            step_file.write_text(str(tr.global_step))
            if tr.global_step == args.checkpoint_at:
                record["checkpoint_at"] = tr.save_checkpoint()
            if tr.global_step == args.notice_during_save_at:
                record["background"] = tr.save_checkpoint(blocking=False)
                _write(out / f"rank{tr.rank}.json", record)
                os.kill(os.getpid(), signal.SIGTERM)  # the save is still being written at the next step
                continue
            time.sleep(args.sleep)
        record["finished_step"] = tr.global_step
        tr.finish(close_run=False)
    except lh.RunPreempted as exc:
        record.update(preempted=exc.signal, code=exc.code, step=exc.step, checkpoint=exc.checkpoint, flag=tr.preempted)
        _write(out / f"rank{tr.rank}.json", record)
        raise
    _write(out / f"rank{tr.rank}.json", record)


if __name__ == "__main__":
    main()
