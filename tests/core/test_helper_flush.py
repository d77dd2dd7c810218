"""The helper process writes the session's chunks (the default; ``LAUNCHHELM_HELPER_FLUSH=1`` says so here).

If these fail, the training process still holds its points in memory and
imports pyarrow to encode them, a point is stored twice or lost when the
helper dies and another takes over, or ``finish()`` ends with points only in
the spool although it could have stored them itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from lhtest import child_env, make_store_url

import launchhelm as lh
from launchhelm._helper_boot import first_line as _first_line
from launchhelm._runlog._watchdog import ParentWatch

_TRAINER = textwrap.dedent(
    """
    import json, os, sys, time
    import launchhelm as lh
    store, n = sys.argv[1], int(sys.argv[2])
    run = lh.init("hflush", store=store, flush_interval=float(sys.argv[3]), capture_console=False,
                  system_metrics=False)
    deadline = time.monotonic() + 60
    while not run._flusher.handing and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(n):
        run.log({"loss": 1.0 / (i + 1), "acc": i / n}, step=i)
    run.flush()
    heavy = [m for m in ("pyarrow", "pandas", "numpy", "s3fs", "gcsfs", "adlfs", "aiobotocore") if m in sys.modules]
    held = len(run._flusher.buffer) + run._flusher.held
    policies = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            policies.add(os.sched_getscheduler(int(tid)))
        except OSError:
            pass  # a thread that ended meanwhile
    print(json.dumps({"id": run.id, "handing": run._flusher.handing, "held": held, "heavy": heavy,
                      "helper": run._helper.process.pid if run._helper else -1,
                      "store_process": getattr(getattr(run._store, "process", None), "pid", -1),
                      "not_other": sorted(policies - {os.SCHED_OTHER})}), flush=True)
    sys.stdin.readline()  # the test looks, or kills the helper, then says go
    for i in range(n, 2 * n):
        run.log({"loss": 1.0 / (i + 1)}, step=i)
        if i % 250 == 0:
            time.sleep(0.1)  # flush ticks pass: a new helper gets requests mid-run
    print("handing" if run._flusher.handing else "taken back", flush=True)
    run.finish()
    print("finished", flush=True)
    """
)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def _start(
    store: str, spool: Path, n: int, interval: float, **env: str
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _TRAINER, store, str(n), str(interval)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(LAUNCHHELM_SPOOL=str(spool), LAUNCHHELM_HELPER_FLUSH="1", **env),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        raise AssertionError(f"the trainer did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc, json.loads(line)


def _go(proc: subprocess.Popen[str]) -> str:
    """Let the trainer log its second half and finish; its stderr."""
    out, err = proc.communicate("go\n", timeout=180)
    assert proc.returncode == 0, err
    assert out.split() == ["handing", "finished"], (out, err)  # a helper wrote the chunks to the end
    return err


@pytest.mark.parametrize(
    "backend",
    ["local", pytest.param("s3", marks=pytest.mark.slow), pytest.param("s3-store-process", marks=pytest.mark.slow)],
)
def test_the_helper_writes_the_chunks_and_the_trainer_holds_no_point_and_no_pyarrow(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url(backend.split("-")[0], tmp_path, request)
    spool = tmp_path / "spool"
    n = 5_000
    # s3-store-process: the store's client in a process of its own (LAUNCHHELM_HELPER_STORE=1, docs/storage.md)
    through = {"LAUNCHHELM_HELPER_STORE": "1"} if backend == "s3-store-process" else {}
    proc, seen = _start(store, spool, n, 1.0, **through)
    try:
        assert seen["handing"] is True, seen
        assert seen["held"] == 0, "the training process kept points in memory"
        # it encodes no chunk, so the encoder's modules (numpy's 16 MiB too) never load; the store's own
        # client does on S3, unless a process of its own holds it
        assert not {"pyarrow", "pandas", "numpy"} & set(seen["heavy"]), seen  # type: ignore[arg-type]
        # with the store's client out of the process, the session's helper serves the store: one process
        if through:
            assert seen["store_process"] == seen["helper"], seen
        else:
            assert seen["store_process"] == -1, seen
        if backend != "s3":
            assert seen["heavy"] == [], seen
        assert seen["not_other"] == [], "a thread of the training process left the default scheduling policy"
        handle = lh.Api(store).run(str(seen["id"]))
        assert handle.history()["step"].tolist() == list(range(n))  # flush() returned once they were stored
        _go(proc)
    finally:
        proc.kill()
        proc.wait()
    frame = lh.Api(store).run(str(seen["id"])).history()
    assert frame["step"].tolist() == list(range(2 * n))  # each point once
    assert frame["loss"].tolist() == [1.0 / (i + 1) for i in range(2 * n)]
    assert int(frame["acc"].count()) == n
    assert lh.Api(store).run(str(seen["id"])).summary()["metric.loss"] == 1.0 / (2 * n)  # the latest, summed up
    assert not (spool / str(seen["id"])).exists(), "the spool was left behind"
    deadline = time.monotonic() + 10
    while _running(int(seen["helper"])) or _running(int(seen["store_process"])):  # type: ignore[call-overload]
        assert time.monotonic() < deadline, "the helper or the store's process outlived its session"
        time.sleep(0.05)


def _leaves_the_encoder_to_the_helper(script: str, tmp_path: Path, **env: str) -> None:
    """Run ``script`` (it logs losses 0..999 and prints what it imported): its helper stored them all,
    and it loaded neither pyarrow nor pandas."""
    store = str(tmp_path / "store")
    done = subprocess.run(
        [sys.executable, "-c", script, store],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(LAUNCHHELM_SPOOL=str(tmp_path / "spool"), **env),
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["handing"] is True and seen["heavy"] == [], seen
    assert lh.Api(store).run(seen["id"]).history()["loss"].tolist() == [float(i) for i in range(1000)]


def test_a_flush_right_after_init_waits_for_the_helper_instead_of_writing_here(tmp_path: Path) -> None:
    # init returns before its helper runs: the first flush() must not load the encoder in this process
    script = textwrap.dedent(
        """
        import json, sys
        import launchhelm as lh
        run = lh.init("hflush", store=sys.argv[1], capture_console=False, system_metrics=False)
        for i in range(1000):
            run.log({"loss": float(i)}, step=i)
        run.flush()
        heavy = [m for m in ("pyarrow", "pandas") if m in sys.modules]
        print(json.dumps({"id": run.id, "heavy": heavy, "handing": run._flusher.handing}))
        run.finish()
        """
    )
    _leaves_the_encoder_to_the_helper(script, tmp_path, LAUNCHHELM_HELPER_FLUSH="1")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_killed_helper_s_replacement_goes_on_from_the_spool_s_state_and_nothing_is_stored_twice(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url(backend, tmp_path, request)
    spool = tmp_path / "spool"
    n = 4_000
    proc, seen = _start(store, spool, n, 0.3)
    try:
        helper = int(seen["helper"])  # type: ignore[call-overload]
        os.kill(helper, signal.SIGKILL)
        err = _go(proc)
    finally:
        proc.kill()
        proc.wait()
    frame = lh.Api(store).run(str(seen["id"])).history()
    assert frame["step"].tolist() == list(range(2 * n))  # none lost, none stored twice
    lines = [line for line in err.splitlines() if "helper process" in line]
    assert len(lines) == 1 and f"(pid {helper}) was killed by SIGKILL" in lines[0], err
    assert "takes over" in lines[0]


def _handing(store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> lh.Run:
    """A run in this process whose helper took the points (flushes only when asked)."""
    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(tmp_path / "spool"))
    run = lh.init("hflush", store=store, flush_interval=3600, capture_console=False, system_metrics=False)
    deadline = time.monotonic() + 60
    while not run._flusher.handing:
        assert time.monotonic() < deadline, "the helper never took the points"
        time.sleep(0.01)
    return run


def test_finish_stores_the_points_itself_when_its_helper_died_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHHELM_HELPER_FLUSH", "1")
    store = str(tmp_path / "store")
    run = _handing(store, tmp_path, monkeypatch)
    for i in range(1_000):
        run.log({"x": float(i)}, step=i)
    run.flush()  # stored by the helper: the state file says so, and the next write starts after them
    for i in range(1_000, 3_000):
        run.log({"x": float(i)}, step=i)
    assert run._helper is not None
    helper = run._helper.process
    helper.kill()
    helper.wait(30)
    run.finish()  # its background thread is stopped first: no replacement comes, so it writes them here
    frame = lh.Api(store).run(run.id).history()
    assert frame["step"].tolist() == list(range(3_000))
    assert frame["x"].tolist() == [float(i) for i in range(3_000)]


def test_a_session_ending_before_its_helper_is_ready_stores_its_points_itself_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a short script: waiting for the helper's imports would cost more than the encoding here
    from launchhelm._runlog._watchdog import READY_SLOT

    store = str(tmp_path / "store")
    run = _handing(store, tmp_path, monkeypatch)
    assert run._helper is not None
    helper = run._helper.process
    os.kill(helper.pid, signal.SIGSTOP)  # a helper still importing: it reads nothing meanwhile
    try:
        run._beacon.slots[READY_SLOT] = 0  # where it was quicker than this test: not ready, as at its start
        for i in range(2_000):
            run.log({"x": float(i)}, step=i)
        run.finish()
        assert run._flusher.handing is False  # taken back: this process wrote them
    finally:
        os.kill(helper.pid, signal.SIGCONT)
    helper.wait(30)  # it sees the clean end and exits without a request to store
    frame = lh.Api(store).run(run.id).history()
    assert frame["step"].tolist() == list(range(2_000))  # each point once
    assert frame["x"].tolist() == [float(i) for i in range(2_000)]


def test_finish_with_a_ready_helper_and_nothing_sent_yet_loads_no_encoder_here(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, sys, time
        import launchhelm as lh
        from launchhelm._runlog._watchdog import READY_SLOT
        run = lh.init("hflush", store=sys.argv[1], flush_interval=3600, capture_console=False,
                      system_metrics=False)
        deadline = time.monotonic() + 60
        while not run._beacon.slots[READY_SLOT] and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in range(1000):
            run.log({"loss": float(i)}, step=i)
        run.finish()
        heavy = [m for m in ("pyarrow", "pandas") if m in sys.modules]
        print(json.dumps({"id": run.id, "heavy": heavy, "handing": run._flusher.handing}))
        """
    )
    _leaves_the_encoder_to_the_helper(script, tmp_path)


def test_requests_that_came_with_the_config_in_one_read_are_kept_in_order() -> None:
    read, write = os.pipe()
    try:
        os.write(write, b'{"config": 1}\n{"flush": [0, 8], "seq": 1}\n{"flush": [1, 40], "se')
        line, rest = _first_line(read)
    finally:
        os.close(read)
        os.close(write)
    assert json.loads(line) == {"config": 1}
    got: list[dict[str, object]] = []
    watch = ParentWatch(os.getpid(), got.append, rest)
    assert got == [{"flush": [0, 8], "seq": 1}]
    watch._take(b'q": 2}\nnot json\n')
    assert got == [{"flush": [0, 8], "seq": 1}, {"flush": [1, 40], "seq": 2}]
