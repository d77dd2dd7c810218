"""Single-process checkpoints: what a save holds, what a load restores, what
is refused, and how a run remembers that history went back."""

from __future__ import annotations

import collections
import copy
import dataclasses
import datetime
import os
import pickle
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import launchhelm as lh
import launchhelm.torch as lht


def _build(seed: int = 0, hidden: int = 8) -> tuple[torch.nn.Module, torch.optim.Optimizer, object, object]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Dropout(0.3), torch.nn.Linear(hidden, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return model, optimizer, scheduler, scaler


def _train(
    tr: lht.TorchRun, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: object, n: int
) -> None:
    for _ in range(n):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()  # type: ignore[attr-defined]
        tr.log({"loss": loss})


def _payload_path(store_url: str, tr: lh.Run, artifact: str) -> Path:
    return Path(store_url) / "runs" / tr.id / "artifacts" / artifact / f"{artifact}.pt"


def test_save_then_load_restores_everything(store_url: str) -> None:
    model, optimizer, scheduler, scaler = _build()
    tr = lht.init("ckpt", store=store_url, tunables={"lr": 1e-2})
    tr.watch(model, optimizer, scheduler, scaler)
    _train(tr, model, optimizer, scheduler, 5)
    assert tr.global_step == 5  # the watched optimizer's step() advances it
    scaler.scale(torch.ones(()))  # GradScaler creates its scale lazily
    scaler.update(512.0)
    random.seed(1)
    np.random.seed(2)
    artifact = tr.save_checkpoint(extra={"epoch": 2, "position": torch.tensor([3, 4]), "tag": "warm"})
    assert isinstance(artifact, str)
    after_save = (random.random(), float(np.random.rand()), torch.rand(3))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = copy.deepcopy(optimizer.state_dict())
    _train(tr, model, optimizer, scheduler, 4)
    scaler.update(64.0)

    extra = tr.load_checkpoint("latest")
    assert extra["epoch"] == 2 and extra["tag"] == "warm" and torch.equal(extra["position"], torch.tensor([3, 4]))
    assert tr.global_step == 5
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    restored_opt = optimizer.state_dict()
    for pid, st in saved_opt["state"].items():
        assert all(torch.equal(st[k], restored_opt["state"][pid][k]) for k in st)
    assert scheduler.state_dict()["last_epoch"] == 5  # type: ignore[attr-defined]
    assert scaler.get_scale() == 512.0
    assert (random.random(), float(np.random.rand())) == after_save[:2]
    assert torch.equal(torch.rand(3), after_save[2])
    assert dict(tr.tunables) == {"lr": 1e-2}
    tr.finish()


def test_a_load_records_its_restore_only_where_it_changes_the_tunables_in_force(tmp_path: Path) -> None:
    """A load that brings back the tunables and control state already in force appends no
    control_applied event (it would fold to the same state); one that changes them does, and a
    resumed session starts from what it restored."""
    store_url = str(tmp_path / "store")
    model, optimizer, scheduler, scaler = _build()
    tr = lht.init("ckpt", store=store_url, tunables={"lr": 1e-2}, control_interval=0.05)
    tr.watch(model, optimizer, scheduler, scaler)
    _train(tr, model, optimizer, scheduler, 2)
    artifact = tr.save_checkpoint()
    handle = lh.Api(store_url).run(tr.id)

    def restores() -> list[dict[str, object]]:
        return [e for e in handle.events() if e["type"] == "control_applied" and e["cause"] == "restore"]

    tr.load_checkpoint(artifact)
    assert restores() == []
    handle.set_tunables(lr=0.5)
    deadline = time.monotonic() + 10
    while tr.tunables["lr"] != 0.5 and time.monotonic() < deadline:
        _train(tr, model, optimizer, scheduler, 1)  # the change applies at a step boundary
        time.sleep(0.02)
    assert tr.tunables["lr"] == 0.5
    tr.load_checkpoint(artifact)
    (restore,) = restores()
    assert restore["tunables"] == {"lr": 1e-2} and restore["step"] == 2
    assert dict(tr.tunables) == {"lr": 1e-2}
    tr.finish(close_run=False)
    resumed = lht.init("ckpt", store=store_url, resume=tr.id, tunables={"lr": 1e-2})
    assert dict(resumed.tunables) == {"lr": 1e-2}
    resumed.finish()


def test_the_bundle_is_weights_only_safe_and_its_record_verifies(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    model, optimizer, scheduler, scaler = _build()
    tr = lht.init("ckpt", store=store_url)
    tr.watch(model, optimizer, scheduler, scaler)
    _train(tr, model, optimizer, scheduler, 2)
    tr.log({"before": 1.0})
    artifact = tr.save_checkpoint()
    assert artifact is not None
    # metrics logged before the save are stored by the time it returns
    assert "before" in lh.Api(store_url).run(tr.id).history().columns
    payload = _payload_path(store_url, tr, artifact)
    bundle = torch.load(payload, weights_only=True)
    assert bundle["format"] == lht.FORMAT_SINGLE == "launchhelm.torch.checkpoint/1"
    assert bundle["step"] == 2 and bundle["world_size"] == 1
    rng = bundle["rng"]
    assert isinstance(rng["python"], tuple) and rng["python"][1].dtype == torch.int64
    assert rng["torch"].dtype == torch.uint8 and rng["numpy"]["key"].dtype == torch.int64
    (record,) = lh.Api(store_url).run(tr.id).checkpoints()
    assert record.id == artifact and record.step == 2 and record.format == lht.FORMAT_SINGLE
    assert record.size == payload.stat().st_size
    # the record holds the whole file's CRC64NVME (what S3 verifies), not a sha256
    from awscrt.checksums import crc64nvme

    assert record.checksums == {"crc64nvme": f"{crc64nvme(payload.read_bytes()):016x}"} and record.sha256 == ""
    tr.finish()


@dataclasses.dataclass
class _Position:
    batch: int


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"lr": np.float64(0.1)}, "extra['lr'] is a numpy.float64"),
        ({"data": {"file": Path("/data/x")}}, "extra['data']['file'] is a pathlib.PosixPath"),
        ({"when": datetime.datetime(2026, 1, 1)}, "extra['when'] is a datetime.datetime"),
        ({"pos": _Position(3)}, "extra['pos'] is a"),
        ({"counts": collections.defaultdict(int)}, "extra['counts'] is a collections.defaultdict"),
        ({"items": [1, object()]}, "extra['items'][1] is a object"),
        ({"gen": torch.Generator()}, "extra['gen'] is a torch._C.Generator"),
        ({"arr": np.zeros(3)}, "extra['arr'] is a numpy.ndarray"),
        ({Path("k"): 3}, "extra key PosixPath('k') is a pathlib.PosixPath"),
    ],
)
def test_extra_that_would_not_load_is_refused_at_save_time(store_url: str, extra: object, needle: str) -> None:
    model, optimizer, scheduler, _ = _build()
    tr = lht.init("ckpt", store=store_url)
    tr.watch(model, optimizer, scheduler)
    with pytest.raises(lh.CheckpointError) as info:
        tr.save_checkpoint(extra=extra)
    assert needle in str(info.value) and "weights_only=True" in str(info.value)
    assert lh.Api(store_url).run(tr.id).checkpoints() == []  # nothing published
    assert tr.save_checkpoint(extra={"fine": [1, 2.0, "x", None, torch.zeros(2)], (1, 2): {3}}) is not None
    tr.finish()


def test_save_and_load_need_watch_and_a_checkpoint(store_url: str) -> None:
    tr = lht.init("ckpt", store=store_url)
    with pytest.raises(lh.CheckpointError, match=r"call run.watch\(model, optimizer\) first"):
        tr.save_checkpoint()
    model, optimizer, scheduler, _ = _build()
    tr.watch(model, optimizer, scheduler)
    with pytest.raises(lh.CheckpointError, match="has no checkpoint yet"):
        tr.load_checkpoint("latest")
    with pytest.raises(lh.CheckpointError, match=r"no checkpoint 'nope\.pt'"):
        tr.load_checkpoint("nope.pt")
    with pytest.raises(TypeError, match=r"torch.nn.Module"):
        tr.watch(optimizer, model)  # type: ignore[arg-type]
    tr.finish()


def _saved_run(store_url: str, steps: int = 3) -> tuple[lht.TorchRun, str, torch.nn.Module, torch.optim.Optimizer]:
    model, optimizer, scheduler, _ = _build()
    tr = lht.init("bad", store=store_url)
    tr.watch(model, optimizer, scheduler)
    _train(tr, model, optimizer, scheduler, steps)
    artifact = tr.save_checkpoint(extra={"ok": True})
    assert artifact is not None
    return tr, artifact, model, optimizer


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "bitflip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("truncated", "truncated or replaced"),
        ("empty", "empty file"),
        ("bitflip", "does not match its crc64nvme"),
    ],
)
def test_a_damaged_checkpoint_file_gives_checkpoint_error_and_changes_nothing(
    tmp_path: Path, how: str, needle: str
) -> None:
    store_url = str(tmp_path / "store")
    tr, artifact, model, optimizer = _saved_run(store_url)
    _corrupt(_payload_path(store_url, tr, artifact), how)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(lh.CheckpointError, match=needle) as info:
        tr.load_checkpoint("latest")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert tr.global_step == 3
    # caught or not, the next step raises the stored error: the model is not in the state asked for
    with pytest.raises(lh.CheckpointError) as again:
        optimizer.step()
    assert again.value is info.value
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert tr.global_step == 3
    tr.finish()


def test_a_caught_checkpoint_error_blocks_training_until_a_load_succeeds_or_it_is_cleared(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    tr, good, model, optimizer = _saved_run(store_url)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)
    _train(tr, model, optimizer, scheduler, 2)
    bad = tr.save_checkpoint()
    assert bad is not None
    _corrupt(_payload_path(store_url, tr, bad), "bitflip")
    try:
        tr.load_checkpoint("latest")  # refused at verification: nothing applied
    except lh.CheckpointError as exc:
        refused = exc
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for attempt in (optimizer.step, tr.save_checkpoint, optimizer.step):
        with pytest.raises(lh.CheckpointError) as info:
            attempt()
        assert info.value is refused, "the stored error is raised again"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert tr.global_step == 5
    # a later load that succeeds lifts it
    assert tr.load_checkpoint(good) == {"ok": True}
    assert tr.global_step == 3
    optimizer.step()
    assert tr.global_step == 4
    # a checkpoint that cannot even be found counts as a failed load too
    with pytest.raises(lh.CheckpointError, match=r"no checkpoint 'nope\.pt'") as info:
        tr.load_checkpoint("nope.pt")
    with pytest.raises(lh.CheckpointError, match=r"no checkpoint 'nope\.pt'"):
        optimizer.step()
    # the user decides the state is fine after all: clear it, and train on
    assert tr.clear_checkpoint_error() is info.value
    assert tr.clear_checkpoint_error() is None
    optimizer.step()
    assert tr.global_step == 5
    assert tr.save_checkpoint() is not None
    tr.finish()


def test_a_load_checkpoint_argument_of_the_wrong_type_is_refused_before_anything(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    tr, _, _, optimizer = _saved_run(store_url)
    with pytest.raises(lh.InvalidTypeError, match="load_checkpoint\\(123\\)"):
        tr.load_checkpoint(123)  # type: ignore[arg-type]
    optimizer.step()  # nothing was attempted: no stored error
    assert tr.global_step == 4
    tr.finish()


def test_a_damaged_copy_loaded_by_path_is_checked_against_its_record(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    tr, artifact, _, _ = _saved_run(store_url)
    copy = tmp_path / f"{artifact}.pt"
    copy.write_bytes(_payload_path(store_url, tr, artifact).read_bytes())
    assert tr.load_checkpoint(str(copy)) == {"ok": True}
    _corrupt(copy, "bitflip")
    with pytest.raises(lh.CheckpointError, match="does not match its crc64nvme"):
        tr.load_checkpoint(copy)
    tr.finish()


class _Exploit:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/launchhelm-pwned-$PPID",))


def test_files_that_are_not_checkpoints_are_refused_and_pickles_never_run(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    tr, _, model, _ = _saved_run(store_url)
    marker = Path(f"/tmp/launchhelm-pwned-{os.getpid()}")
    marker.unlink(missing_ok=True)
    evil = tmp_path / "evil.pt"
    torch.save({"format": lht.FORMAT_SINGLE, "model": _Exploit()}, evil)
    with pytest.raises(
        lh.CheckpointError, match=r"refused by torch.load\(weights_only=True\).*nothing in it was executed"
    ):
        tr.load_checkpoint(evil)
    raw_pickle = tmp_path / "raw.pkl"
    raw_pickle.write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(lh.CheckpointError):
        tr.load_checkpoint(raw_pickle)
    assert not marker.exists(), "a pickled payload was executed"
    foreign = tmp_path / "plain.pt"
    torch.save(model.state_dict(), foreign)  # a plain state dict: not a LaunchHelm bundle
    with pytest.raises(lh.CheckpointError, match="not a LaunchHelm torch checkpoint"):
        tr.load_checkpoint(foreign)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"definitely not a zip file" * 10)
    with pytest.raises(lh.CheckpointError, match="not a readable torch file"):
        tr.load_checkpoint(garbage)
    tr.finish()


def test_a_checkpoint_that_fails_while_applied_blocks_the_next_optimizer_step(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    tr, artifact, _, _ = _saved_run(store_url)
    tr.finish(close_run=False)
    other, other_opt, other_sched, _ = _build(hidden=16)  # a different architecture
    again = lht.init("bad", resume=tr.id, store=store_url)
    again.watch(other, other_opt, other_sched)
    with pytest.raises(lh.CheckpointError, match="failed part-way while being applied"):
        again.load_checkpoint(artifact)
    with pytest.raises(lh.CheckpointError, match="failed part-way"):
        other_opt.step()  # training on with mixed state is refused
    again.finish(close_run=False)


def test_a_rewind_is_recorded_and_both_attempts_stay_in_history(store_url: str) -> None:
    model, optimizer, scheduler, _ = _build()
    tr = lht.init("rewind", store=store_url)
    tr.watch(model, optimizer, scheduler)
    seen: list[lh.Rewind] = []
    tr.on_rewind(seen.append)
    _train(tr, model, optimizer, scheduler, 4)
    artifact = tr.save_checkpoint()
    _train(tr, model, optimizer, scheduler, 6)  # reaches step 10
    tr.load_checkpoint("latest")
    assert seen == [lh.Rewind(to_step=4, reached=10, cause="load_checkpoint", checkpoint=artifact, attempt=1)]
    assert seen[0].describe() == "Resumed from step 4 after reaching 10"
    _train(tr, model, optimizer, scheduler, 6)
    tr.finish()
    handle = lh.Api(store_url).run(tr.id)
    assert handle.rewinds() == seen
    every = handle.history(duplicates="all")
    assert every[every["step"] == 7]["attempt"].tolist() == [0, 1]
    last = handle.history(duplicates="last")
    assert last["step"].tolist() == list(range(1, 11)) and last[last["step"] > 4]["attempt"].eq(1).all()
    # loading the same step again without having moved on records no new rewind
    assert handle.summary()["rewinds"] == 1


def test_a_run_rewound_twice_marks_each_abandoned_attempt(tmp_path: Path) -> None:
    store = str(tmp_path)
    model, optimizer, scheduler, _ = _build()
    tr = lht.init("rewind", store=store)
    tr.watch(model, optimizer, scheduler)
    _train(tr, model, optimizer, scheduler, 2)
    early = tr.save_checkpoint()
    _train(tr, model, optimizer, scheduler, 4)  # attempt 0 reaches 6
    tr.load_checkpoint(early)
    _train(tr, model, optimizer, scheduler, 2)  # attempt 1 reaches 4
    late = tr.save_checkpoint()
    _train(tr, model, optimizer, scheduler, 1)  # and 5
    tr.load_checkpoint(early)  # back to 2 again: attempt 2
    _train(tr, model, optimizer, scheduler, 1)
    tr.finish()
    handle = lh.Api(store).run(tr.id)
    assert [(r.to_step, r.reached, r.checkpoint, r.attempt) for r in handle.rewinds()] == [
        (2, 6, early, 1),
        (2, 6, early, 2),
    ]
    every = handle.history(duplicates="all")
    rows = {
        (int(s), int(a)): bool(ab) for s, a, ab in zip(every["step"], every["attempt"], every["abandoned"], strict=True)
    }
    assert rows == {
        (1, 0): False,
        (2, 0): False,
        (3, 0): True,
        (4, 0): True,
        (5, 0): True,
        (6, 0): True,
        (3, 1): True,
        (4, 1): True,
        (5, 1): True,
        (3, 2): False,
    }
    assert late is not None and handle.checkpoints()[1].steps_to_redo == 6 - 4


@pytest.mark.slow
def test_resume_choice_is_restored_once_then_latest_again(store_url: str) -> None:
    model, optimizer, scheduler, _ = _build()
    tr = lht.init("choice", store=store_url)
    tr.watch(model, optimizer, scheduler)
    ids = []
    for _ in range(3):
        _train(tr, model, optimizer, scheduler, 2)
        ids.append(tr.save_checkpoint(extra={"step": tr.global_step}))
    tr.finish(close_run=False)
    handle = lh.Api(store_url).run(tr.id)
    assert handle.resume_checkpoint().id == ids[-1]  # type: ignore[union-attr]
    chosen = handle.choose_for_resume(ids[0])
    assert chosen.chosen_for_resume and chosen.steps_to_redo == 4
    handle.choose_for_resume(ids[1])  # a new choice replaces the old one
    assert [c.chosen_for_resume for c in handle.checkpoints()] == [False, True, False]
    assert handle.latest_checkpoint().id == ids[2]  # type: ignore[union-attr]
    with pytest.raises(lh.CheckpointError, match="has no checkpoint 'ckpt-0000-bogus'"):
        handle.choose_for_resume("ckpt-0000-bogus")

    again = lht.init("choice", resume=tr.id, store=store_url)
    m2, o2, s2, _ = _build()
    again.watch(m2, o2, s2)
    assert again.load_checkpoint("resume") == {"step": 4}
    assert again.load_checkpoint("resume") == {"step": 6}  # consumed: newest again
    assert not any(c.chosen_for_resume for c in handle.checkpoints())
    assert again.load_checkpoint("latest") == {"step": 6}
    again.finish()

    other = lht.init("choice", store=store_url)
    other.finish()
    with pytest.raises(lh.CheckpointError, match=f"run {other.id} has no checkpoint"):
        lh.Api(store_url).run(other.id).choose_for_resume(ids[0])  # another run's checkpoint


def test_plain_runs_checkpoint_files_and_folders(store_url: str, tmp_path: Path) -> None:
    run = lh.init("plain", store=store_url)
    single = tmp_path / "weights.bin"
    single.write_bytes(os.urandom(1000))
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.json").write_text("{}")
    (folder / "sub" / "b.bin").write_bytes(b"x" * 300)
    run.global_step = 7
    first = run.checkpoint(single)
    second = run.checkpoint(folder, step=9)
    with pytest.raises(FileNotFoundError):
        run.checkpoint(tmp_path / "missing")
    run.finish()
    records = lh.Api(store_url).run(run.id).checkpoints()
    assert [(c.id, c.step, c.format, c.size) for c in records] == [
        (first, 7, "file", 1000),
        (second, 9, "directory", 302),
    ]
    assert records[1].files == {"a.json": 2, "sub/b.bin": 300}
    assert lh.Api(store_url).store.read(f"runs/{run.id}/artifacts/{first}/weights.bin") == single.read_bytes()


# -- non-blocking saves ------------------------------------------------------------
def test_a_non_blocking_save_holds_the_state_at_the_call_while_training_goes_on(store_url: str) -> None:
    model, optimizer, scheduler, _ = _build()
    tr = lht.init("async", store=store_url)
    tr.watch(model, optimizer, scheduler)
    _train(tr, model, optimizer, scheduler, 3)
    at_save = copy.deepcopy(model.state_dict())
    artifact = tr.save_checkpoint(extra={"epoch": 1}, blocking=False)
    _train(tr, model, optimizer, scheduler, 4)  # moves the live tensors on while it is written
    assert not torch.equal(model.state_dict()["0.weight"], at_save["0.weight"])
    assert tr.load_checkpoint("latest") == {"epoch": 1}  # waits for the save, then restores it
    assert tr.global_step == 3
    assert all(torch.equal(model.state_dict()[k], at_save[k]) for k in at_save)
    (saved,) = lh.Api(store_url).run(tr.id).checkpoints()
    assert saved.id == artifact and saved.step == 3
    tr.finish()


def test_a_failed_non_blocking_save_raises_at_the_next_wait_and_publishes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    model, optimizer, scheduler, _ = _build()
    tr = lht.init("async", store=str(store))
    tr.watch(model, optimizer, scheduler)
    _train(tr, model, optimizer, scheduler, 2)
    first = tr.save_checkpoint()
    staging = store / ".staging"
    staging.rename(tmp_path / "staging-away")
    staging.write_bytes(b"not a folder")  # the next write to the store fails for real
    tr.save_checkpoint(blocking=False)
    with pytest.raises(lh.CheckpointError, match=r"background save .* failed"):
        tr.wait_for_checkpoint()
    tr.wait_for_checkpoint()  # reported once
    staging.unlink()
    (tmp_path / "staging-away").rename(staging)
    assert [c.id for c in lh.Api(str(store)).run(tr.id).checkpoints()] == [first]
    tr.finish()


@pytest.mark.slow
def test_interpreter_exit_publishes_a_non_blocking_save_in_progress(tmp_path: Path) -> None:
    from lhtest import run_python

    store = str(tmp_path / "store")
    result = run_python(
        """
        import sys, torch
        import launchhelm.torch as lht
        tr = lht.init("async", store=sys.argv[1])
        model = torch.nn.Linear(2048, 2048)  # ~48 MB with AdamW state: takes a moment to write
        optimizer = torch.optim.AdamW(model.parameters())
        tr.watch(model, optimizer)
        model(torch.randn(4, 2048)).sum().backward()
        optimizer.step()
        print(tr.id, tr.save_checkpoint(blocking=False), flush=True)
        # no finish(): the interpreter exits while the save may still be running
        """,
        store,
    )
    assert result.returncode == 0, result.stderr
    run_id, artifact = result.stdout.split()
    handle = lh.Api(store).run(run_id)
    assert [c.id for c in handle.checkpoints()] == [artifact] and handle.status == "resumable"


# -- checksums: CRC64NVME now, sha256 for checkpoints recorded before ---------------------------
def _publish_as_sha256_recorded(tr: lht.TorchRun, store_url: str, artifact: str) -> str:
    """Re-publish a payload with the record earlier versions wrote: the file's sha256, no CRC64NVME."""
    import hashlib

    from launchhelm._runlog._checkpoints import artifact_prefix, new_artifact_id
    from launchhelm.storage import open_store

    data = _payload_path(store_url, tr, artifact).read_bytes()
    old = new_artifact_id(tr.global_step)
    name = f"{old}.pt"
    open_store(store_url).create(f"{artifact_prefix(tr.id, old)}/{name}", data)
    digest = hashlib.sha256(data).hexdigest()
    tr._events.append(
        "checkpoint",
        {
            "session": tr.session_id,
            "checkpoint": old,
            "prefix": artifact_prefix(tr.id, old),
            "step": tr.global_step,
            "format": lht.FORMAT_SINGLE,
            "files": [{"name": name, "size": len(data), "sha256": digest}],
            "sha256": digest,
            "size": len(data),
            "world_size": 1,
            "control_seq": 0,
        },
    )
    return old


def test_a_checkpoint_recorded_with_sha256_still_loads_and_verifies(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    tr, artifact, model, optimizer = _saved_run(store_url)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    old = _publish_as_sha256_recorded(tr, store_url, artifact)
    (_, record) = lh.Api(store_url).run(tr.id).checkpoints()
    assert record.id == old and set(record.checksums) == {"sha256"} and len(record.sha256) == 64
    optimizer.step()
    assert tr.load_checkpoint(old) == {"ok": True}
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    _corrupt(_payload_path(store_url, tr, old), "bitflip")
    with pytest.raises(lh.CheckpointError, match="does not match its sha256"):
        tr.load_checkpoint(old)
    tr.finish()


def test_a_plain_artifact_records_crc64nvme_per_file(tmp_path: Path) -> None:
    from awscrt.checksums import crc64nvme

    store_url = str(tmp_path / "store")
    run = lh.init("plain", store=store_url)
    (tmp_path / "w.bin").write_bytes(b"weights" * 1000)
    run.checkpoint(tmp_path / "w.bin", step=1)
    (record,) = lh.Api(store_url).run(run.id).checkpoints()
    assert record.checksums == {"crc64nvme": f"{crc64nvme(b'weights' * 1000):016x}"}
    run.finish()


def test_non_blocking_saves_copy_into_host_buffers_reused_from_save_to_save(tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    model, optimizer, scheduler, _ = _build()
    tr = lht.init("nb", store=store_url)
    tr.watch(model, optimizer, scheduler)
    _train(tr, model, optimizer, scheduler, 2)
    first = tr.save_checkpoint(blocking=False)
    at_first = {k: v.clone() for k, v in model.state_dict().items()}
    buffers = [b.data_ptr() for b in tr._checkpointer.snapshots._buffers]
    _train(tr, model, optimizer, scheduler, 2)  # while the first is written: its copy is not touched
    second = tr.save_checkpoint(blocking=False)  # waits for the first, then copies into the same buffers
    at_second = {k: v.clone() for k, v in model.state_dict().items()}
    assert [b.data_ptr() for b in tr._checkpointer.snapshots._buffers] == buffers and buffers
    tr.wait_for_checkpoint()
    for artifact, expected in ((first, at_first), (second, at_second)):
        tr.load_checkpoint(artifact)
        assert all(torch.equal(expected[k], v) for k, v in model.state_dict().items())
    tr.finish()


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_the_checksum_writer_checksums_every_byte_across_write_out_windows(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large writes cut into write-out windows on a local file (none on an upload): same bytes, same CRC."""
    import sys

    from launchhelm._runlog import _checkpoints
    from launchhelm.storage import open_store
    from launchhelm.storage._checksum import CRC64NVME, crc64nvme

    monkeypatch.setattr(_checkpoints._Writeback, "WINDOW", 4096)
    monkeypatch.setattr(_checkpoints.ChecksumWriter, "_MIN_THREADED", 1000)
    store = open_store(str(tmp_path / "store") if backend == "local" else f"memory://writer-{os.getpid()}")
    rng = np.random.default_rng(0)
    parts = [rng.bytes(n) for n in (10, 5000, 4096 * 3 + 17, 999, 70_000, 1)]  # small, large, odd sizes
    with store.writer("artifacts/x/blob.bin") as raw:
        out = _checkpoints.ChecksumWriter(raw)
        # the early write-out runs where there is a file to write out (Linux), never on an upload
        assert out._writeback.active == (backend == "local" and sys.platform.startswith("linux"))
        for part in parts:
            assert out.write(memoryview(part)) == len(part)
        out.close()
    whole = b"".join(parts)
    assert store.read("artifacts/x/blob.bin") == whole
    assert out.size == len(whole)
    assert out.checksum.hexdigests()[CRC64NVME] == f"{crc64nvme(whole):016x}"


def test_the_write_out_finds_the_file_under_the_local_stores_wrappers(tmp_path: Path) -> None:
    import io

    from launchhelm._runlog._checkpoints import _file_descriptor
    from launchhelm.storage import open_store

    assert _file_descriptor(io.BytesIO()) is None  # in memory: nothing to write out
    assert _file_descriptor(object()) is None
    store = open_store(str(tmp_path / "store"))
    with store.writer("a/b.bin") as raw:
        fd = _file_descriptor(raw)
        assert fd is not None
        raw.write(b"abc")
        raw.flush()
        assert os.fstat(fd).st_size == 3  # the staging file the store will publish


def test_resume_with_nothing_saved_restores_nothing_and_a_relaunch_rewinds_to_step_zero(tmp_path: Path) -> None:
    """The relaunch guide's load line on every launch: a first launch gets None; a relaunch of a run that
    died before its first checkpoint gets None too and starts over at step 0, recorded as a rewind."""
    store = str(tmp_path / "store")
    tr = lht.init("ckpt", store=store, run_id="job1", auto_resume=True, system_metrics=False)
    model, optimizer, scheduler, _ = _build()
    tr.watch(model, optimizer, scheduler)
    assert tr.load_checkpoint("resume") is None and tr.global_step == 0
    with pytest.raises(lh.CheckpointError, match="has no checkpoint yet"):
        tr.load_checkpoint("latest")  # "latest" and a path still say there is nothing
    tr.clear_checkpoint_error()  # a failed load is kept until cleared (see load_checkpoint)
    for _ in range(3):
        optimizer.step()
    tr.log({"loss": 1.0})
    tr.finish(close_run=False)
    again = lht.init("ckpt", store=store, run_id="job1", auto_resume=True, system_metrics=False)
    assert again.resumed and again.global_step == 3
    model, optimizer, scheduler, _ = _build()
    again.watch(model, optimizer, scheduler)
    assert again.load_checkpoint("resume") is None
    assert again.global_step == 0
    (rewind,) = lh.Api(store).run(again.id).rewinds()
    assert (rewind.to_step, rewind.reached, rewind.checkpoint) == (0, 3, None)
    again.finish()


@pytest.mark.slow
def test_save_then_load_through_the_stores_own_process(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``LAUNCHHELM_HELPER_STORE=1`` (docs/storage.md): the payload is staged and uploaded by the store's own
    process, the load downloads through it, and what is restored is bitwise what was saved."""
    from lhtest import BUCKET

    from launchhelm.storage._remote import HelperStore

    monkeypatch.setenv("LAUNCHHELM_HELPER_STORE", "1")
    monkeypatch.setenv("LAUNCHHELM_SPOOL", str(tmp_path / "spool"))
    model, optimizer, scheduler, scaler = _build()
    tr = lht.init("ckpt", store=f"s3://{BUCKET}/through-{os.urandom(3).hex()}")
    assert isinstance(tr._store, HelperStore) and tr._store.session_helper
    process = tr._store.process
    assert process is not None
    tr.watch(model, optimizer, scheduler, scaler)
    _train(tr, model, optimizer, scheduler, 5)
    tr.save_checkpoint(extra={"epoch": 2})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _train(tr, model, optimizer, scheduler, 4)
    assert tr.load_checkpoint("latest")["epoch"] == 2
    assert tr.global_step == 5
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    tr.finish()
    assert tr._store.adopted  # the helper init started for the store was given the session
    assert process.wait(10) == 0  # and ended with it
    assert not list((tmp_path / "spool").rglob(".launchhelm-put-*"))  # no staged payload left behind
