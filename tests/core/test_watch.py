"""``launchhelm watch`` tells each change of a project's runs exactly once (issue 42, point 5).

If these fail, a run that crashes or hangs at 3 a.m. is told to nobody, or to
everybody twice (two watchers on two machines), or a watcher that dies while
telling loses the notice, or the watcher's polls cost a request per run of a
big project. Real parts: runs SIGKILLed in child processes, a real hang found
by the run's watchdog (``hang_timeout``), watchers as real ``launchhelm watch``
processes (two at once, one SIGKILLed mid-notice), moto S3 behind the counting
proxy, and a real HTTP server on 127.0.0.1 for ``--post``.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulators import proxied_env
from http_proxy import RequestCounter
from lhtest import BUCKET, ROOT, child_env, kill_with_helper, make_store_url

import launchhelm as lh
from launchhelm._exceptions import InvalidArgumentError
from launchhelm._watch import EVENTS, Notice, Watcher, parse_events, parse_since
from launchhelm.storage import open_store
from launchhelm.storage._keys import notice_told_key, notices_prefix

PROJECT = "watched"

#: A run that logs a few steps, says so, then waits to be killed (or to hang: its watchdog's timeout is 2 s).
_CHILD = """
import sys, time
import launchhelm as lh
hang = float(sys.argv[3]) if sys.argv[3] != "none" else None
run = lh.init("watched", store=sys.argv[1], name=sys.argv[2], hang_timeout=hang)
for i in range(5):
    run.log({"loss": 1.0 / (i + 1)}, step=i)
    time.sleep(0.05)
print(run.id, flush=True)
time.sleep(3600)
"""


def _child(store: str, name: str, hang_timeout: str, **env: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, store, name, hang_timeout],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(**env),
        cwd=ROOT,
    )
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    assert run_id, proc.communicate(timeout=30)
    return proc, run_id


def _watcher(store: str, *args: str, prefix: list[str] | None = None, **env: str) -> subprocess.Popen[str]:
    """``launchhelm --store STORE watch watched ARGS`` in its own process group (killed with what it runs)."""
    return subprocess.Popen(
        [*(prefix or []), sys.executable, "-m", "launchhelm._cli", "--store", store, "watch", PROJECT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(**env),
        cwd=ROOT,
        start_new_session=True,
    )


def _received(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for(what: str, check: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[str]) -> str:
    """End a watcher (and what it runs); its stderr."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, err = proc.communicate(timeout=30)
    return err


def _events(received: list[dict[str, object]], run_id: str) -> list[str]:
    return [str(n["event"]) for n in received if n["run"] == run_id]


# -- quick: the options ------------------------------------------------------------------------------
def test_unknown_events_and_times_are_refused_naming_what_to_give() -> None:
    assert parse_events(None) == EVENTS
    assert parse_events("crashed, hung") == ("crashed", "hung")
    with pytest.raises(InvalidArgumentError, match=r"crashd.*choose from started"):
        parse_events("crashed,crashd")
    assert parse_since("all") == 0.0
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("2026-12-06T03:00:00Z") == 1796526000.0
    with pytest.raises(ValueError, match="how long ago"):
        parse_since("yesterday")


def test_the_command_refuses_a_bad_event_before_polling(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "launchhelm._cli", "watch", PROJECT, "--store", str(tmp_path), "--events", "oops"],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown event(s) oops" in done.stderr


def test_without_exec_or_post_changes_are_printed_and_nothing_is_claimed(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = lh.init(PROJECT, store=store, name="quiet")
    run.log({"loss": 1.0})
    run.finish()
    watcher = Watcher(open_store(store), PROJECT, None, since=0.0)
    seen = watcher.poll()
    assert [(n["event"], n["run"], n["name"]) for n in seen] == [
        ("started", run.id, "quiet"),
        ("finished", run.id, "quiet"),
    ]
    assert seen[1]["detail"] == "finish() closed the run"
    assert seen[1]["id"] == f"{run.id}/{seen[1]['id'].split('/')[1]}/finished"
    assert not open_store(store).list(notices_prefix(PROJECT))  # a peek steals no notice from a real watcher
    assert watcher.poll() == []  # and is not printed twice


def test_the_first_watcher_skips_the_past_and_a_later_one_tells_what_came_while_none_ran(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    told: list[str] = []
    old = lh.init(PROJECT, store=store)
    old.finish()
    time.sleep(0.3)
    first = Watcher(store, PROJECT, lambda n: told.append(n["id"]), interval=0.1)  # since: now, less a poll
    assert first.poll() == []  # the project's past before any watcher is not told
    # a change made while no watcher ran: the next watcher starts from the watermark the first left
    new = lh.init(PROJECT, store=store)
    new.finish(close_run=False)
    second = Watcher(store, PROJECT, lambda n: told.append(n["id"]), interval=0.1)
    second.poll()
    assert sorted(i.split("/")[2] for i in told if i.startswith(new.id)) == ["finished", "started"]
    assert second.poll() == []
    # a third finds them told (told.json), and tells nothing again
    third = Watcher(store, PROJECT, lambda n: told.append(n["id"]), interval=0.1, since=0.0)
    third.poll()
    assert Counter(told)[f"{new.id}/{told[-1].split('/')[1]}/finished"] <= 1
    assert len(told) == len(set(told)), told


def test_a_failed_evaluation_is_told_once_with_its_error(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    lh.Api(store).project(PROJECT).evaluate_every_checkpoint(True)
    run = lh.init(PROJECT, store=store, name="scored")
    for step in (10, 20):
        run.global_step = step
        run.log({"loss": 1.0 / step})
        payload = tmp_path / f"weights-{step}.txt"
        payload.write_text(str(step))
        run.checkpoint(payload)
    run.finish()

    def scorer(ctx: lh.EvaluationContext) -> dict[str, float]:
        if ctx.step == 20:
            raise ValueError("no good at step 20")
        return {"value": float(ctx.step)}

    assert lh.evaluate(project=PROJECT, store=store)(scorer).serve(stop_when_idle=True) == 2
    told: list[Notice] = []
    watchers = [Watcher(open_store(store), PROJECT, told.append, since=0.0, events=["evaluation_failed"]) for _ in "ab"]
    for watcher in watchers * 2:
        watcher.poll()
    assert len(told) == 1, told
    notice = told[0]
    assert (notice["event"], notice["run"], notice["step"]) == ("evaluation_failed", run.id, 20)
    assert "ValueError: no good at step 20" in notice["detail"]
    assert notice["id"].startswith(f"{run.id}/") and notice["id"].endswith("/a0000/evaluation_failed")


# -- slow: real processes, two watchers -------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_two_watchers_tell_a_crash_a_hang_and_a_finish_once_each(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url(backend, tmp_path, request)
    proxy = (
        RequestCounter(int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]), latency=0.02) if backend == "s3" else None
    )
    env = proxied_env(store, proxy.port) if proxy is not None else {}
    out = tmp_path / "received.jsonl"
    watchers = [
        _watcher(store, "--interval", "0.5", "--since", "all", "--exec", f"cat >> {out}", **env) for _ in range(2)
    ]
    children = []
    try:
        crashing, crashed_id = _child(store, "crashing", "none")
        hanging, hung_id = _child(store, "hanging", "2")
        children += [crashing, hanging]
        done = lh.init(PROJECT, store=store, name="done")
        done.log({"loss": 0.5})
        done.finish()
        crashing.send_signal(signal.SIGKILL)
        crashing.wait(30)

        def all_told() -> bool:
            got = _received(out)
            return (
                "crashed" in _events(got, crashed_id)
                and "hung" in _events(got, hung_id)
                and "finished" in _events(got, done.id)
            )

        _wait_for("the crash, the hang and the finish to be told", all_told, timeout=90)
        # the runs table says the same: hung, and where
        table = lh.Api(store).runs(PROJECT).set_index("id")
        assert table.loc[hung_id, "status"] == "hung" and "<module>" in str(table.loc[hung_id, "hang"])
        if proxy is not None:
            # a few more polls of both, counted: each is the table's and the evaluations' listings (1 + 3), the one
            # live run's (the hung one's) heartbeat, summary and hang marker, and the watermark; every 0.5 s or later
            proxy.reset()
            time.sleep(3)
            window = proxy.total
            assert 0 < window <= 2 * 8 * (3 / 0.5 + 1), proxy.snapshot()
        else:
            time.sleep(2)  # a few more polls of both: nothing is told again
    finally:
        errors = [_stop(w) for w in watchers]
        for child in children:
            child.kill()
            child.wait(30)
    got = _received(out)
    counts = Counter((n["run"], n["event"]) for n in got)
    assert counts == {
        (crashed_id, "started"): 1,
        (crashed_id, "crashed"): 1,
        (hung_id, "started"): 1,
        (hung_id, "hung"): 1,
        (done.id, "started"): 1,
        (done.id, "finished"): 1,
    }, (counts, errors)
    by_event = {(n["run"], n["event"]): n for n in got}
    hung = by_event[(hung_id, "hung")]
    assert "no step for" in str(hung["detail"]) and "<module>" in str(hung["detail"]), hung
    assert hung["step"] == 4 and hung["name"] == "hanging" and hung["project"] == PROJECT
    crash = by_event[(crashed_id, "crashed")]
    # at once: the watcher saw the pid gone on this host, or the trainer's helper ended its session first
    # (with the signal, when it read the zombie's status before this test reaped it)
    assert any(said in str(crash["detail"]) for said in ("died without a notice (", "was killed by SIGKILL")), crash
    assert set(crash) == {"event", "project", "run", "name", "step", "time", "detail", "id"}
    assert crash["id"] == f"{crashed_id}/{str(crash['id']).split('/')[1]}/crashed"
    if proxy is not None:
        proxy.close()


@pytest.mark.slow
def test_a_watcher_on_another_host_tells_a_crash_once_the_heartbeat_is_stale(tmp_path: Path) -> None:
    # in its own PID namespace the watcher is another host: it cannot look for the pid, only at the heartbeat
    prefix = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount-proc"]
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    assert probe.returncode == 0, f"unshare --pid does not work here: {probe.stderr!r}"
    store = str(tmp_path / "store")
    out = tmp_path / "received.jsonl"
    watcher = _watcher(store, "--interval", "0.3", "--since", "all", "--exec", f"cat >> {out}", prefix=prefix)
    try:
        proc, run_id = _child(
            store, "far", "none", LAUNCHHELM_HEARTBEAT_INTERVAL="0.2", LAUNCHHELM_HEARTBEAT_TIMEOUT="2"
        )
        kill_with_helper(proc)  # its helper too, else it ends the session itself (tests/core/test_helper_drain.py)
        proc.wait(30)
        _wait_for("the crash to be told", lambda: "crashed" in _events(_received(out), run_id), timeout=60)
    finally:
        err = _stop(watcher)
    crash = [n for n in _received(out) if n["event"] == "crashed"]
    assert len(crash) == 1, (crash, err)
    assert "died without a notice (heartbeat stale)" in str(crash[0]["detail"]), crash


_CRASH_AFTER_LOAD = """
import os, signal, sys
import launchhelm as lh
run = lh.init("watched", store=sys.argv[1], auto_resume=True, run_id="loop-job", hang_timeout=None)
os.kill(os.getpid(), signal.SIGKILL)  # a relaunch that dies right after its load
"""


@pytest.mark.slow
def test_a_restart_loop_is_told_once_and_shown(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    for restart in range(3):  # torchrun's relaunches of one job, each dead before a step
        done = subprocess.run(
            [sys.executable, "-c", _CRASH_AFTER_LOAD, store],
            capture_output=True,
            text=True,
            env=child_env(TORCHELASTIC_RESTART_COUNT=str(restart)),
            cwd=ROOT,
            timeout=120,
        )
        assert done.returncode == -signal.SIGKILL, done.stderr
    (run_id,) = lh.Api(store).run_ids(PROJECT)  # one run, however many launches
    told: list[Notice] = []
    for _ in range(2):
        Watcher(open_store(store), PROJECT, told.append, since=0.0).poll()
    events = Counter(n["event"] for n in told)
    # each attempt's helper ends its session as crashed unless the next launch replaced it first (a race
    # with the relaunch): the last is crashed either way, the two before it may be; each is told once
    crashed = events.pop("crashed", 0)
    assert events == {"started": 1, "relaunched": 2, "restart_loop": 1} and 1 <= crashed <= 3, told
    assert len({n["id"] for n in told}) == len(told), told
    loop = next(n for n in told if n["event"] == "restart_loop")
    assert loop["id"].startswith(f"{run_id}/") and "the last 3 attempts" in loop["detail"], loop
    shown = subprocess.run(
        [sys.executable, "-m", "launchhelm._cli", "--store", store, "show", run_id],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert "restart loop: the last 3 attempts" in shown.stdout, shown.stdout + shown.stderr


@pytest.mark.slow
def test_a_poll_costs_the_same_requests_however_many_settled_runs(
    moto_endpoint: str, request: pytest.FixtureRequest
) -> None:
    prefix = f"watch-{os.urandom(3).hex()}"
    direct = open_store(f"s3://{BUCKET}/{prefix}")
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]), latency=0.02)
    store = open_store(f"s3://{BUCKET}/{prefix}", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
    live = lh.init(PROJECT, store=direct, name="live", hang_timeout=None)
    live.log({"loss": 1.0})
    try:
        costs = []
        for settled in (3, 12):
            while len(lh.Api(direct).runs(PROJECT)) < settled + 1:
                run = lh.init(PROJECT, store=direct)
                run.finish()
            watcher = Watcher(store, PROJECT, lambda n: None, interval=0.5, since=0.0)
            watcher.poll()  # the first poll reads every run once, and tells their past
            proxy.reset()
            assert watcher.poll() == []
            costs.append(proxy.total)
        # the table's listing; the evaluations' listing (one, empty or not); the live run's heartbeat,
        # summary and hang marker (concurrently); the watermark
        assert costs == [6, 6], (costs, proxy.snapshot())
    finally:
        live.finish()
        proxy.close()


@pytest.mark.slow
def test_a_watcher_killed_mid_notice_and_restarted_neither_loses_nor_repeats_it(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    out = tmp_path / "received.jsonl"
    run = lh.init(PROJECT, store=store, name="told-once")
    run.finish()
    # the receiver takes 30 s; the watcher (and the receiver with it, as when its host dies) is killed meanwhile,
    # well within the 4 s its 8 s lease gives a delivery
    slow = _watcher(store, "--interval", "0.5", "--since", "all", "--lease", "8", "--exec", f"sleep 30; cat >> {out}")
    claims = Path(store) / notices_prefix(PROJECT) / run.id
    try:
        _wait_for("a claim", lambda: any(claims.rglob("claim-1.json")), timeout=60)
    finally:
        _stop(slow)
    assert not any(claims.rglob("told.json"))
    assert _received(out) == []
    again = _watcher(store, "--interval", "0.5", "--since", "all", "--lease", "3", "--exec", f"cat >> {out}")
    try:
        _wait_for("both changes told", lambda: len(_received(out)) >= 2, timeout=60)
        time.sleep(2)
    finally:
        _stop(again)
    got = _received(out)
    assert sorted(str(n["event"]) for n in got) == ["finished", "started"], got
    # the change the killed watcher held: its lease ran out, the restarted watcher claimed it again and told it
    claimed = {p.parent.name: sorted(c.name for c in p.parent.glob("claim-*.json")) for p in claims.rglob("told.json")}
    assert sorted(claimed.values()) == [["claim-1.json"], ["claim-1.json", "claim-2.json"]], claimed
    store_obj = open_store(store)
    for notice in got:
        told = json.loads(store_obj.read(notice_told_key(PROJECT, str(notice["id"]))))
        assert told["claim"] == len(claimed[str(notice["event"])])


class _FailsOnce(http.server.BaseHTTPRequestHandler):
    bodies: list[dict[str, object]]
    answers: list[int]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        code = 500 if not self.answers else 200
        self.answers.append(code)
        if code == 200:
            self.bodies.append(body)
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fails_once() -> Iterator[tuple[str, type[_FailsOnce]]]:
    handler = type("Handler", (_FailsOnce,), {"bodies": [], "answers": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    finally:
        server.shutdown()


@pytest.mark.slow
def test_post_to_a_server_that_fails_once_is_retried_and_told_once(
    tmp_path: Path, fails_once: tuple[str, type[_FailsOnce]]
) -> None:
    url, handler = fails_once
    store = str(tmp_path / "store")
    run = lh.init(PROJECT, store=store, name="posted")
    run.finish()
    args = ["--once", "--since", "all", "--events", "finished", "--post", url]
    for _ in range(2):  # the second watcher finds it told
        proc = _watcher(store, *args)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert handler.answers == [500, 200]
    assert [(b["event"], b["run"], b["name"]) for b in handler.bodies] == [("finished", run.id, "posted")]
