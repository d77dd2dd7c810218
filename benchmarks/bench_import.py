"""Benchmark of ``import launchhelm`` in fresh interpreters.

What is measured:

* Wall time of ``python -c "import launchhelm"`` in a fresh subprocess, against a bare interpreter
  (``python -c pass``) and, for scale, ``python -c "import json"``. Each command runs
  ``--repeats`` times (default 15) after 2 untimed warm-up runs; the commands are interleaved so
  drift on the machine hits them alike. The median is reported, and ``import launchhelm`` minus
  the bare interpreter is the added cost (target: <= 50 ms).
* Bytecode: an installed package has its ``.pyc`` files (pip compiles them), so the main figures
  run with bytecode caching on, redirected to a temporary ``PYTHONPYCACHEPREFIX`` (nothing is
  written into the source tree) and filled by the warm-up runs. If this shell sets
  ``PYTHONDONTWRITEBYTECODE`` (or the tree has no ``__pycache__``), every plain import compiles
  LaunchHelm from source; that case is timed too, in the inherited environment, and reported on
  its own line (informational).
* That ``import launchhelm`` leaves none of torch, pandas, pyarrow, altair or IPython in
  ``sys.modules`` (they must be imported only where first needed). This is asserted: the script
  exits with status 1 if any of them is imported, whatever the options.
* The slowest imports under ``-X importtime`` (cumulative, bytecode cached), to show where the
  time goes.

The interpreter is the one running this script (``sys.executable``), so run it from the project's
virtual environment::

    python benchmarks/bench_import.py
    python benchmarks/bench_import.py --repeats 30 --check   # --check: exit 1 if the time target is missed
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

TARGET_ADDED_MS = 50.0
FORBIDDEN = ("torch", "pandas", "pyarrow", "altair", "IPython")
INFORMATIONAL = ("numpy", "fsspec", "launchhelm.widgets")
WARMUP_RUNS = 2

BARE = "python -c pass"
JSON = 'python -c "import json"'
LAUNCHHELM = 'python -c "import launchhelm"'
BARE_ENV = "python -c pass (inherited env)"
LAUNCHHELM_ENV = 'python -c "import launchhelm" (inherited env)'
CODE = {BARE: "pass", JSON: "import json", LAUNCHHELM: "import launchhelm", BARE_ENV: "pass"}
CODE[LAUNCHHELM_ENV] = "import launchhelm"


def run_once(code: str, env: Mapping[str, str] | None) -> float:
    """Wall time in ms of one fresh interpreter running ``code`` (``env`` None: inherit ours)."""
    t0 = time.perf_counter_ns()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return (time.perf_counter_ns() - t0) / 1e6


def cached_env(prefix: str) -> dict[str, str]:
    """The inherited environment with bytecode caching on, redirected into ``prefix``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = prefix
    return env


def modules_after_import() -> tuple[dict[str, bool], int]:
    """Which watched modules are in ``sys.modules`` after ``import launchhelm``, and how many it added."""
    watched = (*FORBIDDEN, *INFORMATIONAL)
    code = (
        "import sys, json; before = set(sys.modules); import launchhelm; "
        f"print(json.dumps({{m: m in sys.modules for m in {list(watched)!r}}})); "
        "print(len(set(sys.modules) - before))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split("\n")
    return json.loads(out[0]), int(out[1])


def slowest_imports(env: Mapping[str, str], limit: int = 10) -> list[tuple[int, int, str]]:
    """(cumulative µs, self µs, module) of the slowest imports under ``-X importtime``."""
    cmd = [sys.executable, "-X", "importtime", "-c", "import launchhelm"]
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = (part.strip() for part in line[len("import time:") :].split("|"))
        rows.append((int(cumulative_us), int(self_us), name))
    rows.sort(reverse=True)
    return rows[:limit]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per command (default 15)")
    parser.add_argument("--check", action="store_true", help="exit with status 1 if the time target is missed")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    prefix = tempfile.mkdtemp(prefix="launchhelm-pycache-")
    try:
        cached = cached_env(prefix)
        envs: dict[str, Mapping[str, str] | None] = {BARE: cached, JSON: cached, LAUNCHHELM: cached}
        envs[BARE_ENV] = envs[LAUNCHHELM_ENV] = None  # None: inherit this process's environment
        dont_write = os.environ.get("PYTHONDONTWRITEBYTECODE", "")
        print(f"interpreter: {sys.executable} (Python {sys.version.split()[0]})")
        print(f"bytecode: cached in {prefix} for the main rows")
        print(f"inherited env (rows so marked): PYTHONDONTWRITEBYTECODE={dont_write!r}")
        print(f"{args.repeats} timed runs per command after {WARMUP_RUNS} warm-up runs, interleaved; median reported")
        print()

        for label, code in CODE.items():
            for _ in range(WARMUP_RUNS):
                run_once(code, envs[label])
        times: dict[str, list[float]] = {label: [] for label in CODE}
        for _ in range(args.repeats):
            for label, code in CODE.items():
                times[label].append(run_once(code, envs[label]))
        found, added_modules = modules_after_import()
        slowest = slowest_imports(cached)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)

    medians = {label: statistics.median(ts) for label, ts in times.items()}
    width = max(len(label) for label in CODE)
    print(f"{'command'.ljust(width)}  {'median ms':>9}  {'min ms':>7}  {'max ms':>7}  {'added ms':>8}  {'ratio':>6}")
    print(f"{'-' * width}  {'-' * 9}  {'-' * 7}  {'-' * 7}  {'-' * 8}  {'-' * 6}")
    for label, ts in times.items():
        med = medians[label]
        bare = medians[BARE_ENV if label in (BARE_ENV, LAUNCHHELM_ENV) else BARE]
        print(
            f"{label.ljust(width)}  {med:9.1f}  {min(ts):7.1f}  {max(ts):7.1f}  {med - bare:8.1f}  {med / bare:5.2f}x"
        )
    added = medians[LAUNCHHELM] - medians[BARE]
    json_added = medians[JSON] - medians[BARE]
    env_added = medians[LAUNCHHELM_ENV] - medians[BARE_ENV]
    time_ok = added <= TARGET_ADDED_MS
    print()
    scale = f"{added / json_added:.0f}x as much" if json_added > 0.5 else "n/a: json adds under 0.5 ms"
    print(f"import launchhelm adds {added:.1f} ms to a bare interpreter (json adds {json_added:.1f} ms; {scale})")
    print(f"target: <= {TARGET_ADDED_MS:.0f} ms added (bytecode cached): {'PASS' if time_ok else 'MISS'}")
    print(f"in the inherited environment it adds {env_added:.1f} ms (informational)")

    print()
    print(f"sys.modules after `import launchhelm` ({added_modules} modules added by the import):")
    for name in FORBIDDEN:
        print(f"  {name:<20} {'IMPORTED (FAIL)' if found[name] else 'not imported (ok)'}")
    for name in INFORMATIONAL:
        print(f"  {name:<20} {'imported' if found[name] else 'not imported'} (informational)")
    leaked = [name for name in FORBIDDEN if found[name]]
    modules_ok = not leaked
    print(f"lazy-import check: {'PASS' if modules_ok else 'FAIL: ' + ', '.join(leaked) + ' imported eagerly'}")

    print()
    print("slowest imports under -X importtime (one run, bytecode cached; cumulative includes children):")
    print(f"  {'cumulative ms':>13}  {'self ms':>7}  module")
    for cumulative_us, self_us, name in slowest:
        print(f"  {cumulative_us / 1000:13.1f}  {self_us / 1000:7.1f}  {name}")

    if not modules_ok:
        return 1
    return 1 if args.check and not time_ok else 0


if __name__ == "__main__":
    sys.exit(main())
