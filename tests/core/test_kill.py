"""SIGKILL in the middle of a flush: what was flushed before stays readable,
and no half-written chunk ever breaks a read."""

from __future__ import annotations

import os
import pathlib
import signal
import time

import pytest
from lhtest import CountingProxy, helper_pids, make_store_url, proc_io, spawn

import launchhelm as lh

# Flushes big chunks back to back, reporting each step range once flush()
# has returned: the parent kills it at a random moment, most likely mid-write.
FLUSHER = """
import sys, launchhelm as lh
run = lh.init("kill", store=sys.argv[1], flush_interval=3600)
print(run.id, flush=True)
step = 0
while True:
    for _ in range(4000):
        step += 1
        run.log({"a": step * 0.5, "b": -step, "c": step % 7, "d": 1.0 / step}, step=step)
    run.flush()
    print(step, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.05, 0.17, 0.31])
def test_sigkill_mid_flush_keeps_every_flushed_point_readable(shared_store_url: str, delay: float) -> None:
    # the store's own atomicity, without the spool (which would bring back the unflushed rest: test_spool.py)
    proc = spawn(FLUSHER, shared_store_url, LAUNCHHELM_SPOOL="off")
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    flushed = 0
    try:
        for _ in range(3):  # let a few flushes land
            line = proc.stdout.readline().strip()
            assert line.isdigit(), (line, proc.stderr.read() if proc.stderr else "")
            flushed = int(line)
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # anything the child reported before the kill; it may have flushed more
    for line in proc.stdout.read().split():
        flushed = max(flushed, int(line))

    handle = lh.Api(shared_store_url).run(run_id)
    assert handle.status == "stopped"
    frame = handle.history()
    assert len(frame) >= flushed
    assert frame["step"].tolist() == list(range(1, len(frame) + 1))  # no gap, no half chunk
    assert frame["a"].tolist() == [s * 0.5 for s in frame["step"]]
    assert frame["d"].tolist() == [1.0 / s for s in frame["step"]]
    assert len(frame) % 4000 == 0  # only whole chunks are ever visible
    resumed = lh.init("kill", resume=run_id, store=shared_store_url)
    assert resumed.global_step == len(frame)
    resumed.finish()


BIG_FLUSH = """
import sys, launchhelm as lh
run = lh.init("kill", store=sys.argv[1], flush_interval=3600)
for step in range(1, 1001):
    run.log({"a": step * 0.5, "b": 1.0 / step}, step=step)
run.flush()
print(run.id, flush=True)
for step in range(1001, 301001):
    run.log({"a": step * 0.5, "b": 1.0 / step}, step=step)
print("flushing", flush=True)
run.flush()
print("flushed", flush=True)
"""


def _written(pid: int) -> int:
    """Bytes the process has written to files so far (/proc/PID/task/*/io)."""
    return proc_io(pid, "wchar")


@pytest.mark.slow
def test_sigkill_while_a_big_chunk_is_being_written_leaves_no_partial_chunk(shared_store_url: str) -> None:
    # The chunk is ~6 MB; the child is killed once 1 MB of it has gone out
    # (into the staging file, or through a proxy in front of the emulator): mid-write.
    local = "://" not in shared_store_url
    proxy = None
    env = {}
    if not local:
        from emulators import emulator_port, proxied_env

        proxy = CountingProxy(emulator_port(shared_store_url))  # moto, fake-gcs-server or Azurite
        env = proxied_env(shared_store_url, proxy.port)
    try:
        caught = _kill_mid_write(shared_store_url, local, proxy, env)
    finally:
        if proxy:
            proxy.close()
    assert caught, "never managed to kill the writer mid-flush in 5 tries"


@pytest.mark.slow
def test_a_node_lost_mid_write_through_its_helper_leaves_no_partial_chunk(
    tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    # LAUNCHHELM_HELPER_STORE=1: the session's helper makes the store's requests, so the training process's
    # death alone never cuts a write (the helper finishes it); a node's loss kills both mid-write
    from emulators import emulator_port, proxied_env

    url = make_store_url("s3", tmp_path, request)
    proxy = CountingProxy(emulator_port(url))
    try:
        env = {**proxied_env(url, proxy.port), "LAUNCHHELM_HELPER_STORE": "1"}
        caught = _kill_mid_write(url, False, proxy, env, whole_node=True)
    finally:
        proxy.close()
    assert caught, "never managed to kill the helper mid-write in 5 tries"


def _kill_mid_write(
    shared_store_url: str,
    local: bool,
    proxy: CountingProxy | None,
    env: dict[str, str],
    whole_node: bool = False,
) -> bool:
    for _ in range(5):
        proc = spawn(BIG_FLUSH, shared_store_url, LAUNCHHELM_SPOOL="off", **env)  # the store's atomicity alone
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "flushing"
        helpers = helper_pids(proc.pid) if whole_node else []
        assert helpers or not whole_node, "no helper serves the store"
        try:
            pid = proc.pid
            written = (lambda: proxy.sent) if proxy else (lambda: _written(pid))  # noqa: B023
            base = written()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and written() - base < 2**20:
                time.sleep(0.0005)
        finally:
            for helper in helpers:  # the writer first: the training process must not take the write over
                os.kill(helper, signal.SIGKILL)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        rest = proc.stdout.read()
        store = lh.Api(shared_store_url).store
        # listed before the read: an emulator may commit a request whose body had all gone out just
        # after the read, and the read then shows that the write completed
        listed = store.list(f"runs/{run_id}/metrics")
        frame = lh.Api(shared_store_url).run(run_id).history()
        if "flushed" in rest or len(frame) > 1000:
            continue  # the write completed before the kill landed: try again
        assert frame["step"].tolist() == list(range(1, 1001))
        assert frame["b"].tolist() == [1.0 / s for s in range(1, 1001)]
        assert len(listed) == 1  # the killed chunk is not there at all
        if local:
            staging = __import__("pathlib").Path(shared_store_url) / ".staging"
            assert any(staging.glob("*.tmp")), "the kill did not land mid-write"
            assert not any(name.startswith(".staging") for name in store.list(""))
        return True
    return False
