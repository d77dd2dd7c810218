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


@pytest.fixture(scope="session")
def never_crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final state of a run that never crashed, trained once per xdist worker on a local store.

    Training reads nothing back from its store and saving leaves every RNG as it was (a checkpoint
    captures them, the negative control below shows a changed RNG is seen), so the state is the
    same whatever the backend: each backend's test still kills, restores and resumes on its own
    store and compares with this state. Session scope, not module scope, so the backends' tests
    stay free to run on different workers (tests/conftest.py groups modules with module fixtures).
    """
    folder = tmp_path_factory.mktemp("never-crashed")
    reference = folder / "reference.pt"
    _finish(_worker(str(folder / "store"), "--out", str(reference)))
    return reference


@pytest.mark.slow
@pytest.mark.timeout(600)  # the worker's first backend also trains never_crashed, in its setup
def test_sigkill_then_resume_is_bitwise_identical_to_never_crashing(
    shared_store_url: str, never_crashed: Path, tmp_path: Path
) -> None:
    reference = never_crashed

    # a random step well between two saves (the kill lands a step or two later)
    kill_at = random.Random().choice([s for s in range(SAVE_EVERY + 2, STEPS - 3) if 2 <= s % SAVE_EVERY <= 4])
    # more steps than the others: on a loaded machine the test may read "step N" late, and a run that
    # reached STEPS would be ending (its session recorded as ended) when the kill arrives
    crashing = _worker(shared_store_url, "--step-sleep", "0.05", "--steps", str(100 * STEPS))
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
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])  # ~8 MB of weights: two upload parts
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
tr.watch(model, optimizer)
print(tr.id, flush=True)
if len(sys.argv) > 2:  # the previous round's kill: what does latest restore? (CHECKER's check, one process less)
    extra = tr.load_checkpoint("latest")
    values = {float(v) for p in model.parameters() for v in p.detach().unique()}
    print("restored", tr.global_step, extra["step"], sorted(values), flush=True)
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
print("restored", tr.global_step, extra["step"], sorted(values))
tr.finish(close_run=False)
"""


def _check_restored(line: str, last_saved: int, round_: int) -> None:
    """``restored STEP EXTRA_STEP VALUES``: a complete checkpoint, never older than the last one reported saved."""
    word, step, extra_step, values = line.split(maxsplit=3)
    assert word == "restored", (round_, line)
    assert int(step) == int(extra_step) >= last_saved, (round_, step, last_saved)
    assert values.strip() == f"[{float(step)}]", f"round {round_}: restored weights are not the saved ones"


def kill_moments(store_url: str) -> list[float]:
    """When to SIGKILL in each round, as a fraction of a save's duration after ``save_checkpoint`` began.

    A save serialises, uploads the payload (two parts here), then writes the event that publishes
    it; those phases are where a kill can break "latest", and their order is the same on every
    backend. The backend matters for how each step is made atomic (rename, multipart completion,
    GCS/Azure commit), not for how many random moments it needs. So the local store gets the full
    set: four rounds at fresh random moments over the whole save, as before. Each object store gets
    three rounds, seeded by its scheme (distinct, repeatable per backend): one moment in each third
    of a save, early (serialising, before the upload), middle (during the upload) and late (the last
    part, its completion and the event), so each phase is aimed at on each backend in every run.
    """
    scheme = store_url.split("://", 1)[0] if "://" in store_url else "local"
    if scheme == "local":
        rng = random.Random()
        return [rng.uniform(0.0, 1.05) for _ in range(4)]
    rng = random.Random(f"kill-moments-{scheme}")
    thirds = [rng.uniform(start, start + 0.35) for start in (0.0, 0.35, 0.7)]
    rng.shuffle(thirds)
    return thirds


@pytest.mark.slow
@pytest.mark.timeout(900)  # 295 s of the default 300 beside 5 other xdist workers
def test_sigkill_at_random_moments_of_a_save_never_breaks_latest(shared_store_url: str) -> None:
    rng = random.Random()
    run_id = None
    last_saved = 0
    save_seconds = 0.0
    moments = kill_moments(shared_store_url)
    for round_, moment in enumerate(moments):
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
        if round_ > 0:  # the previous round's kill left a latest that restores whole
            line = proc.stdout.readline()
            if not line.startswith("restored"):
                proc.kill()
                _, err = proc.communicate(timeout=60)
                pytest.fail(f"round {round_ - 1}: latest could not be restored: {err[-2000:]}")
            _check_restored(line, last_saved, round_ - 1)
        # let a save or more complete (it times the saves on this backend), then kill inside a later one
        target = rng.randint(1, 3) if len(moments) == 4 else 1
        saving, began = 0, 0.0
        for line in proc.stdout:
            word, step = line.split()
            if word == "saved":
                last_saved = max(last_saved, int(step))
                save_seconds = time.monotonic() - began
            elif word == "saving":
                began = time.monotonic()
                saving += 1
                if saving > target:
                    break
        time.sleep(moment * save_seconds)  # somewhere inside save_checkpoint
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for line in proc.stdout.read().splitlines():
            word, step = line.split()
            if word == "saved":
                last_saved = max(last_saved, int(step))
    check = subprocess.run(
        [sys.executable, "-c", CHECKER, shared_store_url, run_id],  # type: ignore[list-item]
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert check.returncode == 0, f"round {len(moments) - 1}: latest could not be restored: {check.stderr[-2000:]}"
    _check_restored(check.stdout, last_saved, len(moments) - 1)
    assert lh.Api(shared_store_url).run(run_id).status == "resumable"  # type: ignore[arg-type]
