"""Long runs: a live session's memory is bounded by its settings, never by how long it has run.

If these fail, a run that logs for a day ends in the OOM killer: the
process keeps every table compaction ever built, or every point logged
faster than the store takes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from lhtest import child_env

import launchhelm as lh
from launchhelm._metrics._layout import list_metrics, read_manifest

# Logs at full speed with a flush and the background compaction step every 2,000 steps (200 of them),
# so segments merge through several levels; samples Arrow's allocations (after gc) while it runs,
# and its peak at the end.
_CHILD = textwrap.dedent(
    """
    import gc, json, sys, time
    import pyarrow as pa
    import launchhelm as lh
    import launchhelm._metrics._compact, launchhelm._metrics._flusher
    # compaction due after every flush: many merges in a few seconds
    launchhelm._metrics._flusher.CHUNKS_PER_SEGMENT = launchhelm._metrics._compact.CHUNKS_PER_SEGMENT = 1
    store, steps, memory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    run = lh.init("long", store=store, system_metrics=False, capture_console=False,
                  flush_interval=3600, compaction_memory=memory)
    samples = []
    for step in range(steps):
        run.log({"a": step, "b": -step, "c": step * 0.5, "d": 1.0, "e": 2.0}, step=step)
        if step % 2_000 == 1_999:
            run.flush()
            run._compact(only_if_due=True)  # what the background thread does after each flush
        if step % 20_000 == 0:
            gc.collect()
            samples.append(pa.total_allocated_bytes())
    run.finish()
    gc.collect()
    print(json.dumps({"run": run.id, "samples": samples, "end": pa.total_allocated_bytes(),
                      "peak": pa.default_memory_pool().max_memory()}))
    """
)


@pytest.mark.slow
def test_compaction_through_several_levels_holds_arrow_memory_under_its_bound(tmp_path: Path) -> None:
    """Arrow's allocations never pass ``compaction_memory``, though the run's points decoded take ~8 times it,
    and every point reads back exactly."""
    store, steps, bound = str(tmp_path / "store"), 400_000, 8 * 2**20
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, store, str(steps), "8MiB"],
        # the encoder and compactor in the child itself (the same code its helper runs by default)
        env=child_env(LAUNCHHELM_SPOOL=str(tmp_path / "spool"), LAUNCHHELM_HELPER_FLUSH="0"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert max(report["samples"]) <= bound, report["samples"]
    assert report["peak"] <= bound, report["peak"]  # the high-water mark, compactions included
    opened = lh.storage.open_store(store)
    manifest = read_manifest(opened, report["run"], list_metrics(opened, report["run"]).newest_manifest)
    assert max(s.level for s in manifest.segments) >= 2  # merges of merges ran
    assert sum(s.rows for s in manifest.segments) == steps * 5
    frame = lh.Api(store).run(report["run"]).history()
    assert frame["step"].tolist() == list(range(steps))
    assert frame["a"].tolist() == [float(s) for s in range(steps)]
    assert frame["b"].tolist() == [-float(s) for s in range(steps)]
    assert frame["c"].tolist() == [s * 0.5 for s in range(steps)]


@pytest.mark.slow
def test_logging_that_outruns_the_store_holds_bounded_memory_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No flush runs while a million values are logged (as when the store is slower than the loop):
    the process holds a bounded amount, the rest waits in the spool, and every point reads back."""
    import tracemalloc

    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(tmp_path / "spool"))
    store = str(tmp_path / "store")
    run = lh.init(
        "long", store=store, system_metrics=False, capture_console=False, flush_interval=3600, compaction_memory="4MiB"
    )
    steps = 200_000
    tracemalloc.start()
    try:
        for step in range(steps):
            # a second layout of keys now and then: the spool's rows are not all alike
            row = {"a": step, "b": -step, "c": step * 0.5, "d": 1.0, "e": 2.0} if step % 1000 else {"rare": step}
            run.log(row, step=step)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 984,800 values: ~17 MB as compact columns, ~90 MB as dicts; the bound is half of compaction_memory
    assert peak <= 3 * 2**20, peak
    run.finish()
    frame = lh.Api(store).run(run.id).history()
    expected = [s for s in range(steps) if s % 1000]
    assert frame["step"].tolist() == list(range(steps))
    body = frame.dropna(subset=["a"])
    assert body["step"].tolist() == expected
    assert body["a"].tolist() == [float(s) for s in expected]
    assert body["c"].tolist() == [s * 0.5 for s in expected]
    rare = frame.dropna(subset=["rare"])
    assert rare["rare"].tolist() == [float(s) for s in range(0, steps, 1000)]
    assert not (tmp_path / "spool" / run.id).exists()  # every point stored: the spool is gone


@pytest.mark.slow
def test_a_session_that_logs_flushes_and_compacts_never_imports_pandas(tmp_path: Path) -> None:
    """pandas costs a training process ~0.4 s and ~60 MB, and imported by the background thread it
    stalls the loop: writing and compacting metrics must not need it (reading them does)."""
    child = textwrap.dedent(
        """
        import sys
        import launchhelm as lh
        import launchhelm._metrics._compact, launchhelm._metrics._flusher
        launchhelm._metrics._flusher.CHUNKS_PER_SEGMENT = launchhelm._metrics._compact.CHUNKS_PER_SEGMENT = 1
        run = lh.init("lean", store=sys.argv[1], system_metrics=False, capture_console=False, flush_interval=3600)
        for step in range(2_000):
            run.log({"loss": 1.0 / (step + 1), "lr": 3e-4}, step=step)
            if step % 200 == 199:
                run.flush()
                run._compact(only_if_due=True)  # ten compactions: a merge into level 1 among them
        run.finish()
        print(sorted(m for m in ("pandas", "torch", "altair", "IPython") if m in sys.modules))
        """
    )
    store = str(tmp_path / "store")
    out = subprocess.run(
        [sys.executable, "-c", child, store],
        # the encoder and compactor in the child itself (the same code its helper runs by default)
        env=child_env(LAUNCHHELM_SPOOL=str(tmp_path / "spool"), LAUNCHHELM_HELPER_FLUSH="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    (run_id,) = [p.name for p in (tmp_path / "store" / "runs").iterdir()]
    opened = lh.storage.open_store(store)
    manifest = read_manifest(opened, run_id, list_metrics(opened, run_id).newest_manifest)
    assert max(s.level for s in manifest.segments) >= 1
    assert lh.Api(store).run(run_id).history()["step"].tolist() == list(range(2_000))


_POOL_CHILD = textwrap.dedent(
    """
    import sys
    import pyarrow as pa
    import launchhelm as lh
    before = pa.default_memory_pool().backend_name
    run = lh.init("pool", store=sys.argv[1], system_metrics=False, capture_console=False)
    run.log({"loss": 1.0}, step=0)
    run.finish()
    print(before, pa.default_memory_pool().backend_name)
    """
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # the helper writes the chunks (the default): the training process's pool is the user's
        ({}, "mimalloc"),
        # the training process writes them itself: its pool is still the user's (issue 40: nothing
        # process-wide changes there), whatever mimalloc keeps resident
        ({"LAUNCHHELM_HELPER_FLUSH": "0"}, "mimalloc"),
        ({"LAUNCHHELM_HELPER_FLUSH": "0", "ARROW_DEFAULT_MEMORY_POOL": "system"}, "system"),
    ],
)
def test_init_leaves_the_training_processs_pyarrow_pool_to_the_user(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    pa = pytest.importorskip("pyarrow")
    if "jemalloc" not in pa.supported_memory_backends():
        pytest.skip("this pyarrow is built without jemalloc")
    chosen = ("ARROW_DEFAULT_MEMORY_POOL", "LAUNCHHELM_ARROW_POOL", "LAUNCHHELM_HELPER_FLUSH")
    base = {k: v for k, v in child_env().items() if k not in chosen}
    out = subprocess.run(
        [sys.executable, "-c", _POOL_CHILD, str(tmp_path / "store")],
        env={**base, "LAUNCHHELM_SPOOL": str(tmp_path / "spool"), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split()
    assert after == expected, (before, after)
    assert lh.Api(str(tmp_path / "store")).runs("pool")["id"].size == 1  # the session's points still landed


_HELPER_POOL_CHILD = textwrap.dedent(
    """
    import pyarrow as pa
    from launchhelm._metrics._flusher import warm_up_encoder
    from launchhelm._metrics._heap import own_this_process
    own_this_process()  # as the helper's main() does
    warm_up_encoder()
    print(pa.default_memory_pool().backend_name)
    """
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # mimalloc keeps what the flush thread's tables freed resident (see prefer_returning_pool): the
        # helper, LaunchHelm's own process, switches its own pool to jemalloc, unless the user chose
        ({}, "jemalloc"),
        ({"ARROW_DEFAULT_MEMORY_POOL": "system"}, "system"),
        ({"LAUNCHHELM_ARROW_POOL": "keep"}, "mimalloc"),
    ],
)
def test_the_helper_switches_its_own_pyarrow_pool_unless_the_user_chose(env: dict[str, str], expected: str) -> None:
    pa = pytest.importorskip("pyarrow")
    if "jemalloc" not in pa.supported_memory_backends():
        pytest.skip("this pyarrow is built without jemalloc")
    base = {k: v for k, v in child_env().items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "LAUNCHHELM_ARROW_POOL")}
    out = subprocess.run(
        [sys.executable, "-c", _HELPER_POOL_CHILD], env={**base, **env}, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [expected]


_TRIM_CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from launchhelm._metrics._heap import give_back_free_heap, own_this_process
    from launchhelm._metrics._pause import pause

    if sys.argv[2] == "helper":
        own_this_process()  # as the helper's main() does

    def anon_mib():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("RssAnon:"))

    big = bytes(16 << 20)
    del big  # a freed mmapped block: glibc now serves blocks up to 16 MiB from its heap
    give_back_free_heap()  # where the growth of resident memory counts from
    holes, kept = [], []
    for _ in range(256):
        block = bytearray(256 << 10)
        block[::4096] = b"x" * 64  # each page touched: resident
        holes.append(block)  # 64 MiB
        kept.append(bytearray(600))  # a live block between each two: freed, they stay holes
    del holes
    before = anon_mib()
    if sys.argv[1] == "trim":
        give_back_free_heap()
    elif sys.argv[1] == "pause":  # the flush thread between two pieces of work
        time.sleep(0.5)  # trims asked for by growth are spaced (100 times as long as the last took)
        worker = threading.Thread(target=pause)
        worker.start()
        worker.join()
    print(before, anon_mib())
    """
)


def _policies(pid: int) -> dict[int, int]:
    """The scheduling policy of each thread of process ``pid`` (threads that exited meanwhile left out)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[int(task.name)] = os.sched_getscheduler(int(task.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")
@pytest.mark.parametrize("flushing", ["helper", "trainer", "no spool"])
def test_every_thread_of_the_training_process_keeps_the_default_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flushing: str
) -> None:
    """Under the default policy the waking flush thread preempted log() 79 times a minute (bench_log), so the
    helper's threads that encode run under SCHED_BATCH; the training process's scheduling is the user's and
    left alone (issue 40), even where it encodes itself (LAUNCHHELM_HELPER_FLUSH=0, or a memory store, whose
    points no helper can read)."""
    store = str(tmp_path / "store")
    if flushing == "trainer":
        monkeypatch.setenv("LAUNCHHELM_HELPER_FLUSH", "0")
    elif flushing == "no spool":
        store = f"memory://policy-{os.getpid()}-{time.monotonic_ns()}"
    run = lh.init("policy", store=store, system_metrics=False, capture_console=False)
    try:
        worker = run._worker
        assert worker.is_alive() and worker.native_id is not None
        for step in range(2_000):
            run.log({"loss": 1.0 / (step + 1)}, step=step)
        run.flush()  # the chunks written, here or by the helper: every thread that encodes has started
        if flushing == "helper":
            assert run._points_to_helper
            pid = run._helper_pid()
            assert pid is not None
            # the helper's own threads that encode give up the CPU on waking (a thread's policy is its own)
            deadline = time.monotonic() + 30
            while os.SCHED_BATCH not in _policies(pid).values() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert os.SCHED_BATCH in _policies(pid).values(), _policies(pid)
        mine = _policies(os.getpid())
        assert worker.native_id in mine and set(mine.values()) == {os.SCHED_OTHER}, mine
    finally:
        run.finish()


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
    reason="malloc_trim is glibc's",
)
@pytest.mark.parametrize("how", ["trim", "pause"])
def test_after_a_merge_the_helpers_free_holes_go_back_to_the_system(how: str) -> None:
    # glibc keeps the free holes between live blocks resident; a day of merges leaves many (bench_soak),
    # and a flood on S3 more; the helper's pauses trim once resident memory grew 8 MiB
    out = subprocess.run(
        [sys.executable, "-c", _TRIM_CHILD, how, "helper"], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert before - after >= 48, (before, after)


@pytest.mark.parametrize(("how", "process"), [("none", "helper"), ("trim", "trainer"), ("pause", "trainer")])
def test_without_a_trim_the_heaps_keep_their_free_holes(how: str, process: str) -> None:
    """The control: what the test above gives back is what glibc would have kept. And a training process
    is the user's (issue 40): its heap is never trimmed, whoever asks."""
    out = subprocess.run(
        [sys.executable, "-c", _TRIM_CHILD, how, process], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert before - after < 16, (before, after)


_OUTAGE_CHILD = textwrap.dedent(
    """
    import socket, sys, threading, time
    import numpy as np
    import launchhelm as lh

    upstream = int(sys.argv[2])

    class Gate:
        # a TCP forwarder to moto that can refuse connections (its listening socket closed) and come back
        def __init__(self):
            self.port = None
            self.conns = []
            self.open()

        def open(self):
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("127.0.0.1", self.port or 0))
            srv.listen(64)
            self.port, self.srv = srv.getsockname()[1], srv
            threading.Thread(target=self.accept, args=(srv,), daemon=True).start()

        def close(self):
            self.srv.close()
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self.conns = []

        def accept(self, srv):
            while True:
                try:
                    client, _ = srv.accept()
                except OSError:
                    return
                up = socket.create_connection(("127.0.0.1", upstream))
                self.conns += [client, up]
                for a, b in ((client, up), (up, client)):
                    threading.Thread(target=self.pipe, args=(a, b), daemon=True).start()

        @staticmethod
        def pipe(a, b):
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    gate = Gate()
    opts = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{gate.port}"}}
    run = lh.init("outage", store=sys.argv[1], storage_options=opts, system_metrics=False,
                  capture_console=False, flush_interval=0.2, heartbeat_interval=0.5, heartbeat_timeout=30)
    step = 0
    images = len(sys.argv) > 5 and sys.argv[5] == "images"
    def log_for(seconds):
        global step
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(100):
                run.log({"x": float(step)}, step=step)
                step += 1
            if images:  # media handed to the helper, which meets the outage too
                run.log({"img": lh.Image(np.full((8, 8, 3), step % 256, dtype=np.uint8))}, step=step - 1)
            time.sleep(0.005)
    log_for(1.5)
    gate.close()       # refuses connections now
    log_for(float(sys.argv[3]))
    if sys.argv[4] == "comes-back":
        gate.open()        # answers again
        log_for(3.0)
    print("RUN", run.id, step, flush=True)
    run.finish()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("media", ["numbers", "images"])
def test_an_outage_is_said_in_one_line_and_its_end_in_another(moto_endpoint: str, tmp_path: Path, media: str) -> None:
    """S3 refusing connections mid-run: nothing lost, one warning line, one recovery line, no traceback.

    With images, the helper storing them meets the outage too, and says nothing of its own.
    """
    import secrets

    from lhtest import BUCKET

    store = f"s3://{BUCKET}/{secrets.token_hex(6)}"
    out = subprocess.run(
        [sys.executable, "-c", _OUTAGE_CHILD, store, moto_endpoint.rsplit(":", 1)[1], "6", "comes-back", media],
        env=child_env(LAUNCHHELM_SPOOL=str(tmp_path / "spool")),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    down = [line for line in lines if "is not answering since" in line]
    up = [line for line in lines if "answers again after" in line]
    assert len(down) == 1 and len(up) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "never retrieved" not in out.stderr, out.stderr[-3000:]
    assert len(lines) == 2, out.stderr[-3000:]
    run_id, steps = out.stdout.split("RUN", 1)[1].split()
    opened = lh.storage.open_store(store, {"client_kwargs": {"endpoint_url": moto_endpoint}})
    frame = lh.Api(opened).run(run_id).history()
    assert frame["x"].tolist() == [float(s) for s in range(int(steps))]
    if media == "images":  # every picture, the ones logged while the store was down included
        items = lh.Api(opened).run(run_id).media("img")
        assert [item.step for item in items] == list(range(99, int(steps), 100))
        assert all(int(item.load()[0, 0, 0]) == (item.step + 1) % 256 for item in items)


@pytest.mark.slow
def test_finish_during_an_outage_waits_a_bounded_time_and_leaves_the_points_for_recover(
    moto_endpoint: str, tmp_path: Path
) -> None:
    """The store never comes back: finish() gives up after LAUNCHHELM_FINISH_TIMEOUT, says where the points
    are, and ``launchhelm recover`` uploads every one of them once the process is gone."""
    import secrets
    import time

    from lhtest import BUCKET

    store = f"s3://{BUCKET}/{secrets.token_hex(6)}"
    env = child_env(LAUNCHHELM_SPOOL=str(tmp_path / "spool"), LAUNCHHELM_FINISH_TIMEOUT="2")
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _OUTAGE_CHILD, store, moto_endpoint.rsplit(":", 1)[1], "2", "stays-down"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    took = time.monotonic() - started
    assert out.returncode != 0  # finish() raised: the run's end is not stored
    assert "StoreUnreachableError" in out.stderr.splitlines()[-1], out.stderr[-3000:]
    assert took < 120, took
    kept = [line for line in out.stderr.splitlines() if "kept in the spool at" in line]
    assert len(kept) == 1 and "launchhelm recover" in kept[0], out.stderr[-3000:]
    assert "never retrieved" not in out.stderr
    run_id, steps = out.stdout.split("RUN", 1)[1].split()
    recovered = subprocess.run(
        [str(Path(sys.executable).with_name("launchhelm")), "--store", store, "recover"],
        env={**env, "AWS_ENDPOINT_URL": moto_endpoint},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    opened = lh.storage.open_store(store, {"client_kwargs": {"endpoint_url": moto_endpoint}})
    frame = lh.Api(opened).run(run_id).history()
    assert frame["x"].tolist() == [float(s) for s in range(int(steps))]
