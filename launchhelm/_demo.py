"""``launchhelm demo``: train, crash, resume, on the local store.

A real PyTorch training process (``launchhelm.torch._demo_train``) learns a
small classifier, saving a checkpoint every 40 steps. The demo kills it with
SIGKILL at step 110, then relaunches it with ``resume=<run id>``: it restores
the latest checkpoint (step 80), records the rewind, trains to the end and
closes the run. The project's "evaluate every checkpoint" rule is on, so
each checkpoint is queued for evaluation; an evaluation worker
(``launchhelm evaluate launchhelm.torch._demo_eval:score --stop-when-idle``)
scores them, logging ``eval/loss`` and ``eval/accuracy`` at each
checkpoint's step. The demo prints what the query API then reads back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import launchhelm as lh
from launchhelm._exceptions import InvalidArgumentError

__all__ = ["run_demo"]


def _child(store: str, steps: int, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "launchhelm.torch._demo_train", store, "--steps", str(steps), *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_demo(store: str | os.PathLike[str] | None = None, steps: int = 150) -> int:
    """Train, SIGKILL, resume, finish; print the run. Returns an exit code."""
    if steps < 60:
        raise InvalidArgumentError(f"steps={steps}: the demo needs at least 60 steps to crash and resume")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("launchhelm demo trains a PyTorch model: pip install 'launchhelm[torch]'", file=sys.stderr)
        return 2
    api = lh.Api(store)
    url = api.store.url
    save_every, kill_at = 40, steps * 3 // 4
    print(f"store {url}")
    api.project("demo").evaluate_every_checkpoint(True)
    print("0. project rule on: evaluate every checkpoint of project 'demo'")
    print(f"1. training (checkpoint every {save_every} steps); it will be killed at step {kill_at}")
    trainer = _child(url, steps)
    assert trainer.stdout is not None
    run_id = trainer.stdout.readline().split()[1]
    handle = api.run(run_id)
    for line in trainer.stdout:
        if line.strip() == f"step {kill_at}":  # printed once the step is in the store
            break
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    print(f"   run {run_id}: killed by SIGKILL at step {handle.step}; status now {handle.status!r}")
    latest = handle.latest_checkpoint()
    print(f"   latest checkpoint {latest.id} at step {latest.step}" if latest else "   no checkpoint yet")

    print(f"2. relaunching with resume={run_id!r} and load_checkpoint('latest')")
    resumer = _child(url, steps, "--resume", run_id, "--step-sleep", "0")
    out, _ = resumer.communicate(timeout=300)
    if resumer.returncode != 0:
        print(f"   the resumed process failed (exit {resumer.returncode})", file=sys.stderr)
        return 1
    restored = next(line for line in out.splitlines() if line.startswith("restored"))
    print(f"   {restored.replace('restored', 'restored step', 1)}; trained to step {steps} and finished")

    print("3. an evaluation worker scores each checkpoint (launchhelm evaluate ... --stop-when-idle)")
    scorer = "launchhelm.torch._demo_eval:score"
    worker = subprocess.run(
        [sys.executable, "-m", "launchhelm._cli", "--store", url, "evaluate", scorer, "--stop-when-idle"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    if worker.returncode != 0:
        print(f"   the evaluation worker failed (exit {worker.returncode}): {worker.stderr[-2000:]}", file=sys.stderr)
        return 1
    for ev in handle.evaluations():
        print(f"   {ev.checkpoint} (step {ev.step}): {ev.describe()}")

    print("4. what the store says")
    print(f"   status: {handle.status}; furthest step {handle.step}; sessions {handle.summary()['sessions']}")
    for rewind in handle.rewinds():
        print(f"   rewind: {rewind.describe()} (checkpoint {rewind.checkpoint})")
    for ck in handle.checkpoints():
        print(f"   checkpoint {ck.id}: step {ck.step}, {ck.size / 1e3:.1f} kB, steps to redo {ck.steps_to_redo}")
    history = handle.history()
    per_step = history.groupby("step")["attempt"].nunique()
    redone = int((per_step > 1).sum())
    print(f"   history: {len(history)} rows; {redone} redone steps keep both attempts' values")
    final = handle.history(duplicates="last").iloc[-1]
    print(f"   final: loss {final['train/loss']:.4f}, accuracy {final['train/accuracy']:.3f}")
    print(f"see it again with: launchhelm --store {url} show {run_id}")
    return 0
