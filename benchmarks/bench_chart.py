"""How fast a ``RunChart`` opens on a long run, beside plain Altair on the same data.

What is measured, each in a fresh interpreter (so imports count, as in a
notebook's first chart), on a run of ``--points`` steps (default 1,000,000) of
one metric written once to a temporary local store:

RunChart
    From the cell's start (``from launchhelm.widgets import RunChart``) to the
    data sent: the widget built (history read through ``RunHandle.history``,
    each series downsampled keeping its extremes) and the snapshot message
    the front end gets on ``ready`` encoded as JSON. Also how many points per
    series reach the browser, and the message's size.

Plain Altair
    ``import altair``, the same ``history()`` read, ``alt.Chart(df).mark_line()``
    with ``max_rows`` lifted, and its spec serialised as JSON (what a notebook
    sends for an Altair chart): every point goes to the browser.

Each is timed twice: "cold", the first chart of a fresh interpreter (every
import included: what a fresh kernel's first chart costs), and "warm", the
same chart opened again in that interpreter. The interpreters may write and
reuse bytecode (in a temporary ``PYTHONPYCACHEPREFIX``, warmed by one untimed
run), as an installed package has its ``.pyc`` files.

Downsampling
    The hand-written MinMax (``launchhelm/widgets/_downsample.py``) against
    tsdownsample's MinMax and MinMaxLTTB (Rust) on the same 1M values, when
    tsdownsample is installed (it is not a dependency: see the verdict).

Target: RunChart < 1 s cold (a fresh kernel, imports included), at most a few
thousand points per series.

    python benchmarks/bench_chart.py                  # 1M points
    python benchmarks/bench_chart.py --points 200000 --check   # exit 1 on a missed target
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

TARGET_S = 1.0
MAX_POINTS_PER_SERIES = 5000

RUNCHART = """
import json, sys, time
t0 = time.perf_counter()
from launchhelm.widgets import RunChart
chart = RunChart(sys.argv[2], keys=["loss"], store=sys.argv[1])
message = json.dumps(chart.snapshot_messages()[0])
elapsed = time.perf_counter() - t0
points = json.loads(message)["points"]
chart.close()
# the same chart opened again in that kernel: imports done (as once a notebook has shown any widget)
t1 = time.perf_counter()
again = RunChart(sys.argv[2], keys=["loss"], store=sys.argv[1])
json.dumps(again.snapshot_messages()[0])
warm = time.perf_counter() - t1
again.close()
print(json.dumps({"seconds": elapsed, "warm": warm, "points": len(points["k"]), "bytes": len(message)}))
"""

ALTAIR = """
import json, sys, time
def altair_chart():
    df = lh.Api(sys.argv[1]).run(sys.argv[2]).history(keys=["loss"])[["step", "loss"]]
    spec = json.dumps(alt.Chart(df).mark_line().encode(x="step:Q", y="loss:Q").to_dict())
    return len(df), len(spec)

t0 = time.perf_counter()
import altair as alt
import launchhelm as lh
alt.data_transformers.disable_max_rows()
points, size = altair_chart()
elapsed = time.perf_counter() - t0
t1 = time.perf_counter()
altair_chart()
warm = time.perf_counter() - t1
print(json.dumps({"seconds": elapsed, "warm": warm, "points": points, "bytes": size}))
"""


def make_run(store: str, points: int) -> str:
    import numpy as np

    import launchhelm as lh

    rng = np.random.default_rng(0)
    values = (1.0 / np.sqrt(np.arange(1, points + 1)) + 0.01 * rng.standard_normal(points)).tolist()
    run = lh.init("bench-chart", store=store)
    for step, value in enumerate(values):
        run.log({"loss": value}, step=step)
    run.finish()
    return run.id


def measure(code: str, store: str, run_id: str, env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), store, run_id],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def downsampling(points: int) -> list[tuple[str, float, int]]:
    """Milliseconds to bring ``points`` values to 2,000, by each downsampler (best of 5)."""
    import numpy as np

    from launchhelm.widgets._downsample import minmax_indices

    rng = np.random.default_rng(0)
    values = np.cumsum(rng.standard_normal(points))
    steps = np.arange(points, dtype=np.float64)
    methods: list[tuple[str, Any]] = [("MinMax, numpy (used)", lambda: minmax_indices(values, 2000))]
    try:
        import tsdownsample
    except ImportError:
        tsdownsample = None
    if tsdownsample is not None:
        minmax, lttb = tsdownsample.MinMaxDownsampler(), tsdownsample.MinMaxLTTBDownsampler()
        methods.append(("tsdownsample MinMax", lambda: minmax.downsample(steps, values, n_out=2000)))
        methods.append(("tsdownsample MinMaxLTTB", lambda: lttb.downsample(steps, values, n_out=2000)))
    out = []
    for name, call in methods:
        best, kept = float("inf"), 0
        for _ in range(5):
            start = time.perf_counter()
            kept = len(call())
            best = min(best, time.perf_counter() - start)
        out.append((name, best * 1e3, kept))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="cold opens of each; the median is reported")
    parser.add_argument("--check", action="store_true", help="exit 1 if RunChart misses its target")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-chart-") as store:
        start = time.perf_counter()
        run_id = make_run(store, args.points)
        print(f"wrote {args.points:,} points of one metric in {time.perf_counter() - start:.1f} s")
        results = {}
        with tempfile.TemporaryDirectory(prefix="bench-chart-pyc-") as pyc:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPYCACHEPREFIX"] = pyc
            for name, code in (("RunChart", RUNCHART), ("plain Altair", ALTAIR)):
                measure(code, store, run_id, env)  # untimed: writes the bytecode an install would have
                runs = sorted(
                    (measure(code, store, run_id, env) for _ in range(args.repeat)), key=lambda r: r["seconds"]
                )
                results[name] = runs[len(runs) // 2]
    print(f"{'':14}{'open, cold (s)':>16}{'open, warm (s)':>16}{'points sent':>14}{'message (MB)':>14}")
    for name, r in results.items():
        row = f"{r['seconds']:>16.2f}{r['warm']:>16.2f}{int(r['points']):>14,}{r['bytes'] / 1e6:>14.2f}"
        print(f"{name:14}{row}")
    print(f"\ndownsampling {args.points:,} values to 2,000:")
    for name, ms, kept in downsampling(args.points):
        print(f"  {name:26}{ms:8.2f} ms  ({kept} points)")
    chart, altair = results["RunChart"], results["plain Altair"]
    ok = chart["seconds"] < TARGET_S and chart["points"] <= MAX_POINTS_PER_SERIES
    verdict = "PASS" if ok else "MISS"
    print(
        f"\n{verdict}: RunChart opens in {chart['seconds']:.2f} s in a fresh interpreter, imports included "
        f"(target < {TARGET_S} s; {chart['warm']:.2f} s once the widgets are imported), "
        f"{int(chart['points'])} points per series sent; plain Altair: {altair['seconds']:.2f} s, "
        f"{int(altair['points']):,} points ({altair['seconds'] / chart['seconds']:.1f}x RunChart's time)"
    )
    if args.check and not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
