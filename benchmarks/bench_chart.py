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

Each is timed as the first cell of a fresh Jupyter kernel (from the cell's
start: every import of the chart included, ipykernel's own already done, as
when a notebook opens) and as a bare ``python -c`` (IPython's import too):
"cold", the first chart there, and "warm", the same chart opened again. The interpreters may write and
reuse bytecode (in a temporary ``PYTHONPYCACHEPREFIX``, warmed by one untimed
run), as an installed package has its ``.pyc`` files.

Downsampling
    The hand-written MinMax (``launchhelm/widgets/_downsample.py``) against
    tsdownsample's MinMax and MinMaxLTTB (Rust) on the same 1M values, when
    tsdownsample is installed (it is not a dependency: see the verdict).

Target: RunChart < 1 s cold in a fresh kernel, imports included, at most a
few thousand points per series.

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
t0, c0 = time.perf_counter(), time.process_time()
from launchhelm.widgets import RunChart
chart = RunChart(sys.argv[2], keys=["loss"], store=sys.argv[1])
message = json.dumps(chart.snapshot_messages()[0])
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
points = json.loads(message)["points"]
chart.close()
# the same chart opened again in that kernel: imports done (as once a notebook has shown any widget)
t1 = time.perf_counter()
again = RunChart(sys.argv[2], keys=["loss"], store=sys.argv[1])
json.dumps(again.snapshot_messages()[0])
warm = time.perf_counter() - t1
again.close()
print(json.dumps({"seconds": elapsed, "cpu": cpu, "warm": warm, "points": len(points["k"]), "bytes": len(message)}))
"""

ALTAIR = """
import json, sys, time
def altair_chart():
    df = lh.Api(sys.argv[1]).run(sys.argv[2]).history(keys=["loss"])[["step", "loss"]]
    spec = json.dumps(alt.Chart(df).mark_line().encode(x="step:Q", y="loss:Q").to_dict())
    return len(df), len(spec)

t0, c0 = time.perf_counter(), time.process_time()
import altair as alt
import launchhelm as lh
alt.data_transformers.disable_max_rows()
points, size = altair_chart()
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
t1 = time.perf_counter()
altair_chart()
warm = time.perf_counter() - t1
print(json.dumps({"seconds": elapsed, "cpu": cpu, "warm": warm, "points": points, "bytes": size}))
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


def measure_in_kernel(code: str, store: str, run_id: str, env: dict[str, str]) -> dict[str, float]:
    """``code`` as a cell of a fresh Jupyter kernel (ipykernel and IPython loaded, as when a notebook opens)."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", env=env)
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    try:
        client.execute_interactive(f"import sys; sys.argv = ['-', {store!r}, {run_id!r}]", timeout=120)
        client.execute_interactive(textwrap.dedent(code), output_hook=hook, timeout=600)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    try:
        result: dict[str, float] = json.loads("".join(out).strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise SystemExit("".join(out)[-3000:]) from None
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
        results: dict[tuple[str, str], dict[str, float]] = {}
        with tempfile.TemporaryDirectory(prefix="bench-chart-pyc-") as pyc:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPYCACHEPREFIX"] = pyc
            for name, code in (("RunChart", RUNCHART), ("plain Altair", ALTAIR)):
                measure(code, store, run_id, env)  # untimed: writes the bytecode an install would have
                # plain Altair takes seconds a go: timed once per way, RunChart --repeat times (the median)
                repeat = args.repeat if name == "RunChart" else 1
                for where, how in (("fresh kernel", measure_in_kernel), ("fresh interpreter", measure)):
                    runs = sorted((how(code, store, run_id, env) for _ in range(repeat)), key=lambda r: r["seconds"])
                    results[name, where] = runs[len(runs) // 2]
    # CPU seconds beside the wall time: on a shared machine the wall time of a cold open is mostly waiting
    head = (
        ("open, cold (s)", 16),
        ("cold CPU (s)", 14),
        ("open, warm (s)", 16),
        ("points sent", 14),
        ("message (MB)", 14),
    )
    print(" " * 32 + "".join(f"{title:>{width}}" for title, width in head))
    for (name, where), r in results.items():
        row = (
            f"{r['seconds']:>16.2f}{r['cpu']:>14.2f}{r['warm']:>16.2f}{int(r['points']):>14,}{r['bytes'] / 1e6:>14.2f}"
        )
        print(f"{name + ', ' + where:32}{row}")
    print(f"\ndownsampling {args.points:,} values to 2,000:")
    for name, ms, kept in downsampling(args.points):
        print(f"  {name:26}{ms:8.2f} ms  ({kept} points)")
    chart, altair = results["RunChart", "fresh kernel"], results["plain Altair", "fresh kernel"]
    bare = results["RunChart", "fresh interpreter"]
    ok = chart["seconds"] < TARGET_S and chart["points"] <= MAX_POINTS_PER_SERIES
    verdict = "PASS" if ok else "MISS"
    print(
        f"\n{verdict}: RunChart opens in {chart['seconds']:.2f} s from the cell's start in a fresh kernel, imports "
        f"included (target < {TARGET_S} s; {bare['seconds']:.2f} s in a bare interpreter, {chart['warm']:.2f} s "
        f"once the widgets are imported), {int(chart['points'])} points per series sent; plain Altair: "
        f"{altair['seconds']:.2f} s, {int(altair['points']):,} points ({altair['seconds'] / chart['seconds']:.1f}x "
        "RunChart's time)"
    )
    if args.check and not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
