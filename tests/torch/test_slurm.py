"""Preempted on a real SLURM cluster: a job submitted with ``sbatch --requeue --signal=USR1@60`` and preempted
(``scontrol requeue``, or ``scancel --signal=USR1``) resumes in the same run, bitwise, with 0 steps redone.

If these fail, a SLURM user's requeued job starts a second run, loses the steps since its last checkpoint,
or never comes back after the notice. The cluster is this machine's own ``slurmctld`` and ``slurmd``
(``tests/slurm_cluster.py``); the job is ``srun python slurm_worker.py``, with no run id anywhere.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from docblocks import file_block, run_by, substitute
from lhtest import ROOT, child_env
from slurm_cluster import CLUSTER, SlurmCluster, slurm_marks
from torch_helpers import bitwise_equal

import launchhelm as lh

torch = pytest.importorskip("torch")

WORKER = Path(__file__).with_name("slurm_worker.py")
STEPS = 60
#: The step after which the test preempts the job: between two checkpoints (every 10), so a relaunch
#: from the last periodic checkpoint would redo steps.
PREEMPT_AFTER = 23
TIMEOUT = 120.0
pytestmark = slurm_marks()


def _env() -> dict[str, str]:
    env = child_env(OMP_NUM_THREADS="1")
    for name in list(env):
        if name.startswith(("SLURM_", "TORCHELASTIC_")) or name in ("LAUNCHHELM_RUN_ID", "SKYPILOT_TASK_ID"):
            env.pop(name)
    return env


def _final(out: Path) -> dict[str, Any]:
    return dict(torch.load(out / "final.pt", weights_only=True))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same script run once without interruption, outside SLURM: what every job must end equal to."""
    tmp = tmp_path_factory.mktemp("plain")
    done = subprocess.run(
        [sys.executable, str(WORKER), "--store", str(tmp / "store"), "--out", str(tmp / "out"), "--steps", str(STEPS)],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return _final(tmp / "out")


class Job:
    """One ``sbatch --requeue`` job running the worker; ``out`` is its folder of records."""

    def __init__(self, cluster: SlurmCluster, tmp: Path, *worker_args: str) -> None:
        self.cluster = cluster
        self.store = str(tmp / "store")
        self.out = tmp / "out"
        self.out.mkdir()
        worker = [sys.executable, str(WORKER), "--store", self.store, "--out", str(self.out), "--steps", str(STEPS)]
        script = tmp / "job.sh"
        script.write_text(f"#!/bin/bash\nexec srun {shlex.join([*worker, *worker_args])}\n")
        # the notice 60 s before a 10-minute limit: submitted as the guide says, preempted by hand below
        submitted = cluster.run(
            "sbatch", "--parsable", "--requeue", "--signal=USR1@60", "--time=10", "--ntasks=1", "--cpus-per-task=1",
            "--job-name=lh-slurm", f"--chdir={ROOT}", f"--output={self.out / 'slurm-%j.out'}", "--open-mode=append",
            str(script), env=_env(),
        )  # fmt: skip
        self.id = submitted.stdout.strip().split(";")[0]
        self.started = time.monotonic()

    def record(self, restart: int) -> dict[str, Any]:
        return dict(json.loads((self.out / f"attempt{restart}.json").read_text()))

    def diagnosis(self) -> str:
        logs = "\n".join(p.read_text(errors="replace")[-4000:] for p in self.out.glob("slurm-*.out"))
        shown = self.cluster.run("scontrol", "show", "job", self.id, check=False).stdout
        return f"job {self.id}:\n{shown}\n{logs}\n{self.cluster.logs()}"

    def wait_step(self, restart: int, step: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                r, s = (int(v) for v in (self.out / "step").read_text().split())
                if (r, s) >= (restart, step):
                    return
            except (OSError, ValueError):
                pass
            assert time.monotonic() < deadline, f"the job never reached step {step}:\n{self.diagnosis()}"
            time.sleep(0.05)

    def wait_end(self) -> float:
        """Wait until the job has completed (after its requeue); return the seconds since it was submitted."""
        deadline = time.monotonic() + TIMEOUT
        while self.cluster.job_state(self.id) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", ""):
            assert time.monotonic() < deadline, f"the job did not end within {TIMEOUT:.0f}s:\n{self.diagnosis()}"
            time.sleep(0.2)
        state = self.cluster.job_state(self.id)
        assert state in ("COMPLETED", ""), f"the job ended {state}:\n{self.diagnosis()}"
        return time.monotonic() - self.started


def _preempt(cluster: SlurmCluster, job: Job, how: str) -> None:
    if how == "scontrol requeue":
        cluster.run("scontrol", "requeue", job.id)  # SIGTERM now, the job back in the queue
    else:
        cluster.run("scancel", "--signal=USR1", job.id)  # the notice only: the job requeues itself


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["scontrol requeue", "scancel --signal=USR1"])
def test_a_preempted_slurm_job_resumes_the_same_run_bitwise_with_no_step_redone(
    how: str, slurm_cluster: SlurmCluster, plain: dict[str, Any], tmp_path: Path
) -> None:
    job = Job(slurm_cluster, tmp_path)
    job.wait_step(0, PREEMPT_AFTER)
    _preempt(slurm_cluster, job, how)
    took = job.wait_end()
    first, second = job.record(0), job.record(1)
    signal_name = "SIGTERM" if how == "scontrol requeue" else "SIGUSR1"
    assert first["ending"] == "preempted" and first["signal"] == signal_name, first
    assert first["step"] >= PREEMPT_AFTER and first["checkpoint"], first
    # 0 steps redone: the relaunch starts at the step the preempted attempt reached and saved
    assert second["start"] == first["step"] and second["ending"] == "finished" and second["resumed"], second
    assert second["run"] == first["run"]
    assert bitwise_equal(_final(job.out), plain), f"the requeued job ({how}) differs from the uninterrupted one"
    api = lh.Api(job.store)
    assert len(api.runs("slurm")) == 1, "the requeue made a second run"
    handle = api.run(first["run"])
    attempts = handle.attempts()
    assert [a.ending for a in attempts] == ["preempted", "finished"], attempts
    launchers = [dict(a.launcher or {}) for a in attempts]
    # the restart count is (SLURM_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT): SLURM's requeues count first
    assert [(la.get("scheduler"), la.get("restart")) for la in launchers] == [("slurm", [0, 0]), ("slurm", [1, 0])]
    assert [la.get("job") for la in launchers] == [f"{CLUSTER}/{job.id}"] * 2, launchers
    assert all(r.to_step == r.reached for r in handle.rewinds()), handle.rewinds()
    assert list(handle.history(duplicates="last")["step"]) == list(range(1, STEPS + 1))
    print(f"\n{how}: submitted to completed in {took:.1f}s")


@pytest.mark.timeout(300)
def test_the_comparison_can_fail_a_requeued_job_that_skips_the_load_line_differs(
    slurm_cluster: SlurmCluster, plain: dict[str, Any], tmp_path: Path
) -> None:
    job = Job(slurm_cluster, tmp_path, "--no-load")
    job.wait_step(0, PREEMPT_AFTER)
    _preempt(slurm_cluster, job, "scontrol requeue")
    job.wait_end()
    assert job.record(1)["ending"] == "finished"
    assert not bitwise_equal(_final(job.out), plain), "the negative control matched: the comparison cannot fail"


#: The relaunch guide: its sbatch script, running its torchrun script, is submitted as the guide shows it.
GUIDE = "docs/guides/relaunch.md"
GUIDE_STEPS = 30  # the guide's train.py trains 30 steps, saving every 10
GUIDE_PREEMPT_AFTER = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["scontrol requeue", "scancel --signal=USR1"])
def test_the_guides_sbatch_script_resumes_its_torchrun_job_after_a_preemption(
    how: str, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The relaunch guide's sbatch script (``srun`` running torchrun running the guide's ``train.py``) on the
    local cluster, preempted once mid-run: it is requeued and finishes in the same run, with no step redone."""
    work = tmp_path / "work"
    work.mkdir()
    # declared substitutions. train.py: 0.5 s a step and a line per step, so the test can preempt it mid-run
    # (the guide's 30 steps take well under a second)
    train = substitute(
        file_block(GUIDE, "train.py").source,
        {
            "import os, signal\n": "import os, signal, time\n",
            '    tr.log({"loss": loss.item()})\n': (
                '    tr.log({"loss": loss.item()})\n    print("step", tr.global_step, flush=True); time.sleep(0.5)\n'
            ),
        },
    )
    (work / "train.py").write_text(train)
    # the job script: this node has 2 CPUs, and torchrun's rendezvous takes a free port (tests run beside it)
    script = substitute(
        run_by(
            GUIDE,
            "tests/torch/test_slurm.py::test_the_guides_sbatch_script_resumes_its_torchrun_job_after_a_preemption",
        ).source,
        {"--cpus-per-task=8": "--cpus-per-task=2", "localhost:29500": f"localhost:{_free_port()}"},
    )
    (work / "job.sh").write_text(script)
    store = str(tmp_path / "store")
    env = _env()
    env.update(
        LAUNCHHELM_STORE=store,
        LAUNCHHELM_SPOOL=str(tmp_path / "spool"),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),  # the script's `python`
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    # where the job runs and writes its output: options of this submission, not of the script
    submitted = slurm_cluster.run(
        "sbatch", "--parsable", f"--chdir={work}", f"--output={work / 'slurm-%j.out'}", "--open-mode=append",
        str(work / "job.sh"), env=env,
    )  # fmt: skip
    job = submitted.stdout.strip().split(";")[0]
    log = work / f"slurm-{job}.out"

    def diagnosis() -> str:
        shown = slurm_cluster.run("scontrol", "show", "job", job, check=False).stdout
        output = log.read_text(errors="replace")[-6000:] if log.exists() else "(no output)"
        return f"job {job}:\n{shown}\n{output}\n{slurm_cluster.logs()}"

    deadline = time.monotonic() + TIMEOUT
    while not (log.exists() and f"step {GUIDE_PREEMPT_AFTER}\n" in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"the job never reached step {GUIDE_PREEMPT_AFTER}:\n{diagnosis()}"
        time.sleep(0.1)
    if how == "scontrol requeue":
        slurm_cluster.run("scontrol", "requeue", job)  # SIGTERM now, the job back in the queue
    else:
        slurm_cluster.run("scancel", "--signal=USR1", job)  # the notice only: the job requeues itself
    deadline = time.monotonic() + 2 * TIMEOUT
    while slurm_cluster.job_state(job) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", ""):
        assert time.monotonic() < deadline, f"the job did not end:\n{diagnosis()}"
        time.sleep(0.2)
    assert slurm_cluster.job_state(job) in ("COMPLETED", ""), diagnosis()
    if how != "scontrol requeue":
        # torchrun's agent handled the notice (the script's --signals-to-handle) and passed it on, rather than
        # die of it and let SLURM end the step under the workers' save (torch's log line says so)
        assert "closing signal SIGUSR1" in log.read_text(errors="replace"), diagnosis()

    api = lh.Api(store)
    runs = api.runs("relaunch-guide")
    assert len(runs) == 1, "the requeue made a second run"
    handle = api.run(runs["id"][0])
    attempts = handle.attempts()
    assert [a.ending for a in attempts] == ["preempted", "finished"], (attempts, diagnosis())
    launchers = [dict(a.launcher or {}) for a in attempts]
    assert [(la.get("scheduler"), la.get("job")) for la in launchers] == [("slurm", f"{CLUSTER}/{job}")] * 2
    assert [la.get("restart") for la in launchers] == [[0, 0], [1, 0]], (
        launchers
    )  # SLURM's requeue, no torchrun restart
    preempted_at = attempts[0].last_step
    assert preempted_at is not None and preempted_at >= GUIDE_PREEMPT_AFTER
    # the notice's checkpoint was saved at the step reached, and the requeued job resumed from it: 0 steps redone
    assert preempted_at in [c.step for c in handle.checkpoints()], handle.checkpoints()
    assert all(r.to_step == r.reached for r in handle.rewinds()), handle.rewinds()
    history = handle.history(duplicates="all")
    assert list(handle.history(duplicates="last")["step"]) == list(range(1, GUIDE_STEPS + 1)), (
        [(a.ending, a.first_step, a.last_step, a.detail) for a in attempts],
        list(zip(history["step"], history["attempt"], strict=True)),
        diagnosis(),
    )
    print(f"\n{how}: attempts {[(a.ending, a.first_step, a.last_step, a.detail) for a in attempts]}")
