"""Benchmark of sharded checkpoints (format /3) on 2 and 4 gloo ranks, beside their baselines.

    python benchmarks/bench_sharded.py [--size-mb 1200] [--repeat 3] [--s3-size-mb 160]

Launches itself under ``torchrun --standalone`` with 2, then 4 ranks (CPU, gloo). Each job
builds ``--layers`` square ``nn.Linear`` layers under FSDP2 (``fully_shard``) with AdamW after
one step, about ``--size-mb`` MB of model and optimizer state in all, and times, in rounds whose
order alternates (one untimed warm-up round first):

* raw: every rank writes the bytes of the local shards it holds (model and AdamW state) to one
  file of its own and fsyncs it: an aligned raw parallel write of the same bytes by the same
  ranks, the baseline of a save;
* ``save_checkpoint()`` on a local store, and ``save_checkpoint(blocking=False)``'s blocking time
  (until it returns; the write is then waited for, untimed);
* ``torch.distributed.checkpoint``: ``dcp.save`` and ``dcp.async_save``'s blocking time;
* loads at the same world size: ``load_checkpoint`` and ``dcp.load``; and in the 4-rank job the
  2-to-4 resharding load of the 2-rank job's checkpoints, LaunchHelm's beside ``dcp.load``'s.

Then, on S3 (a real ``moto_server`` on 127.0.0.1, started here, behind ``tests/http_proxy.py``
adding 20 ms to every request, an in-region S3 round trip), a smaller model of ``--s3-size-mb``
(moto holds every object in its memory and runs on the same two cores): ``save_checkpoint()`` on
an ``s3://`` store beside ``dcp.save`` with torch's fsspec writer (``FsspecWriter``) at its
defaults, and beside the store's ceiling: each rank writing the same bytes with one plain s3fs
``pipe_file``, the same transfer done by the client directly (one PUT under 50 MiB, s3fs's own
multipart threshold; above it parts of the store's size, as many in parallel). ``--s3-size-mb 0``
skips it. moto shares the machine's cores with the ranks: where the ceiling and both writers
meet, the machine, not the writers, sets the figure; it says most where moto has cores to spare.

Method: a time is the slowest rank's (every timed section starts after a barrier and ends with
one). Memory pages freed a moment ago are fast to fill and memory left free for a few seconds is
slow to touch again on these VMs, so every timed write first deletes what the write before it
wrote, whoever wrote it: each writer refills pages just freed, as a checkpoint rotation would.
Rank 0 prints each figure beside its baseline and the ratio of medians over ``--repeat`` rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

BUCKET = "bench-sharded"
TESTS = Path(__file__).resolve().parent.parent / "tests"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_moto(work: Path) -> tuple[subprocess.Popen[bytes], Any]:
    """A real moto_server behind a proxy that adds 20 ms to every request."""
    sys.path.insert(0, str(TESTS))
    from http_proxy import RequestCounter

    port = _free_port()
    with open(work / "moto.log", "wb") as log:
        exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto_server did not start: " + (work / "moto.log").read_text()[-2000:]) from None
            time.sleep(0.1)
    proxy = RequestCounter(port, latency=0.020)
    endpoint = f"http://127.0.0.1:{proxy.port}"
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }
    )
    import boto3

    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket=BUCKET)
    return proc, proxy


def _serve_counts(proxy: Any) -> str:
    """A local HTTP endpoint answering the proxy's request counts so far (JSON), for ``--verbose``."""
    import http.server
    import json
    import threading

    class Counts(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith("trace"):
                body = json.dumps(proxy.trace).encode()
            else:
                body = json.dumps(dict(proxy.snapshot())).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counts)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/"


def _request_counts() -> dict[str, int]:
    import json

    with urllib.request.urlopen(os.environ["BENCH_COUNTS_URL"], timeout=10) as answer:
        counts: dict[str, int] = json.loads(answer.read())
    return counts


def _request_trace(since: float) -> list[tuple[float, str]]:
    """The proxy's requests after ``since`` (its monotonic clock: the same machine's)."""
    import json

    with urllib.request.urlopen(os.environ["BENCH_COUNTS_URL"] + "trace", timeout=10) as answer:
        return [(t, what) for t, what in json.loads(answer.read()) if t >= since]


def launch(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-sharded-", dir=args.dir))
    moto: subprocess.Popen[bytes] | None = None
    try:
        if args.s3_size_mb > 0:
            moto, proxy = _start_moto(work)
            if args.verbose:  # rank 0 prints the requests each S3 save sent, read from the proxy here
                os.environ["BENCH_COUNTS_URL"] = _serve_counts(proxy)
        for nproc in args.ranks:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
            cmd += [__file__, "--worker", "--work", str(work), "--size-mb", str(args.size_mb)]
            cmd += ["--repeat", str(args.repeat), "--layers", str(args.layers), "--s3-size-mb", str(args.s3_size_mb)]
            cmd += ["--s3-repeat", str(args.s3_repeat)] + ["--verbose"] * args.verbose
            env = {**os.environ, "OMP_NUM_THREADS": "1", "LAUNCHHELM_PROGRESS": "0"}
            subprocess.run(cmd, check=True, env=env)
    finally:
        if moto is not None:
            moto.terminate()
            try:
                moto.wait(10)
            except subprocess.TimeoutExpired:
                moto.kill()
        shutil.rmtree(work, ignore_errors=True)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    import launchhelm as lh
    import launchhelm.torch as lht

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    work = Path(args.work)

    def build(size_mb: float) -> tuple[Any, Any]:
        width = int((size_mb * 1e6 / 4 / 3 / args.layers) ** 0.5)
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(args.layers)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, width)).sum().backward()
        optimizer.step()
        return model, optimizer

    def shard_bytes(model: Any, optimizer: Any) -> tuple[list[Any], float]:
        locals_ = [p.to_local() for p in model.parameters()]
        locals_ += [v.to_local() for s in optimizer.state.values() for v in s.values() if hasattr(v, "to_local")]
        totals = [0] * world
        dist.all_gather_object(totals, sum(t.numel() * t.element_size() for t in locals_))
        return locals_, sum(totals) / 1e9

    def timed(fn: Any) -> float:
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - start

    def blocking(fn: Any, wait: Any) -> float:
        """The slowest rank's time until ``fn`` returns; then ``wait`` (untimed). No collective runs
        while a background save may still run its own (dcp.async_save's thread uses the default group)."""
        dist.barrier()
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
        wait()
        times: list[float] = [0.0] * world
        dist.all_gather_object(times, seconds)
        return max(times)

    def state(model: Any, optimizer: Any) -> dict[str, Any]:
        msd, osd = get_state_dict(model, optimizer)
        return {"m": msd, "o": osd}

    def free(paths: list[Path]) -> None:
        """Delete what the write before wrote (rank 0), so that the next writer refills freed pages."""
        if rank == 0:
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)
        paths.clear()
        dist.barrier()

    results: dict[str, list[float]] = {}

    def record(name: str, seconds: float, round_: int) -> None:
        if round_:
            results.setdefault(name, []).append(seconds)
        if args.verbose and rank == 0:
            print(f"round {round_} {name}: {seconds:.3f} s", flush=True)

    # -- local store --------------------------------------------------------------------------
    gb = 0.0
    if args.size_mb > 0:
        model, optimizer = build(args.size_mb)
        locals_, gb = shard_bytes(model, optimizer)

        def raw(path: Path) -> None:
            with open(path, "wb", buffering=0) as f:
                for t in locals_:
                    f.write(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))
                os.fsync(f.fileno())

        store = work / f"store{world}"
        tr = lht.init("bench", store=str(store))
        tr.watch(model, optimizer)
        artifacts = store / "runs" / tr.id / "artifacts"
        written: list[Path] = []
        for round_ in range(args.repeat + 1):
            sections = ["raw", "lh", "lh_async", "dcp", "dcp_async"]
            if round_ % 2:
                sections.reverse()
            for name in sections:
                free(written)
                out = work / f"{name}-w{world}-r{round_}"
                if name == "raw":
                    if rank == 0:
                        out.mkdir(parents=True)
                    dist.barrier()
                    seconds = timed(lambda out=out: raw(out / f"rank{rank}.bin"))
                elif name == "lh":
                    ids: list[Any] = []
                    seconds = timed(lambda ids=ids: ids.append(tr.save_checkpoint()))
                    out = artifacts / str(ids[0])
                elif name == "lh_async":
                    ids = []
                    seconds = blocking(
                        lambda ids=ids: ids.append(tr.save_checkpoint(blocking=False)), tr.wait_for_checkpoint
                    )
                    out = artifacts / str(ids[0])
                elif name == "dcp":
                    s = state(model, optimizer)
                    seconds = timed(lambda out=out, s=s: dcp.save(s, checkpoint_id=out))
                else:
                    s = state(model, optimizer)
                    future: list[Any] = []
                    seconds = blocking(
                        lambda o=out, s=s, f=future: f.append(dcp.async_save(s, checkpoint_id=o)),
                        lambda f=future: f[0].result(),
                    )
                written.append(out)
                record(name, seconds, round_)
        free(written)
        # what the loads read (untimed): a checkpoint of each kind, kept for the 4-rank job's resharding
        tr.save_checkpoint()
        dcp_dir = work / f"dcp-w{world}-final"
        dcp.save(state(model, optimizer), checkpoint_id=dcp_dir)
        for round_ in range(args.repeat + 1):
            order = ["lh_load", "dcp_load"] if round_ % 2 == 0 else ["dcp_load", "lh_load"]
            for name in order:
                if name == "lh_load":
                    record(name, timed(lambda: tr.load_checkpoint("latest")), round_)
                else:
                    s = state(model, optimizer)
                    record(name, timed(lambda s=s: dcp.load(s, checkpoint_id=dcp_dir)), round_)
                    set_state_dict(model, optimizer, model_state_dict=s["m"], optim_state_dict=s["o"])
        if world == 4 and (work / "store2").is_dir():  # the 2-rank job's checkpoints, resharded onto 4 ranks
            api = lh.Api(str(work / "store2"))
            [run_id] = api.run_ids("bench")
            folder = work / "store2" / "runs" / run_id / "artifacts" / api.run(run_id).checkpoints()[-1].id
            for round_ in range(args.repeat + 1):
                order = ["lh_reshard", "dcp_reshard"] if round_ % 2 == 0 else ["dcp_reshard", "lh_reshard"]
                for name in order:
                    if name == "lh_reshard":
                        record(name, timed(lambda: tr.load_checkpoint(folder)), round_)
                    else:
                        s = state(model, optimizer)
                        record(name, timed(lambda s=s: dcp.load(s, checkpoint_id=work / "dcp-w2-final")), round_)
                        set_state_dict(model, optimizer, model_state_dict=s["m"], optim_state_dict=s["o"])
        tr.finish()
        del model, optimizer, tr
        locals_.clear()

    # -- S3 through the 20 ms proxy -------------------------------------------------------------
    s3_gb = 0.0
    if args.s3_size_mb > 0:
        import s3fs
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        model, optimizer = build(args.s3_size_mb)
        _locals, s3_gb = shard_bytes(model, optimizer)
        # the ceiling: the same transfer done by the client directly, one plain s3fs write of this rank's
        # shard bytes: one PUT under the store's single-PUT threshold (s3fs's own multipart threshold),
        # else parts of the store's size, as many in flight (s3fs's pipe_file alone would send up to
        # 100 MiB as one PUT: another transfer)
        from launchhelm.storage._backends import S3PartUpload

        blob = b"".join(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()) for t in _locals)
        del _locals
        if len(blob) < S3PartUpload.whole_bytes:
            direct: dict[str, int] = {}
        else:
            direct = {"chunksize": S3PartUpload.part_bytes, "max_concurrency": S3PartUpload.concurrency}
        prefix = f"{BUCKET}/w{world}"
        tr = lht.init("bench-s3", store=f"s3://{prefix}/store")
        tr.watch(model, optimizer)
        fs = s3fs.S3FileSystem()
        for round_ in range(args.s3_repeat + 1):
            order = ["s3_lh", "s3_dcp", "s3_raw"]
            order = order[round_ % 3 :] + order[: round_ % 3]
            for name in order:
                counting = rank == 0 and "BENCH_COUNTS_URL" in os.environ
                before = _request_counts() if counting else {}
                began = time.monotonic()
                if name == "s3_lh":
                    record(name, timed(lambda: tr.save_checkpoint()), round_)
                elif name == "s3_raw":
                    path = f"{prefix}/raw-r{round_}/rank{rank}"
                    record(name, timed(lambda path=path: fs.pipe_file(path, blob, **direct)), round_)
                else:
                    s = state(model, optimizer)
                    writer = FsspecWriter(f"s3://{prefix}/dcp-r{round_}")
                    record(name, timed(lambda s=s, w=writer: dcp.save(s, storage_writer=w)), round_)
                if counting:
                    after = _request_counts()
                    sent = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
                    kinds: dict[str, int] = {}
                    for k, v in sent.items():  # "METHOD /bucket/prefix": by method and the key's second folder
                        kinds[k.split(" ")[0]] = kinds.get(k.split(" ")[0], 0) + v
                    print(f"  {name}: {sum(sent.values())} requests, all ranks: {kinds}", flush=True)
                    if os.environ.get("BENCH_TRACE"):  # each request, ms after the section began
                        for t, what in _request_trace(began):
                            print(f"    {1000 * (t - began):7.0f} ms  {what[:140]}", flush=True)
            dist.barrier()
            if rank == 0:  # keep moto's memory bounded
                fs.invalidate_cache()
                for folder in (f"{prefix}/dcp-r{round_}", f"{prefix}/raw-r{round_}"):
                    for path in fs.find(folder):
                        fs.rm_file(path)
        tr.finish()

    if rank == 0:
        med = {k: statistics.median(v) for k, v in results.items()}
        print(f"\n== {world} gloo ranks, {gb:.2f} GB of model+AdamW shards, {args.repeat} rounds (medians) ==")
        rows = [
            ("save_checkpoint() throughput", "lh", "raw", "raw parallel write+fsync", 0.85, True, gb),
            ("non-blocking save, blocking time", "lh_async", "dcp_async", "dcp.async_save blocking", 1.0, False, gb),
            ("save_checkpoint() beside dcp.save", "lh", "dcp", "dcp.save", None, False, gb),
            ("load_checkpoint() beside dcp.load", "lh_load", "dcp_load", "dcp.load", None, False, gb),
            ("2->4 resharding load beside dcp.load", "lh_reshard", "dcp_reshard", "dcp.load 2->4", None, False, gb),
            (
                f"S3 (moto, 20 ms/request), {s3_gb:.2f} GB: save_checkpoint() throughput",
                "s3_lh",
                "s3_dcp",
                "dcp.save, FsspecWriter defaults",
                2.0,
                True,
                s3_gb,
            ),
            (
                "S3 (moto, 20 ms/request): save_checkpoint() beside the store's ceiling",
                "s3_lh",
                "s3_raw",
                "a plain s3fs write of the same bytes by the same ranks",
                None,
                True,
                s3_gb,
            ),
            (
                "S3 (moto, 20 ms/request): dcp.save beside the ceiling",
                "s3_dcp",
                "s3_raw",
                "the same",
                None,
                True,
                s3_gb,
            ),
        ]
        for title, mine, base, base_name, target, throughput, size in rows:
            if mine not in med or base not in med:
                continue
            ratio = med[base] / med[mine] if throughput else med[mine] / med[base]
            goal = f"  (target {'>=' if throughput else '<='} {target}x)" if target else ""
            what = "x the baseline's throughput" if throughput else "x the baseline's time"
            print(f"{title}: {med[mine]:.3f} s; {base_name}: {med[base]:.3f} s; {ratio:.2f}{what}{goal}")
            if throughput:
                print(f"  {size / med[mine]:.2f} GB/s against {size / med[base]:.2f} GB/s")
    dist.barrier()
    # gloo's threads (and dcp.async_save's executor) can hang or abort interpreter teardown in
    # torch 2.13 (see tests/torch/ddp_worker.py): leave once everything is printed
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=1200.0)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--ranks", type=lambda v: [int(n) for n in v.split(",")], default=[2, 4], help="e.g. 2,4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--s3-size-mb", type=float, default=160.0, help="model+AdamW on S3 (0: skip S3)")
    parser.add_argument("--s3-repeat", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where the stores and files go (default: the temp dir)")
    parser.add_argument("--verbose", action="store_true", help="print each timed section")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
