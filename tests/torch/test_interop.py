"""``launchhelm export`` and ``launchhelm import dcp``: checkpoints out to torch.save and DCP, and DCP in.

Exports of /1 (here), /2 and /3 (a 2-rank DDP and FSDP2 job under torchrun,
gloo) must read back bitwise; a checkpoint written by ``dcp.save`` on 2 FSDP2
ranks, laid out as torchtitan does, is imported and resumed on 1 and 2 ranks
bitwise; a hostile ``.metadata`` is refused without running anything.
"""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

import launchhelm as lh
from launchhelm import (
    AlreadyExistsError,
    CheckpointError,
    InvalidArgumentError,
    LaunchHelmError,
    RunNotFoundError,
)
from launchhelm._cli import main
from launchhelm._exceptions import SourceReadError

torch = pytest.importorskip("torch")
lht = pytest.importorskip("launchhelm.torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from test_sharded import torchrun  # noqa: E402

from launchhelm.importers import import_dcp  # noqa: E402

WORKER = Path(__file__).with_name("interop_worker.py")


def _bitwise(a: Any, b: Any, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ: tensors by dtype, shape and bytes, everything else by ==."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path} keys {sorted(map(str, set(a) ^ set(b)))}"]
        return [d for k in a for d in _bitwise(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path} length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _bitwise(x, y, f"{path}/{i}")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _zeros_like(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, dict):
        return {k: _zeros_like(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_zeros_like(v) for v in value]
    return value


def _dcp_load(folder: Path, like: dict[str, Any]) -> dict[str, Any]:
    """``dcp.load`` in one process, no process group, into a state dict shaped like ``like`` (zeroed)."""
    state = _zeros_like(like)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=folder)
    return state


def _train(store: str, steps: int = 3) -> tuple[Any, Any, Any, Any, str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    tr = lht.init("interop", store=store)
    tr.watch(model, optimizer, scheduler)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(6, 4)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
    artifact = tr.save_checkpoint()
    return tr, model, optimizer, scheduler, artifact


def test_export_of_a_single_process_checkpoint_reads_back_bitwise(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    tr, model, optimizer, scheduler, artifact = _train(store)
    first = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    first = pickle.loads(pickle.dumps(first))  # a copy: training goes on below
    optimizer.zero_grad()
    model(torch.randn(6, 4)).sum().backward()
    optimizer.step()
    tr.save_checkpoint()  # "latest" is now this one; the export names the first by its id
    tr.finish(close_run=False)
    args = ["--store", store, "export", tr.id, artifact]
    assert main([*args, "--format", "torch", "--out", str(tmp_path / "a.pt")]) == 0
    exported = torch.load(tmp_path / "a.pt", weights_only=True)
    assert exported["step"] == 3
    assert _bitwise({k: exported[k] for k in first}, first) == []
    assert sorted(exported) == ["model", "optimizer", "scheduler", "step"]

    assert main([*args, "--format", "dcp", "--out", str(tmp_path / "d")]) == 0
    loaded = _dcp_load(tmp_path / "d", {**first, "step": 0})
    assert loaded["step"] == 3
    assert _bitwise({k: loaded[k] for k in first}, first) == []
    # the default is the latest checkpoint
    latest = lh.Api(store).run(tr.id).checkpoints()[-1]
    assert main(["--store", store, "export", tr.id, "--format", "torch", "--out", str(tmp_path / "b.pt")]) == 0
    assert torch.load(tmp_path / "b.pt", weights_only=True)["step"] == latest.step == 4


def test_bad_export_requests_are_refused_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from launchhelm.torch._interop import export_checkpoint

    store = str(tmp_path / "store")
    tr, *_ = _train(store, steps=1)
    tr.finish(close_run=False)
    st = lh.Api(store).store
    out = tmp_path / "out.pt"
    with pytest.raises(RunNotFoundError, match="no run 'nosuchrun'"):
        export_checkpoint(st, "nosuchrun", "latest", format="torch", out=out)
    with pytest.raises(CheckpointError, match=r"has no checkpoint 'ckpt-00000009-00000000'; its newest are: ckpt-"):
        export_checkpoint(st, tr.id, "ckpt-00000009-00000000", format="torch", out=out)
    with pytest.raises(InvalidArgumentError, match=r"--format 'safetensors': choose one of torch, dcp"):
        export_checkpoint(st, tr.id, "latest", format="safetensors", out=out)
    out.write_bytes(b"keep me")
    with pytest.raises(AlreadyExistsError, match="already exists: give a new path to --out"):
        export_checkpoint(st, tr.id, "latest", format="dcp", out=out)
    assert out.read_bytes() == b"keep me"
    # a run.checkpoint(path) artifact is no torch checkpoint
    plain = lh.init("interop", store=store, system_metrics=False, capture_console=False)
    (tmp_path / "notes.txt").write_text("hi")
    plain.checkpoint(tmp_path / "notes.txt", step=0)
    plain.finish(close_run=False)
    with pytest.raises(CheckpointError, match="only LaunchHelm torch checkpoints"):
        export_checkpoint(st, plain.id, "latest", format="torch", out=tmp_path / "x.pt")
    # the command line says the same in one line, exit status 2
    assert main(["--store", store, "export", tr.id, "--format", "zip", "--out", str(tmp_path / "y")]) == 2
    assert "launchhelm: error: --format 'zip'" in capsys.readouterr().err
    assert not (tmp_path / "y").exists() and not (tmp_path / "x.pt").exists()


def _flat_model_state(seed: int) -> tuple[Any, Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    return model, optimizer, scheduler


def test_a_dcp_checkpoint_imports_and_resumes_in_one_process(tmp_path: Path) -> None:
    """The plain DCP layout ({"model", "optimizer"} nested): imported once, resumed bitwise, exported back."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer, scheduler = _flat_model_state(0)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
    msd, osd = get_state_dict(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {"model": msd, "optimizer": osd, "scheduler": scheduler.state_dict(), "step": 2},
            checkpoint_id=tmp_path / "dcp",
        )
    store = str(tmp_path / "store")
    result = import_dcp(tmp_path / "dcp", "interop", name="from-dcp", store=store)
    again = import_dcp(tmp_path / "dcp", "interop", store=store)  # the same checkpoint: nothing added
    assert len(result.imported) == 1 and len(again.skipped) == 1 and again.run_ids == result.run_ids
    handle = lh.Api(store).run(result.run_ids[0])
    assert handle.name == "from-dcp" and handle.status == "resumable"
    (ckpt,) = handle.checkpoints()
    assert ckpt.format == lht.FORMAT_SHARDED and ckpt.step == 2 and ckpt.checksums["crc64nvme"]

    fresh, fresh_optimizer, fresh_scheduler = _flat_model_state(9)
    tr = lht.init("interop", store=store, resume=handle.id)
    tr.watch(fresh, fresh_optimizer, fresh_scheduler)
    assert tr.load_checkpoint("resume") is None  # nothing beyond model, optimizer, scheduler and step
    assert tr.global_step == 2 and fresh_scheduler.state_dict() == scheduler.state_dict()
    assert _bitwise(get_state_dict(fresh, fresh_optimizer), (msd, osd)) == []
    tr.finish(close_run=False)
    # lht.load_weights reads the imported checkpoint like any other; export gives the same state back
    out = tmp_path / "back.pt"
    assert main(["--store", store, "export", handle.id, "--format", "torch", "--out", str(out)]) == 0
    back = torch.load(out, weights_only=True)
    assert _bitwise({"model": back["model"], "optimizer": back["optimizer"]}, {"model": msd, "optimizer": osd}) == []


def test_import_leaves_the_rng_alone(tmp_path: Path) -> None:
    """An imported checkpoint holds no RNG state: loading it must not reset the process's generators."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer, _ = _flat_model_state(0)
    msd, osd = get_state_dict(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=tmp_path / "dcp")
    store = str(tmp_path / "store")
    run_id = import_dcp(tmp_path / "dcp", "interop", step=5, store=store).run_ids[0]
    tr = lht.init("interop", store=store, resume=run_id)
    tr.watch(*_flat_model_state(1)[:2])
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tr.load_checkpoint("latest")
    assert torch.equal(torch.rand(3), expected) and tr.global_step == 5
    tr.finish(close_run=False)


class _Boom:
    """Pickles as a call to os.system: what a hostile .metadata holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_hostile_or_unknown_content_is_refused_without_running_it(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    store = str(tmp_path / "store")
    model, optimizer, _ = _flat_model_state(0)
    msd, osd = get_state_dict(model, optimizer)
    folder = tmp_path / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": msd, "optimizer": osd, "step": 1}, checkpoint_id=folder)
    marker = tmp_path / "pwned"
    real = (folder / ".metadata").read_bytes()
    (folder / ".metadata").write_bytes(pickle.dumps(_Boom(marker)))
    with pytest.raises(SourceReadError, match=r"\.metadata was refused: posix\.system is not part of DCP's"):
        import_dcp(folder, "interop", store=store)
    assert not marker.exists()
    # the same call hidden inside otherwise genuine metadata
    metadata = pickle.loads(real)
    metadata.planner_data = {"model.0.weight": _Boom(marker)}
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(SourceReadError, match=r"posix\.system is not part of DCP"):
        import_dcp(folder, "interop", store=store)
    assert not marker.exists()
    # a file outside the folder is never read
    metadata = pickle.loads(real)
    for info in metadata.storage_data.values():
        info.relative_path = "../../../etc/passwd"
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(SourceReadError, match=r"points at '\.\./\.\./\.\./etc/passwd', not one of the folder's"):
        import_dcp(folder, "interop", store=store)
    assert lh.Api(store).runs("interop").empty  # nothing was created
    # a value that is an object (not a tensor or plain data) is refused, named, never unpickled
    odd = tmp_path / "odd"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": msd, "step": 1, "train_state": {"clock": _Boom(marker)}}, checkpoint_id=odd)
    with pytest.raises(SourceReadError, match=r"'train_state\.clock' holds an object torch\.load\(weights_only=True\)"):
        import_dcp(odd, "interop", store=store)
    assert not marker.exists()
    # a top-level key with no place in a LaunchHelm checkpoint is refused, not guessed
    other = tmp_path / "other"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": msd, "step": 1, "ema": {"decay": 0.99}}, checkpoint_id=other)
    with pytest.raises(SourceReadError, match=r"top-level entry 'ema' .* LaunchHelm does not guess"):
        import_dcp(other, "interop", store=store)
    with pytest.raises(SourceReadError, match=r"holds no \.metadata"):
        import_dcp(tmp_path, "interop", store=store)
    nostep = tmp_path / "nostep"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": msd}, checkpoint_id=nostep)
    with pytest.raises(InvalidArgumentError, match="give it with --step N"):
        import_dcp(nostep, "interop", store=store)
    assert lh.Api(store).runs("interop").empty
    for error in (SourceReadError, InvalidArgumentError):
        assert issubclass(error, LaunchHelmError) and issubclass(error, ValueError)


# -- /2 and /3 from a real 2-rank job ------------------------------------------------------------
@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2-rank gloo job: a DDP run (/2), an FSDP2 run (/3), and dcp.save of the FSDP2 state (torchtitan's layout)."""
    import test_sharded

    root = tmp_path_factory.mktemp("interop")
    url = str(root / "store")
    saved = test_sharded.WORKER
    test_sharded.WORKER = WORKER
    try:
        ranks = torchrun(2, "make", url, root / "make")
    finally:
        test_sharded.WORKER = saved
    return {"url": url, "root": root, "out": root / "make", "ranks": ranks}


def _job(mode: str, nproc: int, made: dict[str, Any], out: str, *args: str) -> list[dict[str, Any]]:
    import test_sharded

    saved = test_sharded.WORKER
    test_sharded.WORKER = WORKER
    try:
        return torchrun(nproc, mode, made["url"], made["root"] / out, *args)
    finally:
        test_sharded.WORKER = saved


@pytest.mark.slow
def test_exports_of_ddp_and_fsdp2_checkpoints_read_back_bitwise(made: dict[str, Any]) -> None:
    url, root, out = made["url"], made["root"], made["out"]
    record = made["ranks"][0]
    ddp = lh.Api(url).run(record["ddp"]["run_id"]).checkpoints()[-1]
    fsdp = lh.Api(url).run(record["fsdp"]["run_id"]).checkpoints()[-1]
    assert ddp.format == lht.FORMAT_DISTRIBUTED and fsdp.format == lht.FORMAT_SHARDED and record["fsdp"]["sharded"]
    assert sorted(fsdp.files) == ["manifest.json", "shard-00000.bin", "shard-00001.bin"]

    assert main(["--store", url, "export", ddp.run_id, ddp.id, "--format", "torch", "--out", str(root / "ddp.pt")]) == 0
    exported = torch.load(root / "ddp.pt", weights_only=True)
    assert exported["step"] == 2
    reference = torch.load(out / "ddp.pt", weights_only=True)
    assert _bitwise({k: exported[k] for k in ("model", "optimizer")}, reference) == []

    full = torch.load(out / "full.pt", weights_only=True)
    assert main(["--store", url, "export", fsdp.run_id, "--format", "torch", "--out", str(root / "fsdp.pt")]) == 0
    exported = torch.load(root / "fsdp.pt", weights_only=True)
    assert exported["step"] == 2 and exported["scheduler"] == full["scheduler"]
    # every shard consolidated: 3 layers' weight and bias, the buffer; AdamW's state of 6 parameters
    assert len(exported["model"]) == 7 and len(exported["optimizer"]["state"]) == 6
    both = ("model", "optimizer")
    assert _bitwise({k: exported[k] for k in both}, {k: full[k] for k in both}) == []

    assert main(["--store", url, "export", fsdp.run_id, "--format", "dcp", "--out", str(root / "fsdp-dcp")]) == 0
    loaded = _dcp_load(root / "fsdp-dcp", {"model": full["model"], "optimizer": full["optimizer"], "step": 0})
    assert loaded["step"] == 2
    assert _bitwise({k: loaded[k] for k in ("model", "optimizer")}, {k: full[k] for k in ("model", "optimizer")}) == []


@pytest.mark.slow
def test_a_dcp_save_of_2_fsdp2_ranks_imports_and_resumes_bitwise_on_1_and_2_ranks(made: dict[str, Any]) -> None:
    url, root, out = made["url"], made["root"], made["out"]
    assert sorted(p.name for p in (out / "dcp").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert main(["--store", url, "import", "dcp", str(out / "dcp"), "--project", "titan", "--run", "imported"]) == 0
    (run_id,) = lh.Api(url).runs("titan")["id"].tolist()
    handle = lh.Api(url).run(run_id)
    (ckpt,) = handle.checkpoints()
    assert handle.name == "imported" and ckpt.step == 2 and ckpt.format == lht.FORMAT_SHARDED
    if not (root / "fsdp-dcp").exists():  # the export test's folder: made here when it runs alone
        assert main(["--store", url, "export", made["ranks"][0]["fsdp"]["run_id"], "--format", "dcp",
                     "--out", str(root / "fsdp-dcp")]) == 0  # fmt: skip
    full = str(out / "full.pt")
    resume = ("--project", "titan", "--resume", run_id, "--full", full)
    one = _job("resume", 1, made, "resume1", *resume)
    two = _job("resume", 2, made, "resume2", *resume, "--dcp", str(root / "fsdp-dcp"))
    for ranks in (one, two):
        assert ranks[0]["tensors"] == 6 + 1 + 18 and ranks[0]["differences"] == []
        for rank in ranks:
            assert rank["step"] == 2 and rank["scheduler"]
            # torchtitan's train_state and every rank's dataloader state come back as extra, on every rank
            assert rank["extra"] == {
                "train_state": {"step": 2, "ntokens_seen": 60},
                "dataloader": {"dp_rank_0": "position of rank 0", "dp_rank_1": "position of rank 1"},
            }
    # the export of the /3 checkpoint, dcp.load-ed into a fresh FSDP2 model's sharded state under torchrun
    assert two[0]["dcp_step"] == 2 and two[0]["dcp_differences"] == []


def test_a_dcp_folder_behind_an_fsspec_url_imports(tmp_path: Path) -> None:
    """A remote folder is read through fsspec (memory:// here), with the same safe reader."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer, _ = _flat_model_state(0)
    msd, osd = get_state_dict(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": msd, "optimizer": osd, "step": 4}, storage_writer=FsspecWriter("memory://interop/ck"))
    store = str(tmp_path / "store")
    (run_id,) = import_dcp("memory://interop/ck", "interop", store=store).run_ids
    (ckpt,) = lh.Api(store).run(run_id).checkpoints()
    assert ckpt.step == 4
    model2, _, _ = _flat_model_state(3)
    from launchhelm.storage._keys import artifact_prefix

    lht.load_weights(model2, Path(store) / artifact_prefix(run_id, ckpt.id))  # a sharded checkpoint's folder
    assert _bitwise(model2.state_dict(), msd) == []
