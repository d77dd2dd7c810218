"""The benchmarks' own self-checks: a benchmark that times the wrong thing is worse than none.

What a user would notice if this failed: ``benchmarks/bench_log.py`` printing
"history matches what was logged: NO" (it did, once history() gained its
``abandoned`` column), so its timings could not be trusted.
"""

from __future__ import annotations

import subprocess
import sys

from lhtest import ROOT, child_env


def test_bench_log_reads_back_exactly_what_it_logged() -> None:
    quick = ["--steps", "300", "--reads", "2", "--mlflow-steps", "0", "--wandb-steps", "0", "--stall-seconds", "1"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_log.py"), *quick],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "history matches what was logged: yes" in done.stdout, done.stdout[-3000:]
