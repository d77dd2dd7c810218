"""The product page's example: train, checkpoint, crash, resume.

    python examples/torch_checkpoint.py [STORE]

It starts itself as a training process that saves a checkpoint at step 64
and is then killed with SIGKILL at step 80 (a real crash: no clean-up runs),
then does what a relaunch script does: resume the run and restore the latest
checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import torch

import launchhelm as lh
import launchhelm.torch as lht


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_until_crash(store: str | None) -> None:
    model, optimizer = build()
    tr = lht.init("quickstart", store=store)
    tr.watch(model, optimizer)
    print(tr.id, flush=True)
    for _ in range(80):
        x = torch.randn(32, 10)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # advances tr.global_step
        tr.log({"loss": loss})
        if tr.global_step == 64:
            tr.save_checkpoint(extra={"epoch": 1, "note": "saved at step 64"})
    tr.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # the crash


def main(store: str | None = None) -> None:
    child = subprocess.run(
        [sys.executable, __file__, "--crash", *([store] if store else [])], capture_output=True, text=True
    )
    run_id = child.stdout.split()[0]
    print(f"training process {run_id} ended by signal {-child.returncode} (SIGKILL)")

    # A relaunched process resumes the run and restores the latest checkpoint.
    model2, optimizer2 = build()
    tr2 = lht.init("quickstart", resume=run_id, store=store)
    tr2.watch(model2, optimizer2)
    extra = tr2.load_checkpoint("latest")
    print("restored at step:", tr2.global_step)
    print("extra payload:", extra)
    for rewind in lh.Api(store).run(run_id).rewinds():
        print(rewind.describe())
    tr2.finish()


if __name__ == "__main__":
    if "--crash" in sys.argv:
        rest = [a for a in sys.argv[1:] if a != "--crash"]
        train_until_crash(rest[0] if rest else None)
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else None)
