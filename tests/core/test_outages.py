"""Outages of the store: said in one line each way, nothing lost, nothing half-published, nothing hung.

moto S3 sits behind a proxy on 127.0.0.1 (``tests/http_proxy.py``) that can
refuse connections (the service is down) or take them and never answer (a
partition, a hung load balancer). The training loop runs in a real child
process, so what its user would read on stderr is what the test reads.
"""

from __future__ import annotations

import json
import secrets
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_proxy import BLACKHOLE, REFUSE, RequestCounter
from lhtest import BUCKET, child_env

import launchhelm as lh

#: What a user must never read: a third party's traceback or asyncio's noise.
_FOREIGN = ("Traceback", "never retrieved", "Unclosed", "Exception in thread", "aiohttp", "botocore")


def _outage(proxy: RequestCounter, mode: str) -> None:
    proxy.refuse() if mode == REFUSE else proxy.blackhole()


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[RequestCounter]:
    counter = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    try:
        yield counter
    finally:
        counter.close()


def _options(proxy: RequestCounter) -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}}


# -- save_checkpoint during an outage ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", [REFUSE, BLACKHOLE])
def test_save_checkpoint_during_an_outage_raises_in_bounded_time_and_publishes_nothing(
    proxy: RequestCounter, moto_endpoint: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save retries, then raises a CheckpointError saying nothing was published; after the store is back
    "latest" is still the previous checkpoint, and the next save works. A blackhole fails it within the
    configured timeouts, not never."""
    import torch

    import launchhelm.torch as lht

    monkeypatch.setenv("LAUNCHHELM_READ_TIMEOUT", "2")
    store = f"s3://{BUCKET}/{secrets.token_hex(6)}"
    tr = lht.init("outage", store=store, storage_options=_options(proxy), system_metrics=False, capture_console=False)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tr.watch(model, optimizer)
    tr.global_step = 10
    before = tr.save_checkpoint(extra={"at": 10})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    tr.global_step = 20
    with torch.no_grad():
        model.weight.add_(1.0)
    _outage(proxy, mode)
    started = time.monotonic()
    with pytest.raises(lh.CheckpointError) as caught:
        tr.save_checkpoint(extra={"at": 20})
    took = time.monotonic() - started
    assert isinstance(caught.value, lh.LaunchHelmError)
    message = str(caught.value)
    assert "step 20 was not saved" in message and "StoreUnreachableError" in message, message
    assert "nothing was published" in message and "previous checkpoint is still the latest" in message, message
    # bounded by the timeouts: a refused connection fails fast; no answer within 3 client tries of 2 s
    assert took < 45, took
    proxy.restore()
    events = [
        e
        for e in lh.Api(lh.storage.open_store(store, {"client_kwargs": {"endpoint_url": moto_endpoint}}))
        .run(tr.id)
        .checkpoints()
    ]
    assert [c.id for c in events] == [before]  # no checkpoint event for the failed save
    assert tr.load_checkpoint("latest") == {"at": 10}
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    tr.global_step = 30
    after = tr.save_checkpoint(extra={"at": 30})
    assert after is not None and after != before
    assert tr.load_checkpoint("latest") == {"at": 30}
    tr.finish()


# -- a 30 s outage in the middle of everything ------------------------------------------------------
# The training loop: a small torch step, a few metrics, 2 ms of "GPU"; phases told by the test on stdin.
# Prints each step's time per phase, what the save during the outage did, and the run's id and steps.
_TRAIN = textwrap.dedent(
    """
    import json, queue, sys, threading, time
    import torch
    import launchhelm._metrics._compact, launchhelm._metrics._flusher
    import launchhelm.torch as lht

    # compaction due every few flushes, so merges run before, during and after the outage
    launchhelm._metrics._flusher.CHUNKS_PER_SEGMENT = launchhelm._metrics._compact.CHUNKS_PER_SEGMENT = 4
    store, endpoint, project = sys.argv[1:4]
    told = queue.Queue()
    threading.Thread(target=lambda: [told.put(line.strip()) for line in sys.stdin], daemon=True).start()
    tr = lht.init(project, store=store, storage_options={"client_kwargs": {"endpoint_url": endpoint}},
                  system_metrics=False, capture_console=False, flush_interval=0.2, heartbeat_interval=0.5,
                  heartbeat_timeout=120)
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tr.watch(model, optimizer)
    i = 0
    times = {"before": [], "during": [], "after": []}

    def step(phase):
        global i
        t = time.perf_counter()
        loss = model(torch.randn(16, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tr.log({"i": float(i), "loss": loss.item(), "lr": 0.01})
        i += 1
        time.sleep(0.002)
        times[phase].append((t, time.perf_counter() - t))

    def run_for(phase, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            step(phase)

    def say(*words):
        print(*words, flush=True)

    run_for("before", 2.0)
    say("SAVED", tr.save_checkpoint(extra={"i": i}))   # the evaluation worker scores this one across the outage
    run_for("before", 8.0)
    say("DOWN?")
    assert told.get(timeout=60) == "down"
    run_for("during", 2.0)
    compaction = threading.Thread(target=tr._compact, kwargs={"only_if_due": False})  # as the flusher runs it
    compaction.start()
    run_for("during", 2.0)
    started = time.monotonic()
    try:
        tr.save_checkpoint(extra={"i": i})
        say("SAVE-DURING", "saved", round(time.monotonic() - started, 1))
    except lht.CheckpointError as exc:
        say("SAVE-DURING", "failed", round(time.monotonic() - started, 1), str(exc).replace(chr(10), " "))
    while True:
        step("during")
        try:
            if told.get_nowait() == "up":
                break
        except queue.Empty:
            pass
    compaction.join()
    run_for("after", 4.0)
    say("SAVED", tr.save_checkpoint(extra={"i": i}))
    run_for("after", 4.0)
    say("RESULT", json.dumps({"run": tr.id, "steps": i, **{k: v for k, v in times.items()}}))
    tr.finish()
    """
)

# The evaluation worker: scores a checkpoint slowly, so the outage comes while it holds one.
_WORKER = textwrap.dedent(
    """
    import sys, time
    import launchhelm as lh
    store, endpoint, project = sys.argv[1:4]

    @lh.evaluate(project=project, store=store, storage_options={"client_kwargs": {"endpoint_url": endpoint}},
                 poll_interval=0.5, lease_seconds=60, name="outage-worker")
    def score(ctx):
        path = ctx.download_to()
        time.sleep(12.0)
        return {"size": float(path.stat().st_size), "step": float(ctx.step)}

    print("SCORED", score.serve(max_evaluations=2), flush=True)
    """
)


def _lines(stream: Any, into: list[str]) -> threading.Thread:
    def read() -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _pace(steps: list[tuple[float, float]]) -> float:
    """A phase's step time, robust to the other work on a shared 2-core machine: the median step of each
    second, and of those the lower quartile (a burst of someone else's load slows some seconds; a slower
    loop slows them all)."""
    seconds: dict[int, list[float]] = {}
    for started, took in steps:
        seconds.setdefault(int(started - steps[0][0]), []).append(took)
    medians = sorted(statistics.median(v) for v in seconds.values() if len(v) >= 20)
    return medians[len(medians) // 4]


def _said_plainly(stderr: str, who: str, stdout: list[str]) -> None:
    """Exactly one line saying the store stopped answering, one saying it answers again, nothing else."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    down = [line for line in lines if "is not answering since" in line]
    up = [line for line in lines if "answers again after" in line]
    shown = f"{who}: stderr:\n{stderr[-4000:]}\nstdout:\n" + "\n".join(s[:300] for s in stdout)
    assert len(down) == 1 and len(up) == 1, shown
    assert not [w for w in _FOREIGN if w in stderr], shown
    assert len(lines) == 2, shown


@pytest.mark.slow
@pytest.mark.serial  # it times log() during the outage, to milliseconds
@pytest.mark.parametrize("mode", [REFUSE, BLACKHOLE])
def test_a_30s_outage_during_logging_a_compaction_a_save_and_an_evaluation(
    proxy: RequestCounter, moto_endpoint: str, tmp_path: Path, mode: str
) -> None:
    """Nothing lost, the loop's pace kept, one line each way in each process, no foreign traceback; the
    save during the outage raises and publishes nothing; the evaluation held across it scores once."""
    store, project = f"s3://{BUCKET}/{secrets.token_hex(6)}", "outage"
    direct = lh.storage.open_store(store, {"client_kwargs": {"endpoint_url": moto_endpoint}})
    lh.Api(direct).project(project).evaluate_every_checkpoint(True)
    endpoint = f"http://127.0.0.1:{proxy.port}"
    env = child_env(LAUNCHHELM_SPOOL=str(tmp_path / "spool"), LAUNCHHELM_READ_TIMEOUT="3")
    args = [store, endpoint, project]
    trainer = subprocess.Popen(
        [sys.executable, "-c", _TRAIN, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out: list[str] = []
    errors: list[str] = []
    readers = [_lines(trainer.stdout, out), _lines(trainer.stderr, errors)]
    assert trainer.stdin is not None
    try:
        deadline = time.monotonic() + 120
        while "DOWN?" not in out:
            assert trainer.poll() is None and time.monotonic() < deadline, "\n".join(errors)[-4000:]
            time.sleep(0.05)
        _outage(proxy, mode)
        trainer.stdin.write("down\n")
        trainer.stdin.flush()
        time.sleep(30.0)
        proxy.restore()
        trainer.stdin.write("up\n")
        trainer.stdin.flush()
        trainer.wait(timeout=180)
        worker_out, worker_err = worker.communicate(timeout=180)
    finally:
        for proc in (trainer, worker):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    stderr = "\n".join(errors)
    assert trainer.returncode == 0, stderr[-4000:]
    assert worker.returncode == 0 and "SCORED 2" in worker_out, worker_err[-4000:]

    # nothing lost: every point reads back exactly
    said = {line.split(" ", 1)[0]: line for line in out}
    result = json.loads(said["RESULT"].split(" ", 1)[1])
    run = lh.Api(direct).run(result["run"])
    frame = run.history()
    assert frame["i"].tolist() == [float(s) for s in range(result["steps"])]
    assert frame["step"].tolist() == list(range(1, result["steps"] + 1))

    # the loop's pace: the step time during the outage within 10% of the one before it
    before, during = _pace(result["before"]), _pace(result["during"])
    assert during <= 1.10 * before, (before, during, _pace(result["after"]))
    assert len(result["during"]) > 5 / before  # it went on stepping through the outage (but for the save)

    # the save during the outage: retried, then a clear error, nothing published
    saved = [line.split()[1] for line in out if line.startswith("SAVED ")]
    failed = said["SAVE-DURING"].split(" ", 3)
    assert failed[1] == "failed" and "nothing was published" in failed[3], said["SAVE-DURING"]
    assert float(failed[2]) < 30, failed  # bounded by the configured timeouts
    assert [c.id for c in run.checkpoints()] == saved  # before and after the outage: no half checkpoint

    # the evaluation held across the outage, and the one after it: each scored exactly once
    evaluations = run.evaluations()
    assert sorted(e.checkpoint for e in evaluations) == sorted(saved)
    assert [(e.state, e.attempts) for e in evaluations] == [("done", 1)] * 2
    scored = frame.dropna(subset=["eval/step"])
    assert sorted(scored["eval/step"].tolist()) == sorted(float(c.step) for c in run.checkpoints())

    # what the user reads: one line each way, in each process, and nothing else
    _said_plainly(stderr, "trainer", out)
    _said_plainly(worker_err, "worker", worker_out.splitlines())


# -- finish() while the store takes connections and never answers ------------------------------------
_FINISH = textwrap.dedent(
    """
    import sys, time
    import launchhelm as lh
    store, endpoint = sys.argv[1:3]
    run = lh.init("outage", store=store, storage_options={"client_kwargs": {"endpoint_url": endpoint}},
                  system_metrics=False, capture_console=False, flush_interval=0.2, heartbeat_interval=0.5)
    step = 0
    def log_for(seconds):
        global step
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(100):
                run.log({"x": float(step)}, step=step)
                step += 1
            time.sleep(0.005)
    log_for(1.5)
    print("DOWN?", flush=True)
    assert sys.stdin.readline().strip() == "down"
    log_for(2.0)
    print("RUN", run.id, step, flush=True)
    started = time.monotonic()
    try:
        run.finish()
    finally:
        print("FINISH", round(time.monotonic() - started, 1), flush=True)
    """
)


@pytest.mark.slow
def test_finish_while_the_store_never_answers_gives_up_in_bounded_time_and_recover_uploads_all(
    proxy: RequestCounter, moto_endpoint: str, tmp_path: Path
) -> None:
    """A blackhole (connections taken, never answered) at the end of a run: finish() waits
    LAUNCHHELM_FINISH_TIMEOUT plus at most one request's timeouts, says what it left in the spool, and
    ``launchhelm recover`` uploads every point."""
    store = f"s3://{BUCKET}/{secrets.token_hex(6)}"
    spool = str(tmp_path / "spool")
    env = child_env(LAUNCHHELM_SPOOL=spool, LAUNCHHELM_FINISH_TIMEOUT="3", LAUNCHHELM_READ_TIMEOUT="2")
    child = subprocess.Popen(
        [sys.executable, "-c", _FINISH, store, f"http://127.0.0.1:{proxy.port}"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "DOWN?"
        proxy.blackhole()
        child.stdin.write("down\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode != 0  # finish() raised: the run's end is not stored
    assert "StoreUnreachableError" in err.splitlines()[-1], err[-3000:]
    took = float(out.split("FINISH", 1)[1].split()[0])
    # the finish timeout, then at most the request in flight: 3 tries of 2 s, and the backoffs
    assert took < 3 + 3 * 2 + 10, took
    kept = [line for line in err.splitlines() if "kept in the spool at" in line]
    assert len(kept) == 1 and "launchhelm recover" in kept[0], err[-3000:]
    assert not [w for w in ("never retrieved", "Task exception", "aiohttp") if w in err], err[-3000:]
    run_id, steps = out.split("RUN", 1)[1].split()[:2]
    proxy.restore()
    recovered = subprocess.run(
        [str(Path(sys.executable).with_name("launchhelm")), "--store", store, "recover"],
        env={**env, "AWS_ENDPOINT_URL": moto_endpoint},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    opened = lh.storage.open_store(store, {"client_kwargs": {"endpoint_url": moto_endpoint}})
    assert lh.Api(opened).run(run_id).history()["x"].tolist() == [float(s) for s in range(int(steps))]


def test_a_request_the_outage_swallowed_failing_after_it_ended_is_not_a_new_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a blackhole keeps the requests it swallowed silent after the store is back: when they time out,
    # the user must not read of a second outage
    run = lh.init("outages", store=str(tmp_path), system_metrics=False, capture_console=False)
    try:
        with caplog.at_level("WARNING", logger="launchhelm"):
            sent = time.time()
            run._store_failed(lh.StoreUnreachableError("timed out"), since=sent)
            run._store_answered()
            run._store_failed(lh.StoreUnreachableError("timed out late"), since=sent)  # sent during the outage
            run._store_failed(lh.StoreUnreachableError("timed out late"))  # when sent unknown: within the budget
            said = [r.getMessage() for r in caplog.records]
            assert [("not answering" in m, "answers again" in m) for m in said] == [(True, False), (False, True)]
            run._store_failed(lh.StoreUnreachableError("down again"), since=time.time() + 0.001)  # a new one
            assert "not answering" in caplog.records[-1].getMessage() and len(caplog.records) == 3
    finally:
        run._store_answered()
        run.finish()


def test_a_compaction_that_loses_a_race_is_not_an_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two compactions of one run (a racing session, or one from another thread) may both try to
    # publish the next manifest: the loser's AlreadyExistsError is an OSError, but no outage
    from launchhelm._metrics._compact import Compactor

    def lost(self: Compactor, only_if_due: bool = True) -> None:
        raise lh.AlreadyExistsError("manifest-00000000000000000013.json already exists", url="x")

    monkeypatch.setattr(Compactor, "compact", lost)
    run = lh.init("outages", store=str(tmp_path), system_metrics=False, capture_console=False)
    try:
        run.log({"x": 1.0})
        run.flush()
        with caplog.at_level("WARNING", logger="launchhelm"):
            run._compact(only_if_due=False)
        assert [r.getMessage() for r in caplog.records] == []
    finally:
        monkeypatch.undo()
        run.finish()
    assert lh.Api(str(tmp_path)).run(run.id).history()["x"].tolist() == [1.0]
