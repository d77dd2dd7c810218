"""Benchmark of sharded checkpoints (format /3) on 2 and 4 gloo ranks, beside their baselines.

    python benchmarks/bench_sharded.py [--size-mb 1200] [--repeat 3]

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
  2-to-4 resharding load of the 2-rank job's checkpoints, LaunchHelm's beside ``dcp.load``.

A time is the slowest rank's (every timed section starts after a barrier and ends with one).
Rank 0 prints each figure with its baseline and the ratio of medians over ``--repeat`` rounds.
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
from pathlib import Path
from typing import Any


def launch(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-sharded-", dir=args.dir))
    try:
        for nproc in (2, 4):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
            cmd += [__file__, "--worker", "--work", str(work), "--size-mb", str(args.size_mb)]
            cmd += ["--repeat", str(args.repeat), "--layers", str(args.layers)] + ["--verbose"] * args.verbose
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            subprocess.run(cmd, check=True, env=env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    import launchhelm.torch as lht

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    work = Path(args.work)
    width = int((args.size_mb * 1e6 / 4 / 3 / args.layers) ** 0.5)

    def build() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(args.layers)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, width)).sum().backward()
        optimizer.step()
        return model, optimizer

    model, optimizer = build()
    locals_ = [p.to_local() for p in model.parameters()]
    locals_ += [v.to_local() for s in optimizer.state.values() for v in s.values() if hasattr(v, "to_local")]
    total = sum(t.numel() * t.element_size() for t in locals_)
    totals = [0] * world
    dist.all_gather_object(totals, total)

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

    def raw(path: Path) -> None:
        with open(path, "wb", buffering=0) as f:
            for t in locals_:
                f.write(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))
            os.fsync(f.fileno())

    store = work / f"store{world}"
    tr = lht.init("bench", store=str(store))
    tr.watch(model, optimizer)
    results: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        results.setdefault(name, []).append(seconds)

    for round_ in range(args.repeat + 1):
        sections = ["raw", "lh", "lh_async", "dcp", "dcp_async"]
        if round_ % 2:
            sections.reverse()
        for name in sections:
            out = work / f"{name}-w{world}-r{round_}"
            if rank == 0:
                out.mkdir(parents=True, exist_ok=True)
            dist.barrier()
            if name == "raw":
                seconds = timed(lambda out=out: raw(out / f"rank{rank}.bin"))
            elif name == "lh":
                seconds = timed(lambda: tr.save_checkpoint())
            elif name == "lh_async":
                seconds = blocking(lambda: tr.save_checkpoint(blocking=False), tr.wait_for_checkpoint)
            elif name == "dcp":
                msd, osd = get_state_dict(model, optimizer)
                seconds = timed(lambda out=out, msd=msd, osd=osd: dcp.save({"m": msd, "o": osd}, checkpoint_id=out))
            else:
                msd, osd = get_state_dict(model, optimizer)
                future: list[Any] = []
                state = {"m": msd, "o": osd}
                seconds = blocking(
                    lambda o=out, s=state, f=future: f.append(dcp.async_save(s, checkpoint_id=o)),
                    lambda f=future: f[0].result(),
                )
            if round_:
                record(name, seconds)
            if args.verbose and rank == 0:
                print(f"round {round_} {name}: {seconds:.3f} s", flush=True)
            if rank == 0 and name in ("raw", "dcp", "dcp_async") and round_ < args.repeat:
                shutil.rmtree(out, ignore_errors=True)
    dcp_dir = work / f"dcp-w{world}-r{args.repeat}"
    for _ in range(args.repeat):
        record("lh_load", timed(lambda: tr.load_checkpoint("latest")))
        msd, osd = get_state_dict(model, optimizer)
        state = {"m": msd, "o": osd}
        record("dcp_load", timed(lambda state=state: dcp.load(state, checkpoint_id=dcp_dir)))
        set_state_dict(model, optimizer, model_state_dict=state["m"], optim_state_dict=state["o"])
    if world == 4:  # the 2-rank job's checkpoints, resharded onto 4 ranks
        import launchhelm as lh

        [run_id] = lh.Api(str(work / "store2")).run_ids("bench")
        latest = lh.Api(str(work / "store2")).run(run_id).checkpoints()[-1]
        folder = work / "store2" / "runs" / run_id / "artifacts" / latest.id
        for _ in range(args.repeat):
            record("lh_reshard", timed(lambda: tr.load_checkpoint(folder)))
            msd, osd = get_state_dict(model, optimizer)
            state = {"m": msd, "o": osd}
            record(
                "dcp_reshard", timed(lambda state=state: dcp.load(state, checkpoint_id=work / f"dcp-w2-r{args.repeat}"))
            )
    tr.finish()
    if rank == 0:
        med = {k: statistics.median(v) for k, v in results.items()}
        gb = sum(totals) / 1e9
        print(f"\n== {world} gloo ranks, {gb:.2f} GB of model+AdamW shards, {args.repeat} rounds (medians) ==")
        rows = [
            ("save_checkpoint() throughput", "lh", "raw", "raw parallel write+fsync", 0.85, True),
            ("non-blocking save, blocking time", "lh_async", "dcp_async", "dcp.async_save blocking", 1.0, False),
            ("save_checkpoint() beside dcp.save", "lh", "dcp", "dcp.save", None, False),
            ("load_checkpoint() beside dcp.load", "lh_load", "dcp_load", "dcp.load", None, False),
            ("2->4 resharding load beside dcp.load", "lh_reshard", "dcp_reshard", "dcp.load 2->4", None, False),
        ]
        for title, mine, base, base_name, target, throughput in rows:
            if mine not in med or base not in med:
                continue
            ratio = med[base] / med[mine] if throughput else med[mine] / med[base]
            goal = f"  (target {'>=' if throughput else '<='} {target}x)" if target else ""
            what = "x the baseline's throughput" if throughput else "x the baseline's time"
            print(f"{title}: {med[mine]:.3f} s; {base_name}: {med[base]:.3f} s; {ratio:.2f}{what}{goal}")
            if throughput:
                print(f"  {gb / med[mine]:.2f} GB/s against {gb / med[base]:.2f} GB/s")
    dist.barrier()
    # gloo's threads (and dcp.async_save's executor) can hang or abort interpreter teardown in
    # torch 2.13 (see tests/torch/ddp_worker.py): leave once everything is printed
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=1200.0)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
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
