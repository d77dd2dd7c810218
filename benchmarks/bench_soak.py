"""Soak: a compressed day of logging and a full-speed flood, memory and stalls over time, with the watcher
on and off.

Two runs, each in a fresh interpreter and each twice: with the watcher on (the helper process that
``init`` starts beside the training process, timing its steps for hangs: the defaults) and off (no
helper at all; ``benchmarks/_watcher.py``), on a fresh store (local by default; ``--store URL`` for another,
e.g. moto S3 with ``--storage-options '{"client_kwargs": {...}}'``), each
``system_metrics=False, capture_console=False``:

* **compressed day**: ``--flushes`` flushes (default 1,440, 48 minutes of a day;
  ``--full`` runs 43,200, a day of 2 s flushes) of 1,000 values each (500
  values/s for 2 s: 200 steps of 5 metrics), logged in batches of 100 calls,
  the background thread flushing every 10 ms and compacting as it does, and
  deleting what aged past the grace period, compressed as time is (3 s for
  600 s, unless ``LAUNCHHELM_COMPACTION_GRACE`` is set). RSS and Arrow's
  allocations (after ``gc``) are printed at every tenth; the target is RSS
  growth over the last two thirds at most 16 MiB.
* **flood**: as fast as the loop goes for ``--flood-seconds`` (default 6;
  ``--full``: 120), RSS and Arrow allocations every 2 s; the target is RSS
  under the interpreter's RSS after ``init`` plus ``compaction_memory`` plus
  the buffer's half of it, and Arrow's under ``compaction_memory``.

Both runs are read back and compared with what was logged (every value,
exactly). The per-batch time of the day's 100-call batches is printed beside
the same loop writing into a dict, in the same process, both as wall time and
less the time the kernel kept the thread waiting for a CPU (on a shared, busy
machine, other processes' noise).

With the watcher on and off, the end compares: the day's per-batch times (p50, p99, p99.9, max) and
its RSS growth, the flood's steps a second and its peak RSS, each on / off; and prints what the helper
process itself spent while each run was timed: its CPU seconds (``/proc/<pid>/stat``) and its RSS and
peak RSS (``/proc/<pid>/status``), its start-up (an interpreter importing launchhelm) waited out
before the timed part and printed apart; every run, on or off, waits at least 2.5 s after ``init``.

    python benchmarks/bench_soak.py            # under two minutes on 2 cores
    python benchmarks/bench_soak.py --full     # a compressed day and a 120 s flood
    python benchmarks/bench_soak.py --s3       # on a moto_server started here
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import _watcher
from _gilwatch import RunDelay
from _watcher import MODES

MIB = 2**20
#: The compressed day's grace period, s: the default 600 s over the 200-fold compression of its flushes.
DAY_GRACE = 3.0
KEYS = ("loss", "lr", "grad_norm", "acc", "tput")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_parts() -> tuple[float, float]:
    """Anonymous and file-backed RSS, MiB (the spool's mapped files are the second)."""
    parts = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                parts[line.split(":")[0]] = int(line.split()[1]) / 1024
    return parts.get("RssAnon", 0.0), parts.get("RssFile", 0.0) + parts.get("RssShmem", 0.0)


def arrow_bytes() -> int:
    if "pyarrow" not in sys.modules:
        return 0
    import pyarrow as pa

    gc.collect()
    return int(pa.total_allocated_bytes())


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def row(step: int) -> dict[str, float]:
    x = float(step)
    return {"loss": 1.0 / (x + 1.0), "lr": 3e-4, "grad_norm": x, "acc": x * 0.5, "tput": -x}


def high_water() -> float:
    """The process's peak RSS since the last :func:`reset_high_water`, MiB (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def reset_high_water() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def exact(store: Any, run_id: str, steps: int) -> bool:
    """Every point back through ``history()``, exactly; prints what the read cost in memory."""
    import numpy as np

    import launchhelm as lh

    gc.collect()
    before = rss() / MIB
    reset_high_water()
    started = time.perf_counter()
    frame = lh.Api(store).run(run_id).history()
    took = time.perf_counter() - started
    size = frame.memory_usage(index=False).sum() / MIB
    print(
        f"  history(): {len(frame):,} rows in {took:.1f} s; the frame {size:.0f} MiB, "
        f"the read's peak RSS {high_water() - before:.0f} MiB over the {before:.0f} MiB before it",
        flush=True,
    )
    expected = np.arange(steps, dtype=np.float64)
    return (
        len(frame) == steps
        and np.array_equal(frame["grad_norm"].to_numpy(), expected)
        and np.array_equal(frame["tput"].to_numpy(), -expected)
        and np.array_equal(frame["step"].to_numpy(), np.arange(steps))
    )


def day(store: Any, options: dict[str, Any] | None, flushes: int, on: bool) -> dict[str, Any]:
    import launchhelm as lh

    with _watcher.watcher(on) as extra:
        run = lh.init(
            "soak-day",
            store=store,
            storage_options=options,
            system_metrics=False,
            capture_console=False,
            flush_interval=0.01,
            **extra,
        )
    meter = _watcher.Meter(run, _watcher.settle(run, on))
    pc = time.perf_counter_ns
    queued = RunDelay()
    # 8 bytes a sample, not a float object, and allocated whole now: the benchmark's own samples must
    # not read as the run's growth
    batches = array("d", bytes(8 * 2 * flushes))
    own = array("d", bytes(8 * 2 * flushes))
    marks: list[tuple[int, float, float]] = []
    every = array("d", bytes(8 * flushes))  # RSS after each flush
    step = 0
    total = flushes * 200
    tenth = max(1, flushes // 10)
    meter.start()
    for flush in range(flushes):
        for half in range(2):
            q0 = queued()
            t0 = pc()
            for _ in range(100):
                run.log(row(step), step=step)
                step += 1
            wall = (pc() - t0) / 1e6
            batches[2 * flush + half] = wall
            own[2 * flush + half] = max(0.0, wall - (queued() - q0) * 1e3)
        time.sleep(0.01)  # one background flush's worth
        every[flush] = rss() / MIB
        if flush % tenth == 0 or flush == flushes - 1:
            marks.append((flush, rss() / MIB, arrow_bytes() / MIB))
    spent = meter.stop()
    run.finish()
    queued.close()
    return {
        "spent": spent,
        "run": run.id,
        "steps": total,
        "batches": batches,
        "own": own,
        "marks": marks,
        "every": every,
        "store": run.store,
    }


def flood(store: Any, options: dict[str, Any] | None, seconds: float, on: bool) -> dict[str, Any]:
    import launchhelm as lh

    with _watcher.watcher(on) as extra:
        run = lh.init(
            "soak-flood", store=store, storage_options=options, system_metrics=False, capture_console=False, **extra
        )
    after_init = rss()
    meter = _watcher.Meter(run, _watcher.settle(run, on))
    marks: list[tuple[float, float, float]] = []
    parts: list[tuple[float, float]] = []
    step = 0
    meter.start()
    helper_before = meter.before_rss_mib()  # the helper writes the points: the flood's bound is its too
    start = time.monotonic()
    next_mark = start + 2.0
    while True:
        for _ in range(1000):
            run.log(row(step), step=step)
            step += 1
        now = time.monotonic()
        if now >= next_mark:
            next_mark += 2.0
            marks.append((now - start, rss() / MIB, arrow_bytes() / MIB))
            parts.append(rss_parts())
            if now - start >= seconds:
                break
    finish_s = time.monotonic()
    spent = meter.stop()
    run.finish()
    return {
        "spent": spent,
        "rate": step / (finish_s - start),
        "run": run.id,
        "steps": step,
        "marks": marks,
        "parts": parts,
        "after_init": after_init / MIB,
        "finish_s": time.monotonic() - finish_s,
        "memory": run._flusher.compaction_memory / MIB,
        "store": run.store,
        "helper_before": helper_before,
    }


def dict_baseline(batches: int) -> tuple[list[float], list[float]]:
    """The day's loop writing into a dict: per-batch wall ms, and less the waits for a CPU."""
    pc = time.perf_counter_ns
    queued = RunDelay()
    sink: dict[int, dict[str, float]] = {}
    out: list[float] = []
    own: list[float] = []
    step = 0
    for i in range(batches):
        q0 = queued()
        t0 = pc()
        for _ in range(100):
            sink[step] = row(step)
            step += 1
        wall = (pc() - t0) / 1e6
        out.append(wall)
        own.append(max(0.0, wall - (queued() - q0) * 1e3))
        if i % 2 == 1:
            time.sleep(0.01)
    queued.close()
    return out, own


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="43,200 flushes and a 120 s flood")
    parser.add_argument("--flushes", type=int, default=None, help="flushes in the compressed day (default 1,440)")
    parser.add_argument("--flood-seconds", type=float, default=None, help="seconds of flood (default 6)")
    parser.add_argument("--store", default=None, help="store URL (default: a temporary local folder)")
    parser.add_argument("--storage-options", default=None, help="JSON for fsspec (endpoint_url...)")
    parser.add_argument("--s3", action="store_true", help="a real moto_server on 127.0.0.1 as the store")
    parser.add_argument("--only", choices=("day", "flood"), help=argparse.SUPPRESS)  # one part, in this process
    parser.add_argument("--watcher", choices=MODES, default="on", help=argparse.SUPPRESS)  # with --only
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)  # with --only: its figures, as JSON
    args = parser.parse_args()
    flushes = args.flushes or (43_200 if args.full else 1_440)
    seconds = args.flood_seconds or (120.0 if args.full else 6.0)
    if args.only is None:
        # each part in a fresh interpreter: memory one part freed (the allocators keep some) must not
        # count as the other's growth
        tmp = tempfile.mkdtemp(prefix="launchhelm-soak-")
        store = args.store or os.path.join(tmp, "store")
        if args.s3:
            from bench_checkpoint import BUCKET, MotoServer

            moto = MotoServer(Path(tmp) / "moto.log")
            moto.start()
            store = f"s3://{BUCKET}/soak"
        grace = os.environ.get("LAUNCHHELM_COMPACTION_GRACE") or f"{DAY_GRACE:g} (600 s compressed as the day is)"
        print(
            f"store {store}; compressed day: {flushes:,} flushes x 1,000 values, compaction grace {grace} s; "
            f"flood: {seconds:.0f} s",
            flush=True,
        )
        common = ["--flushes", str(flushes), "--flood-seconds", str(seconds), "--store", store]
        if args.storage_options:
            common += ["--storage-options", args.storage_options]
        env = {**os.environ, "LAUNCHHELM_SPOOL": os.environ.get("LAUNCHHELM_SPOOL") or os.path.join(tmp, "spool")}
        if args.s3:
            # moto 5.2 answers a GET of an object uploaded in parts (FULL_OBJECT CRC64NVME) with a
            # 4-byte crc64nvme header that cannot match, and botocore then refuses the whole read; S3
            # itself returns the checksum the upload gave and checked. Validate only where required.
            env["AWS_RESPONSE_CHECKSUM_VALIDATION"] = "when_required"
        failed = 0
        results: dict[str, dict[str, Any]] = {}
        for part in ("day", "flood"):
            part_env = dict(env)
            if part == "day" and "LAUNCHHELM_COMPACTION_GRACE" not in os.environ:
                # time is compressed 200-fold (2 s flushes every 10 ms), so is the grace period: 600 s
                # unscaled would keep 33 hours of the day's garbage readable where a real run keeps 10 minutes
                part_env["LAUNCHHELM_COMPACTION_GRACE"] = str(DAY_GRACE)
            # off first for the day, on first for the flood: a drift of the machine's load falls on both
            for mode in MODES if part == "day" else tuple(reversed(MODES)):
                print(f"\n== {part}, the watcher {mode}", flush=True)
                result = os.path.join(tmp, f"{part}-{mode}.json")
                code = subprocess.run(
                    [sys.executable, __file__, *common, "--only", part, "--watcher", mode, "--result", result],
                    env=part_env,
                    check=False,
                ).returncode
                if code:
                    # a negative code is a signal: the OOM killer's SIGKILL must not read as success
                    print(f"MISS  the {part} part (the watcher {mode}) exited with {code}", flush=True)
                    failed = 1
                else:
                    with open(result) as file:
                        results[f"{part}-{mode}"] = json.load(file)
        compare(results)
        return failed
    options = json.loads(args.storage_options) if args.storage_options else None
    store = args.store
    import launchhelm  # noqa: F401  imported before the first RSS reading

    checks: list[tuple[str, bool]] = []
    on = args.watcher == "on"
    load = os.getloadavg()[0]  # the machine's load: a part run while other work ran reads differently
    result: dict[str, Any] = {}
    if args.only == "day":
        d = day(store, options, flushes, on)
        print("\ncompressed day: flush, RSS MiB, Arrow MiB")
        for flush, r, a in d["marks"]:
            print(f"  {flush:>8,} {r:>9.1f} {a:>9.1f}")
        third = d["marks"][len(d["marks"]) // 3][1]
        peak = max(r for _, r, _ in d["marks"][len(d["marks"]) // 3 :]) - third
        # the trend, not a compaction caught mid-merge: the median RSS of the last tenth of the flushes
        # against that of the tenth starting at one third
        every = d["every"]
        n, w = len(every), max(1, len(every) // 10)
        early, late = statistics.median(every[n // 3 : n // 3 + w]), statistics.median(every[-w:])
        growth = late - early
        print(
            f"  RSS after every flush: median of the tenth from one third {early:.1f} MiB, of the last tenth "
            f"{late:.1f} MiB, highest {max(every):.1f} MiB; the marks' highest over the last two thirds less "
            f"the one-third mark: {peak:.1f} MiB (a merge's working set, bounded by compaction_memory, when a "
            "mark catches one)"
        )
        # the dict loop is the machine's noise: once, beside the day without the watcher
        base, base_own = dict_baseline(len(d["batches"])) if not on else ([], [])
        print(f"\n  stalls, {'ms per 100 logs':<36}{'p50':>8}{'p99':>8}{'p99.9':>8}{'max':>8}{'>1 ms':>7}{'>2 ms':>7}")
        for label, b in (
            (f"launchhelm, watcher {args.watcher}, wall", d["batches"]),
            ("dict baseline, wall", base),
            (f"launchhelm, watcher {args.watcher}, less CPU waits", d["own"]),
            ("dict baseline, less CPU waits", base_own),
        ):
            if not b:
                continue
            print(
                f"  {label:<44}{percentile(b, 50):>8.3f}{percentile(b, 99):>8.3f}{percentile(b, 99.9):>8.3f}"
                f"{max(b):>8.3f}{sum(x > 1 for x in b):>7}{sum(x > 2 for x in b):>7}"
            )
        print("  (less CPU waits: less the time the kernel kept the thread waiting for a CPU: other processes' noise)")
        print(f"  {d['spent'].line() if d['spent'] else 'the watcher: off (no helper process)'}")
        result = {
            "spent": asdict(d["spent"]) if d["spent"] else None,
            "growth": growth,
            **{f"wall_{q}": quantiles(d["batches"])[q] for q in QUANTILES},
            **{f"own_{q}": quantiles(d["own"])[q] for q in QUANTILES},
        }
        checks += [
            (f"day: RSS growth over the last two thirds {growth:.1f} MiB <= 16 MiB (medians)", growth <= 16),
            ("day: history exact", exact(d["store"], d["run"], d["steps"])),
        ]
    else:
        f = flood(store, options, seconds, on)
        print(
            f"\nflood: {f['steps']:,} steps x 5 values; RSS after init {f['after_init']:.1f} MiB; "
            f"finish() {f['finish_s']:.2f} s; t s, RSS MiB (anonymous, file-backed: the spool's maps), Arrow MiB"
        )
        for (t, r, a), (anon, mapped) in zip(f["marks"], f["parts"], strict=True):
            print(f"  {t:>8.1f} {r:>9.1f} ({anon:>6.1f} {mapped:>5.1f}) {a:>9.1f}")
        bound = f["after_init"] + f["memory"] * 1.5
        flood_rss = max(r for _, r, _ in f["marks"])
        flood_arrow = max(a for _, _, a in f["marks"])
        print(
            f"  {f['rate']:,.0f} steps/s; {f['spent'].line() if f['spent'] else 'the watcher: off (no helper process)'}"
        )
        result = {"spent": asdict(f["spent"]) if f["spent"] else None, "rate": f["rate"], "rss": flood_rss}
        checks += [
            (
                f"flood: RSS {flood_rss:.0f} MiB <= {bound:.0f} MiB (after init + 1.5 x compaction_memory)",
                flood_rss <= bound,
            ),
            (
                f"flood: Arrow {flood_arrow:.1f} MiB <= compaction_memory {f['memory']:.0f} MiB",
                flood_arrow <= f["memory"],
            ),
            ("flood: history exact", exact(f["store"], f["run"], f["steps"])),
        ]
        if f["spent"] is not None and f["helper_before"] is not None:
            helper_bound = f["helper_before"] + f["memory"] * 1.5
            checks.append(
                (
                    f"flood: the helper's peak RSS {f['spent'].hwm_mib:.0f} MiB <= {helper_bound:.0f} MiB "
                    "(its RSS before the flood + 1.5 x compaction_memory)",
                    f["spent"].hwm_mib <= helper_bound,
                )
            )
    print()
    for label, ok in checks:
        print(f"{'PASS' if ok else 'MISS'}  {label}", flush=True)
    if args.result:
        with open(args.result, "w") as file:
            json.dump({**result, "load": [load, os.getloadavg()[0]]}, file)
    return 0


QUANTILES = ("p50", "p99", "p99.9", "max")


def quantiles(values: Sequence[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "p99.9": percentile(values, 99.9),
            "max": max(values)}  # fmt: skip


def compare(results: dict[str, dict[str, Any]]) -> None:
    """The watcher on beside off: the hot path's figures and their ratio, and what the helper spent."""
    print("\nthe watcher on / off (on: the helper process beside training, timing its steps for hangs; off: none)")

    def pair(name: str, key: str, unit: str, digits: int = 3) -> None:
        on, off = results.get(f"{name}-on", {}).get(key), results.get(f"{name}-off", {}).get(key)
        if on is None or off is None:
            print(f"  {name} {key}: not measured (a part failed)")
            return
        ratio = f"{on / off:.2f}x" if off else "n/a"
        print(f"  {name} {key:<18}{on:>12,.{digits}f} / {off:<12,.{digits}f} {unit:<6} {ratio}")

    for q in QUANTILES:
        pair("day", f"wall_{q}", "ms")
    for q in QUANTILES:
        pair("day", f"own_{q}", "ms")
    pair("day", "growth", "MiB", 1)
    pair("flood", "rate", "steps/s", 0)
    pair("flood", "rss", "MiB", 1)
    print("  (wall: each 100-log batch's wall time; own: less the time the kernel kept the thread waiting for a CPU)")
    loads = [
        f"{key} {results[key]['load'][0]:.1f}-{results[key]['load'][1]:.1f}"
        for key in ("day-off", "day-on", "flood-on", "flood-off")
        if key in results
    ]
    print(f"  the machine's load (1-min average) at each part's start and end: {', '.join(loads)}")
    for name in ("day", "flood"):
        spent = results.get(f"{name}-on", {}).get("spent")
        print(f"  {name}: {_watcher.Spent(**spent).line() if spent else 'the watcher: NO helper process measured'}")


if __name__ == "__main__":
    fn: Callable[[], int] = main
    sys.exit(fn())
