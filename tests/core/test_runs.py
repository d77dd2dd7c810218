"""Runs and sessions: init, finish, resume, and the status a person sees.

Crashes here are real: a real training process killed with SIGKILL, a
process in another PID namespace standing in for another host.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import time

import pandas as pd
import pytest
from lhtest import run_python, spawn

import launchhelm as lh
from launchhelm._runlog import _liveness

TRAIN = """
import sys, time, launchhelm as lh
url = sys.argv[1]
run = lh.init("crash", store=url, config={"lr": 0.1}, heartbeat_interval=float(sys.argv[2]),
              heartbeat_timeout=float(sys.argv[3]), flush_interval=0.2)
for step in range(1, 41):
    run.global_step = step
    run.log({"loss": 1.0 / step})
run.flush()
print(run.id, flush=True)
print("ready", flush=True)
time.sleep(600)
"""


def _start_training(url: str, beat: float = 1.0, timeout: float = 60.0, prefix: list[str] | None = None):  # type: ignore[no-untyped-def]
    proc = spawn(TRAIN, url, str(beat), str(timeout), prefix=prefix)
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    ready = proc.stdout.readline().strip()
    if ready != "ready":
        proc.kill()
        raise AssertionError(f"training process failed: {run_id} {ready} {proc.stderr.read() if proc.stderr else ''}")
    return proc, run_id


def test_a_new_run_is_listed_with_its_identity_and_config(store_url: str) -> None:
    run = lh.init("lifecycle", name="first try", config={"lr": 3e-4, "layers": [2, 3]}, store=store_url)
    assert run.project == "lifecycle" and run.name == "first try" and len(run.id) == 8
    assert dict(run.config) == {"lr": 3e-4, "layers": [2, 3]}
    with pytest.raises(TypeError):
        run.config["lr"] = 1  # type: ignore[index]
    api = lh.Api(store_url)
    assert api.projects() == ["lifecycle"]
    assert api.run(run.id).status == "running"
    runs = api.runs("lifecycle")
    columns = ["id", "name", "status", "step", "created", "last_heartbeat", "sessions", "rewinds", "restarts"]
    assert runs.columns.tolist() == [*columns, "config.layers", "config.lr"]  # then config values (and metrics)
    assert runs.loc[0, "id"] == run.id and runs.loc[0, "status"] == "running"
    run.global_step = 12
    run.finish()
    assert api.run(run.id).status == "closed"
    assert api.run(run.id).config == {"lr": 3e-4, "layers": [2, 3]}
    assert api.runs("lifecycle").loc[0, "step"] == 12
    assert api.runs("nothing-here").empty


def test_runs_are_listed_newest_first(store_url: str) -> None:
    ids = []
    for _ in range(3):
        run = lh.init("order", store=store_url)
        run.finish()
        ids.append(run.id)
        time.sleep(0.01)
    assert lh.Api(store_url).runs("order")["id"].tolist() == ids[::-1]
    assert sorted(lh.Api(store_url).run_ids("order")) == sorted(ids)


def test_bad_arguments_to_init_are_refused_before_anything_is_stored(store_url: str) -> None:
    with pytest.raises(ValueError, match="invalid project name"):
        lh.init("no/slashes", store=store_url)
    with pytest.raises(TypeError, match=r"config\['path'\] is a PosixPath"):
        lh.init("p", config={"path": __import__("pathlib").Path("/x")}, store=store_url)
    with pytest.raises(ValueError, match=r"config\['lr'\] is nan"):
        lh.init("p", config={"lr": float("nan")}, store=store_url)
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        lh.init("p", heartbeat_interval=5, heartbeat_timeout=2, store=store_url)
    assert lh.Api(store_url).projects() == []


def test_finish_closes_for_good_and_logging_after_it_is_refused(store_url: str) -> None:
    run = lh.init("lifecycle", store=store_url)
    run.log({"x": 1.0})
    run.finish()
    run.finish()  # a second finish is harmless
    with pytest.raises(lh.RunFinishedError, match="resume"):
        run.log({"x": 2.0})
    with pytest.raises(lh.RunClosedError, match=f"run {run.id} is closed: finish\\(\\) was called at"):
        lh.init("lifecycle", resume=run.id, store=store_url)
    events = lh.Api(store_url).run(run.id).events()
    assert [e["type"] for e in events] == ["session_started", "session_ended"]
    assert events[1]["close_run"] is True and events[1]["reason"] == "finish"


def test_finish_close_run_false_keeps_the_run_resumable(store_url: str) -> None:
    run = lh.init("lifecycle", store=store_url)
    for s in range(1, 31):
        run.global_step = s
        run.log({"loss": 1.0 / s})
    run.finish(close_run=False)
    handle = lh.Api(store_url).run(run.id)
    assert handle.status == "resumable" and handle.step == 30
    again = lh.init("lifecycle", resume=run.id, store=store_url)
    assert again.id == run.id and again.resumed and again.global_step == 30
    assert handle.status == "running"
    started = [e for e in handle.events() if e["type"] == "session_started"]
    assert [e["resumed"] for e in started] == [False, True]
    assert started[1]["step"] == 30 and started[1]["replaces"] is None
    again.finish()
    assert handle.status == "closed"


def test_resume_refuses_unknown_ids_other_projects_and_live_sessions(store_url: str) -> None:
    with pytest.raises(lh.RunNotFoundError, match="no run 'zzzzzzzz'") as info:
        lh.init("lifecycle", resume="zzzzzzzz", store=store_url)
    assert isinstance(info.value, KeyError) and info.value.run_id == "zzzzzzzz"
    with pytest.raises(ValueError, match="invalid run id"):
        lh.init("lifecycle", resume="../../etc", store=store_url)
    run = lh.init("lifecycle", store=store_url)
    with pytest.raises(ValueError, match="belongs to project 'lifecycle'"):
        lh.init("other", resume=run.id, store=store_url)
    with pytest.raises(lh.RunInUseError, match="takeover=True") as in_use:
        lh.init("lifecycle", resume=run.id, store=store_url)
    assert in_use.value.session_id == run.session_id
    run.log({"x": 1.0})  # the live session is untouched
    run.finish()
    assert lh.Api(store_url).run(run.id).history()["x"].tolist() == [1.0]


def test_context_manager_finishes_or_keeps_open_on_error(store_url: str) -> None:
    with lh.init("ctx", store=store_url) as run:
        run.log({"x": 1.0})
    assert lh.Api(store_url).run(run.id).status == "closed"
    with pytest.raises(RuntimeError), lh.init("ctx", store=store_url) as failing:
        failing.log({"x": 1.0})
        raise RuntimeError("diverged")
    handle = lh.Api(store_url).run(failing.id)
    assert handle.status == "resumable"
    assert handle.events()[-1]["reason"] == "exception: RuntimeError: diverged"


@pytest.mark.slow
def test_a_sigkilled_run_reads_stopped_and_resumes_at_once(shared_store_url: str) -> None:
    # heartbeat timeout of 60 s: only the same-host process check can allow this resume
    proc, run_id = _start_training(shared_store_url, beat=1.0, timeout=60.0)
    handle = lh.Api(shared_store_url).run(run_id)
    assert handle.status == "running"
    with pytest.raises(lh.RunInUseError, match=f"pid {proc.pid}"):
        lh.init("crash", resume=run_id, store=shared_store_url)
    proc.send_signal(signal.SIGKILL)
    # not reaped yet: a zombie, as a supervisor that has not called wait() sees it
    time.sleep(0.2)
    assert handle.status == "stopped"
    started = time.monotonic()
    resumed = lh.init("crash", resume=run_id, store=shared_store_url)
    assert time.monotonic() - started < 10
    proc.wait()
    assert resumed.global_step == 40
    events = handle.events()
    first, start_event = [e for e in events if e["type"] == "session_started"][-2:]
    ended = [e for e in events if e["type"] == "session_ended" and e.get("session") == first["session"]]
    # the killed session is replaced as gone, or its helper (which drains a killed process at once) ended
    # it first: on a slow store the resume can come second
    assert (start_event["replaces"] or {}).get("reason") == "process gone" or ended, events
    assert handle.history()["loss"].tolist() == pytest.approx([1.0 / s for s in range(1, 41)])
    resumed.finish(close_run=False)
    assert handle.status == "resumable"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_a_session_on_another_host_is_dead_only_once_its_heartbeat_is_stale(shared_store_url: str) -> None:
    # A process in its own PID namespace has another host identity: only its
    # heartbeat can tell whether it is alive.
    prefix = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.fail(f"unshare --pid does not work here: {probe.stderr!r}")
    # timeout: the resume below must read the heartbeat while it is fresh, after its own init's start
    # (on an object store, a helper process that serves the store: about a second on a busy machine)
    proc, run_id = _start_training(shared_store_url, beat=0.2, timeout=6.0, prefix=prefix)
    handle = lh.Api(shared_store_url).run(run_id)
    session = [e for e in handle.events() if e["type"] == "session_started"][-1]
    assert session["process"]["host_id"] != _liveness.host_id()
    assert handle.status == "running"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.time()
    # process gone, but from here it is another host: its heartbeat is still fresh
    with pytest.raises(lh.RunInUseError, match="heartbeat fresh"):
        lh.init("crash", resume=run_id, store=shared_store_url)
    assert handle.status == "running"
    while time.time() - killed < 6.6:
        time.sleep(0.1)
    assert handle.status == "stopped"
    resumed = lh.init("crash", resume=run_id, store=shared_store_url)
    start_event = [e for e in handle.events() if e["type"] == "session_started"][-1]
    assert start_event["replaces"]["reason"] == "heartbeat stale"
    resumed.finish(close_run=False)


@pytest.mark.slow
def test_takeover_resumes_a_run_whose_session_looks_alive(shared_store_url: str) -> None:
    proc, run_id = _start_training(shared_store_url)
    try:
        taken = lh.init("crash", resume=run_id, store=shared_store_url, takeover=True)
        event = [e for e in lh.Api(shared_store_url).run(run_id).events() if e["type"] == "session_started"][-1]
        assert event["replaces"]["reason"] == "takeover"
        taken.finish(close_run=False)
    finally:
        proc.kill()
        proc.wait()


def _resume_racer(url: str, run_id: str, barrier: object, queue: object, decided: object) -> None:
    barrier.wait(timeout=60)  # type: ignore[attr-defined]
    try:
        run = lh.init("race", resume=run_id, store=url)
        queue.put(("won", run.session_id))  # type: ignore[attr-defined]
        # alive until every racer has decided: a resume that comes after this session ended may win, rightly
        # (on a loaded machine one came more than 2 s late)
        decided.wait(120)  # type: ignore[attr-defined]
        run.finish(close_run=False)
    except lh.RunInUseError as exc:
        queue.put(("refused", str(exc)))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_concurrent_resumes_of_one_run_admit_exactly_one(shared_store_url: str) -> None:
    run = lh.init("race", store=shared_store_url)
    run.finish(close_run=False)
    ctx = multiprocessing.get_context("spawn")
    barrier, queue, decided = ctx.Barrier(4), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_resume_racer, args=(shared_store_url, run.id, barrier, queue, decided)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    try:
        outcomes = [queue.get(timeout=120) for _ in procs]
    finally:
        decided.set()
    for p in procs:
        p.join(60)
    assert sorted(o[0] for o in outcomes) == ["refused", "refused", "refused", "won"], outcomes
    started = [e for e in lh.Api(shared_store_url).run(run.id).events() if e["type"] == "session_started"]
    assert len(started) == 2


@pytest.mark.slow
def test_points_are_flushed_in_the_background_while_the_run_lives(shared_store_url: str) -> None:
    code = """
    import sys, time, launchhelm as lh
    run = lh.init("bg", store=sys.argv[1], flush_interval=0.3)
    for s in range(1, 11):
        run.log({"x": float(s)}, step=s)
    print(run.id, flush=True)
    time.sleep(120)
    """
    proc = spawn(code, shared_store_url)
    try:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        handle = lh.Api(shared_store_url).run(run_id)
        # the helper's start (its imports: about 1.5 CPU-s) comes first; a loaded 2-core machine gave
        # it a quarter of a core (7 s), so the wait is generous: what counts is that the process lives
        deadline = time.monotonic() + 60
        while len(handle.history()) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert handle.history()["x"].tolist() == [float(s) for s in range(1, 11)]
        assert proc.poll() is None and handle.status == "running"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_interpreter_exit_flushes_and_ends_the_session_keeping_the_run_open(shared_store_url: str) -> None:
    done = run_python(
        """
        import sys, launchhelm as lh
        run = lh.init("exit", store=sys.argv[1], flush_interval=60)
        for s in range(100):
            run.log({"x": float(s)}, step=s)
        print(run.id)
        """,
        shared_store_url,
    )
    assert done.returncode == 0, done.stderr
    handle = lh.Api(shared_store_url).run(done.stdout.strip())
    assert len(handle.history()) == 100
    assert handle.status == "resumable"
    assert handle.events()[-1]["reason"] == "exit"
    crashed = run_python(
        """
        import sys, launchhelm as lh
        run = lh.init("exit", store=sys.argv[1], flush_interval=60)
        run.log({"x": 1.0}, step=1)
        print(run.id, flush=True)
        raise ValueError("loss is nan")
        """,
        shared_store_url,
    )
    assert crashed.returncode == 1 and "loss is nan" in crashed.stderr
    handle = lh.Api(shared_store_url).run(crashed.stdout.strip())
    assert handle.status == "resumable" and len(handle.history()) == 1
    assert handle.events()[-1]["reason"] == "exception: ValueError: loss is nan"


def test_heartbeats_advance_and_carry_the_step(store_url: str) -> None:
    run = lh.init("beat", store=store_url, heartbeat_interval=0.1, heartbeat_timeout=5)
    handle = lh.Api(store_url).run(run.id)
    first = handle.last_heartbeat
    run.global_step = 77
    time.sleep(0.5)
    assert handle.last_heartbeat is not None and first is not None and handle.last_heartbeat > first
    beat = json.loads(run.store.read(f"runs/{run.id}/sessions/{run.session_id}.json"))
    assert beat["step"] == 77
    summary = handle.summary()
    assert isinstance(summary["last_heartbeat"], pd.Timestamp) and summary["step"] == 77
    run.finish()


def test_heartbeat_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAUNCHHELM_HEARTBEAT_INTERVAL", "0.5")
    monkeypatch.setenv("LAUNCHHELM_HEARTBEAT_TIMEOUT", "7")
    run = lh.init("env", store="memory://lh-env-beat")
    event = lh.Api("memory://lh-env-beat").run(run.id).events()[0]
    assert event["heartbeat_interval"] == 0.5 and event["heartbeat_timeout"] == 7.0
    run.finish()
    monkeypatch.setenv("LAUNCHHELM_HEARTBEAT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="LAUNCHHELM_HEARTBEAT_TIMEOUT='soon' is not a number"):
        lh.init("env", store="memory://lh-env-beat")


def test_pid_reuse_is_not_mistaken_for_the_session(store_url: str) -> None:
    # a session whose recorded process start time differs from the live pid's
    run = lh.init("reuse", store=store_url)
    run.finish(close_run=False)
    identity = _liveness.process_identity()
    assert _liveness.process_state(identity) == "alive"
    assert _liveness.process_state({**identity, "proc_start": "1"}) == "dead"
    assert _liveness.process_state({**identity, "pid": 2**22 + 7}) == "dead"
    assert _liveness.process_state({**identity, "host_id": "elsewhere"}) == "unknown"
    assert os.getpid() == identity["pid"]
