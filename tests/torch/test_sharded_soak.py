"""SIGKILL soak of sharded checkpoints: whatever moment a rank dies at, ``latest`` is a whole checkpoint.

What a user would notice if this failed: a 2-rank FSDP2 job, its node lost in
the middle of a save, cannot resume (``latest`` names a checkpoint with a
shard or its manifest missing, or one that fails its CRCs), or resumes from
older state than a save that had returned.

One torchrun job saves a checkpoint every step, blocking and non-blocking by
turns (``sharded_worker.py soak``); after a random number of saves and a
random fraction of one more, the test SIGKILLs one rank, chosen at random
(torchrun then ends the other), and starts the job again. Each restart loads
``latest`` on both ranks, in fresh processes (after the last kill, the test's
own process loads it, all shards onto one rank): every block read is checked
against its CRC64NVME, and the step restored, the step kept in ``extra`` and
the newest checkpoint the store lists must agree, and be no older than the
last blocking save that returned. The seed is printed;
``LAUNCHHELM_TEST_SOAK_SEED`` replays it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_sharded import Job

import launchhelm as lh

torch = pytest.importorskip("torch")
lht = pytest.importorskip("launchhelm.torch")

KILLS = 5
MIN_SAVES = 100


def _loaded(job: Job, why: str) -> int:
    """Both ranks' ``loaded`` lines; the step they restored, which they must agree on."""
    found: dict[int, list[int]] = {}
    while len(found) < 2:
        _, rank, step, kept, kept_rank, finite = job.expect("loaded ").split()
        found[int(rank)] = [int(step), int(kept), int(kept_rank), int(finite)]
    for rank, (step, kept, kept_rank, finite) in found.items():
        assert kept == step and kept_rank == rank and finite == 1, (why, found)
    assert found[0][0] == found[1][0], (why, found)
    return found[0][0]


@pytest.mark.slow
def test_sigkill_of_a_random_rank_at_random_moments_always_leaves_latest_complete(tmp_path: Path) -> None:
    seed = int(os.environ.get("LAUNCHHELM_TEST_SOAK_SEED") or random.randrange(2**32))
    print(f"soak seed {seed} (LAUNCHHELM_TEST_SOAK_SEED={seed} replays the choices)")
    rng = random.Random(seed)
    url = str(tmp_path / "store")
    run_id: str | None = None
    attempted = 0
    durable = 0  # the newest step whose blocking save had returned on rank 0 before the kill
    expected: int | None = None
    for cycle in range(KILLS):
        why = f"seed {seed}, cycle {cycle}"
        resume = ["--resume", run_id] if run_id else []
        job = Job(2, "soak", url, tmp_path / f"out{cycle}", *resume, "--saves", "100000")
        try:
            run_id = job.expect("run ").split()[1]
            pids = {}
            while len(pids) < 2:
                _, rank, pid = job.expect("pid ").split()
                pids[int(rank)] = int(pid)
            if expected is not None:
                restored = _loaded(job, why)
                assert restored == expected, (why, restored, expected)
                assert restored >= durable, (why, restored, durable)
            target = rng.randint(20, 35)
            seen = 0
            while seen < target:
                line = job.expect("save")
                if line.startswith("save "):
                    seen += 1
                elif line.endswith(" blocking"):
                    durable = max(durable, int(line.split()[1]))
            time.sleep(rng.uniform(0.0, 0.08))  # somewhere inside the next save, or between two
            victim = rng.choice([0, 1])
            os.kill(pids[victim], signal.SIGKILL)
            try:
                job.proc.wait(60)  # torchrun ends the surviving rank
            except subprocess.TimeoutExpired:
                pass
            # lines printed before the kill still count
            while (line := job._queue.get(timeout=30)) is not None:
                job.lines.append(line)
                if line.startswith("save "):
                    seen += 1
                elif line.startswith("saved ") and line.endswith(" blocking"):
                    durable = max(durable, int(line.split()[1]))
            attempted += seen
            last = [line for line in job.lines if line.startswith("save")][-1]
            moment = f"during the save of step {last.split()[1]}" if last.startswith("save ") else "between saves"
            print(f"cycle {cycle}: SIGKILL of rank {victim} {moment}, {seen} saves begun")
        finally:
            if job.proc.poll() is None:
                job.kill()
        assert run_id is not None
        checkpoints = lh.Api(url).run(run_id).checkpoints()
        expected = checkpoints[-1].step  # what "latest" must restore
    assert attempted >= MIN_SAVES, (seed, attempted)
    assert expected is not None and expected >= durable, (seed, expected, durable)
    # after the last kill: load latest here, in one process (2 ranks' shards onto 1, every block read)
    model, optimizer, scheduler = _build()
    tr = lht.init("sharded", store=url, resume=run_id)
    tr.watch(model, optimizer, scheduler, sharded=True)
    extra = tr.load_checkpoint("latest")
    assert tr.global_step == extra["step"] == expected and extra["rank"] == 0, (seed, extra, expected)
    assert all(bool(torch.isfinite(v).all()) for v in model.state_dict().values()), seed
    tr.finish(close_run=False)


def _build() -> tuple[Any, Any, Any]:
    """``sharded_worker.build(0)`` without FSDP2: the same parameter names, whole on one process."""
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Dropout(0.0), torch.nn.Linear(3, 5), torch.nn.Linear(5, 2)
    )
    model.register_buffer("scale", torch.zeros(3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
