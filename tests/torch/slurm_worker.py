"""A SLURM job's training step, for tests/torch/test_slurm.py: ``sbatch --requeue`` runs it under ``srun``.

    srun python slurm_worker.py --store URL --out DIR [--steps N] [--every K] [--sleep S] [--no-load]

No run id anywhere: ``lht.init(..., auto_resume=True)`` names the run from ``SLURM_CLUSTER_NAME`` and
``SLURM_JOB_ID``. It writes ``DIR/step`` (``<restart> <step>``) after every step so the test knows when to
preempt, ``DIR/attempt<restart>.json`` when it starts and when it ends (preempted or finished), and at the
end ``DIR/final.pt`` (model and optimizer state). Without SLURM (the uninterrupted baseline) it is a plain
process. ``--no-load`` is the negative control: a relaunch skips the load line and trains on from fresh
weights at the step the preempted attempt reached.

The loop is the usual one: ``optimizer.step()``, then ``scheduler.step()`` and ``log``. A notice is agreed
on at the end of a step and saved at the start of the next, so the preempted iteration's scheduler step
and log are in the checkpoint, and the relaunch is bitwise the uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

import launchhelm as lh
import launchhelm.torch as lht


def _write(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)  # the test never reads half a record


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--project", default="slurm")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=0.1)
    parser.add_argument("--no-load", action="store_true")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    torch.manual_seed(0)  # the same weights on every launch
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
    tr = lht.init(
        args.project,
        store=args.store,
        auto_resume=True,
        flush_interval=0.5,
        system_metrics=False,
        capture_console=False,
    )
    tr.watch(model, optimizer, scheduler)
    if args.no_load and restart > 0:
        tr.global_step = json.loads((out / "attempt0.json").read_text())["step"]
    else:
        tr.load_checkpoint("resume")  # nothing on the first launch; the preempted attempt's checkpoint after
    start = tr.global_step
    record: dict[str, Any] = {"run": tr.id, "restart": restart, "start": start, "pid": os.getpid()}
    _write(out / f"attempt{restart}.json", record)
    try:
        for i in range(start, args.steps):
            g = torch.Generator().manual_seed(1000 + i)  # the data of step i, whatever the launch
            x = torch.randn(6, 8, generator=g)
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()  # after a notice: the next call saves (as of here), ends the session and raises
            scheduler.step()
            tr.log({"loss": float(loss.detach()), "lr": scheduler.get_last_lr()[0]})
            if tr.global_step % args.every == 0:
                tr.save_checkpoint()
            (out / "step").write_text(f"{restart} {tr.global_step}")
            time.sleep(args.sleep)
    except lh.RunPreempted as exc:
        record.update(ending="preempted", signal=exc.signal, step=exc.step, checkpoint=exc.checkpoint)
        _write(out / f"attempt{restart}.json", record)
        raise
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    record.update(ending="finished", step=tr.global_step, resumed=tr.resumed)
    tr.finish()
    torch.save(state, out / "final.pt")
    _write(out / f"attempt{restart}.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
