"""Evaluation workers under fire: four worker processes SIGKILLed and restarted
at random moments (mostly mid-evaluation) while a run publishes 32
checkpoints, plus one worker frozen (SIGSTOP) past its lease while holding an
evaluation. Every evaluation still ends done exactly once, every score
appears exactly once at its checkpoint's step, and the frozen worker's
poisoned score is never logged."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from evaluation_helpers import raw_points, results_by_evaluation
from lhtest import child_env

import launchhelm as lh

WORKER = Path(__file__).with_name("chaos_worker.py")
PROJECT = "chaos"
LEASE = 2.0
CHECKPOINTS = 32
WORKERS = 4


def _start(store: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, str(WORKER), store, PROJECT, str(LEASE), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(OMP_NUM_THREADS="1"),
        )


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _wait_for(log: Path, line: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while line not in _lines(log):
        assert time.monotonic() < deadline, f"{log.name} never printed {line!r}: {_lines(log)[-5:]}"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("shared_store_url", ["local", "s3", "gcs", "azure"], indirect=True)  # ~30-60 s each
def test_killed_restarted_and_stalled_workers_log_every_score_exactly_once(
    shared_store_url: str, tmp_path: Path
) -> None:
    store = shared_store_url
    api = lh.Api(store)
    api.project(PROJECT).evaluate_every_checkpoint(True)
    run = lh.init(PROJECT, store=store)

    def publish(step: int) -> str:
        run.global_step = step
        run.log({"loss": 1.0 / step})
        payload = tmp_path / f"w{step}.txt"
        payload.write_text(str(step))
        return run.checkpoint(payload)

    # 1. the stalled worker takes the first checkpoint, then freezes (renewals included)
    go = tmp_path / "go"
    stalled_log = tmp_path / "stalled.log"
    stalled = _start(store, stalled_log, str(go))
    _wait_for(stalled_log, "ready")
    first = publish(10)
    _wait_for(stalled_log, f"stalling {first}")
    os.kill(stalled.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()

    # 2. four workers, killed and restarted at random while checkpoints keep coming
    logs = [tmp_path / f"worker-{i}.log" for i in range(WORKERS)]
    workers = [_start(store, log) for log in logs]
    offsets = [0] * WORKERS
    rng = random.Random()
    pending = [10 * i for i in range(2, CHECKPOINTS + 1)]
    steps = [10, *pending]
    kills = mid_evaluation = 0
    chaos_until = time.monotonic() + 25

    def chaos(now: float) -> bool:
        # a loaded machine starts workers slowly: the chaos goes on (a while) until it killed enough, and
        # enough of them mid-evaluation
        return now < chaos_until or ((kills < 8 or mid_evaluation < 3) and now < chaos_until + 60)

    next_kill = time.monotonic() + rng.uniform(0.5, 1.0)
    next_check = next_publish = 0.0
    thawed = False
    deadline = time.monotonic() + 180
    try:
        while True:
            now = time.monotonic()
            assert now < deadline, "the evaluations did not all finish"
            if pending and now >= next_publish:
                publish(pending.pop(0))
                next_publish = now + 0.5  # spread over the chaos, so kills land mid-evaluation
            if chaos(now) and now >= next_kill:
                tails = [_lines(log)[offsets[i] :] for i, log in enumerate(logs)]  # this incarnation's lines
                serving = [i for i, tail in enumerate(tails) if workers[i].poll() is None and "ready" in tail]
                # inside the score function: its result is not published yet, so another worker takes it over
                busy = [i for i in serving if tails[i][-1].startswith("scoring")]
                # mostly mid-evaluation, sometimes idle: idle ones only once three died mid-evaluation (on a
                # loaded machine an idle kill's slow restart leaves fewer evaluations to kill in)
                if busy or (serving and mid_evaluation >= 3 and rng.random() < 0.3):
                    victim = rng.choice(busy or serving)
                    mid_evaluation += bool(busy)
                    workers[victim].kill()  # SIGKILL: no clean-up runs
                    workers[victim].wait()
                    kills += 1
                    with open(logs[victim], "a") as out:
                        out.write("--- killed ---\n")
                    offsets[victim] = len(_lines(logs[victim]))
                    workers[victim] = _start(store, logs[victim])
                next_kill = now + rng.uniform(0.5, 1.5)
            if now >= next_check:
                next_check = now + 0.5
                records = {e.checkpoint: e for e in api.run(run.id).evaluations()}
                if not thawed and records[first].state == "done":
                    # taken over only after its lease lapsed; now let the frozen worker finish
                    assert time.monotonic() - frozen_at > LEASE
                    go.touch()
                    os.kill(stalled.pid, signal.SIGCONT)
                    thawed = True
                finished = len(records) == CHECKPOINTS and all(e.state == "done" for e in records.values())
                if thawed and not pending and not chaos(now) and finished:
                    history = api.run(run.id).history()
                    if history["eval/value"].notna().sum() == CHECKPOINTS:
                        break  # every score logged (a worker killed before logging is repaired by the next)
            time.sleep(0.05)
    finally:
        # a worker restarted moments ago may still be importing: Ctrl-C there is Python's
        # KeyboardInterrupt traceback, not the worker's clean stop, so let each one start serving
        settle = time.monotonic() + 30
        for i, proc in enumerate(workers):
            while (
                proc.poll() is None
                and time.monotonic() < settle
                and not any("serving project" in line for line in _lines(logs[i])[offsets[i] :])
            ):
                time.sleep(0.05)
        for proc in [*workers, stalled]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean exit
        for proc in [*workers, stalled]:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        run.finish()

    assert stalled.returncode == 0, _lines(stalled_log)
    assert "finished 0" in _lines(stalled_log)
    assert any("this result was dropped" in line for line in _lines(stalled_log))
    assert all(proc.returncode == 0 for proc in workers), [_lines(log)[-3:] for log in logs]
    evaluations = api.run(run.id).evaluations()
    taken_over = sum(e.attempts >= 2 for e in evaluations[1:])  # a worker killed mid-evaluation, replaced
    assert kills >= 8 and mid_evaluation >= 3 and taken_over >= 1, (kills, mid_evaluation, taken_over)
    assert [e.step for e in evaluations] == steps
    assert all(e.state == "done" and e.scores == {"value": e.step, "double": 2 * e.step} for e in evaluations)
    by_checkpoint = {e.checkpoint: e for e in evaluations}
    assert by_checkpoint[first].attempts >= 2  # the frozen worker's lease was taken over
    # exactly one real result per evaluation, over every attempt and lease epoch
    results = results_by_evaluation(store, PROJECT)
    assert sorted(len(found) for found in results.values()) == [1] * CHECKPOINTS
    # every score exactly once, at its checkpoint's step; nothing from the frozen worker
    points = [p for p in raw_points(store, run.id) if p["key"].startswith("eval/")]
    assert sorted((p["step"], p["value"]) for p in points if p["key"] == "eval/value") == [(s, s) for s in steps]
    assert sorted(p["step"] for p in points if p["key"] == "eval/double") == steps
    assert not [p for p in points if p["key"] == "eval/stalled" or p["value"] < 0]
    history = api.run(run.id).history()
    assert history.groupby("step")["eval/value"].count().loc[steps].tolist() == [1] * CHECKPOINTS
