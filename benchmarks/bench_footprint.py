"""Footprint of a training process: RSS after ``init`` and RSS growth per million values logged.

Each figure comes from a fresh interpreter (a child process), so imports and
allocators start cold:

* bare: an interpreter that imports only ``psutil`` (the baseline);
* launchhelm: ``import launchhelm; lh.init(...)`` on a fresh local store
  (``system_metrics=False, capture_console=False``), RSS after ``init``; then a
  burst of ``--values`` values (5 metrics a step, as fast as the loop goes),
  RSS growth per million values, then ``finish()``, RSS and the high-water
  mark, and which heavy modules were imported; once with no flush during the
  burst (what the buffer holds) and once with the default 2 s flushes
  (pyarrow's libraries, loaded by the first flush and compaction, count there);
* the split (issue 40): after ``init``, 1,000 logs and a ``flush()``, the training process's RSS
  beside its helper process's, the heavy modules the training process imported and its threads'
  scheduling policies; W&B's Python process beside wandb-core the same way;
* wandb offline (only if ``wandb`` is installed; never installed by this script):
  RSS after ``wandb.init(mode="offline")``, its service processes included,
  and the same burst.

Targets (informational): RSS after init at most W&B's (else the bare
interpreter's plus 64 MB), growth at most 16 MB per million values.

    python benchmarks/bench_footprint.py             # median of 3 children each
    python benchmarks/bench_footprint.py --repeat 1 --values 2000000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap

CHILDREN = {
    "bare": """
        import json, resource, psutil
        p = psutil.Process()
        print(json.dumps({"init": p.memory_info().rss}))
    """,
    "launchhelm": """
        import json, resource, sys, tempfile, psutil
        import launchhelm as lh
        p = psutil.Process()
        d = tempfile.mkdtemp()
        interval = float(sys.argv[2]) if len(sys.argv) > 2 else None
        run = lh.init("footprint", store=d + "/store", system_metrics=False, capture_console=False,
                      flush_interval=interval)
        after_init = p.memory_info().rss
        steps = int(sys.argv[1]) // 5
        for s in range(steps):
            run.log({"loss": 1.0 / (s + 1), "lr": 3e-4, "grad_norm": float(s), "acc": 0.5, "tput": 1e3}, step=s)
        after_burst = p.memory_info().rss
        run.finish()
        heavy = sorted(m for m in ("pandas", "pyarrow", "torch") if m in sys.modules)
        print(json.dumps({"init": after_init, "burst": after_burst - after_init,
                          "after_finish": p.memory_info().rss,
                          "high_water": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                          "heavy": heavy}))
    """,
    # issue 40's split: the training process and its helper after init, 1,000 logs and a flush
    "launchhelm-split": """
        import json, os, sys, tempfile, time, psutil
        import launchhelm as lh
        p = psutil.Process()
        store = os.environ.get("FOOTPRINT_STORE") or tempfile.mkdtemp() + "/store"
        started = time.perf_counter()
        run = lh.init("footprint", store=store, system_metrics=False, capture_console=False)
        init_s = time.perf_counter() - started
        for s in range(1000):
            run.log({"loss": 1.0 / (s + 1), "lr": 3e-4, "grad_norm": float(s), "acc": 0.5, "tput": 1e3}, step=s)
        run.flush()
        deadline = time.monotonic() + 30  # the helper is started by the background thread: wait until it runs
        expected = int(os.environ.get("FOOTPRINT_CHILDREN", "1"))  # the session's helper (it serves the store too)
        while len(p.children(recursive=True)) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # its imports done
        helpers = p.children(recursive=True)
        policies = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                policies[tid] = os.sched_getscheduler(int(tid))
            except OSError:
                pass  # a thread that ended meanwhile
        watched = ("pyarrow", "pandas", "s3fs", "gcsfs", "adlfs", "aiobotocore", "aiohttp")
        print(json.dumps({
            "trainer": p.memory_info().rss,
            "helper": sum(h.memory_info().rss for h in helpers),
            "helpers": len(helpers),
            "imported": sorted(m for m in watched if m in sys.modules),
            "threads": len(policies),
            "not_other": sorted({v for v in policies.values() if v != os.SCHED_OTHER}),
            "init_s": init_s,
        }), flush=True)
        started = time.perf_counter()
        run.finish()
        print(json.dumps({"finish_s": time.perf_counter() - started}))
    """,
    "wandb-split": """
        import json, os, sys, tempfile, time, psutil
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb
        p = psutil.Process()
        run = wandb.init(project="footprint", mode="offline", dir=tempfile.mkdtemp())
        for s in range(1000):
            run.log({"loss": 1.0 / (s + 1), "lr": 3e-4, "grad_norm": float(s), "acc": 0.5, "tput": 1e3}, step=s)
        time.sleep(1.0)
        core = p.children(recursive=True)
        print(json.dumps({"trainer": p.memory_info().rss, "helper": sum(c.memory_info().rss for c in core),
                          "helpers": len(core)}))
        run.finish()
    """,
    "wandb": """
        import json, os, sys, tempfile, psutil
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb
        p = psutil.Process()
        def tree():
            return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
        run = wandb.init(project="footprint", mode="offline", dir=tempfile.mkdtemp())
        after_init = tree()
        steps = int(sys.argv[1]) // 5
        for s in range(steps):
            run.log({"loss": 1.0 / (s + 1), "lr": 3e-4, "grad_norm": float(s), "acc": 0.5, "tput": 1e3}, step=s)
        after_burst = tree()
        run.finish()
        print(json.dumps({"init": after_init, "burst": after_burst - after_init}))
    """,
}


def child(kind: str, values: int, *extra: str, env: dict[str, str] | None = None) -> dict[str, object] | None:
    with tempfile.TemporaryDirectory() as spool:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(CHILDREN[kind]), str(values), *extra],
            capture_output=True,
            text=True,
            timeout=600,
            env={**__import__("os").environ, "LAUNCHHELM_SPOOL": spool, **(env or {})},
        )
    if done.returncode != 0:
        if kind == "wandb" and "No module named 'wandb'" in done.stderr:
            return None
        raise SystemExit(f"{kind} child failed:\n{done.stderr[-2000:]}")
    result: dict[str, object] = {}
    for line in done.stdout.strip().splitlines():  # the split's child prints its finish() time on a line of its own
        if line.startswith("{"):
            result.update(json.loads(line))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="children per kind; medians are printed (default 3)")
    parser.add_argument("--values", type=int, default=2_000_000, help="values in the burst (default 2,000,000)")
    parser.add_argument("--split-only", action="store_true", help="only the training process beside its helper")
    parser.add_argument(
        "--s3",
        action="store_true",
        help="the split on a moto_server started here, with a row for LAUNCHHELM_HELPER_STORE=1 (implies --split-only)",
    )
    args = parser.parse_args()
    if args.s3:
        import tempfile as tf
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent))
        from bench_checkpoint import BUCKET, MotoServer

        with tf.TemporaryDirectory() as tmp:
            moto = MotoServer(Path(tmp) / "moto.log")
            moto.start()
            try:
                split(args.repeat, s3=f"s3://{BUCKET}/footprint")
            finally:
                moto.stop()
        return 0
    if args.split_only:
        split(args.repeat)
        return 0
    mb = 1e6
    results: dict[str, list[dict[str, object]]] = {}
    for label, kind, extra in (
        ("bare", "bare", ()),
        ("launchhelm", "launchhelm", ("3600",)),
        ("lh, 2 s flushes", "launchhelm", ()),
        ("wandb", "wandb", ()),
    ):
        runs = [child(kind, args.values, *extra) for _ in range(args.repeat)]
        if runs[0] is None:
            print(f"{label}: skipped (not installed)")
            continue
        results[label] = [r for r in runs if r is not None]

    def med(kind: str, field: str) -> float:
        return statistics.median(float(r[field]) for r in results[kind])  # type: ignore[arg-type]

    print(f"burst: {args.values:,} values (5 metrics a step), median of {args.repeat}")
    print(f"  {'':<16}{'RSS after init, MB':>20}{'growth, MB / M values':>24}")
    for kind in results:
        growth = f"{med(kind, 'burst') / mb / (args.values / 1e6):>24.1f}" if kind != "bare" else f"{'-':>24}"
        print(f"  {kind:<16}{med(kind, 'init') / mb:>20.1f}{growth}")
    lh = results["launchhelm"]
    print(
        f"  launchhelm after finish: {med('launchhelm', 'after_finish') / mb:.1f} MB, "
        f"high-water {med('launchhelm', 'high_water') / mb:.1f} MB; imported: {lh[0]['heavy']}"
    )
    reference = med("wandb", "init") if "wandb" in results else med("bare", "init") + 64 * mb
    what = "W&B's" if "wandb" in results else "bare + 64 MB"
    ok_init = med("launchhelm", "init") <= reference
    ok_growth = med("launchhelm", "burst") / (args.values / 1e6) <= 16 * mb
    print(f"  RSS after init <= {what}: {'PASS' if ok_init else 'MISS'}")
    print(f"  growth (no flush during the burst) <= 16 MB per million values: {'PASS' if ok_growth else 'MISS'}")
    split(args.repeat)
    return 0


def split(repeat: int, s3: str | None = None) -> None:
    """The training process beside its helper, and W&B's Python process beside wandb-core (issue 40).

    ``s3``: the stores' URL prefix on moto (each child a prefix of its own), and a third LaunchHelm row
    where the store's client is in a process of its own (``LAUNCHHELM_HELPER_STORE=1``)."""
    mib = 2**20
    count = iter(range(1_000_000))

    def where(**env: str) -> dict[str, str]:
        return {**env, "FOOTPRINT_STORE": f"{s3}-{next(count)}"} if s3 else env

    # the default: the helper writes the chunks too (docs/storage.md, "Flushing in the helper")
    hf = [r for r in (child("launchhelm-split", 0, env=where()) for _ in range(repeat)) if r is not None]
    # and its opt-out, where the training process writes them (as before)
    lh = [
        r
        for r in (child("launchhelm-split", 0, env=where(LAUNCHHELM_HELPER_FLUSH="0")) for _ in range(repeat))
        if r is not None
    ]
    through = {"LAUNCHHELM_HELPER_STORE": "1"}  # one helper: the session's, serving the store too
    hs = [r for r in (child("launchhelm-split", 0, env=where(**through)) for _ in range(repeat)) if s3 and r]
    wb = [r for r in (child("wandb-split", 0) for _ in range(repeat)) if r is not None]

    def med(rows: list[dict[str, object]], field: str) -> float:
        return statistics.median(float(r[field]) for r in rows)  # type: ignore[arg-type]

    print(f"\nafter init, 1,000 logs and a flush, median of {repeat}: MiB")
    print(f"  {'':<12}{'training process':>18}{'helper':>10}{'total':>10}")
    print(
        f"  {'launchhelm':<12}{med(hf, 'trainer') / mib:>18.1f}{med(hf, 'helper') / mib:>10.1f}"
        f"{(med(hf, 'trainer') + med(hf, 'helper')) / mib:>10.1f}   (helper processes: {hf[0]['helpers']})"
    )
    print(
        f"  {'lh, =0':<12}{med(lh, 'trainer') / mib:>18.1f}{med(lh, 'helper') / mib:>10.1f}"
        f"{(med(lh, 'trainer') + med(lh, 'helper')) / mib:>10.1f}   (LAUNCHHELM_HELPER_FLUSH=0: the trainer writes)"
    )
    if hs:
        print(
            f"  {'lh, store':<12}{med(hs, 'trainer') / mib:>18.1f}{med(hs, 'helper') / mib:>10.1f}"
            f"{(med(hs, 'trainer') + med(hs, 'helper')) / mib:>10.1f}   (LAUNCHHELM_HELPER_STORE=1: "
            f"{hs[0]['helpers']} processes beside it)"
        )
    if wb:
        print(
            f"  {'wandb':<12}{med(wb, 'trainer') / mib:>18.1f}{med(wb, 'helper') / mib:>10.1f}"
            f"{(med(wb, 'trainer') + med(wb, 'helper')) / mib:>10.1f}   (wandb-core and other children)"
        )
    modes = [("the default (its helper writes the chunks)", hf), ("LAUNCHHELM_HELPER_FLUSH=0 (the trainer writes)", lh)]
    if hs:
        modes.append(("LAUNCHHELM_HELPER_STORE=1 (the store's client in a process of its own)", hs))
    if s3:
        print(f"  on moto S3 ({s3}-N)")
    timed = [("launchhelm", hf), ("lh, =0", lh)] + ([("lh, store", hs)] if hs else [])
    times = (f"{k}: init {med(r, 'init_s'):.2f}, finish {med(r, 'finish_s'):.2f}" for k, r in timed)
    print("  seconds, median: " + "; ".join(times))
    for title, rows in modes:
        imported = rows[0]["imported"]
        print(f"  {title}:")
        print(f"    imported by the training process: {imported or 'none of those watched'}")
        print(f"    threads of the training process: {rows[0]['threads']}, not SCHED_OTHER: {rows[0]['not_other']}")
        print(f"    imports no pyarrow, pandas or object-store client: {'MISS' if imported else 'PASS'}")
        print(f"    every thread under SCHED_OTHER: {'MISS' if rows[0]['not_other'] else 'PASS'}")
        print(f"    training process RSS <= 64 MiB: {'PASS' if med(rows, 'trainer') <= 64 * mib else 'MISS'}")
        if wb:
            ok = med(rows, "trainer") + med(rows, "helper") <= med(wb, "trainer") + med(wb, "helper")
            print(f"    total <= W&B's total: {'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
    sys.exit(main())
