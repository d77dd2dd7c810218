"""Self-check of sharded checkpoints (format /3) on CUDA, for when a GPU machine is lent.

Checks, on an FSDP2 (``fully_shard``) model whose parameters are DTensors on CUDA:

* a non-blocking save copies this rank's shards into pinned host buffers
  (``is_pinned()``), the same buffers from save to save, and blocks for less
  than ``torch.distributed.checkpoint.async_save`` of the same state (its
  blocking time printed beside, with DCP's default stager and with a pinned one);
* the round trip is bitwise: every model and AdamW tensor (a bf16 layer
  included) as ``get_state_dict(full_state_dict=True)`` gathers it, and the
  CUDA RNG;
* the restored model trains on.

With two or more CUDA devices it relaunches itself under ``torchrun
--standalone`` on two of them (process group ``cpu:gloo,cuda:nccl``, as DCP's
async_save needs a CPU backend); with one, it runs as a single rank. Without
CUDA it prints one ``SKIP`` line and exits 0. Exit status 1 on any failed check.
``--cpu`` runs the same checks on CPU (gloo, unpinned buffers): how the tests
check this script on machines without a GPU.

Run it from the repository root::

    python benchmarks/gpu_sharded_check.py              # ~200 MB of state
    python benchmarks/gpu_sharded_check.py --size-mb 2000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_CHILD = "LAUNCHHELM_GPU_SHARDED_CHILD"


def _bitwise(a: dict[str, Any], b: dict[str, Any], path: str = "") -> list[str]:
    """Keys where two nested state dicts differ (tensors compared byte for byte)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path} keys"]
        return [d for k in a for d in _bitwise(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _bitwise(x, y, f"{path}/{i}")]
    return [] if a == b else [path]


def _cloned(value: Any) -> Any:
    if hasattr(value, "clone"):
        return value.clone()
    if isinstance(value, dict):
        return {k: _cloned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cloned(v) for v in value)
    return value


def _check(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import launchhelm.torch as lht

    cuda = not args.cpu
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    else:
        backend = "cpu:gloo,cuda:nccl" if cuda and dist.is_nccl_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    def say(line: str) -> None:
        if rank == 0:
            print(line, flush=True)

    width = max(64, int((args.size_mb * 1e6 / 12 / 4) ** 0.5))
    say(
        f"torch {torch.__version__}; {world} rank(s), backend {dist.get_backend()}; "
        + (f"{torch.cuda.get_device_name(device)}; " if cuda else "CPU (--cpu); ")
        + f"width {width}"
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).to(device)
    model[3].to(torch.bfloat16)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad()
        x = torch.randn(16, width, device=device)
        for layer in model:
            x = layer(x.to(layer.weight.dtype))
        x.float().pow(2).mean().backward()
        optimizer.step()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()

    def full() -> dict[str, Any]:
        """The whole state, gathered; cloned, since on one CPU rank it shares the live tensors."""
        msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _cloned({"model": msd, "optimizer": osd})

    failures: list[str] = []
    box = [tempfile.mkdtemp(prefix="launchhelm-gpu-sharded-") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    work = Path(str(box[0]))
    tr = lht.init("gpu-sharded-check", store=str(work / "store"))
    tr.watch(model, optimizer)
    step()
    if not tr._checkpointer.watched.sharded:
        failures.append("watch() did not choose sharded checkpoints for an FSDP2 model")
    tr.save_checkpoint(blocking=False)  # the first save allocates the staging buffers
    tr.wait_for_checkpoint()
    first = [b.data_ptr() for b in tr._checkpointer.snapshots._buffers]
    step()
    if cuda:
        torch.cuda.manual_seed(1234 + rank)
    sync()
    saved = full()
    rng_at_save = torch.cuda.get_rng_state(device) if cuda else None
    t0 = time.perf_counter()
    artifact = tr.save_checkpoint(blocking=False)
    blocked = time.perf_counter() - t0
    buffers = tr._checkpointer.snapshots._buffers
    staged = [b for b in buffers if b.numel() > 1]  # the shards (AdamW's step counts are CPU scalars)
    pinned = bool(staged) and all(b.is_pinned() for b in staged)
    reused = [b.data_ptr() for b in buffers] == first
    tr.wait_for_checkpoint()
    sync()

    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    dcp_blocked: dict[str, float] = {}
    # DCP's defaults stage into fresh pageable memory; a stager kept between saves reuses pinned buffers
    stagers = {
        "default stager": None,
        ("pinned stager" if cuda else "kept stager"): StagingOptions(cuda, False, False, cuda),
    }
    for name, options in stagers.items():
        stager = DefaultStager(options) if options is not None else None
        for attempt in range(2):  # the first allocates; the second is timed
            sync()
            t0 = time.perf_counter()
            pending = dcp.async_save(state, checkpoint_id=str(work / f"dcp-{name[:6]}-{attempt}"), async_stager=stager)
            took = time.perf_counter() - t0
            (pending.upload_completion if hasattr(pending, "upload_completion") else pending).result()
        dcp_blocked[name] = took
        if stager is not None:
            stager.close()
    ratio = blocked / dcp_blocked["default stager"] if dcp_blocked["default stager"] > 0 else float("inf")
    say(
        f"non-blocking save blocked {blocked:.4f} s (rank 0); DCP async_save blocked "
        + ", ".join(f"{t:.4f} s ({name})" for name, t in dcp_blocked.items())
        + f"; ratio to DCP's default {ratio:.2f}x"
    )
    say(f"staging buffers: {len(staged)} shard buffer(s), pinned: {pinned}; reused from the previous save: {reused}")
    if cuda and not pinned:
        failures.append("the staging buffers of the CUDA shards are not pinned")
    if not reused:
        failures.append("the staging buffers were allocated again instead of reused")
    # a time is a target only on the GPU it is for: on --cpu (the suite's self-check, a shared machine) one
    # sample of a 2 MB save says how the logic runs, not how fast
    if cuda and blocked > 1.5 * dcp_blocked["default stager"] + 0.05:
        failures.append(f"the non-blocking save blocked {blocked:.4f} s, more than DCP async_save's")

    step()  # move every tensor and the RNG on
    if cuda:
        torch.randn(3, device=device)
    t0 = time.perf_counter()
    tr.load_checkpoint(artifact)
    sync()
    load_s = time.perf_counter() - t0
    differ = _bitwise(saved, full())
    devices = {str(p.device) for p in model.parameters()}
    restored = rng_at_save is None or torch.equal(rng_at_save, torch.cuda.get_rng_state(device))
    say(
        f"load {load_s:.3f} s; bitwise round trip of every model and AdamW tensor: {not differ}; "
        f"parameters on {sorted(devices)}; CUDA RNG restored: {restored if cuda else 'n/a'}"
    )
    if differ:
        failures.append(f"the round trip is not bitwise at {differ[:5]}")
    if devices != {str(device)}:
        failures.append(f"the loaded parameters are on {sorted(devices)}, not {device}")
    if not restored:
        failures.append("the CUDA RNG state was not restored")
    step()  # training goes on from the restored state
    tr.finish()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, failures)
    dist.destroy_process_group()
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)
    if rank != 0:
        return 1 if any(gathered) else 0
    for r, theirs in enumerate(gathered):
        for failure in theirs:
            print(f"FAIL: rank {r}: {failure}")
    bad = sum(len(g) for g in gathered)
    print("PASS" if not bad else f"{bad} check(s) failed")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=200, help="weights + AdamW state, MB (default 200)")
    parser.add_argument("--cpu", action="store_true", help="run the checks on CPU (gloo): a test of this script")
    args = parser.parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("SKIP: no CUDA device here (torch.cuda.is_available() is False); nothing checked")
        return 0
    devices = torch.cuda.device_count() if not args.cpu else 0
    if devices >= 2 and "RANK" not in os.environ and not os.environ.get(_CHILD):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__]
        return subprocess.call([*cmd, *(argv if argv is not None else sys.argv[1:])], env={**os.environ, _CHILD: "1"})
    return _check(args)


if __name__ == "__main__":
    sys.exit(main())
