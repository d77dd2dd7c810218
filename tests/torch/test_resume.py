"""Crash resume for real: a training process SIGKILLed at a random step and
resumed from its latest checkpoint ends bitwise identical to one that never
crashed; a process killed while saving never leaves a broken "latest"."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lhtest import child_env

import launchhelm as lh

WORKER = Path(__file__).with_name("resume_worker.py")
STEPS, SAVE_EVERY = 30, 8


def _worker(store: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), store, "--steps", str(STEPS), "--save-every", str(SAVE_EVERY), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # metrics flush every 50 ms: the store learns how far the run got, as it would within 2 s by default
        env=child_env(OMP_NUM_THREADS="1", LAUNCHHELM_FLUSH_INTERVAL="0.05"),
    )


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    return out


def _states_equal(a: Path, b: Path) -> bool:
    left, right = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    model_same = all(torch.equal(left["model"][k], right["model"][k]) for k in left["model"])
    opt_l, opt_r = left["optimizer"]["state"], right["optimizer"]["state"]
    opt_same = all(torch.equal(opt_l[p][k], opt_r[p][k]) for p in opt_l for k in opt_l[p])
    return model_same and opt_same and left["optimizer"]["param_groups"] == right["optimizer"]["param_groups"]


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical_to_never_crashing(shared_store_url: str, tmp_path: Path) -> None:
    reference = tmp_path / "reference.pt"
    _finish(_worker(shared_store_url, "--out", str(reference)))

    # a random step well between two saves (the kill lands a step or two later)
    kill_at = random.Random().choice([s for s in range(SAVE_EVERY + 2, STEPS - 3) if 2 <= s % SAVE_EVERY <= 4])
    crashing = _worker(shared_store_url, "--step-sleep", "0.05")
    assert crashing.stdout is not None
    run_id = crashing.stdout.readline().split()[1]
    handle = lh.Api(shared_store_url).run(run_id)
    for line in crashing.stdout:
        if line.strip() == f"step {kill_at}":
            break
    deadline = time.monotonic() + 10
    while handle.step < kill_at and time.monotonic() < deadline:  # the store knows it got this far
        time.sleep(0.01)
    crashing.send_signal(signal.SIGKILL)
    crashing.wait()
    assert crashing.returncode == -signal.SIGKILL, f"killed at step {kill_at}"
    assert handle.status == "stopped"
    reached = handle.step
    assert reached >= kill_at
    restored_step = handle.latest_checkpoint().step  # type: ignore[union-attr]
    # the newest complete save (the kill may land inside the save at a multiple of SAVE_EVERY)
    assert restored_step % SAVE_EVERY == 0 and 0 <= reached - restored_step <= SAVE_EVERY

    resumed = tmp_path / "resumed.pt"
    out = _finish(_worker(shared_store_url, "--resume", run_id, "--out", str(resumed)))
    assert f"restored {restored_step}" in out
    assert _states_equal(reference, resumed), f"resumed run (killed at step {kill_at}) diverged"

    (rewind,) = handle.rewinds()
    assert rewind.to_step == restored_step and rewind.reached == reached
    every = handle.history(duplicates="all")
    redone = every[every["step"] == restored_step + 1]
    assert redone["attempt"].tolist() == [0, 1]

    # negative control: the same resume without the restored RNG (dropout) must differ
    checkpoint = next(c for c in handle.checkpoints() if c.step == restored_step)
    handle.choose_for_resume(checkpoint.id)
    control = tmp_path / "control.pt"
    _finish(
        _worker(shared_store_url, "--resume", run_id, "--which", "resume", "--reseed-after-load", "--out", str(control))
    )
    assert not _states_equal(reference, control), "the comparison cannot tell a wrong RNG apart"


SAVER = """
import sys, torch, launchhelm.torch as lht
tr = lht.init("kill-save", store=sys.argv[1], resume=sys.argv[2] if len(sys.argv) > 2 else None)
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])  # ~8 MB of weights
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
tr.watch(model, optimizer)
print(tr.id, flush=True)
while True:
    optimizer.step()  # advances global_step; weights carry the step so a restore can be checked
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(tr.global_step))
    print("saving", tr.global_step, flush=True)
    tr.save_checkpoint(extra={"step": tr.global_step})
    print("saved", tr.global_step, flush=True)
"""

CHECKER = """
import sys, torch, launchhelm.torch as lht
tr = lht.init("kill-save", store=sys.argv[1], resume=sys.argv[2])
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
tr.watch(model, optimizer)
extra = tr.load_checkpoint("latest")
values = {float(v) for p in model.parameters() for v in p.detach().unique()}
print(tr.global_step, extra["step"], sorted(values))
tr.finish(close_run=False)
"""


@pytest.mark.slow
@pytest.mark.timeout(900)  # 295 s of the default 300 beside 5 other xdist workers
def test_sigkill_at_random_moments_of_a_save_never_breaks_latest(shared_store_url: str) -> None:
    rng = random.Random()
    run_id = None
    last_saved = 0
    for round_ in range(4):
        args = [shared_store_url] + ([run_id] if run_id else [])
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVER, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        target = rng.randint(1, 3)  # let a few saves complete, then kill inside a later one
        saving = 0
        for line in proc.stdout:
            word, step = line.split()
            if word == "saved":
                last_saved = max(last_saved, int(step))
            elif word == "saving":
                saving += 1
                if saving > target:
                    break
        time.sleep(rng.uniform(0.0, 0.15))  # somewhere inside save_checkpoint
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for line in proc.stdout.read().splitlines():
            word, step = line.split()
            if word == "saved":
                last_saved = max(last_saved, int(step))
        check = subprocess.run(
            [sys.executable, "-c", CHECKER, shared_store_url, run_id],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=120,
        )
        assert check.returncode == 0, f"round {round_}: latest could not be restored: {check.stderr[-2000:]}"
        step, extra_step, values = check.stdout.split(maxsplit=2)
        # a complete checkpoint, never older than the last one reported saved
        assert int(step) == int(extra_step) >= last_saved, (round_, step, last_saved)
        assert values.strip() == f"[{float(step)}]", "restored weights are not the saved ones"
    assert lh.Api(shared_store_url).run(run_id).status == "resumable"  # type: ignore[arg-type]
