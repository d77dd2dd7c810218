"""DDP checkpoints for real: ranks are separate processes under torchrun, talking gloo.

Each job runs ``ddp_worker.py`` on every rank (``python -m torch.distributed.run``),
and every rank writes what it saw to ``rank<r>.json``; the tests judge that, the
published bundle and the run's record. The crash in the resume tests is a
SIGKILL of torchrun's process group and of every rank (torchrun starts each rank
in a session of its own, so killing the launcher's group alone leaves them running).
"""

from __future__ import annotations

import io
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lhtest import BUCKET, ROOT, FaultyS3Proxy, child_env

import launchhelm as lh

torch = pytest.importorskip("torch")
lht = pytest.importorskip("launchhelm.torch")

WORKER = Path(__file__).with_name("ddp_worker.py")
FORMAT_2 = "launchhelm.torch.checkpoint/2"
TIMEOUT = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Job:
    """A torchrun job of ``nproc`` ranks of ddp_worker.py, in its own process group."""

    def __init__(self, nproc: int, mode: str, store: str, out: Path, *args: str) -> None:
        self.nproc, self.mode, self.out = nproc, mode, out
        out.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            str(WORKER),
            mode,
            "--store",
            store,
            "--out",
            str(out),
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(OMP_NUM_THREADS="1"),
            cwd=ROOT,
            start_new_session=True,  # the agent's own group; each rank leads another (see kill())
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                self._queue.put(line.rstrip("\n"))
        except ValueError:
            pass  # the test closed the pipe at its end
        self._queue.put(None)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def expect(self, prefix: str, timeout: float = TIMEOUT) -> str:
        """The next output line starting with ``prefix``; fails on exit or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise AssertionError(f"{self.mode}: no {prefix!r} within {timeout}s:\n{self.output[-6000:]}") from None
            if line is None:
                self.proc.wait()
                raise AssertionError(
                    f"{self.mode} exited ({self.proc.returncode}) before {prefix!r}:\n{self.output[-6000:]}"
                )
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def finish(self, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """Wait for a clean exit; every rank's record."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self._drain()
            raise AssertionError(f"{self.mode} hung for {timeout}s:\n{self.output[-6000:]}") from None
        self._drain()
        assert self.proc.returncode == 0, f"{self.mode} failed ({self.proc.returncode}):\n{self.output[-6000:]}"
        return [json.loads((self.out / f"rank{r}.json").read_text()) for r in range(self.nproc)]

    def _drain(self) -> None:
        while True:
            try:
                line = self._queue.get(timeout=10)
            except queue.Empty:
                return
            if line is None:
                return
            self.lines.append(line)

    def ranks(self) -> list[int]:
        """Pids of the agent's children: torchrun starts each rank in a session of its own."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat[stat.rfind(")") + 2 :].split()[1]) == self.proc.pid:
                    found.append(int(entry.name))
        return found

    def kill(self) -> list[int]:
        """SIGKILL the agent's process group and every rank (each leads its own); their pids."""
        ranks = self.ranks() if self.proc.poll() is None else []
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in ranks:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        return ranks

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill()


def torchrun(nproc: int, mode: str, store: str, out: Path, *args: str) -> list[dict[str, Any]]:
    with Job(nproc, mode, store, out, *args) as job:
        return job.finish()


def _wait_dead(pids: list[int], timeout: float = 30.0) -> None:
    """Until each pid is gone or a zombie (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while True:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                break
            if stat[stat.rfind(")") + 2] in "ZX":
                break
            assert time.monotonic() < deadline, f"rank process {pid} survived SIGKILL"
            time.sleep(0.02)


def _bundle(url: str, run_id: str, ckpt: lh.Checkpoint) -> dict[str, Any]:
    """The published bundle, fetched through the store and checked against its record."""
    from launchhelm.storage import open_store

    [name] = ckpt.files
    data = open_store(url).read(f"runs/{run_id}/artifacts/{ckpt.id}/{name}")
    from awscrt.checksums import crc64nvme

    assert len(data) == ckpt.size and f"{crc64nvme(data):016x}" == ckpt.checksums["crc64nvme"]
    return dict(torch.load(io.BytesIO(data), weights_only=True))


def _draws_from(record: dict[str, Any]) -> dict[str, Any]:
    """What draws() gives right after restoring ``record`` (one rng_by_rank entry)."""
    g = torch.Generator()
    g.set_state(record["torch"])
    version, words, gauss = record["python"]
    py = random.Random()
    py.setstate((int(version), tuple(int(w) for w in words.tolist()), gauss))
    npy = np.random.RandomState()
    n = record["numpy"]
    npy.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    return {"torch": torch.rand(3, generator=g).tolist(), "python": py.random(), "numpy": float(npy.rand())}


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths at which two nested state dicts are not bitwise equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
        return [] if ok else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path} keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{path} length"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _linear_and_sgd() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


# -- one run, one bundle, one RNG stream per rank ------------------------------------
@pytest.mark.slow
def test_on_a_remote_store_each_node_downloads_a_checkpoint_once(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ranks run on this node: local rank 0 downloads into a node-local file, rank 1 reads it."""
    proxy = FaultyS3Proxy(int(moto_endpoint.rsplit(":", 1)[1]), status=500, code="x", failures=0, match="-")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")  # the ranks' S3 goes through it
    try:
        url = f"s3://{BUCKET}/node-{os.urandom(3).hex()}"
        r0, r1 = torchrun(2, "roundtrip", url, tmp_path / "out")
    finally:
        proxy.close()
    assert r0["params_restored"] and r1["params_restored"]
    assert r0["extra_back"]["rank"] == 0 and r1["extra_back"]["rank"] == 1
    payload_gets = [p for m, p, _, _ in proxy.forwarded if m == "GET" and p.split("?")[0].endswith(".pt")]
    assert len(payload_gets) == 1, payload_gets  # one small object: one ranged GET, for both ranks
    leftovers = list(Path(__import__("tempfile").gettempdir()).glob(f"launchhelm-{r0['run_id']}-*"))
    assert leftovers == []  # the node-local copy is removed once every rank has read it


@pytest.mark.slow
def test_two_ranks_share_one_run_and_each_restores_its_own_rng(shared_store_url: str, tmp_path: Path) -> None:
    r0, r1 = torchrun(2, "roundtrip", shared_store_url, tmp_path / "out")
    run_id = r0["run_id"]
    assert r1["run_id"] == run_id
    assert (r0["rank"], r0["world_size"], r1["rank"], r1["world_size"]) == (0, 2, 1, 2)
    assert isinstance(r0["artifact"], str) and r0["artifact"].startswith("ckpt-")
    assert r1["artifact"] is None

    api = lh.Api(shared_store_url)
    assert api.run_ids("ddp") == [run_id]  # the ranks joined one run, none made its own
    handle = api.run(run_id)
    assert handle.name == "ddp-roundtrip" and handle.config == {"lr": 0.1}
    assert [e["type"] for e in handle.events()].count("session_started") == 1
    [ckpt] = handle.checkpoints()
    assert (ckpt.id, ckpt.step, ckpt.format) == (r0["artifact"], 1, FORMAT_2)

    bundle = _bundle(shared_store_url, run_id, ckpt)
    assert bundle["format"] == FORMAT_2 and bundle["world_size"] == 2
    assert bundle["run_id"] == run_id and bundle["step"] == 1
    assert "rng" not in bundle and "extra" not in bundle
    by_rank = bundle["rng_by_rank"]
    assert [r["rank"] for r in by_rank] == [0, 1]
    assert not torch.equal(by_rank[0]["torch"], by_rank[1]["torch"])
    assert not torch.equal(by_rank[0]["python"][1], by_rank[1]["python"][1])
    assert not torch.equal(by_rank[0]["numpy"]["key"], by_rank[1]["numpy"]["key"])
    # each record is the state its own rank was in when save_checkpoint() returned
    assert _draws_from(by_rank[0]) == r0["after_save"]
    assert _draws_from(by_rank[1]) == r1["after_save"]
    extras = bundle["extra_by_rank"]
    assert [(e["rank"], e["name"], e["position"].tolist()) for e in extras] == [
        (0, "rank-0", [0, 0]),
        (1, "rank-1", [1, 10]),
    ]

    for r, rec in enumerate((r0, r1)):
        assert rec["moved"] and rec["params_restored"], rec
        assert rec["step_at_save"] == 1 and rec["step_after_load"] == 1
        assert rec["after_load"] == rec["after_save"], f"rank {r} did not get its own RNG stream back"
        assert rec["extra_back"] == {"rank": r, "name": f"rank-{r}", "position": [r, 10 * r]}
    for source in ("torch", "python", "numpy"):
        assert r0["after_load"][source] != r1["after_load"][source], source
    assert [(w.to_step, w.reached, w.checkpoint) for w in handle.rewinds()] == [(1, 2, ckpt.id)]


@pytest.mark.slow
def test_three_ranks_round_trip(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    ranks = torchrun(3, "roundtrip", url, tmp_path / "out")
    assert len({r["run_id"] for r in ranks}) == 1
    assert [r["artifact"] is None for r in ranks] == [False, True, True]
    run_id = ranks[0]["run_id"]
    [ckpt] = lh.Api(url).run(run_id).checkpoints()
    bundle = _bundle(url, run_id, ckpt)
    assert bundle["format"] == FORMAT_2 and bundle["world_size"] == 3
    assert [r["rank"] for r in bundle["rng_by_rank"]] == [0, 1, 2]
    assert [e["rank"] for e in bundle["extra_by_rank"]] == [0, 1, 2]
    for r, rec in enumerate(ranks):
        assert _draws_from(bundle["rng_by_rank"][r]) == rec["after_save"]
        assert rec["after_load"] == rec["after_save"] and rec["params_restored"]
        assert rec["extra_back"] == {"rank": r, "name": f"rank-{r}", "position": [r, 10 * r]}
    assert len({json.dumps(rec["after_load"]) for rec in ranks}) == 3


# -- refusals ---------------------------------------------------------------------------
@pytest.mark.slow
def test_a_checkpoint_is_refused_by_another_world_size(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    # a 1-process run saves a checkpoint
    single = lht.init("ddp", store=url)
    model, optimizer = _linear_and_sgd()
    single.watch(model, optimizer)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    assert single.save_checkpoint(extra={"who": "single"}) is not None
    single.finish(close_run=False)

    # two ranks resume it and are refused; then they save a 2-rank checkpoint of a new run
    ranks = torchrun(2, "worldsize", url, tmp_path / "two", "--resume", single.id)
    for r, rec in enumerate(ranks):
        assert rec["resumed_id"] == single.id
        assert "extra_back" not in rec, f"rank {r} restored a 1-process checkpoint with 2 ranks"
        error = rec["load_error"]
        assert error["type"] == "CheckpointError"
        assert re.search(r"saved by 1 rank\(s\) and cannot be restored with 2", error["message"]), error
        assert "world size" in error["message"]
        assert "rank 0:" in error["message"] and "rank 1:" in error["message"]
        assert rec["params_untouched"]
    assert lh.Api(url).run(single.id).rewinds() == []
    assert ranks[0]["run_id"] == ranks[1]["run_id"] != single.id

    # one process resumes the 2-rank run and is refused
    tr = lht.init("ddp", resume=ranks[0]["run_id"], store=url)
    model, optimizer = _linear_and_sgd()
    tr.watch(model, optimizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(lh.CheckpointError, match=r"saved by 2 rank\(s\) and cannot be restored with 1") as info:
        tr.load_checkpoint("latest")
    assert "world size" in str(info.value)
    assert _differences(before, model.state_dict()) == []
    tr.finish(close_run=False)


def _launch_by_hand(mode: str, store: str, out: Path, local_ranks: list[int], *args: str) -> list[dict[str, Any]]:
    """Start ``len(local_ranks)`` ranks ourselves (env:// rendezvous, as torchrun would), global
    rank r getting ``LOCAL_RANK=local_ranks[r]``, and return every rank's record."""
    out.mkdir(parents=True, exist_ok=True)
    port = str(_free_port())
    procs = []
    for rank, local in enumerate(local_ranks):
        env = child_env(
            OMP_NUM_THREADS="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            WORLD_SIZE=str(len(local_ranks)),
            RANK=str(rank),
            LOCAL_RANK=str(local),
            LOCAL_WORLD_SIZE=str(len(local_ranks)),
        )
        cmd = [sys.executable, str(WORKER), mode, "--store", store, "--out", str(out), *args]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        outputs.append(output.decode(errors="replace"))
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{outputs[rank][-4000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(len(local_ranks))]


@pytest.mark.slow
def test_a_checkpoint_is_refused_when_the_rank_mapping_is_swapped(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    saved = _launch_by_hand("mapping", url, tmp_path / "save", [0, 1])
    run_id = saved[0]["run_id"]
    assert saved[0]["artifact"] and saved[1]["artifact"] is None  # rank 0 uploads
    # global rank 0 now on local rank 1 and rank 1 on local rank 0: same world size, other mapping
    swapped = _launch_by_hand("mapping", url, tmp_path / "swapped", [1, 0], "--resume", run_id)
    for r, rec in enumerate(swapped):
        error = rec.get("load_error")
        assert error is not None, f"rank {r} restored a checkpoint saved under another rank mapping"
        assert error["type"] == "CheckpointError" and "same rank mapping" in error["message"]
        assert "rank 0: " in error["message"] and "rank 1: " in error["message"]  # each rank saw it
        assert f"rank {r} was local rank {r}" in error["message"]
        assert rec["params_untouched"] and "trained_on" not in rec
        assert rec["step_error"] == error  # the fail-together rule
    assert swapped[0]["load_error"] == swapped[1]["load_error"]
    assert lh.Api(url).run(run_id).rewinds() == []
    # the control: the same mapping as the save restores it
    same = _launch_by_hand("mapping", url, tmp_path / "same", [0, 1], "--resume", run_id)
    assert [rec.get("extra_back") for rec in same] == [{"rank": 0}, {"rank": 1}]
    assert all("load_error" not in rec for rec in same)


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]], str]:
    """One 2-rank job (local store) that meets both failures: (store, rank records, output)."""
    root = tmp_path_factory.mktemp("failures")
    url, out = str(root / "store"), root / "out"
    with Job(2, "errors", url, out) as job:
        _, run_id, artifact = job.expect("saved ").split()
        payload = Path(url, "runs", run_id, "artifacts", artifact, f"{artifact}.pt")
        data = bytearray(payload.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
        os.chmod(payload, 0o644)
        payload.write_bytes(bytes(data))
        (out / "go").touch()
        ranks = job.finish()
    return url, ranks, job.output


@pytest.mark.slow
def test_a_corrupted_checkpoint_is_refused_on_every_rank_and_blocks_the_next_step(
    failures: tuple[str, list[dict[str, Any]], str],
) -> None:
    _, ranks, output = failures
    for r, rec in enumerate(ranks):
        assert f"corrupt: rank {r} caught CheckpointError" in output
        error = rec["corrupt"].get("load_error")
        assert error is not None, f"rank {r} loaded a corrupted checkpoint"
        assert error["type"] == "CheckpointError"
        assert "nothing was applied" in error["message"] and "crc64nvme" in error["message"]
        assert "rank 0:" in error["message"] and "rank 1:" in error["message"]  # each rank checked it
        assert rec["corrupt"]["params_untouched"] and rec["corrupt"]["step_untouched"]
        # caught, and still the next optimizer step raises the stored error, on both ranks
        assert "trained_on" not in rec["corrupt"], f"rank {r} trained on after a refused load"
        assert rec["corrupt"]["step_error"] == error
        assert rec["corrupt"]["params_untouched_by_step"] and rec["corrupt"]["step_untouched_by_step"]
        # until the user clears it deliberately
        assert rec["corrupt"]["cleared"] == error
        assert rec["corrupt"]["step_after_clear"] == 3, rec["corrupt"]
    assert ranks[0]["corrupt"]["load_error"] == ranks[1]["corrupt"]["load_error"]


@pytest.mark.slow
def test_a_failure_on_one_rank_fails_every_rank_and_blocks_training(
    failures: tuple[str, list[dict[str, Any]], str],
) -> None:
    url, ranks, output = failures
    # a save that one rank's extra would spoil is refused on every rank, and nothing is published
    for r, rec in enumerate(ranks):
        one = rec["one_fails"]
        assert "saved_bad_extra" not in one, f"rank {r} saved an extra holding a PosixPath"
        error = one["bad_extra_error"]
        assert error["type"] == "CheckpointError" and "checkpoint not saved: rank 1:" in error["message"]
        assert "extra['where']" in error["message"] and "rank 0:" not in error["message"]
    published = [c.id for c in lh.Api(url).run(ranks[0]["run_id"]).checkpoints()]
    assert published == [ranks[0]["corrupt"]["artifact"], ranks[0]["one_fails"]["artifact"]]
    # a load that fails while being applied, on rank 1 only
    for r, rec in enumerate(ranks):
        one = rec["one_fails"]
        assert f"one-fails: rank {r} caught CheckpointError" in output
        error = one.get("load_error")
        assert error is not None, f"rank {r} returned from load_checkpoint as if all was well"
        assert error["type"] == "CheckpointError"
        assert "failed part-way" in error["message"] and "rank 1: RuntimeError" in error["message"]
        assert "size mismatch" in error["message"] and "rank 0:" not in error["message"]
        assert "trained_on" not in one, f"rank {r}'s optimizer.step() trained on mixed state"
        assert one["step_error"] == error  # the stored error, raised again
        assert one["params_untouched_by_step"] and one["step_untouched_by_step"]
        assert one.get("save_error") == error
    assert ranks[0]["one_fails"]["load_error"] == ranks[1]["one_fails"]["load_error"]


# -- crash and resume under DDP ----------------------------------------------------------
#: 3 epochs x 4 batches per rank = 12 steps, a checkpoint every 3 steps.
STEPS, EVERY, BATCHES = 12, 3, 4


def _extra_at(step: int) -> dict[str, int]:
    """The data position the worker saves with the checkpoint at ``step``: the next batch."""
    epoch, batch = divmod(step - 1, BATCHES)
    nxt = (epoch, batch + 1) if batch + 1 < BATCHES else (epoch + 1, 0)
    return {"epoch": nxt[0], "batch": nxt[1], "step": step}


@pytest.fixture(scope="module")
def crash(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2-rank training job (StepLR scheduler) SIGKILLed after a random step between checkpoints,
    resumed to step 12; an uninterrupted job with the same seeds; and the resume again with the
    RNG re-seeded after load.

    The kill step is drawn from 4..11 (not a checkpoint step, so there is always a step to
    redo); ``LAUNCHHELM_TEST_KILL_STEP`` pins it to reproduce a failure, which names it.
    """
    kill_at = int(os.environ.get("LAUNCHHELM_TEST_KILL_STEP") or random.choice([4, 5, 7, 8, 10, 11]))
    ckpt = kill_at // EVERY * EVERY
    root = tmp_path_factory.mktemp("crash")
    url = str(root / "store")
    seen: dict[str, Any] = {"url": url, "kill_at": kill_at, "ckpt_step": ckpt}
    with Job(2, "train", url, root / "killed", "--hang-at", str(kill_at)) as job:
        run_id = job.expect("run ").split()[1]
        job.expect(f"ready {kill_at}")
        seen["printed_pids"] = sorted(int(line.split()[2]) for line in job.lines if line.startswith("pid "))
        seen["killed_pids"] = sorted(job.kill())
    _wait_dead(seen["killed_pids"])
    handle = lh.Api(url).run(run_id)
    seen.update(run_id=run_id, status_after_kill=handle.status)
    seen["steps_after_kill"] = [c.step for c in handle.checkpoints()]
    assert seen["steps_after_kill"][-1:] == [ckpt], seen
    restored = seen["restored"] = handle.checkpoints()[-1].id

    seen["resumed"] = torchrun(2, "train", url, root / "resumed", "--resume", run_id, "--final", str(root / "r.pt"))
    seen["reference"] = torchrun(2, "train", url, root / "ref", "--project", "ref", "--final", str(root / "u.pt"))
    # the run as the resume left it (the negative control below rewinds it once more)
    seen["rewinds"] = handle.rewinds()
    seen["steps_after_resume"] = [c.step for c in handle.checkpoints()]
    seen["history_all"] = handle.history(duplicates="all")
    seen["history_last"] = handle.history(duplicates="last")
    [ref_id] = lh.Api(url).run_ids("ref")
    seen["history_ref"] = lh.Api(url).run(ref_id).history()

    # negative control: the same restore, but the RNG is re-seeded right after it
    args = ["--resume", run_id, "--ckpt", restored, "--reseed-after-load", "--final", str(root / "x.pt")]
    seen["reseeded"] = torchrun(2, "train", url, root / "reseeded", *args)
    for name in ("r", "u", "x"):
        seen[f"{name}.pt"] = torch.load(root / f"{name}.pt", weights_only=True)
    return seen


@pytest.mark.slow
def test_ddp_resume_after_sigkill_is_bitwise_identical_to_an_uninterrupted_run(crash: dict[str, Any]) -> None:
    kill_at, ckpt = crash["kill_at"], crash["ckpt_step"]
    why = f"killed after step {kill_at} (LAUNCHHELM_TEST_KILL_STEP={kill_at} reproduces it)"
    assert len(crash["killed_pids"]) == 2 and crash["killed_pids"] == crash["printed_pids"]
    assert crash["status_after_kill"] == "stopped"
    assert crash["steps_after_kill"] == list(range(EVERY, ckpt + 1, EVERY)), why
    for rec in crash["resumed"]:
        assert rec["run_id"] == crash["run_id"]
        assert rec["extra_back"] == _extra_at(ckpt), why
        assert rec["step_after_load"] == ckpt and rec["final_step"] == STEPS, why
    assert [rec["final_step"] for rec in crash["reference"]] == [STEPS, STEPS]
    full, after_crash = crash["u.pt"], crash["r.pt"]
    assert full["optimizer"]["state"], "AdamW kept no state: nothing to compare"
    # the scheduler really moved the lr, and the resumed one is where the uninterrupted one is
    assert full["scheduler"]["last_epoch"] == STEPS and full["scheduler"]["_last_lr"][0] < 1e-2
    assert _differences(full, after_crash) == [], why
    # the run's visible line is the uninterrupted run's line, value for value, lr included
    assert crash["history_last"]["step"].tolist() == list(range(1, STEPS + 1))
    for key in ("loss", "lr"):
        assert crash["history_last"][key].tolist() == crash["history_ref"][key].tolist(), (key, why)


@pytest.mark.slow
def test_ddp_resume_records_the_rewind_and_keeps_both_attempts(crash: dict[str, Any]) -> None:
    kill_at, ckpt = crash["kill_at"], crash["ckpt_step"]
    why = f"killed after step {kill_at} (LAUNCHHELM_TEST_KILL_STEP={kill_at} reproduces it)"
    [rewind] = crash["rewinds"]
    assert rewind.to_step == ckpt and rewind.reached >= kill_at, why
    assert rewind.checkpoint == crash["restored"] and rewind.cause == "load_checkpoint"
    for rec in crash["resumed"]:  # on_rewind ran on every rank, with the same rewind
        assert rec["rewinds"] == [{"to_step": ckpt, "reached": rewind.reached, "attempt": rewind.attempt}]
    assert crash["steps_after_resume"] == list(range(EVERY, STEPS + 1, EVERY)), why
    history = crash["history_all"]
    pairs = sorted(zip(history["step"].tolist(), history["attempt"].tolist(), strict=True))
    expected = [(s, 0) for s in range(1, kill_at + 1)] + [(s, 1) for s in range(ckpt + 1, STEPS + 1)]
    assert pairs == sorted(expected), why
    for step in range(ckpt + 1, kill_at + 1):  # the redone steps replayed the abandoned attempt exactly
        for key in ("loss", "lr"):
            values = history.loc[history["step"] == step, key].tolist()
            assert len(values) == 2 and values[0] == values[1], (step, key, values, why)


@pytest.mark.slow
def test_reseeding_the_rng_after_load_breaks_the_bitwise_resume(crash: dict[str, Any]) -> None:
    for rec in crash["reseeded"]:
        assert rec["extra_back"] == _extra_at(crash["ckpt_step"]) and rec["final_step"] == STEPS
    changed = _differences(crash["u.pt"], crash["x.pt"])
    assert any(path.startswith(".model.") for path in changed), changed  # dropout drew other masks
    assert not any(path.startswith(".scheduler") for path in changed), changed  # the schedule is not RNG


@pytest.mark.slow
def test_every_rank_of_a_resumed_ddp_run_reports_it_resumed(crash: dict[str, Any]) -> None:
    # every rank runs the same code, so ``if tr.resumed: tr.load_checkpoint()`` must take
    # the same branch on every rank, or rank 0 waits forever in the load's collectives
    assert [rec["resumed"] for rec in crash["resumed"]] == [True, True], "TorchRun.resumed differs between ranks"
    assert [rec["resumed"] for rec in crash["reference"]] == [False, False]


# -- steering a DDP job from outside --------------------------------------------------
@pytest.mark.slow
def test_control_changes_apply_on_every_rank_at_the_same_step(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    job = Job(2, "steer", url, tmp_path / "out")
    run_id = job.expect("run ").split()[1]
    handle = lh.Api(url).run(run_id)

    def until(check: Any, what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not check():
            if time.monotonic() > deadline or job.proc.poll() is not None:
                job.kill()
                raise AssertionError(f"no {what}:\n{job.output[-4000:]}")
            time.sleep(0.05)

    until(lambda: handle.step >= 3, "steps")
    seq = handle.set_tunables(lr=0.01)
    until(lambda: not handle.pending_controls(), "lr change applied")
    handle.control("checkpoint")
    until(lambda: len(handle.checkpoints()) == 1, "checkpoint on request")
    handle.control("stop")
    r0, r1 = job.finish()

    applied = next(c for c in handle.control_changes() if c["seq"] == seq)["applied_at_step"]
    for rank in (r0, r1):
        lrs = {int(step): lr for step, lr in rank["lr_by_step"].items()}
        assert all(lr == 0.1 for step, lr in lrs.items() if step < applied), rank["rank"]
        assert all(lr == pytest.approx(0.01) for step, lr in lrs.items() if step >= applied), rank["rank"]
        assert rank["tunables"] == {"lr": 0.01}
    assert r0["stopped_at"] == r1["stopped_at"] is not None  # both ranks stopped at the same step
    assert max(map(int, r0["lr_by_step"])) == max(map(int, r1["lr_by_step"]))
    [ckpt] = handle.checkpoints()
    assert ckpt.format == FORMAT_2 and not ckpt.before_last_control_change
    assert handle.status == "resumable"
