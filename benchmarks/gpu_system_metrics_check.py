"""Self-check of GPU system metrics, for when a GPU machine is lent (nothing in CI needs one).

A session with ``system_metrics=1`` (one sample a second) trains a matmul loop on every
visible CUDA device for ``--seconds`` (default 8) while logging a metric each step, then
reads ``RunHandle.history(stream="system")`` back from the store and checks, for each GPU
``i``:

* ``system/gpu<i>/utilization``, ``memory_used_bytes``, ``temperature`` and ``power_watts``
  were sampled at least three times;
* utilization rose above 0 while the loop ran, memory used is at least what torch
  allocated on that device, the temperature is between 1 and 120 C and the power above 0 W;

and that ``log()``'s mean latency with the sampler on stays under 5 µs (the same loop of
``log()`` calls timed with the sampler off, in the same run, printed beside it). It prints
every sample, so its output can be pasted into a note.

Needs nvidia-ml-py (``pip install 'launchhelm[gpu]'``). Without CUDA, without NVML or
without the package it prints ``SKIP`` and the reason and exits 0. Exit status 1 on any
failed check.

Run it from the repository root::

    python benchmarks/gpu_system_metrics_check.py
    python benchmarks/gpu_system_metrics_check.py --seconds 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

KEYS = ("utilization", "memory_used_bytes", "temperature", "power_watts")
LOG_CALLS = 200_000


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False)"
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed (pip install 'launchhelm[gpu]')"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # no driver library, or NVML refuses
        return f"NVML could not start: {type(exc).__name__}: {exc}"
    return None if count else "NVML sees no GPU"


def _log_latency_us(run: Any, calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        run.log({"bench/x": float(i)}, step=i)
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the loop runs (default 8)")
    args = parser.parse_args(argv)
    reason = _skip_reason()
    if reason is not None:
        print(f"SKIP: {reason}; nothing checked")
        return 0
    import torch

    import launchhelm as lh

    failures: list[str] = []
    devices = list(range(torch.cuda.device_count()))
    with tempfile.TemporaryDirectory(prefix="launchhelm-gpu-metrics-") as store:
        off = lh.init("gpu-metrics", store=store, system_metrics=False, capture_console=False)
        latency_off = _log_latency_us(off, LOG_CALLS)
        off.finish()
        run = lh.init("gpu-metrics", store=store, system_metrics=1.0, capture_console=False)
        latency_on = _log_latency_us(run, LOG_CALLS)
        xs = [torch.randn(4096, 4096, device=f"cuda:{d}") for d in devices]
        allocated = {d: torch.cuda.memory_allocated(d) for d in devices}
        step, deadline = LOG_CALLS, time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            for x in xs:
                x.copy_((x @ x).clamp_(-1, 1))
            run.log({"train/step_time": 0.0}, step=step)
            step += 1
        for d in devices:
            torch.cuda.synchronize(d)
        run.finish()
        frame = lh.Api(store).run(run.id).history(stream="system")

    print(
        f"torch {torch.__version__}, {len(devices)} CUDA device(s): "
        + ", ".join(torch.cuda.get_device_name(d) for d in devices)
    )
    print(f"{len(frame)} system samples over {args.seconds:g} s of training")
    gpu_columns = [c for c in frame.columns if c.startswith("system/gpu")]
    with_time = frame[["time", *gpu_columns]]
    print(with_time.to_string(index=False))
    for d in devices:
        prefix = f"system/gpu{d}/"
        missing = []
        for key in KEYS:
            column = prefix + key
            samples: Any = frame[column].dropna() if column in frame else []
            if len(samples) < 3:
                missing.append(f"{column}: {len(samples)} samples, expected at least 3")
        failures += missing
        if missing:
            continue
        checks = {
            "utilization rose above 0": frame[prefix + "utilization"].max() > 0,
            f"memory used >= {allocated[d]:,} bytes torch allocated": frame[prefix + "memory_used_bytes"].max()
            >= allocated[d],
            "temperature within 1..120 C": frame[prefix + "temperature"].between(1, 120).all(),
            "power above 0 W": (frame[prefix + "power_watts"] > 0).all(),
        }
        for what, ok in checks.items():
            print(f"gpu{d}: {what}: {'yes' if ok else 'NO'}")
            if not ok:
                failures.append(f"gpu{d}: {what}")
    print(f"log() mean latency: {latency_on:.2f} µs with the sampler on, {latency_off:.2f} µs off")
    if latency_on > 5.0:
        failures.append(f"log() took {latency_on:.2f} µs with the sampler on (target <= 5)")
    for failure in failures:
        print(f"FAIL: {failure}")
    if not failures:
        print("PASS: GPU system metrics sampled and read back for every device")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
