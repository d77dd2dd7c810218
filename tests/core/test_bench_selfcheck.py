"""The benchmarks' own self-checks: a benchmark that times the wrong thing is worse than none.

What a user would notice if this failed: ``benchmarks/bench_log.py`` printing
"history matches what was logged: NO" (it did, once history() gained its
``abandoned`` column), so its timings could not be trusted; or a GPU self-check
(``benchmarks/gpu_*_check.py``) that cannot even run where no GPU is, so nobody
learns it is broken until a GPU machine is lent.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from lhtest import ROOT, child_env


@pytest.mark.slow
def test_bench_log_reads_back_exactly_what_it_logged() -> None:
    quick = ["--steps", "300", "--reads", "2", "--mlflow-steps", "0", "--wandb-steps", "0", "--stall-seconds", "1"]
    quick += ["--watcher-rounds", "1"]
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
    # the watcher (the helper process) on and off, and what the helper itself spent, in both parts
    assert "log() mean, µs/call, watcher on (vs off: no helper process)" in done.stdout, done.stdout[-3000:]
    assert "launchhelm log(), watcher off, wall" in done.stdout, done.stdout[-3000:]
    assert done.stdout.count("the watcher (helper process): ") == 2, done.stdout[-3000:]
    assert "NO helper process" not in done.stdout, done.stdout[-3000:]


@pytest.mark.slow
def test_bench_soak_compares_the_watcher_on_and_off() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_soak.py"), "--flushes", "30", "--flood-seconds", "2"],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # each part read back exactly, with the watcher on and off
    assert done.stdout.count("PASS  day: history exact") == 2, done.stdout[-3000:]
    assert done.stdout.count("PASS  flood: history exact") == 2, done.stdout[-3000:]
    assert "flood rate" in done.stdout and "day wall_p99.9" in done.stdout, done.stdout[-3000:]
    assert "day: the watcher (helper process): " in done.stdout, done.stdout[-3000:]
    assert "flood: the watcher (helper process): " in done.stdout, done.stdout[-3000:]
    # the helper writes the points by default: the flood's memory bound is checked on it too
    assert "  flood: the helper's peak RSS " in done.stdout, done.stdout[-3000:]


@pytest.mark.slow
def test_bench_media_runs_and_reads_back_every_item_it_logged() -> None:
    quick = ["--images", "5", "--stall-seconds", "0.2", "--steps", "10", "--flood-seconds", "0.5"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_media.py"), *quick],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "read back 40 media items" in done.stdout, done.stdout[-3000:]
    assert "log() 512x512x3 p99 µs (vs copy)" in done.stdout, done.stdout[-3000:]
    lost = next(line for line in done.stdout.splitlines() if line.startswith("flood: items lost"))
    assert float(lost.split()[3]) == 0 and lost.endswith("PASS"), lost  # every image stored or in the spool


def _gpu_sharded_check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_sharded_check.py"), *args],
        capture_output=True,
        text=True,
        env=child_env(OMP_NUM_THREADS="1", **env),
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.slow
def test_gpu_sharded_check_skips_in_one_line_without_cuda() -> None:
    done = _gpu_sharded_check(CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "SKIP: no CUDA device here (torch.cuda.is_available() is False); nothing checked"
    ], done.stdout


@pytest.mark.slow
def test_gpu_sharded_check_runs_its_checks_on_cpu() -> None:
    """The GPU script's own logic, on CPU: a round trip it could not see as bitwise would fail here first."""
    done = _gpu_sharded_check("--cpu", "--size-mb", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "PASS", done.stdout
    assert "bitwise round trip of every model and AdamW tensor: True" in done.stdout
    assert "reused from the previous save: True" in done.stdout
    assert "DCP async_save blocked" in done.stdout
