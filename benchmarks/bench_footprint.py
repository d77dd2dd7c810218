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


def child(kind: str, values: int, *extra: str) -> dict[str, object] | None:
    with tempfile.TemporaryDirectory() as spool:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(CHILDREN[kind]), str(values), *extra],
            capture_output=True,
            text=True,
            timeout=600,
            env={**__import__("os").environ, "LAUNCHHELM_SPOOL": spool},
        )
    if done.returncode != 0:
        if kind == "wandb" and "No module named 'wandb'" in done.stderr:
            return None
        raise SystemExit(f"{kind} child failed:\n{done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="children per kind; medians are printed (default 3)")
    parser.add_argument("--values", type=int, default=2_000_000, help="values in the burst (default 2,000,000)")
    args = parser.parse_args()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
