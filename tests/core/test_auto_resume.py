"""``auto_resume``: the first launch of a job creates its run, every relaunch reopens it, a newer attempt fences
the one before. Launches are played in this process with the scheduler's environment (SLURM's, torchelastic's);
the zombie of a relaunch is a real process frozen with SIGSTOP. Real schedulers: tests/torch/test_relaunch.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lhtest import make_store_url, run_python, spawn

import launchhelm as lh
from launchhelm._runlog._launch import auto_run_id, launch_identity

SCHEDULER_VARS = (
    "LAUNCHHELM_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_CLUSTER_NAME",
    "SLURM_RESTART_COUNT",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "KUBERNETES_SERVICE_HOST",
    "LAUNCHHELM_K8S_JOB",
    "SKYPILOT_TASK_ID",
)


@pytest.fixture(autouse=True)
def _no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test plays the scheduler it names, and no other (the CI machine may run under one)."""
    for name in SCHEDULER_VARS:
        monkeypatch.delenv(name, raising=False)


def _slurm(monkeypatch: pytest.MonkeyPatch, job: str, restart: int, cluster: str = "lab") -> None:
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURM_CLUSTER_NAME", cluster)
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))


def _quiet(**extra: object) -> dict[str, object]:
    return {"system_metrics": False, "capture_console": False, **extra}


def test_the_first_launch_creates_the_run_and_each_relaunch_reopens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    _slurm(monkeypatch, "4242", 0)
    first = lh.init("jobs", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
    assert not first.resumed
    first.global_step = 7
    first.log({"loss": 1.0})
    first.finish(close_run=False)
    _slurm(monkeypatch, "4242", 1)  # SLURM requeued the job: same id, restart count + 1
    second = lh.init("jobs", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
    assert second.id == first.id and second.resumed
    assert second.global_step == 7  # the furthest step reached: "resume" then rewinds from there
    second.finish()
    attempts = lh.Api(store).run(first.id).attempts()
    assert [a.session for a in attempts] == [first.session_id, second.session_id]
    assert [a.ending for a in attempts] == ["finished", "finished"]
    expected = {"scheduler": "slurm", "job": "lab/4242", "restart": [0, 0], "instance": os.uname()[1]}
    assert attempts[0].launcher == expected
    assert attempts[1].launcher is not None and attempts[1].launcher["restart"] == [1, 0]
    assert attempts[0].last_step == 7 and attempts[1].first_step == 7
    shown = subprocess.run(
        [sys.executable, "-c", "import sys; from launchhelm._cli import main; sys.exit(main())",
         "--store", store, "show", first.id],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = shown[shown.index("attempts:") :].splitlines()
    assert "slurm job lab/4242 (restart 0)" in lines[1] and "finished at step 7; relaunched" in lines[1]
    assert "slurm job lab/4242 (restart 1)" in lines[2] and "finished at step 7" in lines[2]


def test_two_jobs_never_share_a_run_and_one_job_id_on_two_clusters_gives_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    ids = []
    for cluster, job in (("lab", "1"), ("lab", "2"), ("cloud", "1")):
        _slurm(monkeypatch, job, 0, cluster)
        run = lh.init("jobs", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
        ids.append(run.id)
        run.finish(close_run=False)
    assert len(set(ids)) == 3
    # and two projects with the same job: two runs too
    _slurm(monkeypatch, "1", 0, "lab")
    assert auto_run_id("other", launch_identity()) != ids[0]  # type: ignore[arg-type]


def test_without_an_identity_each_launch_is_a_new_run_and_one_line_says_how(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = str(tmp_path / "store")
    with caplog.at_level("WARNING", logger="launchhelm"):
        a = lh.init("laptop", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
        a.finish(close_run=False)
        b = lh.init("laptop", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
        b.finish()
    assert a.id != b.id
    lines = [r.getMessage() for r in caplog.records if "auto_resume found no job identity" in r.getMessage()]
    assert len(lines) == 2 and "LAUNCHHELM_RUN_ID" in lines[0]


def test_an_explicit_identity_is_the_id_when_it_is_one_and_hashed_when_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    a = lh.init("p", store=store, run_id="exp42", auto_resume=True, **_quiet())  # type: ignore[arg-type]
    assert a.id == "exp42"
    a.finish(close_run=False)
    b = lh.init("p", store=store, run_id="exp-42", auto_resume=True, **_quiet())  # type: ignore[arg-type]
    assert b.id.startswith("j") and len(b.id) == 20
    b.finish(close_run=False)
    monkeypatch.setenv("LAUNCHHELM_RUN_ID", "exp-42")
    c = lh.init("p", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
    assert c.id == b.id and c.resumed
    c.finish()


def _listing(store: str) -> list[str]:
    root = Path(store)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_bad_input_is_refused_before_anything_is_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = str(tmp_path / "store")
    with pytest.raises(lh.InvalidArgumentError, match="auto_resume=True finds the run"):
        lh.init("p", store=store, resume="abcd1234", auto_resume=True)  # type: ignore[arg-type]
    with pytest.raises(lh.InvalidTypeError, match="auto_resume"):
        lh.init("p", store=store, auto_resume="yes")  # type: ignore[arg-type]
    assert _listing(store) == []
    # the identity names a run of another project: refused, nothing stored for it
    first = lh.init("p", store=store, run_id="shared1", auto_resume=True, **_quiet())  # type: ignore[arg-type]
    first.finish(close_run=False)
    before = _listing(store)
    with pytest.raises(lh.RunIdentityError, match="belongs to project 'p'") as caught:
        lh.init("q", store=store, run_id="shared1", auto_resume=True, **_quiet())  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert _listing(store) == before


def test_an_identity_reused_by_another_script_is_refused_not_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    _slurm(monkeypatch, "77", 0)
    monkeypatch.setattr(sys, "argv", ["train.py", "--lr", "1e-3"])
    run = lh.init("p", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
    run.finish(close_run=False)
    monkeypatch.setattr(sys, "argv", ["train.py", "--lr", "1e-4"])  # other flags: the same job
    again = lh.init("p", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
    assert again.id == run.id
    again.finish(close_run=False)
    before = _listing(store)
    monkeypatch.setattr(sys, "argv", ["evaluate.py"])
    with pytest.raises(lh.RunIdentityError, match=r"created by 'train\.py'.*runs 'evaluate\.py'"):
        lh.init("p", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
    assert _listing(store) == before
    # a run made by plain init under an id the scheduler's identity now hashes to is not the job's
    monkeypatch.setattr(sys, "argv", ["train.py"])
    _slurm(monkeypatch, "78", 0)
    target = auto_run_id("p", launch_identity())  # type: ignore[arg-type]
    lh.init("p", store=store, run_id=target, **_quiet()).finish(close_run=False)  # type: ignore[arg-type]
    with pytest.raises(lh.RunIdentityError, match="was not created by a launch"):
        lh.init("p", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]


#: Every backend; the object stores' cases are slow ones (the full suite's, not --quick's).
BACKENDS = [
    "local",
    pytest.param("s3", marks=pytest.mark.slow),
    pytest.param("gcs", marks=pytest.mark.slow),
    pytest.param("azure", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_newer_attempt_takes_over_a_live_looking_session_at_once_and_fences_it(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fence is put-if-absent plus list-after-write, which each object store gives: it holds on all of them."""
    store = make_store_url(backend, tmp_path, request)
    _slurm(monkeypatch, "9", 0)
    old = lh.init("p", store=store, auto_resume=True, **_quiet(control_interval=0.2))  # type: ignore[arg-type]
    old.global_step = 3
    old.log({"loss": 3.0})
    old.flush()
    # the same attempt again while the first lives: two copies of one launch, refused as before
    with pytest.raises(lh.RunInUseError):
        lh.init("p", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
    _slurm(monkeypatch, "9", 1)
    started = time.monotonic()
    new = lh.init("p", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
    assert time.monotonic() - started < 10  # no heartbeat timeout to wait out, no takeover=True
    assert new.id == old.id
    deadline = time.monotonic() + 10
    with pytest.raises(lh.RunFencedError, match="replaced by a newer attempt") as caught:
        while time.monotonic() < deadline:
            old.global_step += 1
            old.log({"loss": 99.0})
            time.sleep(0.05)
    assert caught.value.session_id == new.session_id and isinstance(caught.value, RuntimeError)
    with pytest.raises(lh.RunFencedError):
        old.finish()
    new.global_step = 3
    new.log({"loss": 4.0})
    new.finish()
    handle = lh.Api(store).run(new.id)
    assert 99.0 not in set(handle.history()["loss"])
    attempts = handle.attempts()
    assert [a.ending for a in attempts] == ["fenced", "finished"]
    assert new.session_id in (attempts[0].detail or "")


FROZEN_SCRIPT = """
import os, sys, time
import launchhelm as lh
run = lh.init("p", store=sys.argv[1], auto_resume=True, system_metrics=False, capture_console=False,
              flush_interval=0.2, control_interval=0.5)
print("started", run.id, run.session_id, flush=True)
step = 0
try:
    while True:
        step += 1
        run.global_step = step
        run.log({"loss": float(step), "from_zombie": 1.0 if os.path.exists(sys.argv[2]) else 0.0})
        time.sleep(0.02)
except lh.RunFencedError as exc:
    print("fenced", exc.session_id, flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_frozen_session_resumed_after_its_relaunch_adds_nothing_and_exits_fenced(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP freezes the first attempt mid-training (a node cut off); the relaunch trains; SIGCONT: the
    zombie's first act is to find the fence, and nothing it logged after it reaches the run."""
    store = make_store_url(backend, tmp_path, request)
    woke = tmp_path / "woke"
    env = {"SLURM_JOB_ID": "31", "SLURM_CLUSTER_NAME": "lab", "SLURM_RESTART_COUNT": "0"}
    zombie = spawn(FROZEN_SCRIPT, store, str(woke), **env)
    try:
        assert zombie.stdout is not None
        line = zombie.stdout.readline().split()
        assert line[:1] == ["started"], zombie.stderr.read() if zombie.stderr else ""
        run_id = line[1]
        time.sleep(1.5)  # it logs and flushes
        os.kill(zombie.pid, signal.SIGSTOP)
        woke.touch()  # every point it logs from now on says so
        _slurm(monkeypatch, "31", 1)
        monkeypatch.setattr(sys, "argv", ["-c"])  # the same script as the child's (python -c)
        relaunch = lh.init("p", store=store, auto_resume=True, **_quiet())  # type: ignore[arg-type]
        assert relaunch.id == run_id
        relaunch.global_step = 1
        relaunch.log({"loss": -1.0, "from_zombie": 0.0})
        relaunch.flush()
        os.kill(zombie.pid, signal.SIGCONT)
        out, err = zombie.communicate(timeout=60)
        assert zombie.returncode == 3, err[-3000:]
        assert f"fenced {relaunch.session_id}" in out
        relaunch.global_step = 2
        relaunch.log({"loss": -2.0, "from_zombie": 0.0})
        relaunch.finish()
    finally:
        if zombie.poll() is None:
            os.kill(zombie.pid, signal.SIGCONT)
            zombie.kill()
            zombie.wait()
    handle = lh.Api(store).run(run_id)
    history = handle.history()
    assert (history["from_zombie"] == 1.0).sum() == 0, "a point logged after the fence reached the run"
    assert {-1.0, -2.0} <= set(history["loss"])
    assert [a.ending for a in handle.attempts()] == ["fenced", "finished"]
    assert json.loads(json.dumps([a.launcher for a in handle.attempts()]))[1]["restart"] == [1, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_readers_drop_what_a_fenced_session_stored_past_its_watermark(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The fence's objects: a chunk, console part or media index chunk past the watermark (an upload in flight while the
    relaunch listed, or `launchhelm recover` on the frozen host later) is never read, compacted or shown."""
    from launchhelm._runlog._runinfo import session_watermark
    from launchhelm.media._index import encode_index, merge_tables
    from launchhelm.storage import open_store
    from launchhelm.storage._keys import (
        console_key,
        console_prefix,
        fence_name,
        media_index_key,
        media_index_prefix,
        metrics_prefix,
    )

    store_url = make_store_url(backend, tmp_path, request)
    killed = run_python(  # three chunks, then SIGKILL: no compaction at the end merges them
        """
        import os, signal, sys
        import launchhelm as lh
        import numpy as np
        run = lh.init("p", store=sys.argv[1], system_metrics=False, capture_console=False)
        for step in range(3):
            run.global_step = step
            run.log({"loss": float(step), "sample": lh.Image(np.full((4, 4, 3), step, np.uint8))})
            run.flush()
        print(run.id, run.session_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        store_url,
        LAUNCHHELM_SPOOL="off",  # no helper: the session numbers its own media index chunks 0, 1, 2
    )
    run_id, session = killed.stdout.split()
    store = open_store(store_url)
    chunks = [n for n in store.list(f"{metrics_prefix(run_id)}/{session}") if n.endswith(".arrow")]
    assert len(chunks) == 3
    for n, text in enumerate(["before\n", "also before\n", "after the fence\n"]):
        store.put(console_key(run_id, session, 100 + n), text.encode())
    index = sorted(store.list(f"{media_index_prefix(run_id)}/{session}"))
    assert len(index) == 3  # one index chunk per flush
    # a merge of all three that landed after the fence (in flight while the relaunch listed)
    merged = encode_index(merge_tables([store.read(f"{media_index_prefix(run_id)}/{session}/{n}") for n in index]))
    store.put(media_index_key(run_id, session, 0, 2), merged)
    assert session_watermark(store, run_id, session) == {"metrics": 2, "console": 102, "media": 2}
    store.create(f"{metrics_prefix(run_id)}/{fence_name(session, 1)}", b"{}")  # chunk 0 admitted
    store.create(f"{media_index_prefix(run_id)}/{fence_name(session, 1)}", b"{}")
    store.create(f"{console_prefix(run_id)}/{fence_name(session, 102)}", b"{}")
    handle = lh.Api(store_url).run(run_id)
    assert list(handle.history()["loss"]) == [0.0]
    assert [(item.step, int(item.load()[0, 0, 0])) for item in handle.media("sample")] == [(0, 0)]
    console = handle.console()
    assert "also before" in console and "after the fence" not in console
