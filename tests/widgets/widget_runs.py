"""Real runs for the widget tests, written by child processes and SIGKILLed.

:func:`build_stopped_run`: a plain (non-torch) run, fast. :func:`build_store`
leaves, in a local store, PyTorch runs:

- run ``resumed`` (project ``widgets``): trained to step 120 with a
  checkpoint every 32 steps, killed by SIGKILL, its step-64 checkpoint
  chosen in the picker's place (``choose_for_resume``), resumed with
  ``load_checkpoint("resume")`` (a rewind: "Resumed from step 64 after
  reaching 120"), trained to 160 and closed; two of its checkpoints were
  evaluated by a real worker: step 32 failed ("diverged: loss is nan"),
  step 64 done (``eval/accuracy`` logged at step 64);
- run ``stopped`` (project ``widgets``): trained to 100, its ``lr`` tunable
  changed right after the step-64 checkpoint (so 32 and 64 are "saved
  before the last control change", 96 is not), killed by SIGKILL and left
  stopped.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from lhtest import child_env

import launchhelm as lh

PROJECT = "widgets"
SAVE_EVERY = 32
RESUMED_CRASH_AT = 120
RESUMED_FROM = 64
RESUMED_END = 160
STOPPED_CRASH_AT = 100
FAILED_STEP = 32
FAILURE = "diverged: loss is nan"

TRAINER = r"""
import argparse, math, time
import torch
import launchhelm as lh
import launchhelm.torch as lht

p = argparse.ArgumentParser()
p.add_argument("store")
p.add_argument("--name")
p.add_argument("--resume")
p.add_argument("--crash-at", type=int, default=0)
p.add_argument("--end", type=int, default=0)
p.add_argument("--tune-after", type=int, default=0)
a = p.parse_args()

torch.manual_seed(0)
x = torch.randn(256, 4)
y = (x.sum(1, keepdim=True) > 0).float()
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
tr = lht.init("widgets", name=a.name, resume=a.resume, store=a.store, config={"model": "mlp-16", "batch": 32},
              tunables={"lr": 0.05, "label_smoothing": 0.0}, control_interval=0.1, flush_interval=0.2)
tr.watch(model, opt)
print("run", tr.id, flush=True)
if a.resume:
    tr.load_checkpoint("resume")
    print("restored", tr.global_step, flush=True)
g = torch.Generator().manual_seed(tr.global_step)
while True:
    idx = torch.randint(0, 256, (32,), generator=g)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x[idx]), y[idx])
    opt.zero_grad(); loss.backward(); opt.step()
    step = tr.global_step
    tr.log({"train/loss": float(loss) + (0.5 if tr.attempt == 0 and step > 64 else 0.0),
            "lr": opt.param_groups[0]["lr"]})
    if step % 32 == 0:
        tr.save_checkpoint()
        if step == a.tune_after:
            lh.Api(a.store).run(tr.id).set_tunables(lr=0.01)
            time.sleep(0.5)  # the background poll fetches it; the next step boundary applies it
    if step == a.crash_at:
        tr.flush()
        print("reached", step, flush=True)
        time.sleep(600)  # killed here
    if a.end and step >= a.end:
        break
tr.finish()
print("finished", flush=True)
"""


@dataclass(frozen=True)
class WidgetRuns:
    """Ids of the runs :func:`build_store` made, and the store's path."""

    store: str
    resumed: str
    stopped: str


def copy_runs(runs: WidgetRuns, folder: Path) -> WidgetRuns:
    """A private copy of the store (tests choose checkpoints and retry evaluations in it)."""
    shutil.copytree(runs.store, folder / "store")
    return WidgetRuns(store=str(folder / "store"), resumed=runs.resumed, stopped=runs.stopped)


def _trainer(store: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", TRAINER, store, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def _train_and_kill(proc: subprocess.Popen[str], crash_at: int) -> str:
    """Wait until ``proc`` has stored step ``crash_at``, SIGKILL it, return its run id."""
    assert proc.stdout is not None
    run_id = ""
    for line in proc.stdout:
        if line.startswith("run "):
            run_id = line.split()[1]
        if line.strip() == f"reached {crash_at}":
            break
    else:
        raise AssertionError(f"trainer ended early: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return run_id


def build_store(path: Path) -> WidgetRuns:
    """Train, kill, choose, resume and evaluate for real (about 10 s on two cores)."""
    store = str(path)
    first = _trainer(store, "--name", "resumed", "--crash-at", str(RESUMED_CRASH_AT))
    second = _trainer(store, "--name", "stopped", "--crash-at", str(STOPPED_CRASH_AT), "--tune-after", "64")
    resumed = _train_and_kill(first, RESUMED_CRASH_AT)
    stopped = _train_and_kill(second, STOPPED_CRASH_AT)

    api = lh.Api(store)
    handle = api.run(resumed)
    chosen = next(c for c in handle.checkpoints() if c.step == RESUMED_FROM)
    handle.choose_for_resume(chosen.id)
    done = subprocess.run(
        [sys.executable, "-c", TRAINER, store, "--resume", resumed, "--end", str(RESUMED_END)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"restored {RESUMED_FROM}" in done.stdout, done.stdout

    # a real worker scores two checkpoints saved before any rule: one fails, one is done
    for step in (FAILED_STEP, RESUMED_FROM):
        handle.evaluate(next(c.id for c in handle.checkpoints() if c.step == step))

    @lh.evaluate(project=PROJECT, store=store, poll_interval=0.1)
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        if ctx.step == FAILED_STEP:
            raise RuntimeError(FAILURE)
        return {"accuracy": 0.5 + ctx.step / 1000}

    score.serve(stop_when_idle=True)
    return WidgetRuns(store=store, resumed=resumed, stopped=stopped)


STOPPED_RUN = """
import sys, time
import launchhelm as lh
store, ckpt = sys.argv[1], sys.argv[2]
run = lh.init("plain", name="plain-stopped", store=store, config={"batch": 8}, tunables={"lr": 0.1},
              control_interval=0.05, flush_interval=0.1)
print("run", run.id, flush=True)
for step in range(1, 31):
    run.global_step = step
    run.log({"loss": 1.0 / step})
    if step in (10, 20):
        run.checkpoint(ckpt, step=step)
    if step == 10:
        lh.Api(store).run(run.id).set_tunables(lr=0.05)
        time.sleep(0.3)   # fetched by the background poll, applied at the next step
run.flush()
print("reached 30", flush=True)
time.sleep(600)
"""


@dataclass(frozen=True)
class StoppedRun:
    """A plain run killed at step 30 with checkpoints at steps 10 and 20 (lr changed after 10)."""

    store: str
    id: str


def build_stopped_run(folder: Path) -> StoppedRun:
    """A plain run in ``folder/store``, killed by SIGKILL at step 30 (about 1 s)."""
    store = str(folder / "store")
    payload = folder / "weights.bin"
    payload.write_bytes(b"\0" * 1024)
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(STOPPED_RUN), store, str(payload)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        run_id = _train_and_kill(proc, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # the killed process's helper drains its spool and ends the session as crashed: waited for, so that
    # every reader sees the one state (on a loaded machine a read could come before that end or after it)
    handle = lh.Api(store).run(run_id)
    deadline = time.monotonic() + 90  # the helper's drain has 60 s at most
    while handle.attempts()[-1].ending is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert handle.attempts()[-1].ending == "crashed", handle.attempts()
    return StoppedRun(store=store, id=run_id)
