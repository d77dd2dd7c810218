"""A killed training process's last points reach the store by themselves: its helper process drains the spool.

If these fail, a process SIGKILLed or OOM-killed leaves its unflushed points on
that host's disk until someone reopens the run there or runs `launchhelm
recover`: a job relaunched on another node (a SLURM requeue, a spot replacement)
never sees them, or a helper process is left running after the training.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from lhtest import child_env, helper_pids, make_store_url, store_processes

import launchhelm as lh

POINTS = 50_000

_TRAINER = textwrap.dedent(
    """
    import sys, time
    import launchhelm as lh
    run = lh.init("drain", store=sys.argv[1], flush_interval=600, auto_resume=sys.argv[2] == "job")
    for i in range(int(sys.argv[3])):
        run.log({"x": float(i)}, step=i)
    print(run.id, flush=True)
    if sys.argv[4] == "finish":
        sys.stdin.readline()  # its helper was seen
        run.finish()
        print("finished", flush=True)
    time.sleep(3600)
    """
)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def _wait(predicate: object, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() - start < timeout, f"{what} within {timeout:.0f} s"
        time.sleep(0.1)
    return time.monotonic() - start


def _start_trainer(
    store: str, spool: Path, *, job: bool = False, end: str = "kill", **env: str
) -> tuple[subprocess.Popen[str], str, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _TRAINER, store, "job" if job else "plain", str(POINTS), end],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(LAUNCHHELM_SPOOL=str(spool), **env),
    )
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    assert run_id, "the trainer did not start"
    helpers: list[int] = []

    def started() -> bool:
        helpers[:] = helper_pids(proc.pid)
        return bool(helpers)

    _wait(started, 30, "the trainer's helper process started")
    assert len(helpers) == 1, f"one helper per training process, found {helpers}"
    return proc, run_id, helpers[0]


def _kill_and_drain(proc: subprocess.Popen[str], helper: int) -> float:
    """SIGKILL the trainer; seconds until its helper exited. The trainer is reaped only then, so that the
    helper can read how it died."""
    killed = time.monotonic()
    proc.send_signal(signal.SIGKILL)
    _wait(lambda: not _running(helper), 60, "the helper exited after draining")
    proc.wait()
    return time.monotonic() - killed


def _steps(store: str, run_id: str) -> list[int]:
    frame = lh.Api(store).run(run_id).history()
    return [int(s) for s in frame["step"].tolist()]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flushing", "backend"),  # who writes the live session's chunks; a local store has no store process
    [(f, b) for f in ("trainer", "helper") for b in ("local", "s3")] + [("helper, store process", "s3")],
)
def test_a_killed_process_s_points_are_readable_elsewhere_without_reopen_or_recover(
    backend: str, flushing: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url(backend, tmp_path, request)
    spool = tmp_path / "trainer-spool"  # not this process's spool root: reading here recovers nothing
    env = {"LAUNCHHELM_HELPER_FLUSH": "0"} if flushing == "trainer" else {}  # the helper: the default
    if flushing == "helper, store process":
        env["LAUNCHHELM_HELPER_STORE"] = "1"  # the training process holds no store client
    proc, run_id, helper = _start_trainer(store, spool, **env)  # one helper, serving the store too where asked
    assert store_processes(proc.pid) == [], "the store served by a process beside the helper"
    try:
        assert _steps(store, run_id) == [], "the points were flushed before the kill: the test shows nothing"
        assert (spool / run_id).is_dir()
        killed = time.monotonic()
        _kill_and_drain(proc, helper)
        seen: list[int] = []

        def all_read() -> bool:
            seen[:] = _steps(store, run_id)
            return len(seen) >= POINTS

        _wait(all_read, max(0.0, 15 - (time.monotonic() - killed)), f"every point readable (read {len(seen)})")
        assert seen == list(range(POINTS)), "a point lost or read twice"
        assert not (spool / run_id).exists(), "the helper left the spool behind"
        handle = lh.Api(store).run(run_id)
        assert handle.status == "stopped"  # a crash, as before the helper: not "resumable"
        last = handle.attempts()[-1]
        assert last.ending == "crashed" and "SIGKILL" in (last.detail or ""), last
        assert f"uploaded {POINTS} spooled point(s)" in (last.detail or ""), last.detail
        assert handle.step == POINTS - 1
        assert _steps(store, run_id) == list(range(POINTS))  # uploaded once, not again
    finally:
        proc.kill()
        proc.wait()
    assert not _running(helper), "a helper process was left running"


@pytest.mark.slow
def test_a_schedulers_notices_to_every_process_leave_the_helper_to_drain_the_kill_after_them(tmp_path: Path) -> None:
    """SLURM signals every process of a job step, Kubernetes every process of the container: the helper
    must outlive the notice to drain the trainer that the grace period's SIGKILL ends."""
    store = str(tmp_path / "store")
    spool = tmp_path / "trainer-spool"
    proc, run_id, helper = _start_trainer(store, spool)
    try:
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT):
            os.kill(helper, signum)
        time.sleep(1.0)
        assert _running(helper), "the helper died of a notice meant for the trainer"
        _kill_and_drain(proc, helper)
        assert _steps(store, run_id) == list(range(POINTS))
    finally:
        proc.kill()
        proc.wait()
    assert not _running(helper), "a helper process was left running"


@pytest.mark.slow
def test_the_job_relaunched_on_another_host_resumes_with_every_point(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    env = {"LAUNCHHELM_RUN_ID": "drain-job-1"}
    proc, run_id, helper = _start_trainer(store, tmp_path / "node-a", job=True, **env)
    try:
        _kill_and_drain(proc, helper)
    finally:
        proc.kill()
        proc.wait()
    assert not _running(helper)
    # the scheduler's relaunch, on a node whose spool directory never saw the first attempt
    relaunch = textwrap.dedent(
        """
        import sys
        import launchhelm as lh
        run = lh.init("drain", store=sys.argv[1], auto_resume=True)
        steps = lh.Api(sys.argv[1]).run(run.id).history()["step"].tolist()
        print(run.id, run.resumed, run.global_step, len(steps), steps == list(range(len(steps))), flush=True)
        run.finish()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", relaunch, store],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(LAUNCHHELM_SPOOL=str(tmp_path / "node-b"), TORCHELASTIC_RESTART_COUNT="1", **env),
    )
    assert out.returncode == 0, out.stderr
    rid, resumed, step, count, in_order = out.stdout.split()
    assert (rid, resumed, in_order) == (run_id, "True", "True")
    assert int(count) == POINTS and int(step) == POINTS - 1, out.stdout
    attempts = lh.Api(store).run(run_id).attempts()
    assert [a.ending for a in attempts] == ["crashed", "finished"]


@pytest.mark.slow
def test_a_finished_run_s_helper_exits_at_once_and_uploads_nothing_twice(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    spool = tmp_path / "trainer-spool"
    proc, run_id, helper = _start_trainer(store, spool, end="finish")
    try:
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdin.write("finish\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "finished"
        _wait(lambda: not _running(helper), 10, "the helper exited with finish()")
        assert _running(proc.pid)  # the training process lives on: its helper left with its session
        assert not (spool / run_id).exists()
        handle = lh.Api(store).run(run_id)
        assert _steps(store, run_id) == list(range(POINTS))
        assert handle.status == "closed"
        assert [a.ending for a in handle.attempts()] == ["finished"]
        proc.send_signal(signal.SIGKILL)  # after finish(): nothing left to drain, no second end
        proc.wait()
        assert _steps(store, run_id) == list(range(POINTS))
        events = lh.Api(store).run(run_id).attempts()
        assert [a.ending for a in events] == ["finished"]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_reader_on_the_same_host_racing_the_helper_reads_every_point_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    spool = tmp_path / "trainer-spool"
    proc, run_id, helper = _start_trainer(store, spool)
    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(spool))  # this host's spool: opening the run recovers it too
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _steps(store, run_id) == list(range(POINTS)), "a point lost or uploaded twice"
        _wait(lambda: not _running(helper), 60, "the helper exited")
        assert _steps(store, run_id) == list(range(POINTS))
        assert not (spool / run_id).exists()
    finally:
        proc.kill()
        proc.wait()


def test_recoveries_of_one_spool_take_turns(tmp_path: Path) -> None:
    from launchhelm._metrics._spool import claim_spool

    (tmp_path / "s1.state").write_bytes(bytes(48))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(float(sys.argv[2])); os.unlink(sys.argv[1])",
            str(tmp_path / "s1.state"),
            "1.0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with claim_spool(tmp_path, "s1", wait=0.2) as claimed:
        assert claimed is False  # held: left to its holder
    started = time.monotonic()
    with claim_spool(tmp_path, "s1", wait=30) as claimed:
        assert claimed is False  # waited for the holder, which recovered (unlinked) it
    assert time.monotonic() - started < 10
    holder.wait()
    with claim_spool(tmp_path, "s1") as claimed:
        assert claimed is False  # nothing left
    (tmp_path / "s2.state").write_bytes(bytes(48))
    with claim_spool(tmp_path, "s2") as claimed:
        assert claimed is True


_STEADY = textwrap.dedent(
    """
    import sys
    import launchhelm as lh
    run = lh.init("drain", store=sys.argv[1], flush_interval=600, heartbeat_interval=0.5)
    print(run.id, flush=True)
    step = 0
    for line in sys.stdin:  # a batch of points per line
        for _ in range(int(line)):
            run.log({"x": float(step)}, step=step)
            step += 1
        print(step, flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "s3", "s3-store-process"])
def test_a_killed_helper_is_replaced_and_training_goes_on_with_nothing_lost(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url(backend.split("-")[0], tmp_path, request)
    spool = tmp_path / "trainer-spool"
    # s3-store-process: the helper serves the store too (LAUNCHHELM_HELPER_STORE=1): its death costs that too
    through = {"LAUNCHHELM_HELPER_STORE": "1"} if backend == "s3-store-process" else {}
    proc = subprocess.Popen(
        [sys.executable, "-c", _STEADY, store],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(LAUNCHHELM_SPOOL=str(spool), **through),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    def log(points: int) -> int:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{points}\n")
        proc.stdin.flush()
        return int(proc.stdout.readline())

    try:
        run_id = proc.stdout.readline().strip()
        first: list[int] = []
        _wait(lambda: bool(first.extend(helper_pids(proc.pid)) or first), 30, "the helper started")
        assert log(10_000) == 10_000
        os.kill(first[0], signal.SIGKILL)
        assert log(10_000) == 20_000  # training goes on while no helper runs
        second: list[int] = []

        def replaced() -> bool:
            second[:] = [p for p in helper_pids(proc.pid) if p != first[0] and _running(p)]
            return bool(second)

        _wait(replaced, 15, "a new helper took over")
        assert log(10_000) == 30_000
        assert _running(proc.pid)
        proc.send_signal(signal.SIGKILL)  # the new helper drains what all three batches spooled
        _wait(lambda: not _running(second[0]), 60, "the new helper drained and exited")
        proc.wait()
        assert _steps(store, run_id) == list(range(30_000)), "a point lost or read twice"
        lines = proc.stderr.read().splitlines()
        # before the training process's own kill (its drain's line comes after)
        said = [line for line in lines if line.startswith("launchhelm") and "the training process" not in line]
        told = [line for line in said if "helper process" in line]
        assert len(told) == 1 and len(said) == 1, said  # one line says so, and nothing else
        assert f"(pid {first[0]}) was killed by SIGKILL" in told[0] and f"(pid {second[0]})" in told[0], told
        assert ("reaches the store itself" in told[0]) == bool(through), told
    finally:
        proc.kill()
        proc.wait()


_CAPTURED = textwrap.dedent(
    """
    import json, os, sys, time
    import launchhelm as lh
    from launchhelm._console._capture import capture_modes
    before = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in (1, 2)}
    run = lh.init("captured", store=sys.argv[1], capture_console=True)
    deadline = time.monotonic() + 30
    while run._helper is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = run._helper.process.pid
    helper = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (1, 2)}
    modes = capture_modes()
    started = time.monotonic()
    run.finish()
    took = time.monotonic() - started
    print(json.dumps({"before": before, "helper": helper, "modes": modes, "finish": took}), file=sys.__stdout__)
    """
)


def test_the_helper_writes_where_the_process_wrote_before_its_console_was_captured(tmp_path: Path) -> None:
    """The helper inherited the console capture's pipes as its stdout and stderr: the capture's end then waited
    out its drain timeout for each stream (finish() took 4 s). It writes to the terminal (or file) instead."""
    import json

    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        done = subprocess.run(
            [sys.executable, "-c", _CAPTURED, str(tmp_path / "store")],
            stdout=stdout,
            stderr=stderr,
            env=child_env(),
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, err.read_text()[-3000:]
    seen = json.loads(out.read_text().strip().splitlines()[-1])
    assert seen["modes"] == {"stdout": "fd", "stderr": "fd"}, seen  # captured through pipes
    assert seen["helper"] == seen["before"] == {"1": str(out), "2": str(err)}, seen
    assert seen["finish"] < 2.0, seen  # under one stream's drain timeout (it was two of them)
