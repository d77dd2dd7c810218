"""Points logged just before a hard crash survive it: the memory-mapped spool.

If these fail, a SIGKILL or an OOM kill loses the last seconds of a run's
points, and the rewind after it says the run reached less far than it did.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lhtest import child_env, kill_with_helper

import launchhelm as lh
from launchhelm._metrics._buffer import KeyIds, PointBuffer
from launchhelm._metrics._spool import spool_root
from launchhelm.storage._keys import row_marker_key, run_record_key

_TIGHT_LOOP = textwrap.dedent(
    """
    import sys
    import launchhelm as lh
    run = lh.init("spool", store=sys.argv[1], flush_interval=float(sys.argv[2]))
    print(run.id, flush=True)
    step = 0
    while True:
        step += 1
        run.global_step = step
        run.log({"x": float(step), "y": -float(step)})
        if step % 500 == 0:
            print(step, flush=True)
    """
)


def _kill_mid_loop(store: str, flush_interval: float, rng: random.Random, env: dict[str, str]) -> tuple[str, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _TIGHT_LOOP, store, str(flush_interval)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    last = int(proc.stdout.readline())  # it is logging
    time.sleep(rng.uniform(0.0, 1.5))
    kill_with_helper(proc)  # the helper too: the spool is left for a reopen or `recover` (test_helper_drain.py)
    for line in proc.stdout:
        last = max(last, int(line))
    proc.wait()
    return run_id, last


def _check_exactly_once(store: str, run_id: str, at_least: int) -> int:
    frame = lh.Api(store).run(run_id).history()
    steps = frame["step"].tolist()
    assert steps == list(range(1, len(steps) + 1)), "a point lost or read twice"
    assert frame["x"].tolist() == [float(s) for s in steps]
    assert frame["y"].tolist() == [-float(s) for s in steps]
    assert len(steps) >= at_least, (len(steps), at_least)
    return len(steps)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_sigkill_in_a_tight_log_loop_loses_no_point(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lhtest import make_store_url

    store = make_store_url(backend, tmp_path, request)
    spool = tmp_path / "spool"
    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(spool))
    env = child_env(LAUNCHHELM_SPOOL=str(spool))
    rng = random.Random(5)
    for trial in range(6 if backend == "local" else 3):
        # the flush interval is long, so every point logged since the last flush exists only in the spool
        run_id, printed = _kill_mid_loop(store, 3600.0 if trial % 2 else 0.2, rng, env)
        assert (spool / run_id).is_dir()  # spooled, not uploaded
        logged = _check_exactly_once(store, run_id, printed)  # opening the run recovers the spool
        assert not (spool / run_id).exists()
        assert lh.Api(store).run(run_id).step == logged  # the furthest step reached counts them
        assert _check_exactly_once(store, run_id, logged) == logged  # recovered once, not again


@pytest.mark.slow
def test_a_clean_finish_leaves_no_spool_and_the_cli_recovers_a_killed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "store")
    spool = tmp_path / "spool"
    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(spool))
    assert spool_root() == spool
    run = lh.init("spool", store=store)
    run.log({"x": 1.0})
    assert (spool / run.id).is_dir()
    run.finish()
    assert not (spool / run.id).exists()
    env = child_env(LAUNCHHELM_SPOOL=str(spool))
    run_id, printed = _kill_mid_loop(store, 3600.0, random.Random(1), env)
    exe = Path(sys.executable).with_name("launchhelm")
    project = json.loads((Path(store) / run_record_key(run_id)).read_bytes())["project"]
    marker = Path(store) / row_marker_key(project, run_id)
    before = marker.read_bytes()
    out = subprocess.run([str(exe), "--store", store, "recover"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"run {run_id}: recovered" in out.stdout
    # the run changed without a session: its row marker says so, so cached rows are read afresh
    assert json.loads(marker.read_bytes())["state"] == "recovered" != json.loads(before)["state"]
    recovered = int(out.stdout.split(f"run {run_id}: recovered ", 1)[1].split()[0])
    assert recovered >= 2 * printed - 2 * 500  # both keys of every step since the last print at least
    assert not (spool / run_id).exists()
    _check_exactly_once(store, run_id, printed)


@pytest.mark.slow
def test_a_resumed_torch_run_rewinds_from_the_last_step_logged_before_the_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    store = str(tmp_path / "store")
    spool = tmp_path / "spool"
    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(spool))
    script = textwrap.dedent(
        """
        import sys, torch
        import launchhelm.torch as lht
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        tr = lht.init("spool", store=sys.argv[1], flush_interval=3600)
        tr.watch(model, opt)
        print(tr.id, flush=True)
        while True:
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            tr.log({"loss": loss.item()})
            if tr.global_step == 50:
                tr.save_checkpoint()
                print("saved", flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, store],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(LAUNCHHELM_SPOOL=str(spool)),
    )
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "saved"
    time.sleep(0.5)  # a few hundred steps after the checkpoint, none of them flushed
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    import torch

    import launchhelm.torch as lht

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tr = lht.init("spool", store=store, resume=run_id)
    tr.watch(model, opt)
    tr.load_checkpoint("latest")
    tr.finish()
    handle = lh.Api(store).run(run_id)
    history = handle.history()
    last_logged = int(history["step"].max())
    assert last_logged > 60
    (rewind,) = handle.rewinds()
    assert rewind.to_step == 50
    assert rewind.reached == last_logged


@pytest.mark.slow
def test_files_made_ready_by_the_flush_thread_keep_every_row_in_order(tmp_path: Path) -> None:
    """The flush thread makes the next spool file ready (log() only switches maps); rows of mixed layouts
    read back exactly across the switches, live and after the session died with a ready file unused."""
    from launchhelm._metrics._buffer import read_spool
    from launchhelm._metrics._points import decode_chunks
    from launchhelm._metrics._spool import Spool, recover_session
    from launchhelm.storage import open_store

    spool = Spool("run", "s", {}, directory=tmp_path / "spool")
    rows = 0
    used_ready = 0
    # over two 8 MiB files, then on until a file is ready and waits (a session that dies then leaves it)
    while rows < 500_000 or not spool._ready:
        i = rows
        spool.append(i, 0, 1.0, {"a": float(i)} if i % 7 else {"b": -float(i), "a": float(i)})
        rows += 1
        if i % 10_000 == 0:
            before = spool._file
            ready = bool(spool._ready)
            spool.prepare()
            used_ready += ready and spool._file == before
    assert spool._file >= 2 and used_ready and spool._ready
    end, names = spool.position(), spool.key_names()
    steps, a_values, b_values = [], [], []
    for piece in read_spool(spool.dir, "s", (0, 8), end, names, max_bytes=1 << 20):
        step, _, _, kid, value = piece.buffer.columns()
        keys = piece.buffer.keys.names
        a = [keys[int(k)] == "a" for k in kid]
        steps += [int(s) for s, is_a in zip(step, a, strict=True) if is_a]
        a_values += [float(v) for v, is_a in zip(value, a, strict=True) if is_a]
        b_values += [float(v) for v, is_a in zip(value, a, strict=True) if not is_a]
    assert steps == list(range(rows))
    assert a_values == [float(i) for i in range(rows)]
    assert b_values == [-float(i) for i in range(0, rows, 7)]
    spool.close(remove=False)  # as a killed session leaves it
    store = open_store(str(tmp_path / "store"))
    assert recover_session(store, "run", "s", spool.dir, lambda number: False) == rows + len(b_values)
    table = decode_chunks(store.read(f"runs/run/metrics/{key}") for key in store.list("runs/run/metrics/"))
    assert sorted(table.column("step").to_pylist()) == sorted(steps + list(range(0, rows, 7)))


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE and per-thread fault counts are Linux's"
)
def test_a_new_sessions_first_appends_find_their_pages_mapped(tmp_path: Path) -> None:
    """Before the first flush faults pages in ahead, the first log() to reach each page of a new file
    waited on the file system holding the GIL (5 ms, once, measured by bench_log)."""
    import resource

    from launchhelm._metrics._spool import PREFAULT_BYTES, Spool

    spool = Spool("run", "s", {}, directory=tmp_path / "spool")
    row = {"loss": 1.0, "lr": 3e-4, "grad_norm": 2.0}
    before = resource.getrusage(resource.RUSAGE_THREAD)
    step = 0
    while spool.position()[1] < PREFAULT_BYTES - 4096:  # pages the populated region covers
        spool.append(step, 0, 1.0, row)
        step += 1
    after = resource.getrusage(resource.RUSAGE_THREAD)
    spool.close(remove=True)
    pages = PREFAULT_BYTES // 4096
    # unmapped, each of these pages would fault once: 255 here
    assert after.ru_minflt - before.ru_minflt < pages // 8, (after.ru_minflt - before.ru_minflt, step)
    assert after.ru_majflt == before.ru_majflt


@given(
    st.lists(
        st.dictionaries(st.sampled_from(["loss", "lr", "acc", "grad", "tok"]), st.floats(allow_nan=False), min_size=1),
        max_size=60,
    )
)
def test_a_buffers_latest_values_are_each_keys_last_logged(rows: list[dict[str, float]]) -> None:
    # the summary's "latest" of a buffer, worked out without numpy (a training process need not load it)
    buffer = PointBuffer(KeyIds(), 1 << 20)
    expected: dict[str, float] = {}
    for step, row in enumerate(rows):
        buffer.append(step, 0, 0.0, row)
        expected.update(row)
    assert buffer.latest() == expected
