"""Sharded (FSDP2) checkpoints for real: ranks are processes under ``torchrun --standalone``, talking gloo.

Each job runs ``sharded_worker.py`` on every rank; every rank writes what it saw
to ``rank<r>.json``. Saved on N ranks and loaded on M, every model and
optimizer tensor must be bitwise equal to the saver's full state (as
``get_state_dict(..., full_state_dict=True)`` gathers it); a run SIGKILLed
between checkpoints and resumed must end bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lhtest import BUCKET, ROOT, child_env

import launchhelm as lh

torch = pytest.importorskip("torch")
lht = pytest.importorskip("launchhelm.torch")

WORKER = Path(__file__).with_name("sharded_worker.py")
TIMEOUT = 180.0
EVERY = 3  # sharded_worker.EVERY


class Job:
    """A torchrun job of ``nproc`` ranks of sharded_worker.py, in its own process group."""

    def __init__(self, nproc: int, mode: str, store: str, out: Path, *args: str) -> None:
        self.nproc, self.mode, self.out = nproc, mode, out
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        cmd += [str(WORKER), mode, "--store", store, "--out", str(out), *args]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(OMP_NUM_THREADS="1"),
            cwd=ROOT,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def expect(self, prefix: str) -> str:
        deadline = time.monotonic() + TIMEOUT
        while True:
            line = self._queue.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"{self.mode} exited before {prefix!r}:\n" + "\n".join(self.lines[-80:]))
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def finish(self) -> list[dict[str, Any]]:
        try:
            self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
        while (line := self._queue.get(timeout=30)) is not None:
            self.lines.append(line)
        assert self.proc.returncode == 0, f"{self.mode} failed:\n" + "\n".join(self.lines[-80:])
        return [json.loads((self.out / f"rank{r}.json").read_text()) for r in range(self.nproc)]

    def kill(self) -> None:
        """SIGKILL the agent's group and every rank (torchrun starts each in a session of its own)."""
        ranks = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == self.proc.pid]
        for pgid in [self.proc.pid, *ranks]:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def _parent(proc: Path) -> int:
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return -1
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def torchrun(nproc: int, mode: str, store: str, out: Path, *args: str) -> list[dict[str, Any]]:
    job = Job(nproc, mode, store, out, *args)
    try:
        return job.finish()
    finally:
        if job.proc.poll() is None:
            job.kill()


# -- saved at N, loaded at M -------------------------------------------------------------
@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Checkpoints saved at N in {1, 2, 4}; each loaded at M in {1, 2, 3, 4} (one job per M loads all three)."""
    root = tmp_path_factory.mktemp("matrix")
    url = str(root / "store")
    saves: dict[int, dict[str, Any]] = {}
    for n in (1, 2, 4):
        saves[n] = torchrun(n, "save", url, root / f"save{n}")[0]
    specs = [f"{saves[n]['run_id']}:{saves[n]['artifact']}:{root / f'save{n}' / 'full.pt'}" for n in (1, 2, 4)]
    loads = {m: torchrun(m, "load", url, root / f"load{m}", "--load", *specs) for m in (1, 2, 3, 4)}
    return {"url": url, "saves": saves, "loads": loads}


@pytest.mark.slow
def test_saved_on_n_ranks_every_tensor_loads_bitwise_on_m_ranks(matrix: dict[str, Any]) -> None:
    for n, record in matrix["saves"].items():
        assert record["sharded"] and record["step"] == 2
        ckpt = lh.Api(matrix["url"]).run(record["run_id"]).checkpoints()[-1]
        assert ckpt.format == lht.FORMAT_SHARDED
        # every rank holding bytes wrote its own object (3 rows on 4 ranks: rank 3 holds rows too)
        assert sorted(ckpt.files) == ["manifest.json", *[f"shard-{r:05d}.bin" for r in range(n)]]
    for m, ranks in matrix["loads"].items():
        for i, n in enumerate((1, 2, 4)):
            full = ranks[0]["results"][i]
            # 3 layers' weight and bias, the buffer, and AdamW's step, exp_avg, exp_avg_sq of 6 parameters
            assert full["tensors"] == 6 + 1 + 18, (n, m)
            assert full["differences"] == [], (n, m, full["differences"])
            for rank in ranks:
                got = rank["results"][i]
                assert got["step"] == 2 and got["scheduler_epoch"] == 2 and got["lr"] == 0.025, (n, m)
                # per-rank state: rank r gets saved rank r mod N's (its own when M == N)
                assert got["extra"] == {"rank": rank["rank"] % n, "pos": [rank["rank"] % n, 7]}, (n, m)


@pytest.mark.slow
def test_each_rank_restores_the_rng_of_saved_rank_r_mod_n(matrix: dict[str, Any]) -> None:
    """The saver seeded rank r with 500 + r right before saving: a draw after the load says whose RNG it got."""
    expected = {}
    for saved_rank in range(4):
        torch.manual_seed(500 + saved_rank)
        expected[saved_rank] = torch.rand(2).tolist()
    for m, ranks in matrix["loads"].items():
        for rank in ranks:
            for i, n in enumerate((1, 2, 4)):
                assert rank["results"][i]["rng"] == expected[rank["rank"] % n], (n, m, rank["rank"])


@pytest.mark.slow
def test_strict_refuses_per_rank_state_saved_by_another_world_size(matrix: dict[str, Any], tmp_path: Path) -> None:
    record = matrix["saves"][2]
    ranks = torchrun(
        3,
        "damaged",
        matrix["url"],
        tmp_path / "out",
        "--resume",
        record["run_id"],
        "--ckpt",
        record["artifact"],
        "--strict",
    )
    for rank in ranks:
        assert "saved by 2 rank(s) and is loaded on 3" in rank["load_error"], rank
        assert rank["step_error"] is not None  # the fail-together rule: the next step raises


# -- damage ----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("target", ["shard-00001.bin", "manifest.json"])
def test_a_flipped_byte_is_refused_on_every_rank_and_blocks_the_next_step(
    matrix: dict[str, Any], tmp_path: Path, target: str
) -> None:
    record = matrix["saves"][2]
    folder = Path(matrix["url"]) / "runs" / record["run_id"] / "artifacts" / record["artifact"]
    path = folder / target
    original = path.read_bytes()
    data = bytearray(original)
    data[len(data) // 3] ^= 0x10
    path.write_bytes(bytes(data))
    try:
        ranks = torchrun(
            2, "damaged", matrix["url"], tmp_path / "out", "--resume", record["run_id"], "--ckpt", record["artifact"]
        )
    finally:
        path.write_bytes(original)
    for rank in ranks:
        assert rank["load_error"] is not None and "crc64nvme" in rank["load_error"], rank
        assert rank["step_error"] == rank["load_error"], rank


# -- crash and resume ----------------------------------------------------------------------
@pytest.mark.slow
def test_fsdp2_resume_after_sigkill_is_bitwise_identical_to_an_uninterrupted_run(tmp_path: Path) -> None:
    kill_at = int(os.environ.get("LAUNCHHELM_TEST_KILL_STEP") or random.choice([4, 5, 7, 8]))
    why = f"killed after step {kill_at} (LAUNCHHELM_TEST_KILL_STEP={kill_at} reproduces it)"
    url = str(tmp_path / "store")
    job = Job(2, "train", url, tmp_path / "killed", "--hang-at", str(kill_at))
    try:
        run_id = job.expect("run ").split()[1]
        job.expect(f"ready {kill_at}")
    finally:
        job.kill()
    handle = lh.Api(url).run(run_id)
    ckpt = kill_at // EVERY * EVERY
    assert [c.step for c in handle.checkpoints()] == list(range(EVERY, ckpt + 1, EVERY)), why
    restored = handle.checkpoints()[-1].id
    resumed = torchrun(2, "train", url, tmp_path / "resumed", "--resume", run_id, "--final", str(tmp_path / "r.pt"))
    reference = torchrun(2, "train", url, tmp_path / "ref", "--project", "ref", "--final", str(tmp_path / "u.pt"))
    torchrun(  # the negative control
        2,
        "train",
        url,
        tmp_path / "x",
        "--resume",
        run_id,
        "--ckpt",
        restored,
        "--reseed-after-load",
        "--final",
        str(tmp_path / "x.pt"),
    )
    assert [r["restored_step"] for r in resumed] == [ckpt, ckpt], why
    r, u, x = (torch.load(tmp_path / f"{n}.pt", weights_only=True) for n in ("r", "u", "x"))
    for part in ("model", "optimizer"):
        flat_r, flat_u, flat_x = (_tensors(s[part]) for s in (r, u, x))
        assert flat_r.keys() == flat_u.keys()
        assert all(torch.equal(flat_r[k], flat_u[k]) for k in flat_r), why
    for rank_r, rank_u in zip(resumed, reference, strict=True):  # the redone steps' losses too
        assert {k: v for k, v in rank_u["losses"].items() if int(k) >= ckpt} == rank_r["losses"], why
    # the negative control: re-seeding after the load changes dropout, so the weights differ
    flat_r, flat_x = _tensors(r["model"]), _tensors(x["model"])
    assert any(not torch.equal(flat_r[k], flat_x[k]) for k in flat_r), why
    assert [rw.to_step for rw in handle.rewinds()][:1] == [ckpt], why


def _tensors(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {path: value}
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _tensors(item, f"{path}/{key}").items()}
    if isinstance(value, (list, tuple)):
        return {k: v for i, item in enumerate(value) for k, v in _tensors(item, f"{path}/{i}").items()}
    return {}


@pytest.mark.slow
def test_on_s3_two_ranks_save_and_three_ranks_load_every_tensor_bitwise(moto_endpoint: str, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/sharded-{os.urandom(3).hex()}"
    [saver, _] = torchrun(2, "save", url, tmp_path / "save")
    spec = f"{saver['run_id']}:{saver['artifact']}:{tmp_path / 'save' / 'full.pt'}"
    ranks = torchrun(3, "load", url, tmp_path / "load", "--load", spec)
    assert ranks[0]["results"][0]["differences"] == [] and ranks[0]["results"][0]["tensors"] == 25
    assert [r["results"][0]["extra"]["rank"] for r in ranks] == [0, 1, 0]
    ckpt = lh.Api(url).run(saver["run_id"]).checkpoints()[-1]
    assert sorted(ckpt.files) == ["manifest.json", "shard-00000.bin", "shard-00001.bin"]


@pytest.mark.slow
def test_load_weights_consolidates_a_four_rank_checkpoint_into_a_plain_module(matrix: dict[str, Any]) -> None:
    """An evaluation worker's view: one process, no process group, the shards of 4 ranks in one module."""
    record = matrix["saves"][4]
    folder = Path(matrix["url"]) / "runs" / record["run_id"] / "artifacts" / record["artifact"]
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Dropout(0.0), torch.nn.Linear(3, 5), torch.nn.Linear(5, 2)
    )
    model.register_buffer("scale", torch.zeros(3))
    lht.load_weights(model, folder)
    full = torch.load(Path(matrix["url"]).parent / "save4" / "full.pt", weights_only=True)["model"]
    assert model.state_dict().keys() == full.keys()
    assert all(torch.equal(v, full[k]) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_a_non_blocking_save_under_fsdp2_holds_the_state_it_was_called_with(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    [saver, _] = torchrun(2, "save", url, tmp_path / "save", "--nonblocking")
    spec = f"{saver['run_id']}:{saver['artifact']}:{tmp_path / 'save' / 'full.pt'}"
    ranks = torchrun(3, "load", url, tmp_path / "load", "--load", spec)
    assert ranks[0]["results"][0]["differences"] == [] and ranks[0]["results"][0]["tensors"] == 25
    assert [r["results"][0]["step"] for r in ranks] == [2, 2, 2]
