"""A sharded non-blocking save that fails in the background stops training on every rank, together.

What a user would notice if this failed: a 2-rank FSDP2 job whose background
save failed on one rank trains on as if it had a checkpoint, or raises on one
rank only and hangs the others in FSDP2's next all-gather.

The failure is real: rank 1's file size limit (``RLIMIT_FSIZE``) is set to a
few bytes before the save, so its shard write fails with ``EFBIG`` while rank
0's succeeds (the worker's ``poison`` mode).
"""

from __future__ import annotations

from pathlib import Path

import pytest
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
