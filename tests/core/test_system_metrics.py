"""System metrics: how the machine was doing, on their own time axis.

If these fail, a run's CPU, memory and GPU readings are missing, mixed into
its training metrics, or cost the training loop time.
"""

from __future__ import annotations

import time

import pytest
from lhtest import run_python

import launchhelm as lh
from launchhelm._metrics._system import SystemSampler


@pytest.mark.slow
def test_a_training_subprocess_logs_system_metrics_read_by_wall_time(shared_store_url: str) -> None:
    out = run_python(
        """
        import sys, time
        import launchhelm as lh
        run = lh.init("system", store=sys.argv[1], system_metrics=0.2)
        step, end = 0, time.monotonic() + 1.5
        while time.monotonic() < end:
            step += 1
            run.global_step = step
            run.log({"loss": 1.0 / step})
            sum(range(2000))  # some work for the CPU reading
        run.finish()
        print(run.id)
        """,
        shared_store_url,
    )
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.split()[-1]
    handle = lh.Api(shared_store_url).run(run_id)
    system = handle.history(stream="system")
    assert len(system) >= 3  # a sample every 0.2 s of a 1.5 s loop
    assert list(system.columns[:2]) == ["time", "step"]
    for key in ("system/cpu_percent", "system/memory_rss_bytes", "system/memory_percent"):
        assert key in system.columns, system.columns
    assert (system["system/memory_rss_bytes"] > 10e6).all()  # a Python process with pandas loaded
    assert system["time"].is_monotonic_increasing and system["step"].is_monotonic_increasing
    assert not any("gpu" in c for c in system.columns) or SystemSampler()._gpus  # no GPU here: no keys, no error
    default = handle.history()
    assert not any(c.startswith("system/") for c in default.columns)  # the run's own metrics stay apart
    assert default["step"].iloc[-1] >= system["step"].max()  # samples carry the step training was at
    only = handle.history(keys=["system/cpu_percent"], stream="system")
    assert only.columns.tolist() == ["time", "step", "system/cpu_percent"]


def test_no_sampler_when_turned_off_and_bad_settings_are_refused(tmp_path: object) -> None:
    store = f"memory://system-{time.time_ns()}"
    run = lh.init("system", store=store, system_metrics=False)
    run.log({"x": 1.0})
    run.finish()
    assert lh.Api(store).run(run.id).history(stream="system").empty
    with pytest.raises(lh.InvalidTypeError, match="system_metrics='often'"):
        lh.init("system", store=store, system_metrics="often")  # type: ignore[arg-type]
    with pytest.raises(lh.InvalidArgumentError, match="system_metrics=-1"):
        lh.init("system", store=store, system_metrics=-1)
    with pytest.raises(lh.InvalidArgumentError, match="stream='gpu'"):
        lh.Api(store).run(run.id).history(stream="gpu")


def test_each_rank_reports_under_its_own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    sample = SystemSampler().sample()
    assert sample and all(k.startswith("system/rank1/") for k in sample)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert all(k.startswith("system/") and "rank" not in k for k in SystemSampler().sample())


@pytest.mark.slow
def test_the_gpu_self_check_says_why_it_skips_without_a_gpu() -> None:
    """benchmarks/gpu_system_metrics_check.py is for GPU machines; elsewhere it names what is missing and succeeds."""
    import subprocess
    import sys

    from lhtest import ROOT, child_env

    script = ROOT / "benchmarks" / "gpu_system_metrics_check.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=child_env())
    assert done.returncode == 0, done.stdout + done.stderr
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        assert "PASS" in done.stdout or "SKIP: nvidia-ml-py" in done.stdout, done.stdout
    else:
        assert done.stdout.startswith("SKIP: no CUDA device here"), done.stdout
