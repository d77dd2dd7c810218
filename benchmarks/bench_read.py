"""Reads that scale: requests and seconds of every read a person waits for, beside today's serial path.

Against moto S3 behind a proxy on 127.0.0.1 that adds ``--latency`` (20 ms,
an in-region S3 GET) to every request, and against a local store, it
measures, with requests counted exactly by the proxy:

- the history of a run with 500, 5,000 and 43,200 flushes (5 metrics each),
  written as a live session writes them: a chunk per flush, compacted every
  32 chunks, covered chunks collected after the grace period (the last 10
  minutes of chunks, 300, are still there, as in a running 24-hour run);
- a chart's open (``RunHandle.poll`` on a fresh handle) and one live poll
  after one more flush, of the 43,200-flush run;
- ``Api.runs()`` and ``Api.history(project)`` over 100 and 1,000 runs (settled: finished or
  resumable), the history first run by run (the baseline: every run's own reads, concurrently),
  then from the project dataset (published from what the baseline read).

The baseline is the read path before compaction (list every chunk, then one
HEAD + GET per chunk, in series), measured in the same run on the same data
before it is compacted; where it would take minutes, it is timed on its
first 500 objects and extrapolated (marked ``~``). Targets (issue 11), on
moto through the 20 ms proxy: 43,200-flush history in <= 2 s and <= 50
requests; ``Api.runs()`` over 1,000 runs in <= 3 s; a live poll in <= 5
requests; local: 43,200-flush history in <= 0.5 s. Issue 25: ``Api.history(project)`` over
1,000 settled runs in <= 3 s and <= 100 requests.

    python benchmarks/bench_read.py                      # everything (about 15 minutes here)
    python benchmarks/bench_read.py --flushes 500 --runs 100 --quick
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from http_proxy import RequestCounter  # noqa: E402
from pandas import testing as pd_testing  # noqa: E402

import launchhelm as lh  # noqa: E402
from launchhelm._metrics._compact import CHUNKS_PER_SEGMENT, Compactor  # noqa: E402
from launchhelm._metrics._layout import list_metrics  # noqa: E402
from launchhelm._metrics._points import chunk_key, encode_chunk  # noqa: E402
from launchhelm.storage import Store, open_store  # noqa: E402

BUCKET = "bench-read"
METRICS = ("loss", "lr", "grad_norm", "tokens_per_s", "eval/accuracy")
#: chunks still listed in a running 24-hour run: the last 10 minutes (the grace period) at one flush per 2 s
LIVE_WINDOW = 300
RESULTS: list[tuple[str, str, str, str, str]] = []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto() -> Iterator[int]:
    port = _free_port()
    proc = subprocess.Popen(
        [shutil.which("moto_server") or "moto_server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket=BUCKET)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def s3_store(prefix: str, port: int) -> Store:
    return open_store(f"s3://{BUCKET}/{prefix}", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}})


def measure(proxy: RequestCounter | None, fn: Callable[[], Any]) -> tuple[float, int, Any]:
    if proxy is not None:
        proxy.reset()
    start = time.perf_counter()
    value = fn()
    elapsed = time.perf_counter() - start
    return elapsed, (proxy.total if proxy is not None else 0), value


def report(what: str, where: str, new: tuple[float, int], base: tuple[float, int, bool] | None, target: str) -> None:
    seconds, requests = new
    if base is None:
        baseline = "-"
    else:
        b_seconds, b_requests, estimated = base
        mark = "~" if estimated else ""
        baseline = f"{mark}{b_seconds:.2f} s, {mark}{b_requests} req ({b_seconds / max(seconds, 1e-9):.0f}x)"
    row = (what, where, f"{seconds:.3f} s, {requests} req" if requests else f"{seconds:.3f} s", baseline, target)
    RESULTS.append(row)
    print(" | ".join(row), flush=True)


# -- writing a long run as a live session writes it ----------------------------------------------
def _chunk(run_id: str, session: str, n: int) -> tuple[str, bytes]:
    step = n
    rows = [(step, 0, 1.7e9 + 2.0 * n, {k: float(step) + i for i, k in enumerate(METRICS)})]
    return chunk_key(run_id, session, n, step, step), encode_chunk(rows)


def _new_run(store: Store) -> tuple[str, str]:
    run = lh.init("bench-history", store=store, flush_interval=3600, heartbeat_interval=60, heartbeat_timeout=3600)
    run.log({k: 0.0 for k in METRICS})
    run.flush()  # chunk 0, at step 0
    run._compact = lambda **_: None  # type: ignore[method-assign]  # compacted below, as the session would
    run.finish(close_run=False)
    return run.id, run.session_id


def write_old_run(store: Store, flushes: int) -> str:
    """A run as stores were written before compaction: one chunk per flush, nothing else."""
    run_id, session = _new_run(store)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: store.create(*_chunk(run_id, session, n)), range(1, flushes + 1)))
    return run_id


def write_live_run(store: Store, flushes: int) -> tuple[str, str]:
    """What a session leaves after ``flushes`` flushes: segments in levels, the last 10 minutes of chunks
    still listed (covered ones are collected after the grace period), up to 31 chunks not yet covered."""
    run_id, session = _new_run(store)
    compactor = Compactor(store, run_id, by=session)
    with ThreadPoolExecutor(16) as pool:
        for start in range(1, flushes + 1, CHUNKS_PER_SEGMENT):
            batch = [_chunk(run_id, session, n) for n in range(start, min(start + CHUNKS_PER_SEGMENT, flushes + 1))]
            list(pool.map(lambda kv: store.create(*kv), batch))
            if len(batch) < CHUNKS_PER_SEGMENT:
                break  # the live tail: not due yet
            compactor.known.update(batch)
            compactor.compact(collect=False)
            batches = (start - 1) // CHUNKS_PER_SEGMENT
            if batches % 10 == 9 and start + CHUNKS_PER_SEGMENT <= flushes - LIVE_WINDOW:
                compactor.collect(list_metrics(store, run_id), grace=0)  # past the grace period by now
    return run_id, session


def serial_history(store: Store, run_id: str, limit: int | None = None) -> int:
    """Today's path before compaction: list the chunks, read each one in series (on S3: HEAD + GET), pivot."""
    from launchhelm._metrics._points import decode_chunks, history_frame

    if not hasattr(store, "fs"):  # a local folder
        names = store.list(f"runs/{run_id}/metrics")
        blobs = [store.read(f"runs/{run_id}/metrics/{name}") for name in names[:limit]]
    else:
        fs = store.fs
        root = store.root  # type: ignore[attr-defined]
        names = sorted(fs.find(f"{root}/runs/{run_id}/metrics"))
        blobs = [fs.cat_file(path) for path in names[:limit]]  # s3fs's default: HEAD for the size, then GET
    history_frame(decode_chunks(blobs))
    return len(names)


def history_case(port: int, proxy: RequestCounter, flushes: int, local_root: Path) -> None:
    tag = f"history, {flushes:,} flushes"
    direct = s3_store(f"h{flushes}-{secrets.token_hex(3)}", port)
    proxied = s3_store(direct.root.split("/", 1)[1], proxy.port)  # type: ignore[attr-defined]
    # baseline: the serial path on a run written as before (up to 5,000 flushes, then extrapolated)
    old_id = write_old_run(direct, min(flushes, 5000))
    limit = None if flushes <= 500 else 500
    b_seconds, b_requests, _ = measure(proxy, lambda: serial_history(proxied, old_id, limit))
    if limit is not None:
        objects = flushes + 1
        exact = -(-objects // 1000) + 2 * objects  # list pages + HEAD and GET per chunk
        b_seconds, b_requests = b_seconds * exact / max(b_requests, 1), exact
    run_id, session = write_live_run(direct, flushes)
    seconds, requests, frame = measure(proxy, lambda: lh.Api(proxied).run(run_id).history())
    assert len(frame) == flushes + 1, (len(frame), flushes)
    assert frame["loss"].tolist() == [float(s) for s in range(flushes + 1)]
    target = "<= 2 s, <= 50 req" if flushes >= 43_200 else ""
    report(tag, "moto + 20 ms", (seconds, requests), (b_seconds, b_requests, limit is not None), target)
    if flushes >= 43_200:
        # a chart opening, then one live poll after one more flush
        handle = lh.Api(proxied).run(run_id)
        o_seconds, o_requests, _ = measure(proxy, handle.poll)
        report(f"chart open (RunHandle.poll), {flushes:,} flushes", "moto + 20 ms", (o_seconds, o_requests), None, "")
        direct.create(*_chunk(run_id, session, flushes + 1))
        p_seconds, p_requests, view = measure(proxy, handle.poll)
        assert len(view.history) == flushes + 2
        report(
            f"live poll after one flush, {flushes:,} flushes", "moto + 20 ms", (p_seconds, p_requests), None, "<= 5 req"
        )
    # the same on a local folder
    local = open_store(local_root / f"h{flushes}")
    old_local = write_old_run(local, flushes)
    b_local, _, _ = measure(None, lambda: serial_history(local, old_local))
    local_id, _ = write_live_run(local, flushes)
    seconds, _, frame = measure(None, lambda: lh.Api(local).run(local_id).history())
    assert len(frame) == flushes + 1
    report(tag, "local", (seconds, 0), (b_local, 0, False), "<= 0.5 s" if flushes >= 43_200 else "")


# -- many runs -----------------------------------------------------------------------------------
def write_runs(store: Store, count: int, project: str) -> list[str]:
    def one(i: int) -> str:
        run = lh.init(project, store=store, config={"lr": 1e-3 * (i + 1), "seed": i}, flush_interval=3600)
        for step in range(1, 21):
            run.global_step = step
            run.log({k: float(step + i) for k in METRICS})
        if i % 3:
            run.finish()
        else:
            run.finish(close_run=False)
        return run.id

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(count)))


def serial_runs(store: Store, project: str, limit: int | None = None) -> int:
    """Before summaries: per run, in series, its record, every event, its heartbeats and its chunk listing."""
    fs = store.fs  # type: ignore[attr-defined]
    root = store.root  # type: ignore[attr-defined]
    runs = sorted(p.rsplit("/", 1)[1] for p in fs.find(f"{root}/projects/{project}/runs"))
    for run_id in runs[:limit]:
        fs.cat_file(f"{root}/runs/{run_id}/run.json")
        for path in sorted(fs.find(f"{root}/runs/{run_id}/events")):
            fs.cat_file(path)
        for path in sorted(fs.find(f"{root}/runs/{run_id}/sessions")):
            fs.cat_file(path)
        fs.find(f"{root}/runs/{run_id}/metrics")
    return len(runs)


def runs_case(port: int, proxy: RequestCounter, count: int, history: bool) -> None:
    prefix = f"r{count}-{secrets.token_hex(3)}"
    direct = s3_store(prefix, port)
    write_runs(direct, count, "bench-runs")
    proxied = s3_store(direct.root.split("/", 1)[1], proxy.port)  # type: ignore[attr-defined]
    limit = None if count <= 100 else 100
    b_seconds, b_requests, total = measure(proxy, lambda: serial_runs(proxied, "bench-runs", limit))
    if limit is not None:
        b_seconds, b_requests = b_seconds * total / limit, b_requests * total // limit
    first, first_requests, frame = measure(proxy, lambda: lh.Api(proxied).runs("bench-runs"))
    assert len(frame) == count
    report(f"Api.runs(), {count:,} runs, first read", "moto + 20 ms", (first, first_requests), None, "")
    seconds, requests, frame = measure(proxy, lambda: lh.Api(proxied).runs("bench-runs"))
    assert len(frame) == count
    report(
        f"Api.runs(), {count:,} runs",
        "moto + 20 ms",
        (seconds, requests),
        (b_seconds, b_requests, limit is not None),
        "<= 3 s" if count >= 1000 else "",
    )
    if history:
        project_history_case(proxy, proxied, count)


def project_history_case(proxy: RequestCounter, proxied: Store, count: int) -> None:
    """``Api.history(project)`` of settled runs: run by run (the baseline), then from the project dataset."""
    from launchhelm._api._project import _project_frame, _publish, read_project
    from launchhelm._metrics._project import ProjectReader, list_project

    listing = list_project(proxied, "bench-runs")
    read: list[Any] = []

    def run_by_run() -> Any:
        read[:] = read_project(proxied, "bench-runs", None, build_after=10**9)  # reads only, publishes nothing
        return _project_frame([(r.run_id, r.frame(None, "all")) for r in read])

    b_seconds, b_requests, baseline = measure(proxy, run_by_run)
    assert baseline["run"].nunique() == count
    # publish what the baseline read, as Api.history's first read would (not timed: paid once)
    _publish(proxied, "bench-runs", ProjectReader(proxied, "bench-runs"), listing, read)
    seconds, requests, frame = measure(proxy, lambda: lh.Api(proxied).history("bench-runs"))
    pd_testing.assert_frame_equal(frame, baseline)  # exactly what the runs themselves read
    report(
        f"Api.history(project), {count:,} settled runs",
        "moto + 20 ms",
        (seconds, requests),
        (b_seconds, b_requests, False),
        "<= 3 s, <= 100 req" if count >= 1000 else "",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flushes", default="500,5000,43200", help="history cases (comma-separated)")
    parser.add_argument("--runs", default="100,1000", help="Api.runs() cases (comma-separated)")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added to each request (default 0.02)")
    args = parser.parse_args()
    print(f"launchhelm {lh.__version__}, latency {args.latency * 1000:.0f} ms per request, moto_server on 127.0.0.1")
    print("what | where | now | before (serial; ~ extrapolated from its first 500 objects or 100 runs) | target")
    with moto() as port, tempfile.TemporaryDirectory() as tmp:
        proxy = RequestCounter(port, latency=args.latency)
        try:
            for flushes in (int(x) for x in args.flushes.split(",") if x):
                history_case(port, proxy, flushes, Path(tmp))
            for count in (int(x) for x in args.runs.split(",") if x):
                runs_case(port, proxy, count, history=True)
        finally:
            proxy.close()


if __name__ == "__main__":
    main()
