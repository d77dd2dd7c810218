"""A hung run is a crash (issue 42): found, its stacks stored, ended or marked; restart loops refused.

If these fail, a job whose loop blocks (a stuck data loader, a C call that
never returns) sits "running" until someone kills it by hand, or a relaunch
that crashes right after its load is relaunched for ever. Real processes:
the training script is tests/torch/hang_worker.py; the watchdog is a real
child process and the stuck call really blocks (with and without the GIL).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from lhtest import ROOT, child_env

import launchhelm as lh
from launchhelm._runlog._flightrec import RecorderNote, describe_collectives, read_recorder_note
from launchhelm._runlog._watchdog import (
    AUTO,
    AUTO_FLOOR,
    DUMP_SIGNAL,
    Frame,
    HangClock,
    describe_groups,
    group_stacks,
    grouped_record,
    hang_setting,
    read_stacks_file,
    stacks_file,
    summarize_dump,
)
from launchhelm._views._runs import table_rows
from launchhelm.storage._keys import hang_key
from launchhelm.widgets._picker import picker_state

WORKER = Path(__file__).with_name("hang_worker.py")


def _launch(store: str, run_id: str, tag: str, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), "--store", store, "--run-id", run_id, *args],
        cwd=ROOT,
        env=child_env(OMP_NUM_THREADS="1", LAUNCHHELM_TEST_TAG=tag, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _show(store: str, run_id: str) -> str:
    """What ``launchhelm show RUN`` prints."""
    main = "import sys; from launchhelm._cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", main, "--store", store, "show", run_id],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        check=True,
    ).stdout


def _tagged(tag: str) -> list[int]:
    """Processes (the worker's watchdog included) whose environment carries ``tag``."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"LAUNCHHELM_TEST_TAG={tag}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            pass
    return found


def _no_survivor(tag: str) -> None:
    deadline = time.monotonic() + 5
    while _tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _tagged(tag), "a watchdog (or worker) outlived its training process"


def _wait_line(proc: subprocess.Popen[str], text: str, lines: list[str], timeout: float = 90) -> float:
    """Read the worker's output until a line has ``text``; the monotonic time it came."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            return time.monotonic()
        assert time.monotonic() < deadline, "".join(lines[-40:])
    raise AssertionError(f"the worker ended before {text!r}:\n{''.join(lines[-40:])}")


@pytest.mark.serial  # it times the end of a hang to the second (under a minute): alone, as other timed tests
@pytest.mark.parametrize("how", ["py", "gil"])
def test_a_stuck_attempt_ends_hung_and_its_relaunch_finishes(tmp_path: Path, how: str) -> None:
    """Both in a one-rank gloo group: ``py`` with torch's flight recorder turned off (no ``.fr.json``, no
    recorder section), ``gil`` with it on (torch's default), where the stuck call keeps the GIL: the recorder
    cannot be read, the record says so in one line, and the hang is ended within the same bound."""
    store, run_id, tag = str(tmp_path / "store"), f"hang{how}", uuid.uuid4().hex
    recorder = {"TORCH_FR_BUFFER_SIZE": "0"} if how == "py" else {}
    proc = _launch(store, run_id, tag, "--stuck-at", "30", "--how", how, "--hang-timeout", "10", "--dist", **recorder)
    lines: list[str] = []
    # a thread that keeps the GIL also keeps the console capture's thread from passing on the last line
    stuck_at = _wait_line(proc, "step 29" if how == "gil" else "step 30", lines)
    rest, _ = proc.communicate(timeout=90)
    waited = time.monotonic() - stuck_at
    assert proc.returncode != 0, rest
    assert waited < 60, f"the hung process lived {waited:.0f}s past its hang"
    _no_survivor(tag)
    handle = lh.Api(store).run(run_id)
    [attempt] = handle.attempts()
    assert attempt.ending == "hung", attempt
    assert "stuck_here" in (attempt.detail or "") and "after step 30" in (attempt.detail or ""), attempt.detail
    assert sorted(handle._store.list(f"runs/{run_id}/hangs")) == [
        f"{attempt.session}/grouped.txt",
        f"{attempt.session}/rank-0.txt",
    ]
    dump = handle._store.read(f"runs/{run_id}/hangs/{attempt.session}/rank-0.txt").decode()
    assert "in stuck_here" in dump and "Thread 0x" in dump
    grouped = handle._store.read(f"runs/{run_id}/hangs/{attempt.session}/grouped.txt").decode()
    assert grouped.startswith(f"{attempt.detail}\n\nrank 0 (1 of 1), most recent call first:\n"), grouped
    assert grouped.count("in stuck_here") == 1, grouped
    if how == "py":  # the recorder off: nothing of it in the record
        assert "flight recorder" not in grouped and "flight recorder" not in dump, grouped
    else:
        assert "rank 0: not read: no answer within 5 s" in grouped, grouped
        assert "flight recorder" not in (attempt.detail or "")
    # the relaunch (the scheduler's) resumes from the step-30 checkpoint and finishes
    again = _launch(store, run_id, tag)
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    assert "starts at step 30" in out
    assert [a.ending for a in handle.attempts()] == ["hung", "finished"]
    _no_survivor(tag)


@pytest.mark.slow
def test_without_auto_resume_the_run_shows_hung_until_it_steps(tmp_path: Path) -> None:
    store, run_id, tag = str(tmp_path / "store"), "hangmark", uuid.uuid4().hex
    proc = _launch(
        store,
        run_id,
        tag,
        "--no-auto-resume",
        "--stuck-at",
        "12",
        "--how",
        "pause",
        "--stuck-for",
        "24",
        "--hang-timeout",
        "4",
        "--steps",
        "20",
        "--dist",  # one all_reduce per step: torch's flight recorder (on by default) goes into the record
    )
    lines: list[str] = []
    _wait_line(proc, "step 12", lines)
    handle = lh.Api(store).run(run_id)
    deadline = time.monotonic() + 20
    while handle.status != "hung":
        assert time.monotonic() < deadline, f"never hung: {handle.status}"
        time.sleep(0.3)
    assert "stuck_here" in handle.summary()["hang"]
    hangs = f"runs/{run_id}/hangs/{handle.attempts()[0].session}"
    trace = json.loads(handle._store.read(f"{hangs}/rank-0.fr.json"))  # as torch dumps it
    reduces = [e for e in trace["entries"] if e["profiling_name"] == "gloo:all_reduce"]
    assert len(reduces) >= 12 and max(e["collective_seq_id"] for e in reduces) >= 12, trace["entries"][-3:]
    grouped = handle._store.read(f"{hangs}/grouped.txt").decode()
    last = max(e["collective_seq_id"] for e in trace["entries"])
    assert f"rank 0: #{last} gloo:all_reduce, state scheduled, retired" in grouped, grouped
    shown = _show(store, run_id)
    assert "status   hung" in shown and "stuck_here" in shown, shown
    row = next(r for r in table_rows(lh.Api(store).runs("hangs")) if r["id"] == run_id)
    assert row["status"] == "hung" and "stuck_here" in row["sentence"] and "hung since" in row["sentence"], row
    _wait_line(proc, "step 13", lines, timeout=30)  # left alone: it goes on
    deadline = time.monotonic() + 10
    while handle.status == "hung":
        assert time.monotonic() < deadline, "still hung after it stepped again"
        time.sleep(0.3)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert [a.ending for a in handle.attempts()] == ["finished"]
    assert not handle._store.exists(hang_key(run_id, handle.attempts()[0].session))
    _no_survivor(tag)


@pytest.mark.slow
def test_a_restart_loop_is_refused_and_a_choice_clears_it(tmp_path: Path) -> None:
    store, run_id, tag = str(tmp_path / "store"), "loop", uuid.uuid4().hex
    first = _launch(store, run_id, tag, "--steps", "30", "--hang-timeout", "none")
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    handle = lh.Api(store).run(run_id)
    assert [c.step for c in handle.checkpoints()] == [10, 20, 30]
    for _ in range(3):
        crash = _launch(store, run_id, tag, "--crash-after-load", "--hang-timeout", "none")
        out, _ = crash.communicate(timeout=120)
        assert crash.returncode == 1, out
    sessions = len(handle.attempts())
    refused = _launch(store, run_id, tag, "--hang-timeout", "none")
    out, _ = refused.communicate(timeout=120)
    assert refused.returncode != 0 and "RestartLoopError" in out, out
    assert "max_failed_restarts=3" in out and "crashed" in out, out
    assert "starts at step" not in out, "it trained before the refusal"
    assert len(handle.attempts()) == sessions, "a refused launch must not start an attempt"
    # every view says so: the runs table (status, sentence, restarts), `launchhelm show`, the picker
    row = next(r for r in table_rows(lh.Api(store).runs("hangs")) if r["id"] == run_id)
    assert row["status"] == "restart loop" and row["restarts"] == 3, row
    assert "3 attempts in a row ended without progress (crashed, crashed, crashed)" in row["sentence"], row
    assert "choose a checkpoint" in row["sentence"]
    assert "status   restart loop" in _show(store, run_id)
    picker = picker_state(handle, None)
    assert "3 attempts in a row" in picker["restart_loop"] and len(picker["attempts"]) == sessions
    assert "restart loop" in picker["sentence"]
    refused_again = _launch(store, run_id, tag, "--hang-timeout", "none")
    out, _ = refused_again.communicate(timeout=120)
    assert refused_again.returncode != 0 and "RestartLoopError" in out, out
    assert sum(1 for e in handle._events.read() if e["type"] == "restart_loop") == 1, "recorded once"
    # a person looks, picks the step-10 checkpoint: the refusal is cleared, and the next launch trains
    ten = next(c for c in handle.checkpoints() if c.step == 10)
    handle.choose_for_resume(ten.id)
    assert handle.summary()["status"] == "stopped"  # as its last attempt left it
    assert not picker_state(handle, None)["restart_loop"]
    cleared = _launch(store, run_id, tag, "--hang-timeout", "none")
    out, _ = cleared.communicate(timeout=120)
    assert cleared.returncode == 0, out
    assert "starts at step 10" in out
    _no_survivor(tag)


@pytest.mark.slow
def test_without_auto_resume_nothing_is_refused(tmp_path: Path) -> None:
    store, run_id, tag = str(tmp_path / "store"), "noloop", uuid.uuid4().hex
    base = ("--no-auto-resume", "--hang-timeout", "none")
    first = _launch(store, run_id, tag, *base, "--steps", "20")
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    for _ in range(4):
        crash = _launch(store, run_id, tag, *base, "--resume", "--crash-after-load")
        out, _ = crash.communicate(timeout=120)
        assert crash.returncode == 1, out
    last = _launch(store, run_id, tag, *base, "--resume", "--steps", "25")
    out, _ = last.communicate(timeout=120)
    assert last.returncode == 0, out
    assert "starts at step 20" in out


# -- "auto": the rule itself, on the watchdog's clock (seconds are simulated: the real defaults) ----------
def _steps(clock: HangClock, t: float, step: int, every: float, count: int) -> tuple[float, int]:
    for _ in range(count):
        t += every
        step += 1
        clock.observe(t, step, 0)
    return t, step


def test_auto_does_not_fire_on_40s_steps() -> None:
    clock = HangClock(AUTO, start=0)
    t, step = _steps(clock, 0.0, 0, 40.0, 50)
    assert clock.timeout() == 400.0  # 10x the slowest recent step, over the 5-minute floor
    clock.observe(t + 399, step, 0)
    assert clock.stalled(t + 399) is None
    assert clock.stalled(t + 401) == pytest.approx(401)


def test_auto_floor_and_arming() -> None:
    clock = HangClock(AUTO, start=0)
    clock.observe(0.0, 0, 0)
    assert clock.stalled(10_000.0) is None  # no step yet: not armed
    clock.observe(900.0, 1, 0)  # the first step took 15 minutes (compile): no measure, not armed
    assert clock.timeout() is None and clock.stalled(1_700.0) is None
    t, _ = _steps(clock, 900.0, 1, 0.8, 5)
    assert clock.timeout() == AUTO_FLOOR  # 0.8 s steps: the 5-minute floor, not 10x the compile
    assert clock.stalled(t + 299) is None and clock.stalled(t + 301) is not None
    assert clock.typical == pytest.approx(0.8)


def test_auto_does_not_count_a_long_save_or_a_pause() -> None:
    clock = HangClock(AUTO, start=0)
    t, step = _steps(clock, 0.0, 0, 1.0, 10)
    for second in range(1, 181):  # a 3-minute save (or pause): the page's section is open
        clock.observe(t + second, step, 1)
        assert clock.stalled(t + second) is None
    t += 180
    clock.observe(t + 1, step, 0)  # the section closed: the step's time starts again
    assert clock.stalled(t + 250) is None
    t, step = _steps(clock, t + 2, step, 1.0, 1)
    assert clock.timeout() == AUTO_FLOOR  # the save's time is no step's time


def test_explicit_timeout_counts_from_the_first_step() -> None:
    clock = HangClock(10.0, start=5)
    clock.observe(0.0, 5, 0)
    assert clock.stalled(60.0) is None  # before its first step (a resume's load, a compile)
    clock.observe(61.0, 6, 0)
    assert clock.stalled(70.0) is None and clock.stalled(71.5) == pytest.approx(10.5)


def test_hang_timeout_is_checked() -> None:
    assert hang_setting("auto") == "auto" and hang_setting(None) is None and hang_setting(3) == 3.0
    for bad in (0, -1, "soon", True, float("nan")):
        with pytest.raises(lh.InvalidArgumentError, match="hang_timeout"):
            hang_setting(bad)
    with pytest.raises(lh.InvalidArgumentError, match="max_failed_restarts"):
        lh.init("hangs", store="memory://bad-limit", max_failed_restarts=0)


def test_summary_names_the_training_thread() -> None:
    dump = (
        "Thread 0x00000000000000aa (most recent call first):\n"
        '  File "/x/threading.py", line 331 in wait\n\n'
        "Current thread 0x00000000000000bb (most recent call first):\n"
        '  File "/x/train.py", line 7 in stuck_here\n'
        '  File "/x/train.py", line 40 in main\n'
    )
    assert summarize_dump(dump, 0xBB) == "`stuck_here` (train.py:7)"
    assert summarize_dump(dump, 0xAA) == "`wait` (threading.py:331)"


@pytest.mark.slow
def test_auto_in_a_real_process_ignores_a_slow_first_step_and_a_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHHELM_HANG_AUTO_FLOOR", "3")  # the floor scaled down: the rule is the same
    monkeypatch.setenv("LAUNCHHELM_HANG_POLL", "0.1")  # looks finer than the floor's tenth
    store = str(tmp_path / "store")
    run = lh.init(
        "hangs", store=store, hang_timeout="auto", heartbeat_interval=0.5, control_interval=0.3, flush_interval=0.3
    )
    handle = lh.Api(store).run(run.id)
    statuses: list[str] = []
    stop = threading.Event()

    def look() -> None:
        while not stop.is_set():
            statuses.append(handle.status)
            time.sleep(0.3)

    watcher = threading.Thread(target=look)
    watcher.start()
    try:
        time.sleep(6)  # a slow first step (a compile): twice the floor
        for step in range(1, 30):
            run.global_step = step
            time.sleep(0.05)
        assert run._helper is not None, "the helper (the hang watchdog) did not start"
        handle.control("pause")
        resume = threading.Timer(7, handle.control, ["resume"])  # paused for twice the floor
        resume.start()
        step = 30
        while resume.is_alive():  # steps go on until one's boundary applies the pause and waits in it
            run.global_step = step
            step += 1
            time.sleep(0.05)
        assert run._beacon.slots[2] == 0  # the pause's section closed
        paused_until = time.monotonic()
        for _ in range(10):
            step += 1
            run.global_step = step
            time.sleep(0.05)
        stop.set()
        watcher.join()
        assert "hung" not in statuses, statuses
        assert not handle._store.list(f"runs/{run.id}/hangs")
        # the positive control: stop stepping for longer than the floor
        time.sleep(6)
        assert handle.status == "hung", time.monotonic() - paused_until
    finally:
        stop.set()
        run.finish()
    assert handle.status == "closed"


@pytest.mark.slow
def test_an_evaluation_in_the_loop_is_no_hang_and_the_same_wait_outside_one_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHHELM_HANG_POLL", "0.1")
    store = str(tmp_path / "store")
    run = lh.init("hangs", store=store, hang_timeout=2, heartbeat_interval=0.5, flush_interval=0.3)
    handle = lh.Api(store).run(run.id)
    try:
        for step in range(1, 6):
            run.global_step = step
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        while run._helper is None and time.monotonic() < deadline:  # the watchdog runs in the helper
            time.sleep(0.05)
        assert run._helper is not None, "the helper (the hang watchdog) did not start"
        with run.evaluating():  # three times the timeout in a validation pass, nested as an integration may
            with run.evaluating():
                time.sleep(3)
            time.sleep(3)
        assert not run._beacon.counting_paused
        assert handle.status != "hung"
        assert not handle._store.list(f"runs/{run.id}/hangs")
        for step in range(6, 10):
            run.global_step = step
            time.sleep(0.05)
        time.sleep(4)  # the positive control: the same wait, not in an evaluation
        assert handle.status == "hung"
    finally:
        run.finish()


def test_the_ranks_places_are_grouped_and_the_odd_one_out_comes_first() -> None:
    waiting = [Frame("graph.py", "_engine_run_backward", 979), Frame("train.py", "main", 60)]
    stuck = [Frame("train.py", "stuck_here", 40), Frame("train.py", "main", 58)]
    groups = group_stacks({0: waiting, 1: stuck, 2: waiting, 3: waiting})
    assert [g.ranks for g in groups] == [[1], [0, 2, 3]]
    place = "`_engine_run_backward` (graph.py:979)"
    assert describe_groups(groups, 4) == f"rank 1 in `stuck_here` (train.py:40); ranks 0, 2, 3 in {place}"
    # two ranks alone: the one waiting in torch for its peer comes second
    assert describe_groups(group_stacks({0: waiting, 1: stuck}), 2).startswith("rank 1 in `stuck_here`")
    assert describe_groups(group_stacks({0: waiting}), 2) == f"rank 0 in {place}; no stacks from rank 1"


# a training script stuck in stuck_here(): where, by its argument (the lines below are read by the test)
STUCK_SCRIPT = """
import faulthandler, signal, sys, threading, time


def stuck_here(where):
    if where == "a":
        time.sleep(600)  # line A
    else:
        time.sleep(600)  # line B


def main(where):
    if where == "c":
        stuck_here("a")  # caller C
    else:
        stuck_here(where)  # caller AB


dump = open(sys.argv[1], "wb")
faulthandler.register(int(sys.argv[3]), file=dump, all_threads=True, chain=False)
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()  # another thread: not the one that hangs
print(hex(threading.get_ident()), flush=True)
main(sys.argv[2])
"""


def _real_dump(tmp_path: Path, rank: int, where: str) -> str:
    """A rank's ``rank-<r>.txt`` made as the helper makes it: faulthandler's own dump of a stuck process,
    asked for with the watchdog's signal."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_SCRIPT)
    out = tmp_path / f"dump-{rank}.txt"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), where, str(DUMP_SIGNAL)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        thread = int(proc.stdout.readline(), 16)
        deadline = time.monotonic() + 20
        dump = ""
        while "in stuck_here" not in dump:  # until the main thread is in the sleep; each dump read alone
            assert time.monotonic() < deadline, dump
            start = out.stat().st_size
            proc.send_signal(DUMP_SIGNAL)
            time.sleep(0.3)
            dump = out.read_text()[start:]
    finally:
        proc.kill()
        proc.wait()
    return stacks_file(f"no step for 10 s after step 12; rank {rank} in ...", thread, dump)


def test_ranks_are_grouped_by_their_whole_stack_in_real_dumps(tmp_path: Path) -> None:
    """Ranks 0 and 1 stand in the same whole stack; rank 2 in the same function, another line; rank 3 on the
    same line, called from another place: three groups, the outliers first, each stack stored once."""
    wheres = {0: "a", 1: "a", 2: "b", 3: "c"}
    files = {rank: _real_dump(tmp_path, rank, where) for rank, where in wheres.items()}
    stacks = {rank: read_stacks_file(text) for rank, text in files.items()}
    lines = STUCK_SCRIPT.splitlines()
    line_a, line_b = (1 + lines.index(next(x for x in lines if x.endswith(m))) for m in ("# line A", "# line B"))
    caller_ab, caller_c = (
        1 + lines.index(next(x for x in lines if x.endswith(m))) for m in ("# caller AB", "# caller C")
    )
    assert [(f.func, f.line) for f in stacks[0]] == [
        ("stuck_here", line_a),
        ("main", caller_ab),
        ("<module>", len(lines)),
    ]
    assert stacks[0] == stacks[1], "identical whole stacks (another process, another thread id) must group"
    assert stacks[2][1:] == stacks[0][1:] and stacks[2][0] != stacks[0][0]
    groups = group_stacks(stacks)
    assert [g.ranks for g in groups] == [[2], [3], [0, 1]], "the same function on another line is another stack"
    detail = describe_groups(groups, 4)
    assert detail == (
        f"rank 2 in `stuck_here` (stuck.py:{line_b}); "
        f"rank 3 in `stuck_here` (stuck.py:{line_a}) from `main` (stuck.py:{caller_c}); "
        f"ranks 0, 1 in `stuck_here` (stuck.py:{line_a}) from `main` (stuck.py:{caller_ab})"
    )
    record = grouped_record(f"no step for 10 s after step 12; {detail}", groups, 4)
    assert record.startswith(f"no step for 10 s after step 12; {detail}\n")
    # each distinct stack once, with its ranks; the other thread (not the training one) is in no group
    assert record.count("in stuck_here") == 3 and "ranks 0, 1 (2 of 4)" in record and "rank 2 (1 of 4)" in record
    assert record.count(f'"{tmp_path / "stuck.py"}", line {line_a} in stuck_here') == 2
    assert "threading.py" not in record


def _note(*groups: tuple[str, int, bool], last: str = "0") -> RecorderNote:
    return {
        "stored": "rank-0.fr.json",
        "last": last,
        "groups": {pg: {"seq": seq, "name": "gloo:all_reduce", "state": "scheduled", "retired": retired}
                   for pg, seq, retired in groups},
    }  # fmt: skip


def test_the_flight_recorders_name_the_rank_behind_in_collectives() -> None:
    """Each rank's last collective; the ranks at a lower number than the others in a process group are
    named behind; a rank whose recorder was not read says why; equal numbers name nobody."""
    notes = {0: _note(("0", 9, False)), 1: _note(("0", 8, True)), 2: _note(("0", 9, False))}
    behind, section = describe_collectives(notes)
    assert behind == "rank 1 last entered collective #8 gloo:all_reduce, ranks 0, 2 at #9, waiting"
    assert section[1:] == [
        "  rank 0: #9 gloo:all_reduce, state scheduled, not retired (waiting)",
        "  rank 1: #8 gloo:all_reduce, state scheduled, retired",
        "  rank 2: #9 gloo:all_reduce, state scheduled, not retired (waiting)",
    ]
    unread: RecorderNote = {"error": "no answer within 5 s"}
    behind, section = describe_collectives({0: _note(("0", 4, True)), 1: _note(("0", 4, True)), 2: unread})
    assert behind == "" and section[-1] == "  rank 2: not read: no answer within 5 s"
    # two process groups: compared within each, and named
    notes = {0: _note(("0", 5, True), ("1", 3, False), last="1"), 1: _note(("0", 5, True), ("1", 2, True))}
    behind, section = describe_collectives(notes)
    assert behind == "rank 1 last entered collective #2 gloo:all_reduce, rank 0 at #3, waiting (process group 1)"
    assert section[1] == "  rank 0: #3 gloo:all_reduce in process group 1, state scheduled, not retired (waiting)"
    # a stacks file carries its rank's note; one without reads as none
    text = stacks_file("no step for 10 s", 0xAB, "Thread 0x..\n", notes[0])
    assert read_recorder_note(text) == notes[0] and read_stacks_file(text) == []
    assert read_recorder_note(stacks_file("no step for 10 s", 0xAB, "Thread 0x..\n")) is None


def test_the_flight_recorder_is_on_where_torch_keeps_it() -> None:
    """torch 2.13 keeps its flight recorder by default; either variable at 0 turns it off, the first wins."""
    from launchhelm.torch._torch_private import flight_recorder_size

    assert flight_recorder_size({}) == 2000
    assert flight_recorder_size({"TORCH_FR_BUFFER_SIZE": "0"}) == 0
    assert flight_recorder_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}) == 0
    assert flight_recorder_size({"TORCH_FR_BUFFER_SIZE": "100", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}) == 100
    assert flight_recorder_size({"TORCH_FR_BUFFER_SIZE": "many", "TORCH_NCCL_TRACE_BUFFER_SIZE": "5"}) == 5
