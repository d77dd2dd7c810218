"""What watching for hangs costs (issue 42): the training loop's tail with the watchdog on and off, and the
watchdog process's own CPU and memory.

    python benchmarks/bench_hang.py [--seconds 20] [--rounds 4] [--check]

The same loop (``run.global_step += 1`` and a 5-metric ``log()`` per step, timed per 100-step batch, wall
clock) runs in alternating rounds with ``hang_timeout=None`` (the baseline) and ``hang_timeout=600`` (the
watchdog beside it), so machine noise falls on both alike. Every run has a helper process (issue 40);
with a ``hang_timeout`` it also times the steps: that watchdog's whole cost in the training
process is one store into a shared page per step; what its process spends (it samples the page every
``LAUNCHHELM_HANG_POLL`` s, 0.5 by default) is read from ``/proc/<pid>``. ``--check`` fails if the watched
loop's mean step is over 1.10x the baseline's, or its p99.9 batch over 1.5x (the tail is noisy on a shared
machine: the figures, not the check, are what the benchmarks page keeps).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import launchhelm as lh

BATCH = 100


def _loop(store: str, hang_timeout: float | None, seconds: float) -> tuple[list[float], float, dict[str, float]]:
    """Batches' wall times (s), the mean step (s), and the watchdog process's CPU seconds and RSS (MiB)."""
    run = lh.init(
        "bench-hang",
        store=store,
        hang_timeout=hang_timeout,
        system_metrics=False,
        capture_console=False,
        flush_interval=2.0,
    )
    # warm-up, the same for both: until the helper (started by the run's thread at its first wake-up) runs
    # and has finished importing, so its start-up is not counted as the loop's
    settle = time.perf_counter() + 30
    while time.perf_counter() < settle and run._helper is None:
        run.global_step += 1
        time.sleep(0.01)
    time.sleep(2.0)
    # the helper process (every run has one; with hang_timeout it also times the steps): the bench reads its
    # /proc entry, for which there is no public handle
    helper = run._helper if hang_timeout is not None else None
    before = _proc_usage(helper.process.pid) if helper is not None else {}
    batches: list[float] = []
    steps = 0
    end = time.perf_counter() + seconds
    watched: dict[str, float] = {}
    while time.perf_counter() < end:
        start = time.perf_counter()
        for _ in range(BATCH):
            run.global_step += 1
            run.log({"loss": 0.5, "acc": 0.9, "lr": 1e-3, "grad_norm": 1.0, "tokens": 4096.0})
        batches.append(time.perf_counter() - start)
        steps += BATCH
    if helper is not None:  # what it spent while the loop was timed, its start-up left out
        after = _proc_usage(helper.process.pid)
        watched = {"cpu_s": after["cpu_s"] - before["cpu_s"], "rss_mib": after["rss_mib"]}
    run.finish()
    return batches, sum(batches) / steps, watched


def _proc_usage(pid: int) -> dict[str, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return {"cpu_s": cpu, "rss_mib": rss / 1024}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per round (default 20)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each, alternating (default 4)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {
        "off": {"batches": [], "means": []},
        "on": {"batches": [], "means": []},
    }
    usage: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        for i in range(args.rounds):
            for label, timeout in (("off", None), ("on", 600.0)) if i % 2 == 0 else (("on", 600.0), ("off", None)):
                batches, mean, watched = _loop(str(Path(tmp) / f"store-{label}-{i}"), timeout, args.seconds)
                results[label]["batches"] += batches
                results[label]["means"].append(mean)
                if watched:
                    usage.append({**watched, "seconds": args.seconds})
    print(f"bench_hang: {args.rounds} rounds x {args.seconds:g} s each, watchdog off and on alternating")
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}; load {os.getloadavg()[0]:.1f}")
    rows = {}
    for label in ("off", "on"):
        b = results[label]["batches"]
        rows[label] = {
            "mean step us": statistics.median(results[label]["means"]) * 1e6,
            "p50 batch ms": _quantile(b, 0.5) * 1e3,
            "p99 batch ms": _quantile(b, 0.99) * 1e3,
            "p99.9 batch ms": _quantile(b, 0.999) * 1e3,
            "max batch ms": max(b) * 1e3,
        }
    print(f"{'':16}{'off (baseline)':>16}{'on':>12}{'ratio':>8}")
    for name in rows["off"]:
        off, on = rows["off"][name], rows["on"][name]
        print(f"{name:16}{off:16.3f}{on:12.3f}{on / off:8.2f}x")
    if usage:
        cpu = sum(u["cpu_s"] for u in usage) / sum(u["seconds"] for u in usage)
        rss = max(u["rss_mib"] for u in usage)
        poll = os.environ.get("LAUNCHHELM_HANG_POLL", "0.5")
        print(f"watchdog process: {cpu * 100:.2f}% of one CPU while timed, RSS {rss:.1f} MiB (poll {poll} s)")
    else:
        print("watchdog process: no helper started (the store is not watchable?)")
    mean_ratio = rows["on"]["mean step us"] / rows["off"]["mean step us"]
    tail_ratio = rows["on"]["p99.9 batch ms"] / rows["off"]["p99.9 batch ms"]
    ok = bool(usage) and mean_ratio <= 1.10 and tail_ratio <= 1.5
    verdict = "met" if ok else "MISSED"
    print(f"targets: mean step <= 1.10x ({mean_ratio:.2f}x), p99.9 batch <= 1.5x ({tail_ratio:.2f}x): {verdict}")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
