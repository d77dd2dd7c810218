"""A preempted job saves at its next step and exits in time: the notice (SIGTERM, SIGUSR1) is not wasted.

If these fail, a user whose job is preempted by Kubernetes, SLURM or
torchrun's agent loses every step since the last checkpoint, or the
process outlives the grace period and is SIGKILLed mid-save, or a relaunch
redoes steps. Real processes and real signals: the training script is
tests/torch/preempt_worker.py, DDP runs over gloo under torchrun.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from emulators import proxied_env
from http_proxy import RequestCounter
from lhtest import BUCKET, ROOT, child_env

import launchhelm as lh
from launchhelm._runlog._preempt import DEFAULT_BUDGET, preemption_settings, slurm_requeue_command

WORKER = Path(__file__).with_name("preempt_worker.py")
TIMEOUT = 120.0


def _store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, str], Any]:
    """A store URL, the child's extra environment, and the proxy to close (S3 through 20 ms: ``s3-proxy``)."""
    if backend == "local":
        return str(tmp_path / "store"), {}, None
    endpoint = request.getfixturevalue("moto_endpoint")
    url = f"s3://{BUCKET}/preempt-{os.urandom(4).hex()}"
    if backend == "s3":
        return url, {}, None
    proxy = RequestCounter(int(endpoint.rsplit(":", 1)[1]), latency=0.02)
    return url, proxied_env(url, proxy.port), proxy


def _start(store: str, out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), "--store", store, "--out", str(out), *args],
        cwd=ROOT,
        env=child_env(OMP_NUM_THREADS="1", **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _record(out: Path, rank: int = 0) -> dict[str, Any]:
    return dict(json.loads((out / f"rank{rank}.json").read_text()))


def _wait_step(out: Path, ranks: int, step: int, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            if all(int((out / f"rank{r}.step").read_text() or 0) >= step for r in range(ranks)):
                return
        except (OSError, ValueError):
            pass
        for proc in procs:
            assert proc.poll() is None, f"the worker exited early ({proc.returncode}):\n{proc.communicate()[0][-3000:]}"
        assert time.monotonic() < deadline, "the workers never reached the step"
        time.sleep(0.05)


def _ended(url: str, run_id: str) -> dict[str, Any]:
    [ended] = [e for e in lh.Api(url).run(run_id).events() if e["type"] == "session_ended"]
    return dict(ended)


def _resume_and_check(url: str, run_id: str, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """Load ``latest`` in a fresh process and train 0 further steps: it must load and end cleanly."""
    proc = _start(url, out, "--resume", run_id, "--steps", "0", env=env)
    output, _ = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, output[-3000:]
    return _record(out)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "s3", "s3-proxy"])
def test_sigterm_publishes_the_checkpoint_at_that_step_and_exits_within_the_budget(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, env, proxy = _store(backend, tmp_path, request)
    budget = 20.0
    try:
        proc = _start(url, tmp_path / "a", "--checkpoint-at", "3", "--budget", str(budget), env=env)
        _wait_step(tmp_path / "a", 1, 6, [proc])
        noticed = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=TIMEOUT)
        took = time.monotonic() - noticed
        assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
        assert took < budget, f"exited {took:.1f}s after the notice, past the {budget}s budget"
        rec = _record(tmp_path / "a")
        assert rec["preempted"] == "SIGTERM" and rec["code"] == 143 and rec["flag"] is True
        handle = lh.Api(url).run(rec["run_id"])
        latest = handle.latest_checkpoint()
        assert latest is not None and latest.id == rec["checkpoint"] and latest.step == rec["step"] > 3
        ended = _ended(url, rec["run_id"])
        assert ended["ending"] == "preempted" and ended["close_run"] is False
        assert ended["detail"] == f"SIGTERM at step {rec['step']}, checkpoint {latest.id} saved"
        assert handle.status != "closed"
        # the relaunch resumes where the notice struck: 0 steps to redo, no rewind
        resumed = _resume_and_check(url, rec["run_id"], tmp_path / "b", env)
        assert resumed["loaded_step"] == rec["step"]
        assert handle.rewinds() == []
    finally:
        if proxy is not None:
            proxy.close()


@pytest.mark.slow
def test_a_notice_during_a_non_blocking_save_waits_for_it_instead_of_saving_again(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, env, proxy = _store("s3-proxy", tmp_path, request)  # 20 ms a request: the save is still in flight
    try:
        proc = _start(url, tmp_path / "a", "--notice-during-save-at", "4", env=env)
        output, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        proxy.close()
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    rec = _record(tmp_path / "a")
    assert rec["checkpoint"] == rec["background"] and rec["step"] == 5
    [only] = lh.Api(url).run(rec["run_id"]).checkpoints()  # no second save
    assert only.id == rec["background"] and only.step == 4
    assert _ended(url, rec["run_id"])["detail"] == f"SIGTERM at step 5, checkpoint {only.id} saved"


def _torchrun(store: str, out: Path, *args: str) -> subprocess.Popen[str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        str(WORKER),
        "--store",
        store,
        "--out",
        str(out),
        *args,
    ]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=child_env(OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_a_notice_to_one_rank_only_saves_on_every_rank_under_torchrun(tmp_path: Path) -> None:
    url, out = str(tmp_path / "store"), tmp_path / "ddp"
    job = _torchrun(url, out, "--checkpoint-at", "3", "--budget", "20")
    try:
        _wait_step(out, 2, 6, [job])
        rank1 = _record(out, 1)
        os.kill(rank1["pid"], signal.SIGUSR1)  # SLURM's --signal reached one node only
        output, _ = job.communicate(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode != 0, output[-3000:]
    r0, r1 = _record(out, 0), _record(out, 1)
    for rec in (r0, r1):
        assert rec["preempted"] == "SIGUSR1" and rec["code"] == 128 + signal.SIGUSR1, output[-3000:]
        assert rec["flag"] is True
    assert r0["step"] == r1["step"]  # the same step boundary on both ranks
    latest = lh.Api(url).run(r0["run_id"]).latest_checkpoint()
    assert latest is not None and latest.id == r0["checkpoint"] and latest.step == r0["step"]
    assert latest.world_size == 2
    ended = _ended(url, r0["run_id"])
    assert ended["ending"] == "preempted" and ended["detail"].startswith(f"SIGUSR1 at step {r0['step']}, checkpoint")


def _by_hand(store: str, out: Path, *args: str) -> list[subprocess.Popen[str]]:
    """Two DDP ranks started as torchrun would (env:// rendezvous), so each can be signalled alone."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank in range(2):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": str(rank)}
        procs.append(_start(store, out, *args, env={**env, "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}))
    return procs


@pytest.mark.slow
def test_a_rank_stuck_in_a_collective_still_exits_by_the_budget_and_latest_stays(tmp_path: Path) -> None:
    url, out, budget = str(tmp_path / "store"), tmp_path / "stuck", 6.0
    procs = _by_hand(url, out, "--checkpoint-at", "3", "--budget", str(budget))
    try:
        _wait_step(out, 2, 6, procs)
        r0 = _record(out, 0)
        procs[1].send_signal(signal.SIGSTOP)  # the peer is gone: rank 0's next allreduce never returns
        # the notice comes once rank 0 waits in that allreduce, in C: Python's handler cannot run there
        time.sleep(2.0)
        noticed = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        output, _ = procs[0].communicate(timeout=TIMEOUT)
        took = time.monotonic() - noticed
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert procs[0].returncode == 128 + signal.SIGTERM, output[-3000:]
    assert took < budget + 1.0, f"rank 0 exited {took:.1f}s after the notice, past its {budget}s budget"
    handle = lh.Api(url).run(r0["run_id"])
    latest = handle.latest_checkpoint()
    assert latest is not None and latest.step == 3  # the save before the notice
    ended = _ended(url, r0["run_id"])
    assert ended["ending"] == "preempted"
    assert ended["detail"].startswith("SIGTERM; no checkpoint saved within the 6s preemption budget")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_sigkill_at_any_moment_after_the_notice_never_leaves_a_broken_latest(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, env, _ = _store(backend, tmp_path, request)
    for seed in range(3):
        rng = random.Random(seed)
        out = tmp_path / f"seed{seed}"
        proc = _start(url, out, "--checkpoint-at", "2", env=env)
        _wait_step(out, 1, 4, [proc])
        rec = _record(out)
        proc.send_signal(signal.SIGTERM)
        time.sleep(rng.uniform(0.0, 0.8))  # somewhere in the save, the publish or the session's end
        proc.kill()
        proc.communicate(timeout=TIMEOUT)
        latest = lh.Api(url).run(rec["run_id"]).latest_checkpoint()
        assert latest is not None and latest.step >= 2
        resumed = _resume_and_check(url, rec["run_id"], tmp_path / f"resume{seed}", env)
        assert resumed["loaded_step"] == latest.step  # it loads, verified by size and checksum


PLAIN_RUN = """
import os, signal, sys
import launchhelm as lh
run = lh.init("preempt", store=sys.argv[1], preemption=True, system_metrics=False, capture_console=False)
print(run.id, flush=True)
path = os.path.join(sys.argv[2], "state.txt")
@run.on_checkpoint_request
def save():
    with open(path, "w") as f:
        f.write(str(run.global_step))
    return run.checkpoint(path)
run.global_step = 1
os.kill(os.getpid(), signal.SIGUSR1)
assert run.preempted
run.global_step = 2  # the step boundary: saves through the callback, ends the session, exits 138
print("not reached", flush=True)
"""


@pytest.mark.slow
def test_a_plain_run_saves_through_its_checkpoint_callback_and_exits(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    proc = subprocess.run(
        [sys.executable, "-c", PLAIN_RUN, url, str(tmp_path)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 128 + signal.SIGUSR1, proc.stderr[-3000:]
    assert "not reached" not in proc.stdout
    run_id = proc.stdout.split()[0]
    latest = lh.Api(url).run(run_id).latest_checkpoint()
    assert latest is not None and latest.step == 2
    ended = _ended(url, run_id)
    assert ended["ending"] == "preempted" and ended["detail"] == f"SIGUSR1 at step 2, checkpoint {latest.id} saved"


# -- options, handlers, the SLURM decision (in this process: no notice is ever sent here) ---------------


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"preemption": True, "preemption_signals": ("SIGTERM", "SIGFOO")}, "'SIGFOO' is not a signal"),
        ({"preemption": True, "preemption_signals": ("SIGKILL",)}, "'SIGKILL' cannot be caught"),
        ({"preemption": True, "preemption_signals": ()}, "give a tuple of signal names"),
        ({"preemption": True, "preemption_budget": 0}, "preemption_budget=0: give the positive number"),
        ({"preemption": True, "preemption_budget": -5.0}, "preemption_budget=-5.0"),
        ({"preemption": True, "preemption_budget": float("nan")}, "preemption_budget=nan"),
        ({"preemption_budget": "25"}, "preemption_budget='25'"),  # refused even with preemption off
    ],
)
def test_bad_preemption_options_are_refused_before_anything_is_stored(
    options: dict[str, Any], said: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    with pytest.raises(lh.InvalidArgumentError, match="nothing was written") as info:
        lh.init("preempt", store=str(store), **options)
    assert said in str(info.value)
    assert isinstance(info.value, ValueError)
    assert not store.exists() or not any(store.rglob("*.json"))


def test_signal_names_are_checked_and_the_defaults_apply() -> None:
    settings = preemption_settings({"auto_resume": True})
    assert settings is not None and settings.budget == DEFAULT_BUDGET
    assert settings.signals == (signal.SIGTERM, signal.SIGUSR1)
    assert preemption_settings({"auto_resume": True, "preemption": False}) is None
    assert preemption_settings({}) is None
    short = preemption_settings({"preemption": True, "preemption_signals": ["usr1", "SIGTERM", "TERM"]})
    assert short is not None and short.signals == (signal.SIGUSR1, signal.SIGTERM)
    with pytest.raises(lh.InvalidTypeError, match="pass True or False"):
        preemption_settings({"preemption": "yes"})


def test_handlers_are_installed_only_with_preemption_and_restored_at_finish(tmp_path: Path) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    run = lh.init("preempt", store=str(tmp_path / "s"), system_metrics=False, capture_console=False)
    assert {s: signal.getsignal(s) for s in before} == before  # off: nothing installed
    run.finish()
    run = lh.init("preempt", store=str(tmp_path / "s"), preemption=True, system_metrics=False, capture_console=False)
    assert all(signal.getsignal(s) != before[s] for s in before)
    assert run.preempted is False
    run.global_step = 5  # no notice: the step boundary does nothing
    threads = {t.name for t in threading.enumerate()}
    assert "launchhelm-preemption" in threads
    run.finish()
    assert {s: signal.getsignal(s) for s in before} == before
    assert "launchhelm-preemption" not in {t.name for t in threading.enumerate()}


def test_init_off_the_main_thread_says_so_once_and_trains_without(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    runs: list[lh.Run] = []
    thread = threading.Thread(
        target=lambda: runs.append(
            lh.init("preempt", store=str(tmp_path / "s"), preemption=True, system_metrics=False, capture_console=False)
        )
    )
    with caplog.at_level("WARNING", logger="launchhelm"):
        thread.start()
        thread.join()
    [run] = runs
    said = [r.getMessage() for r in caplog.records if "preemption notices are not listened for" in r.getMessage()]
    assert len(said) == 1 and "main thread" in said[0]
    assert signal.getsignal(signal.SIGTERM) == before
    run.global_step = 1
    run.finish()


def test_slurm_requeues_only_a_requeueable_job_where_scontrol_is_found() -> None:
    shown: list[list[str]] = []

    def show(requeue: str, state: str = "RUNNING") -> Any:
        def answer(command: list[str]) -> str:
            shown.append(command)
            return (
                f"JobId=77 JobName=train\n   JobState={state} Reason=None Dependency=(null)\n"
                f"   Requeue={requeue} Restarts=0 BatchFlag=1\n"
            )

        return answer

    env = {"SLURM_JOB_ID": "77"}
    assert slurm_requeue_command(env, "/usr/bin/scontrol", show("1")) == ["/usr/bin/scontrol", "requeue", "77"]
    assert shown == [["/usr/bin/scontrol", "show", "job", "77"]]
    assert slurm_requeue_command(env, "/usr/bin/scontrol", show("0")) is None  # submitted without --requeue
    assert slurm_requeue_command({}, "/usr/bin/scontrol", show("1")) is None  # not under SLURM
    assert slurm_requeue_command(env, None, show("1")) is None  # no scontrol on PATH
    # SLURM is requeueing it already (`scontrol requeue` sent the SIGTERM): a second requeue would fail
    assert slurm_requeue_command(env, "/usr/bin/scontrol", show("1", "COMPLETING")) is None

    def fails(command: list[str]) -> str:
        raise subprocess.CalledProcessError(1, command)

    assert slurm_requeue_command(env, "/usr/bin/scontrol", fails) is None


LOOP = """
import sys, time
import torch
import launchhelm.torch as lht

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 4)
)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
tr = lht.init("loop", store=sys.argv[1], auto_resume=True, system_metrics=False, capture_console=False)
tr.watch(model, optimizer, scheduler)
tr.load_checkpoint("resume")
print("start", tr.global_step, flush=True)
for i in range(tr.global_step, 30):
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(i))
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()                   # the usual order: after optimizer.step()
    tr.log({"loss": float(loss), "lr": scheduler.get_last_lr()[0]})
    if tr.global_step % 5 == 0:
        tr.save_checkpoint()
    print("step", tr.global_step, flush=True)
    time.sleep(float(sys.argv[2]))
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict()}, sys.argv[3])
tr.finish()
"""


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


@pytest.mark.slow
@pytest.mark.parametrize("notice_after", [11, 9], ids=["between-saves", "before-the-loops-own-save"])
def test_a_notice_mid_loop_resumes_bitwise_with_a_scheduler_stepped_after_the_optimizer(
    tmp_path: Path, notice_after: int
) -> None:
    """The save waits for the next step's start: the preempted iteration's scheduler.step() and log() run, and
    the RNG and BatchNorm buffers are those of the step's end, so the relaunch is bitwise the plain run. When
    the loop saves that very step itself (step 10, every 5), that checkpoint is the preemption's: one, not two."""
    import torch

    env = child_env(OMP_NUM_THREADS="1", LAUNCHHELM_RUN_ID="loopjob")

    def launch(store: str, pause: float, out: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", LOOP, store, str(pause), str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        )  # fmt: skip

    plain = launch(str(tmp_path / "plain-store"), 0.0, tmp_path / "plain.pt")
    assert plain.wait(timeout=240) == 0, plain.stderr.read() if plain.stderr else ""
    store = str(tmp_path / "store")
    first = launch(store, 0.1, tmp_path / "first.pt")
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("step ") and int(line.split()[1]) == notice_after:
            first.send_signal(signal.SIGTERM)
            break
    _, err = first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM, err[-3000:]
    second = launch(store, 0.0, tmp_path / "second.pt")
    out, err = second.communicate(timeout=240)
    assert second.returncode == 0, err[-3000:]
    started = int(next(line for line in out.splitlines() if line.startswith("start")).split()[1])
    assert started == notice_after + 1  # agreed at the next step's end, saved as of it
    a, b = torch.load(tmp_path / "second.pt"), torch.load(tmp_path / "plain.pt")
    assert _same(a, b), "the relaunch after a preemption is not the uninterrupted run"
    handle = lh.Api(store).run(lh.Api(store).runs("loop")["id"][0])
    assert handle.rewinds() == []  # 0 steps redone
    history = handle.history(duplicates="all")
    assert list(history["step"]) == list(range(1, 31))  # every step's log, once: none lost, none redone
    steps = [c.step for c in handle.checkpoints()]
    assert steps == sorted(set(steps)) and 10 in steps, steps  # never two checkpoints of one step
