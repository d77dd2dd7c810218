"""The console log: what a training process printed, kept in the run, for real processes.

What a user would notice if these failed: ``RunHandle.console()`` missing a
line the script (or a C library, or a child process) printed, or the
terminal no longer showing it; a SIGKILLed run losing output it had already
flushed; a tight print loop eating memory or the log going silent about what
it dropped; pytest's (or a notebook's) own streams left wrapped after
``finish()``; rank 1 of a DDP job mixing into rank 0's log.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from http_proxy import RequestCounter
from lhtest import BUCKET, ROOT, child_env, run_python, spawn

import launchhelm as lh
from launchhelm._console import _capture as _console
from launchhelm._console._capture import ConsoleBuffer, capture_modes, capture_wanted
from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError
from launchhelm.storage import open_store
from launchhelm.storage._keys import console_key

SCRIPT = """
import os, subprocess, sys
import launchhelm as lh
from launchhelm._console import _capture as _console
run = lh.init("console", store=sys.argv[1], flush_interval=0.2)
print("modes", sorted(_console.capture_modes().items()))
print("python print")
print("python to stderr", file=sys.stderr)
os.write(1, b"straight to fd 1\\n")
subprocess.run([sys.executable, "-c", "print('from a child process')"], check=True)
sys.stdout.write("no newline at the end")
run.finish()
print("after finish: not captured")
print(run.id)
"""


@pytest.mark.slow
def test_a_script_keeps_python_c_level_and_child_output_and_still_shows_it(shared_store_url: str) -> None:
    done = run_python(SCRIPT, shared_store_url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    run_id = lines[-1]
    # the terminal (here: the pipe to this test) still got everything, in order
    assert lines[:4] == [
        "modes [('stderr', 'fd'), ('stdout', 'fd')]",
        "python print",
        "straight to fd 1",
        "from a child process",
    ]
    assert "python to stderr" in done.stderr
    text = lh.Api(shared_store_url).run(run_id).console()
    for line in ("python print", "python to stderr", "straight to fd 1", "from a child process"):
        assert f"{line}\n" in text
    assert text.endswith("no newline at the end")
    assert "after finish" not in text
    # stdout and stderr are two pipes read apart: their lines keep each pipe's order, not one shared order
    last_two = lh.Api(shared_store_url).run(run_id).console(tail=2).split("\n")
    assert last_two[1] == "no newline at the end"
    assert last_two[0] in ("from a child process", "python to stderr")
    stdout_only = [line for line in text.splitlines() if line != "python to stderr"]
    assert stdout_only[-3:] == ["straight to fd 1", "from a child process", "no newline at the end"]


TICKER = """
import sys, time
import launchhelm as lh
run = lh.init("console", store=sys.argv[1], flush_interval=0.2)
print(run.id, flush=True)
i = 0
while True:
    print(f"tick {i}", flush=True)
    i += 1
    time.sleep(0.005)
"""


@pytest.mark.slow
def test_a_sigkilled_process_keeps_its_output_up_to_its_last_flush(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    child = spawn(TICKER, store)
    try:
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()
        handle = lh.Api(store).run(run_id)
        deadline = time.monotonic() + 30
        while "tick 100\n" not in handle.console():  # several flushes have gone in
            assert time.monotonic() < deadline and child.poll() is None, child.stderr
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        shown = child.stdout.read().splitlines()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    kept = lh.Api(store).run(run_id).console()
    if not kept.endswith("\n"):  # the kill came between a line and its newline: the flush had the line
        kept, _, cut = kept.rpartition("\n")
        assert re.fullmatch(r"tick \d+", cut), cut
    ticks = [int(line.split()[1]) for line in kept.splitlines() if line.startswith("tick ")]
    assert ticks == list(range(len(ticks)))  # none missing, none twice, in order
    assert len(ticks) > 100
    # what the terminal showed after the last flush is all that is missing
    assert len(shown) + 1 >= len(ticks) - 1
    assert lh.Api(store).run(run_id).status == "stopped"


FLOOD = """
import sys
import threading
import launchhelm as lh

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

# nothing flushed before finish(); no machine samples, whose first (psutil's import) lands anywhere
run = lh.init("console", store=sys.argv[1], flush_interval=3600, system_metrics=False)
marks = {}
for i in range(1_000_000):
    print(f"line {i:07d}")
    if i in (400_000, 999_999):
        marks[i] = rss()
run.finish()
print(marks[400_000], marks[999_999], run.id, file=sys.stderr)
"""


@pytest.mark.slow
def test_a_flood_keeps_memory_flat_and_the_log_counts_every_dropped_line(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    with open(tmp_path / "out.txt", "wb") as out:
        done = subprocess.run(
            [sys.executable, "-c", FLOOD, store],
            stdout=out,
            stderr=subprocess.PIPE,
            env=child_env(),
            cwd=ROOT,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    at_400k, at_1m, run_id = done.stderr.decode().split()[-3:]
    # 600,000 more lines (7.8 MB) printed, the buffer already full at 400,000: memory did not follow
    assert int(at_1m) - int(at_400k) < 2 * 2**20, (at_400k, at_1m)
    assert (tmp_path / "out.txt").read_bytes().count(b"\n") == 1_000_000  # the terminal lost nothing
    text = lh.Api(store).run(run_id).console()
    assert len(text.encode()) <= _console.BUFFER_BYTES + 200
    lines = text.splitlines()
    marker = re.fullmatch(
        r"\[launchhelm: ([\d,]+) lines? \(([\d.]+) MiB\) dropped: output faster than the store takes it\]", lines[-1]
    )
    assert marker is not None, lines[-1]
    kept = lines[:-1]
    assert kept == [f"line {i:07d}" for i in range(len(kept))]  # whole lines, no loss up to the cap
    assert len(kept) + int(marker.group(1).replace(",", "")) == 1_000_000  # and every line after it counted
    assert len(kept) >= 300_000


def test_a_line_past_64_kib_is_cut_with_a_marker_and_the_next_line_kept() -> None:
    limit = _console.LINE_BYTES
    buffer = ConsoleBuffer()
    buffer.feed(b"short\n")
    for _ in range(5):  # 200 KiB + 6 bytes, written in pieces, as a pipe delivers it
        buffer.feed(b"y" * 40_000)
    buffer.feed(b"y" * 6 + b"\nnext\n")
    buffer.feed(b"z" * limit + b"\n")  # exactly the limit: kept whole
    buffer.feed(b"w" * (3 * limit) + b"\nlast")  # one big write (a Python-level tee hands these)
    data = buffer.take()
    assert data is not None and data.endswith(b"\n")  # "last" has no newline yet: it waits a flush
    assert buffer.take() == b"last"  # open for a whole flush interval: handed on as it is
    lines = (data + b"last").split(b"\n")
    assert lines[0] == b"short"
    assert lines[1] == b"y" * limit + f" [launchhelm: line cut at 64.0 KiB, {200_006 - limit:,} bytes dropped]".encode()
    assert lines[2:4] == [b"next", b"z" * limit]
    assert lines[4] == b"w" * limit + f" [launchhelm: line cut at 64.0 KiB, {2 * limit:,} bytes dropped]".encode()
    assert lines[5] == b"last"
    assert buffer.cut_lines == 2
    assert buffer.take() is None  # nothing new: the flush makes no request
    buffer.feed(b"progress 10%")
    assert buffer.take(final=True) == b"progress 10%"  # the session's last flush hands on everything


def test_a_full_buffer_drops_whole_lines_until_the_next_flush_and_says_so() -> None:
    buffer = ConsoleBuffer(limit=100)
    buffer.feed(b"a" * 60 + b"\n")
    buffer.feed(b"open line, ", "stderr")  # a line still open when the flood comes: dropped whole
    buffer.feed(b"b\n" * 30)  # 60 bytes more: over the limit
    buffer.feed(b"c\n")  # and everything after it until the flush takes the buffer
    data = buffer.take()
    assert data == b"a" * 60 + b"\n[launchhelm: 31 lines (73 B) dropped: output faster than the store takes it]\n"
    assert (buffer.dropped_lines, buffer.dropped_bytes) == (31, 73)
    buffer.feed(b"its end\nnext\n", "stderr")  # the rest of the dropped line goes too
    buffer.feed(b"d\n")
    assert buffer.take() == b"next\nd\n[launchhelm: 1 line (8 B) dropped: output faster than the store takes it]\n"
    assert (buffer.dropped_lines, buffer.dropped_bytes) == (32, 81)
    buffer.put_back(b"refused by the store\n")  # a failed flush keeps its bytes first
    buffer.feed(b"e\n")
    assert buffer.take() == b"refused by the store\ne\n"


def _streams() -> tuple[object, ...]:
    return (
        sys.stdout,
        sys.stderr,
        "write" in getattr(sys.stdout, "__dict__", {}),
        "write" in getattr(sys.stderr, "__dict__", {}),
        os.fstat(1).st_ino,
        os.fstat(2).st_ino,
    )


@pytest.mark.slow
def test_finish_puts_this_process_streams_back_exactly_even_after_an_exception(store_url: str) -> None:
    before = _streams()
    run = lh.init("console", store=store_url, flush_interval=3600)
    assert capture_modes() == {"stdout": "python", "stderr": "python"}  # pytest's own streams, teed in place
    assert sys.stdout is before[0] and sys.stderr is before[1]  # the same objects while captured
    print("inside the run")
    print("to stderr inside", file=sys.stderr)
    run.finish()
    assert _streams() == before
    assert capture_modes() == {}
    print("after the run")
    text = lh.Api(store_url).run(run.id).console()
    assert text == "inside the run\nto stderr inside\n"

    with pytest.raises(RuntimeError, match="boom"), lh.init("console", store=store_url) as failing:
        print("before the failure")
        raise RuntimeError("boom")
    assert _streams() == before
    assert lh.Api(store_url).run(failing.id).console() == "before the failure\n"


RESTORE = """
import fcntl, os, sys
import launchhelm as lh
from launchhelm._console import _capture as _console
def state():
    return [(os.fstat(fd).st_ino, os.fstat(fd).st_dev, fcntl.fcntl(fd, fcntl.F_GETFD)) for fd in (1, 2)], (
        id(sys.stdout), id(sys.stderr), type(sys.stdout), vars(sys.stdout).get("write"))
before = state()
try:
    with lh.init("console", store=sys.argv[1]) as run:
        assert _console.capture_modes() == {"stdout": "fd", "stderr": "fd"}
        assert os.fstat(1).st_ino != before[0][0][0]  # a pipe while captured
        print("in the run")
        raise KeyError("boom")
except KeyError:
    pass
assert state() == before, (state(), before)
print("after the run")
print(run.id)
"""


@pytest.mark.slow
def test_a_script_gets_its_file_descriptors_back_exactly(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    done = run_python(RESTORE, store)
    assert done.returncode == 0, done.stderr
    *shown, run_id = done.stdout.splitlines()
    assert shown == ["in the run", "after the run"]
    assert lh.Api(store).run(run_id).console() == "in the run\n"


def test_capture_console_false_keeps_nothing_and_a_non_bool_is_refused() -> None:
    store = open_store(f"memory://console-{os.urandom(3).hex()}")
    run = lh.init("console", store=store, capture_console=False)
    assert capture_modes() == {}
    print("not kept")
    run.finish()
    assert lh.Api(store).run(run.id).console() == ""
    assert store.list(f"runs/{run.id}/console") == []
    with pytest.raises(InvalidTypeError, match="capture_console='no'"):
        lh.init("console", store=store, capture_console="no")  # type: ignore[arg-type]
    assert capture_modes() == {}


def test_only_rank_0_of_a_distributed_job_captures_by_default() -> None:
    assert capture_wanted(True, {})
    assert capture_wanted(True, {"RANK": "0", "WORLD_SIZE": "2"})
    assert not capture_wanted(True, {"RANK": "1", "WORLD_SIZE": "2"})
    assert not capture_wanted(False, {"RANK": "0"})


RANKED = """
import sys
import threading
import launchhelm as lh
from launchhelm._console import _capture as _console
run = lh.init("console", store=sys.argv[1])
print("modes", _console.capture_modes())
run.finish()
print(run.id)
"""


@pytest.mark.slow
def test_a_process_started_as_rank_1_captures_nothing(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    done = run_python(RANKED, store, RANK="1", WORLD_SIZE="2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "modes {}"
    assert lh.Api(store).run(done.stdout.split()[-1]).console() == ""


DDP = """
import os, sys
import torch.distributed as dist
import launchhelm.torch as lht
dist.init_process_group("gloo")
run = lht.init("console", store=sys.argv[1], flush_interval=0.2)
print(f"hello from rank {dist.get_rank()}", flush=True)
dist.barrier()
run.finish()
if dist.get_rank() == 0:
    print("run", run.id, flush=True)
dist.barrier()
dist.destroy_process_group()
# torch 2.13's gloo threads now and then abort a rank at interpreter teardown (tests/torch/ddp_worker.py)
import atexit
atexit._run_exitfuncs()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_under_ddp_the_log_holds_rank_0s_output_only(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    store = str(tmp_path / "store")
    script = tmp_path / "ddp_console.py"
    script.write_text(DDP)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(_free_port()), str(script), store],
        capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hello from rank 1" in done.stdout and "hello from rank 0" in done.stdout  # both still shown
    run_id = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("run "))
    text = lh.Api(store).run(run_id).console()
    assert "hello from rank 0\n" in text
    assert "rank 1" not in text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_with_sessions(store: lh.storage.Store) -> tuple[str, list[str]]:
    """A run of two sessions: 10 flushes of 3 lines, then a resumed session of 2 flushes."""
    run = lh.init("console", store=store, flush_interval=3600)
    first = run.session_id
    for k in range(10):
        print(f"a{k}-0\na{k}-1\na{k}-2")
        run._flush_console()
    sys.stdout.write("a cut short")  # the session ends mid-line
    run.finish(close_run=False)
    again = lh.init("console", store=store, resume=run.id, flush_interval=3600)
    for k in range(2):
        print(f"b{k}")
        again._flush_console()
    again.finish()
    return run.id, [first, again.session_id]


@pytest.mark.slow
def test_sessions_read_in_order_by_id_or_index_and_tail_reads_only_the_last_objects(moto_endpoint: str) -> None:
    prefix = f"console-{os.urandom(3).hex()}"
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}}
    store = open_store(f"s3://{BUCKET}/{prefix}", options)
    try:
        run_id, sessions = _run_with_sessions(store)
        handle = lh.Api(store).run(run_id)
        first = "".join(f"a{k}-0\na{k}-1\na{k}-2\n" for k in range(10)) + "a cut short"
        assert handle.console() == first + "\nb0\nb1\n"  # a newline closes the cut-short line
        assert handle.console(session=sessions[0]) == first
        assert handle.console(session=-1) == handle.console(session=sessions[1]) == "b0\nb1\n"
        assert handle.console(session=0) == first
        proxy.reset()
        assert handle.console(tail=4) == "a9-2\na cut short\nb0\nb1\n"
        # one listing and the last objects (four of the 13) in one concurrent round, not every object
        assert proxy.snapshot() == {f"GET /{BUCKET}": 1, f"GET /{BUCKET}/{prefix}": 4}, proxy.snapshot()
        assert handle.console(tail=0) == ""
        assert handle.console(tail=1000) == handle.console()
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_follower_reads_only_what_is_new(moto_endpoint: str) -> None:
    prefix = f"console-{os.urandom(3).hex()}"
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}}
    store = open_store(f"s3://{BUCKET}/{prefix}", options)
    try:
        run = lh.init("console", store=store, flush_interval=3600)
        for k in range(20):
            print(f"old {k}")
            run._flush_console()
        follower = lh.Api(store).run(run.id).console_follower(tail=3)
        assert follower.poll() == "old 17\nold 18\nold 19\n"
        proxy.reset()
        assert follower.poll() == ""
        assert proxy.total == 1, proxy.snapshot()  # nothing new: the listing only
        print("new 1")
        run._flush_console()
        print("new 2")
        run._flush_console()
        proxy.reset()
        assert follower.poll() == "new 1\nnew 2\n"
        assert proxy.total == 3, proxy.snapshot()  # the listing and the two new objects
        run.finish()
    finally:
        proxy.close()


def test_bad_arguments_say_what_to_give() -> None:
    store = open_store(f"memory://console-{os.urandom(3).hex()}")
    run = lh.init("console", store=store)
    run.finish()
    handle = lh.Api(store).run(run.id)
    with pytest.raises(InvalidArgumentError, match="tail=-1"):
        handle.console(tail=-1)
    with pytest.raises(InvalidTypeError, match="tail='3'"):
        handle.console(tail="3")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="has no session 'nope'"):
        handle.console(session="nope")
    with pytest.raises(InvalidArgumentError, match="0 session"):
        handle.console(session=3)
    assert handle.console(session=run.session_id) == ""  # a real session that printed nothing
    assert console_key(run.id, run.session_id, 7).endswith(f"/console/{run.session_id}/00000007.txt")


LIVE = """
import sys, time
import launchhelm as lh
run = lh.init("console", store=sys.argv[1], flush_interval=0.2)
print(run.id, flush=True)
for i in range(8):
    print(f"live {i}", flush=True)
    time.sleep(0.25)
run.finish()
"""


@pytest.mark.slow
def test_launchhelm_logs_prints_the_log_and_follows_a_live_run(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    child = spawn(LIVE, store)
    try:
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()
        follow = subprocess.run(
            [sys.executable, "-m", "launchhelm._cli", "--store", store, "logs", run_id, "--follow"],
            capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
    assert follow.returncode == 0, follow.stderr
    # it ended by itself when the run did, with every line once
    assert follow.stdout == f"{run_id}\n" + "".join(f"live {i}\n" for i in range(8))
    tail = subprocess.run(
        [sys.executable, "-m", "launchhelm._cli", "--store", store, "logs", run_id, "--tail", "2"],
        capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert tail.stdout == "live 6\nlive 7\n"


CRASH = """
import sys
import threading
import launchhelm as lh
run = lh.init("console", store=sys.argv[1])
print(run.id, flush=True)
print("last words")
raise RuntimeError("the loss went to nan")
"""


@pytest.mark.slow
def test_an_uncaught_exception_leaves_its_traceback_in_the_log_in_order(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    # stdout and stderr to one place (a terminal, `> log 2>&1`): one pipe, so the log keeps their order
    done = subprocess.run(
        [sys.executable, "-c", CRASH, store],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "RuntimeError: the loss went to nan" in done.stdout  # still shown
    text = lh.Api(store).run(done.stdout.split()[0]).console()
    assert text == done.stdout  # exactly what the terminal got
    assert "last words\nTraceback (most recent call last):\n" in text
    assert text.endswith("RuntimeError: the loss went to nan\n")


def test_two_live_sessions_in_one_process_both_keep_what_is_printed() -> None:
    store = open_store(f"memory://console-{os.urandom(3).hex()}")
    before = _streams()
    first = lh.init("console", store=store)
    second = lh.init("console", store=store)
    print("both see this")
    first.finish()
    assert capture_modes() == {"stdout": "python", "stderr": "python"}  # the second still captures
    print("only the second")
    second.finish()
    assert _streams() == before
    assert lh.Api(store).run(first.id).console() == "both see this\n"
    assert lh.Api(store).run(second.id).console() == "both see this\nonly the second\n"


def _run_cell(client: object, code: str) -> str:
    """Execute ``code`` in a real kernel; return what the cell showed (its stream output)."""
    msg_id = client.execute(code)  # type: ignore[attr-defined]
    shown = []
    while True:
        msg = client.get_iopub_msg(timeout=60)  # type: ignore[attr-defined]
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "stream":
            shown.append(msg["content"]["text"])
        elif kind == "error":
            raise AssertionError("\n".join(msg["content"]["traceback"]))
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(shown)


@pytest.mark.slow
def test_in_a_jupyter_kernel_cells_still_show_their_output_and_the_run_keeps_it(tmp_path: Path) -> None:
    manager_module = pytest.importorskip("jupyter_client.manager")
    store = str(tmp_path / "store")
    env = child_env()
    env.pop("PYTEST_CURRENT_TEST", None)  # ipykernel forwards fd-level output only outside pytest
    manager, client = manager_module.start_new_kernel(kernel_name="python3", env=env, cwd=str(ROOT))
    try:
        shown = _run_cell(
            client,
            "import os, sys, time\nimport launchhelm as lh\nfrom launchhelm._console import _capture as _console\n"
            "before = (sys.stdout, sys.stderr, type(sys.stdout))\n"
            f"run = lh.init('console', store={store!r}, flush_interval=0.2)\n"
            "print('modes', sorted(_console.capture_modes().items()))",
        )
        assert shown == "modes [('stderr', 'kernel'), ('stdout', 'kernel')]\n"  # ipykernel's OutStream, teed
        assert _run_cell(client, "print('from a cell')\nprint('a warning', file=sys.stderr)") == (
            "from a cell\na warning\n"
        )
        # fd-level output (a C library, a child process): ipykernel forwards it through write()
        _run_cell(client, "os.system('echo from a child process'); time.sleep(0.5)")
        after = _run_cell(
            client,
            "print('just before finish')\nrun.finish()\n"
            "print((sys.stdout, sys.stderr, type(sys.stdout)) == before, type(sys.stdout).__name__, run.id)",
        )
        last_words, restored, kind, run_id = after.split("\n", 1)[0], *after.split("\n", 1)[1].split()
        assert last_words == "just before finish"
        assert (restored, kind) == ("True", "OutStream")  # the kernel's own streams again
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    text = lh.Api(store).run(run_id).console()
    assert text.startswith("modes [('stderr', 'kernel'), ('stdout', 'kernel')]\nfrom a cell\na warning\n")
    assert "from a child process\n" in text
    assert text.endswith("just before finish\n")  # written in the cell that ended the run


def test_what_reaches_the_terminal_goes_in_whole_lines_of_atomic_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipe write of up to PIPE_BUF bytes is atomic: no other rank's bytes inside, no half of it left by
    a SIGKILL. The reader forwards in such writes, each ending at a newline, so lines reach the terminal whole."""
    from launchhelm._console import _capture as _console

    data = b"".join(f"saving {i}\n".encode() for i in range(5000)) + b"x" * 9000 + b"\nlast, no newline"
    writes: list[bytes] = []
    monkeypatch.setattr(_console.os, "write", lambda fd, chunk: writes.append(bytes(chunk)) or len(chunk))
    _console._forward(99, data)
    assert b"".join(writes) == data
    assert all(len(w) <= _console._ATOMIC_WRITE for w in writes)
    # every write ends a line, except where one line alone is longer than a write, and the very end
    ends = [w.endswith(b"\n") for w in writes]
    assert all(ends[: len(writes) - 5])
    assert sum(not e for e in ends) <= 4


def test_in_a_kernel_the_echo_is_a_c_level_append_and_both_streams_keep_their_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ipykernel's real ``OutStream`` on a real IOPub thread, in this process: the copy stdout's echo makes
    is ``list.append`` itself (no Python frame per write, so a print loop runs at the kernel's speed), and
    stdout and stderr interleaved line by line reach the log in exactly the order they were written."""
    zmq = pytest.importorskip("zmq")
    session_module = pytest.importorskip("jupyter_client.session")
    iostream = pytest.importorskip("ipykernel.iostream")
    socket = zmq.Context.instance().socket(zmq.PUB)
    socket.bind_to_random_port("tcp://127.0.0.1")
    iopub = iostream.IOPubThread(socket)
    iopub.start()
    session = session_module.Session()
    out = iostream.OutStream(session, iopub, "stdout", watchfd=False)
    err = iostream.OutStream(session, iopub, "stderr", watchfd=False)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    store = open_store(f"memory://console-{os.urandom(3).hex()}")
    try:
        run = lh.init("console", store=store, system_metrics=False)
        assert capture_modes() == {"stdout": "kernel", "stderr": "kernel"}
        assert type(out.echo.write).__name__ == "builtin_function_or_method"  # the C-level append
        expected = []
        for i in range(3000):
            print(f"out {i}")
            expected.append(f"out {i}\n")
            if i % 7 == 0:
                print(f"err {i}", file=sys.stderr)
                expected.append(f"err {i}\n")
        run.finish()
        assert (out.echo, err.echo) == (None, None)  # put back as they were
        assert capture_modes() == {}
        assert lh.Api(store).run(run.id).console() == "".join(expected)
    finally:
        monkeypatch.undo()
        iopub.stop()
        iopub.close()
        socket.close()


def test_a_python_level_flood_whose_writes_release_the_gil_keeps_the_queue_bounded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A Python stream on a file (each buffer-full write releases the GIL for a moment, which can keep the
    drainer thread from running): the writer drains the queue itself, so it never holds more than a batch."""

    class Stream:  # a Python-level stream with no fd 1 behind it
        def __init__(self, path: Path) -> None:
            self._file = open(path, "w")  # noqa: SIM115  # closed below

        def write(self, text: str) -> int:
            return self._file.write(text)

        def flush(self) -> None:
            self._file.flush()

    stream = Stream(tmp_path / "out.txt")
    monkeypatch.setattr(sys, "stdout", stream)
    store = open_store(f"memory://console-{os.urandom(3).hex()}")
    run = lh.init("console", store=store, system_metrics=False)
    try:
        assert capture_modes()["stdout"] == "python"
        queue = _console._capture.write_queue()
        longest = 0
        for i in range(100_000):
            print(f"line {i:07d}")
            longest = max(longest, len(queue.items))
        assert longest <= _console._QUEUE_ITEMS + 1
    finally:
        run.finish()
        monkeypatch.undo()
        stream._file.close()
    assert (tmp_path / "out.txt").read_text().count("\n") == 100_000  # the stream still got every line
    text = lh.Api(store).run(run.id).console()
    kept = text.count("line ")
    dropped = sum(int(n.replace(",", "")) for n in re.findall(r"\[launchhelm: ([\d,]+) lines? \(", text))
    assert kept + dropped == 100_000


@pytest.mark.serial  # times a read to 20 ms and 1 s
def test_the_terminal_gets_a_line_written_in_pieces_whole_and_a_line_never_ended_soon() -> None:
    """An unbuffered ``print("saving", 12)`` is four writes: the reader passes the line on in one write once
    its newline came (a SIGKILL in between leaves no half line on the terminal); a progress bar that never
    ends its line is passed on after a moment all the same."""
    from launchhelm._console import _capture as _console

    source_read, source_write = os.pipe()
    terminal_read, terminal_write = os.pipe()
    reader = threading.Thread(target=_console._StreamCapture("stdout", 1, _console._Capture())._pump,
                              args=(source_read, terminal_write), daemon=True)  # fmt: skip
    reader.start()
    for piece in (b"saving", b" ", b"12"):
        os.write(source_write, piece)
        time.sleep(0.01)  # each its own read: the reader sees the line in pieces
    assert select.select([terminal_read], [], [], 0.02)[0] == []  # nothing of the half line yet
    os.write(source_write, b"\n")
    assert os.read(terminal_read, 100) == b"saving 12\n"  # whole, in one write
    os.write(source_write, b"progress 50%")
    started = time.monotonic()
    assert os.read(terminal_read, 100) == b"progress 50%"
    assert time.monotonic() - started < 1.0
    os.close(source_write)
    reader.join(5)
    assert not reader.is_alive()
    os.close(terminal_read)
