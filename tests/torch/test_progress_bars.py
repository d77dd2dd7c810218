"""Progress bars where a person waits: a bar on a terminal, at most one line in a job's log.

A training job saves checkpoints in a real child process on moto S3 behind
the suite's proxy (``tests/http_proxy.py``). Its first saves are quick (the
delay raised for them, so a busy machine cannot make them long); then
the proxy holds every request for a second, as a distant or congested store
does, and one save lasts several seconds (a multipart upload takes at least
three rounds). Its stderr is a file in one test and a real pseudo-terminal in
the other, with the console capture on (the default), which points fd 2 at
its own pipe.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from http_proxy import RequestCounter
from lhtest import BUCKET, ROOT, Terminal, child_env

import launchhelm as lh

pytestmark = pytest.mark.slow

#: Seconds the proxy holds each request during the slow save.
_LATENCY = 1.0

# argv: store URL, folder for the handshake files. Two quick saves, then one while the proxy is slow.
_JOB = """
import os, sys, time
from pathlib import Path

import torch
import launchhelm.torch as lht

store, folder = sys.argv[1], Path(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Linear(1024, 1024)                 # 4 MiB of weights, 12 MiB with AdamW's state: two parts
optimizer = torch.optim.AdamW(model.parameters())
run = lht.init("bars", store=store)
run.watch(model, optimizer)
model(torch.randn(4, 1024)).sum().backward()
optimizer.step()
os.environ["LAUNCHHELM_PROGRESS_DELAY"] = "30"     # quick: shorter than the delay, however busy the machine
run.save_checkpoint()
run.save_checkpoint()
del os.environ["LAUNCHHELM_PROGRESS_DELAY"]         # the slow save waits the default 2 s
(folder / "run_id").write_text(run.id)
(folder / "quick").touch()
while not (folder / "slow").exists():               # the test makes the store slow meanwhile
    time.sleep(0.02)
started = time.monotonic()
run.save_checkpoint()
(folder / "seconds").write_text(str(time.monotonic() - started))
(folder / "saved").touch()
while not (folder / "finish").exists():
    time.sleep(0.02)
run.finish()
"""


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[RequestCounter]:
    counter = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    try:
        yield counter
    finally:
        counter.close()


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the job exited ({proc.returncode}) before {path.name}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.02)


def _drive(
    proc: subprocess.Popen[bytes], proxy: RequestCounter, folder: Path, quick_done: Callable[[], None] | None = None
) -> float:
    """Quick saves, then one save through the slow proxy; returns how long the slow save lasted."""
    _wait_for(folder / "quick", proc)
    time.sleep(0.3)  # the console capture's reader passes on what the quick saves wrote
    if quick_done is not None:
        quick_done()
    proxy.latency = _LATENCY
    (folder / "slow").touch()
    _wait_for(folder / "saved", proc)
    proxy.latency = 0.0
    (folder / "finish").touch()
    assert proc.wait(120) == 0
    return float((folder / "seconds").read_text())


def _env(proxy: RequestCounter) -> dict[str, str]:
    # 1 MiB counts as large here, so the 12 MiB checkpoint is one a bar is for; what is tested is the time
    # and where stderr goes (tests/storage/test_large_objects.py tests the size)
    env = child_env(LAUNCHHELM_PROGRESS_MIN_MB="1", AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}")
    env.pop("LAUNCHHELM_PROGRESS", None)
    env.pop("LAUNCHHELM_PROGRESS_DELAY", None)
    return env


def test_a_job_logging_to_a_file_gets_one_line_for_a_long_save_and_no_bar_states(
    proxy: RequestCounter, tmp_path: Path
) -> None:
    """The issue's log: ``save ckpt-...: 0.00B [00:00, ?B/s]save ckpt-...: 384MB [00:00, 5.24GB/s]``. Now the
    quick saves write nothing and the slow one a single line when it ends, in the file and in the run's
    console log alike."""
    store = f"s3://{BUCKET}/bars-{secrets.token_hex(4)}"
    log = tmp_path / "job.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_JOB), store, str(tmp_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=_env(proxy),
            cwd=ROOT,
        )
    try:
        seconds = _drive(proc, proxy, tmp_path)
    finally:
        proc.kill()
    assert seconds > 2 * _LATENCY, seconds  # it was a save a person would wait on
    text = log.read_text()
    assert "\r" not in text and "B/s]" not in text, text
    lines = [line for line in text.splitlines() if "save ckpt-" in line]
    assert len(lines) == 1, text  # the slow save's, not the quick ones'
    assert lines[0].startswith("launchhelm: save ckpt-") and " MiB in " in lines[0] and lines[0].endswith("/s"), lines
    console = lh.Api(store).run((tmp_path / "run_id").read_text()).console()
    assert "\r" not in console and [line for line in console.splitlines() if "save ckpt-" in line] == lines


def test_a_job_on_a_terminal_shows_a_bar_for_a_long_save_only(proxy: RequestCounter, tmp_path: Path) -> None:
    """Under a real pseudo-terminal the quick saves draw nothing, the slow one a bar that moves (tqdm's
    ``\\r`` redraws), though the console capture stands between the job and the terminal."""
    store = f"s3://{BUCKET}/bars-{secrets.token_hex(4)}"
    terminal = Terminal([sys.executable, "-c", textwrap.dedent(_JOB), store, str(tmp_path)], _env(proxy))
    quick = b""

    def after_quick_saves() -> None:
        nonlocal quick
        quick = terminal.output()

    try:
        seconds = _drive(terminal.proc, proxy, tmp_path, after_quick_saves)
    finally:
        terminal.close()
    assert seconds > 2 * _LATENCY, seconds
    assert b"save ckpt-" not in quick, quick  # the quick saves: nobody waited, no bar
    slow = terminal.output()[len(quick) :].decode(errors="replace")
    drawn = [state for state in slow.split("\r") if "save ckpt-" in state]
    assert len(drawn) >= 2, slow  # drawn, then redrawn in place as bytes arrive, not printed once
    assert "B/s" in drawn[-1] and "12.0MB" in drawn[-1], drawn  # all the bytes in the end, and the speed
    assert "launchhelm: save ckpt-" not in slow, slow  # the log's line is for logs only
