"""Self-check of checkpoints on CUDA, for when a GPU machine is lent (nothing in CI needs one).

Checks, on every visible CUDA device:

* a non-blocking save copies the state into reused pinned host buffers and blocks
  for about one device-to-host copy (printed beside a plain ``.to("cpu")`` of the
  same tensors, and beside the blocking save);
* the load reads tensor bytes in place, staged through pinned memory into the CUDA
  parameters and AdamW state (``_loaded_in_place`` > 0), and the round trip is
  bitwise (bf16 included);
* the CUDA RNG of every device is restored.

With two or more devices the model's layers alternate between ``cuda:0`` and
``cuda:1``, so a snapshot waits for the copies of each device it copied from.

Without CUDA it prints ``SKIP`` and exits 0. Exit status 1 on any failed check.

Run it from the repository root::

    python benchmarks/gpu_checkpoint_check.py            # ~200 MB of state per device
    python benchmarks/gpu_checkpoint_check.py --size-mb 2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any


def _state(model: Any, optimizer: Any) -> list[Any]:
    tensors = [t.detach().cpu().clone() for t in model.state_dict().values()]
    for entries in optimizer.state_dict()["state"].values():
        tensors += [t.detach().cpu().clone() for t in entries.values() if hasattr(t, "detach")]
    return tensors


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=200, help="weights + AdamW state, MB (default 200)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device here (torch.cuda.is_available() is False); nothing checked")
        return 0
    import launchhelm.torch as lht
    from launchhelm.torch import _inplace

    _inplace.IN_PLACE_MIN_BYTES = 0
    devices = torch.cuda.device_count()
    width = max(64, int((args.size_mb * 1e6 / 12 / 4) ** 0.5))
    print(
        f"torch {torch.__version__}; {devices} CUDA device(s): {torch.cuda.get_device_name(0)}; width {width}"
        + ("; layers alternate between cuda:0 and cuda:1" if devices > 1 else "")
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).cuda()
    for i, layer in enumerate(model):  # with several devices, the layers alternate between the first two
        layer.to(f"cuda:{i % min(devices, 2)}")
    model[3].to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad()
        x = torch.randn(16, width, device="cuda")
        for layer in model:
            x = layer(x.to(layer.weight.device, layer.weight.dtype))
        x.float().pow(2).mean().backward()
        optimizer.step()

    def sync() -> None:
        for d in range(devices):
            torch.cuda.synchronize(d)

    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="launchhelm-gpu-check-") as store:
        tr = lht.init("gpu-check", store=store)
        tr.watch(model, optimizer)
        step()
        for d in range(devices):  # a distinct stream per device
            with torch.cuda.device(d):
                torch.cuda.manual_seed(1000 + d)
        sync()
        tensors = list(model.state_dict().values())
        tensors += [t for st in optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        t0 = time.perf_counter()
        _ = [t.to("cpu") for t in tensors]
        sync()
        plain_copy = time.perf_counter() - t0

        tr.save_checkpoint(blocking=False)  # first one allocates the pinned buffers
        tr.wait_for_checkpoint()
        step()
        sync()
        saved = _state(model, optimizer)
        rng_at_save = [s.clone() for s in torch.cuda.get_rng_state_all()]
        t0 = time.perf_counter()
        artifact = tr.save_checkpoint(blocking=False)
        blocked = time.perf_counter() - t0
        pinned = all(b.is_pinned() for b in tr._checkpointer.snapshots._buffers if b.numel() > 1024)
        tr.wait_for_checkpoint()
        t0 = time.perf_counter()
        tr.save_checkpoint()
        blocking_save = time.perf_counter() - t0
        print(
            f"non-blocking save blocked {blocked:.3f} s; plain .to('cpu') of the same tensors {plain_copy:.3f} s; "
            f"blocking save {blocking_save:.3f} s; snapshot buffers pinned: {pinned}"
        )
        if not pinned:
            failures.append("the snapshot buffers of CUDA tensors are not pinned")
        if blocked > 1.5 * plain_copy + 0.05:
            failures.append(f"the non-blocking save blocked {blocked:.3f} s, more than one copy ({plain_copy:.3f} s)")

        step()
        torch.randn(3, device="cuda")  # move every device's stream on
        for d in range(devices):
            torch.randn(3, device=f"cuda:{d}")
        t0 = time.perf_counter()
        tr.load_checkpoint(artifact)
        sync()
        load_s = time.perf_counter() - t0
        loaded = _state(model, optimizer)
        bitwise = len(loaded) == len(saved) and all(
            a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(saved, loaded, strict=True)
        )
        restored = all(torch.equal(a, b) for a, b in zip(rng_at_save, torch.cuda.get_rng_state_all(), strict=True))
        print(
            f"load {load_s:.3f} s, {tr._checkpointer.loaded_in_place / 1e6:,.1f} MB in place through pinned memory; "
            f"bitwise: {bitwise}; CUDA RNG of {devices} device(s) restored: {restored}"
        )
        if tr._checkpointer.loaded_in_place == 0:
            failures.append("nothing was read in place into the CUDA tensors")
        if not bitwise:
            failures.append("the round trip is not bitwise")
        if not restored:
            failures.append("the CUDA RNG states were not restored")
        step()  # training goes on from the restored state
        tr.finish()
    for failure in failures:
        print(f"FAIL: {failure}")
    print("PASS" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
