"""A project's first read right after its runs finished, beside its second (issue 40, point 4).

``--runs`` runs (300) are created and finished through the real path
(``lh.init``, a few ``log()`` calls, ``finish()``, each with its helper
process) by ``--workers`` processes at once, on moto S3 behind a proxy on
127.0.0.1 that adds ``--latency`` (20 ms, an in-region S3 request) to every
request, writers and helpers included. Once every helper exited (each adds
its run to the project's runs index and history dataset, then exits), a
fresh reader that read nothing before times ``Api.runs()`` and
``Api.history(project)`` and counts their requests, then the same reads a
second time, and checks both answers are the same.

Target (issue 40), the first reads: ``Api.runs()`` <= 1 s and <= 20 requests,
``Api.history(project)`` <= 3 s and <= 100 requests. ``--no-settle`` sets
``LAUNCHHELM_SETTLE_TIMEOUT=0`` (the helpers leave the runs to the first
reader, as before) to show the first read that pays for every run.

    python benchmarks/bench_first_read.py                 # 300 runs: a few minutes here
    python benchmarks/bench_first_read.py --runs 60 --no-settle
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from http_proxy import RequestCounter  # noqa: E402
from pandas import testing as pd_testing  # noqa: E402

import launchhelm as lh  # noqa: E402
from launchhelm.storage import open_store  # noqa: E402

BUCKET = "bench-first-read"
PROJECT = "sweep"
TARGETS = {"runs": (1.0, 20), "history": (3.0, 100)}

#: One writer: its share of the runs, one after another, each through init, log and finish.
_WRITER = """
import json, sys
import launchhelm as lh
from launchhelm._helper import _leaving, _leaving_lock
url, options, first, count = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for i in range(first, first + count):
    run = lh.init("sweep", store=url, storage_options=options, config={"lr": 1e-3 * (i + 1), "seed": i},
                  flush_interval=3600, system_metrics=False, capture_console=False)
    for step in range(1, 21):
        run.global_step = step
        run.log({"train/loss": 1.0 / step + i / 1000, "lr": 1e-3 * (i + 1)})
    run.finish(close_run=bool(i % 2))
with _leaving_lock:
    helpers = list(_leaving)
for helper in helpers:  # each settles its run, then exits: wait for them here
    helper.wait(120)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _timed(proxy: RequestCounter, read: object) -> tuple[float, int, object]:
    proxy.reset()
    t0 = time.perf_counter()
    result = read()  # type: ignore[operator]
    return time.perf_counter() - t0, proxy.total, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=6, help="processes finishing runs at once")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds the proxy adds to each request")
    parser.add_argument("--no-settle", action="store_true", help="helpers leave the runs to the first reader")
    args = parser.parse_args()

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = _free_port()
    moto = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "moto_serial.py"), "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proxy = None
    try:
        _wait_for(f"http://127.0.0.1:{port}/moto-api/")
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket=BUCKET)
        proxy = RequestCounter(port, latency=args.latency)
        url = f"s3://{BUCKET}/{secrets.token_hex(4)}"
        options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}}
        os.environ.setdefault("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")  # the checks' direct reads
        env = dict(os.environ, PYTHONPATH=str(ROOT), LAUNCHHELM_SPOOL=tempfile.mkdtemp(prefix="bench-first-read-"))
        env["LAUNCHHELM_SETTLE_TIMEOUT"] = "0" if args.no_settle else "30"  # on: off by default
        import json

        share = -(-args.runs // args.workers)
        t0 = time.perf_counter()
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(_WRITER), url, json.dumps(options), str(first), str(count)],
                env=env,
                cwd=ROOT,
            )
            for first in range(0, args.runs, share)
            for count in [min(share, args.runs - first)]
        ]
        for writer in writers:
            if writer.wait() != 0:
                raise SystemExit(f"a writer failed ({writer.returncode})")
        written = time.perf_counter() - t0
        print(
            f"{args.runs} runs finished by {len(writers)} processes, every helper exited: {written:.0f} s "
            f"({'helpers leave them to the first reader' if args.no_settle else 'helpers settle them'}); "
            f"moto behind {args.latency * 1000:.0f} ms a request"
        )

        def read(name: str) -> object:
            api = lh.Api(open_store(url, options))  # a fresh reader each time: nothing cached
            return api.runs(PROJECT) if name == "runs" else api.history(PROJECT)

        # the process's own first use (imports, the S3 client's session) is not the project's first read
        import pyarrow.parquet  # noqa: F401

        warm = lh.Api(open_store(f"s3://{BUCKET}/warm-up", options))
        warm.runs("warm-up"), warm.history("warm-up")
        direct = open_store(url)
        from launchhelm._metrics._project import ProjectReader, list_project
        from launchhelm._runlog._table import read_index, table_listing

        indexes = table_listing(direct, PROJECT)[1]
        indexed = read_index(direct, PROJECT, indexes[-1] if indexes else None)
        vouched = ProjectReader(direct, PROJECT).vouched(list_project(direct, PROJECT))
        print(f"runs in the newest runs index: {len(indexed)}, in the newest history generation: {len(vouched)}")

        figures = {name: _timed(proxy, lambda name=name: read(name)) for name in ("runs", "history")}
        for name in ("runs", "history"):
            seconds, requests, again = _timed(proxy, lambda name=name: read(name))
            first_seconds, first_requests, first = figures[name]
            pd_testing.assert_frame_equal(first, again)  # type: ignore[arg-type]
            limit_s, limit_n = TARGETS[name]
            met = first_seconds <= limit_s and first_requests <= limit_n
            call = "Api.runs()" if name == "runs" else "Api.history(project)"
            print(
                f"{call:22} first {first_seconds:6.2f} s {first_requests:5d} requests | "
                f"second {seconds:6.2f} s {requests:5d} requests | target <= {limit_s:.0f} s, <= {limit_n} "
                f"requests: {'met' if met else 'MISSED'}"
            )
        assert len(figures["runs"][2]) == args.runs  # type: ignore[arg-type]
    finally:
        if proxy is not None:
            proxy.close()
        moto.terminate()
        moto.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
