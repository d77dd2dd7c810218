"""Crash resume of a sharded (FSDP2) run on every object store: moto S3, fake-gcs-server, Azurite.

What a user would notice if this failed: a 2-rank FSDP2 job on S3, GCS or Azure,
SIGKILLed and resumed, ends with other weights than a run that was never
interrupted (the local store's case is in ``test_sharded.py``).

Real processes under ``torchrun --standalone`` (gloo, CPU) run
``sharded_worker.py``; the kill is a real SIGKILL of every rank. The
uninterrupted reference is one run, shared by every store (the training is
deterministic whatever the store). The resumed job also runs the negative
control: it loads the same checkpoint again, re-seeds, trains again, and must
end elsewhere (dropout draws from the restored RNG), so the comparison can fail.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from lhtest import make_store_url
from test_sharded import EVERY, Job, _tensors, torchrun

import launchhelm as lh

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("uninterrupted")
    ranks = torchrun(2, "train", str(root / "store"), root / "out", "--final", str(root / "u.pt"))
    return {"ranks": ranks, "final": torch.load(root / "u.pt", weights_only=True)}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
def test_fsdp2_resumed_after_sigkill_on_an_object_store_is_bitwise_identical(
    backend: str, uninterrupted: dict[str, Any], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = make_store_url(backend, tmp_path, request)
    kill_at = int(os.environ.get("LAUNCHHELM_TEST_KILL_STEP") or random.choice([4, 5, 7, 8]))
    why = f"{backend}: killed after step {kill_at} (LAUNCHHELM_TEST_KILL_STEP={kill_at} reproduces it)"
    job = Job(2, "train", url, tmp_path / "killed", "--hang-at", str(kill_at))
    try:
        run_id = job.expect("run ").split()[1]
        job.expect(f"ready {kill_at}")
    finally:
        job.kill()
    handle = lh.Api(url).run(run_id)
    ckpt = kill_at // EVERY * EVERY
    assert [c.step for c in handle.checkpoints()] == list(range(EVERY, ckpt + 1, EVERY)), why
    latest = handle.checkpoints()[-1]
    assert latest.format == "launchhelm.torch.checkpoint/3", why
    assert sorted(latest.files) == ["manifest.json", "shard-00000.bin", "shard-00001.bin"], why
    control = tmp_path / "x.pt"
    resumed = torchrun(
        2,
        "train",
        url,
        tmp_path / "resumed",
        "--resume",
        run_id,
        "--final",
        str(tmp_path / "r.pt"),
        "--control",
        f"{latest.id}:{control}",
    )
    assert [r["restored_step"] for r in resumed] == [ckpt, ckpt], why
    r, u, x = torch.load(tmp_path / "r.pt", weights_only=True), uninterrupted["final"], torch.load(control)
    for part in ("model", "optimizer"):
        flat_r, flat_u = _tensors(r[part]), _tensors(u[part])
        assert flat_r.keys() == flat_u.keys(), why
        assert all(torch.equal(flat_r[k], flat_u[k]) for k in flat_r), why
    for rank_r, rank_u in zip(resumed, uninterrupted["ranks"], strict=True):  # the redone steps' losses too
        assert {k: v for k, v in rank_u["losses"].items() if int(k) >= ckpt} == rank_r["losses"], why
    flat_r, flat_x = _tensors(r["model"]), _tensors(x["model"])
    assert flat_r.keys() == flat_x.keys(), why
    assert any(not torch.equal(flat_r[k], flat_x[k]) for k in flat_r), why  # the negative control differs
    assert [rw.to_step for rw in handle.rewinds()][:1] == [ckpt], why
