"""A sharded non-blocking save that fails in the background stops training on every rank, together.

What a user would notice if this failed: a 2-rank FSDP2 job whose background
save failed on one rank trains on as if it had a checkpoint, or raises on one
rank only and hangs the others in FSDP2's next all-gather.

The failure is real: rank 1's file size limit (``RLIMIT_FSIZE``) is set to a
few bytes before the save, so its shard write fails with ``EFBIG`` while rank
0's succeeds (the worker's ``poison`` mode).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lhtest import run_python
from test_sharded import torchrun

import launchhelm as lh

pytest.importorskip("torch")


@pytest.mark.slow
def test_a_failed_background_save_raises_at_the_same_next_step_on_every_rank(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    ranks = torchrun(2, "poison", url, tmp_path / "out")
    rank0 = ranks[0]
    failed, good, recovered = rank0["failed"], rank0["good"], rank0["recovered"]
    for rank in ranks:
        # the step after the failure raises, on every rank at the same step, naming what failed where
        assert rank["raised_at"] == ranks[0]["raised_at"] is not None, ranks
        assert rank["raised_at"] <= 3, rank  # at once, or at the step whose boundary shared the news
        error = rank["step_error"]
        assert f"background save of checkpoint {failed}" in error, error
        assert "rank 1: " in error and "File too large" in error, error
        assert "clear_checkpoint_error()" in error, error
        assert rank["step_after"] == rank0["step_after"], ranks  # no rank trained past the others
        # the error stays until cleared: later steps and saves raise the same
        assert rank["later_errors"] == [error, error, error], rank
        assert rank["cleared"] == error, rank
    handle = lh.Api(url).run(rank0["run_id"])
    # nothing half-published: the failed checkpoint has no event and no manifest; the next save works
    assert [c.id for c in handle.checkpoints()] == [good, recovered]
    folder = Path(url) / "runs" / rank0["run_id"] / "artifacts" / failed
    assert not (folder / "manifest.json").exists()
    assert not (folder / "shard-00001.bin").exists()


ONE_PROCESS = """
import json, resource, sys
import torch
import launchhelm.torch as lht
from launchhelm import CheckpointError

torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
tr = lht.init("sharded", store=sys.argv[1])
tr.watch(model, optimizer, sharded=True)

def step():
    optimizer.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()

step()
out = {"good": tr.save_checkpoint()}
limits = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (16, limits[1]))
out["failed"] = tr.save_checkpoint(blocking=False)
out["trained"] = 0
try:
    for _ in range(200):
        step()
        out["trained"] += 1
except CheckpointError as exc:
    out["error"] = str(exc)
resource.setrlimit(resource.RLIMIT_FSIZE, limits)
try:
    tr.save_checkpoint()
except CheckpointError as exc:
    out["save_error"] = str(exc)
out["cleared"] = str(tr.clear_checkpoint_error())
step()
out["recovered"] = tr.save_checkpoint(blocking=False)
tr.finish(close_run=False)
out["run_id"] = tr.id
print(json.dumps(out))
"""


@pytest.mark.slow
def test_in_one_process_a_failed_background_save_raises_at_a_next_step_until_cleared(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    done = run_python(ONE_PROCESS, url, OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["trained"] < 200 and "File too large" in out["error"], out  # training stopped
    assert out["save_error"] == out["error"] == out["cleared"], out
    handle = lh.Api(url).run(out["run_id"])
    assert [c.id for c in handle.checkpoints()] == [out["good"], out["recovered"]]
