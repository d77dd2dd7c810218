"""Lightning's ``Trainer`` with LaunchHelmLogger and its callback: metrics, hyperparameters as config,
checkpoints published with every RNG in them, and a SIGKILLed training job that resumes through
``trainer.fit(ckpt_path=logger.checkpoint_path(...))`` and ends bitwise identical to one that never crashed
(and differs without the callback: Lightning's own checkpoint holds no RNG state)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning", reason="the lightning extra is not installed (pip install -e '.[lightning]')")

import lightning as L
import torch
from lhtest import child_env, make_store_url
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import launchhelm as lh
from launchhelm.lightning import RNG_FORMAT, LaunchHelmCallback, LaunchHelmLogger

WORKER = Path(__file__).with_name("lightning_worker.py")
EPOCHS = 4  # 4 batches an epoch, a checkpoint at each epoch's end


class Tiny(L.LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, hidden), torch.nn.Dropout(0.3), torch.nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _fit(logger: LaunchHelmLogger, root: Path, epochs: int, *callbacks: Any, ckpt_path: str | None = None) -> Any:
    L.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(16, 3, generator=gen), torch.randn(16, 1, generator=gen)), 8, True)
    trainer = L.Trainer(
        max_epochs=epochs,
        logger=logger,
        callbacks=[ModelCheckpoint(every_n_epochs=1, save_top_k=-1, save_last=True), *callbacks],
        default_root_dir=str(root),
        accelerator="cpu",
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), loader, ckpt_path=ckpt_path, weights_only=True)
    return trainer


def test_logger_records_hyperparameters_metrics_and_publishes_checkpoints_with_rng(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    logger = LaunchHelmLogger("pl", store=store, config={"note": "tiny"})
    trainer = _fit(logger, tmp_path / "root", 2, logger.callback)
    assert logger.experiment is logger.run and logger.version == logger.run.id and logger.name == "pl"
    logger.log_graph(trainer.lightning_module)  # a no-op
    logger.run.finish()

    handle = lh.Api(store).run(logger.run.id)
    assert handle.config == {"hidden": 8, "lr": 0.05, "note": "tiny"}
    history = handle.history(keys=["loss"])
    assert history["step"].tolist() == [0, 1, 2, 3] and history["loss"].notna().all()
    checkpoints = handle.checkpoints()
    assert [c.step for c in checkpoints] == [2, 4]  # save_last's copy of each is published once
    assert list(checkpoints[0].files) == ["epoch=0-step=2.ckpt"]
    # the published file is Lightning's, with the RNG record added, and loads with weights_only=True
    local = next((tmp_path / "root").rglob("epoch=1-step=4.ckpt"))
    saved = torch.load(local, weights_only=True)
    assert saved["launchhelm"]["format"] == RNG_FORMAT and saved["launchhelm"]["world_size"] == 1
    (record,) = saved["launchhelm"]["rng_by_rank"]
    assert record["rank"] == 0 and isinstance(record["torch"], torch.Tensor)
    assert checkpoints[1].size == local.stat().st_size


class SlowValidation(Tiny):
    """A validation pass longer than the run's hang timeout; it notes whether the hang clock was stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.clock_stopped: list[bool] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(1.0)
        run = self.logger.experiment  # type: ignore[union-attr]
        self.clock_stopped.append(run._beacon.counting_paused)


@pytest.mark.slow
def test_a_validation_pass_longer_than_the_hang_timeout_is_no_hang(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    logger = LaunchHelmLogger("pl", store=store, hang_timeout=2)
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(16, 3, generator=gen), torch.randn(16, 1, generator=gen))
    trainer = L.Trainer(
        max_epochs=2,
        logger=logger,
        callbacks=[logger.callback],
        default_root_dir=str(tmp_path / "root"),
        accelerator="cpu",
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = SlowValidation()
    trainer.fit(model, DataLoader(data, 8), DataLoader(data, 4))  # 4 s of validation an epoch
    assert model.clock_stopped == [True] * 8
    assert not logger.run._beacon.counting_paused  # each pass's section closed
    handle = lh.Api(store).run(logger.run.id)
    assert handle.status != "hung"
    assert not handle._store.list(f"runs/{logger.run.id}/hangs")
    logger.run.finish()


def test_hyperparameters_reach_config_only_through_the_callback(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    logger = LaunchHelmLogger("pl", store=store)
    _fit(logger, tmp_path / "root", 1, LaunchHelmCallback())  # a callback made alone finds the logger
    assert lh.Api(store).run(logger.run.id).config == {"hidden": 8, "lr": 0.05}
    logger.run.finish()


def test_resume_from_a_chosen_checkpoint_records_the_rewind_and_consumes_the_choice(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    first = LaunchHelmLogger("pl", store=store)
    _fit(first, tmp_path / "root", 3, first.callback)
    first.run.finish(close_run=False)
    handle = lh.Api(store).run(first.run.id)
    chosen = handle.checkpoints()[0]  # step 2, of 2, 4, 6
    handle.choose_for_resume(chosen.id)

    again = LaunchHelmLogger("pl", store=store, resume=first.run.id)
    with pytest.raises(lh.CheckpointError, match="no checkpoint 'ckpt-nope'"):
        again.checkpoint_path("ckpt-nope")
    path = again.checkpoint_path("resume", directory=tmp_path / "fetched")
    assert path is not None and Path(path).is_file() and chosen.id in path
    trainer = _fit(again, tmp_path / "root2", 3, again.callback, ckpt_path=path)
    assert trainer.global_step == 6
    again.run.finish(close_run=False)

    (rewind,) = handle.rewinds()
    assert (rewind.to_step, rewind.checkpoint, rewind.cause) == (2, chosen.id, "trainer.fit(ckpt_path)")
    assert not any(c.chosen_for_resume for c in handle.checkpoints())
    history = handle.history(keys=["loss"])
    assert history[history["step"] == 3]["attempt"].tolist() == [0, 1]
    assert LaunchHelmLogger("pl", store=store).checkpoint_path() is None  # a new run: train from scratch
    with pytest.raises(lh.InvalidArgumentError, match="project name"):
        LaunchHelmLogger()


# -- SIGKILL and resume -------------------------------------------------------------------------------


def _worker(store: str, root: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), store, str(root), "--epochs", str(EPOCHS), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(OMP_NUM_THREADS="1", LAUNCHHELM_FLUSH_INTERVAL="0.05", **env),
    )


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-4000:]
    return out


def _equal(a: Path, b: Path) -> bool:
    left, right = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    model = all(torch.equal(left["model"][k], right["model"][k]) for k in left["model"])
    opt_l, opt_r = left["optimizer"]["state"], right["optimizer"]["state"]
    optimizer = opt_l.keys() == opt_r.keys() and all(
        torch.equal(opt_l[p][k], opt_r[p][k]) for p in opt_l for k in opt_l[p]
    )
    return model and optimizer and left["optimizer"]["param_groups"] == right["optimizer"]["param_groups"]


@pytest.mark.slow
def test_sigkill_then_resume_through_the_logger_is_bitwise_identical(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    reference = tmp_path / "reference.pt"
    _finish(_worker(str(tmp_path / "reference-store"), tmp_path / "reference", "--out", str(reference)))

    store = make_store_url("s3", tmp_path, request)  # published to, and fetched back from, (moto) S3
    kill_at = 10  # two steps into the third epoch, after the checkpoint at step 8
    crashing = _worker(store, tmp_path / "first-machine", "--step-sleep", "0.1")
    assert crashing.stdout is not None
    run_id = next(line for line in crashing.stdout if line.startswith("run ")).split()[1]
    handle = lh.Api(store).run(run_id)
    for line in crashing.stdout:
        if line.strip() == f"step {kill_at}":
            break
    deadline = time.monotonic() + 20
    while handle.step < kill_at - 1 and time.monotonic() < deadline:  # Lightning logs step k-1 at batch k
        time.sleep(0.02)
    crashing.send_signal(signal.SIGKILL)
    crashing.wait()
    assert crashing.returncode == -signal.SIGKILL
    reached = handle.step
    assert reached >= kill_at - 1
    assert [c.step for c in handle.checkpoints()] == [4, 8]

    resumed = tmp_path / "resumed.pt"
    out = _finish(_worker(store, tmp_path / "second-machine", "--resume", run_id, "--out", str(resumed)))
    assert "ckpt-00000008-" in out
    assert _equal(reference, resumed), "the resumed run diverged from the uninterrupted one"
    (rewind,) = handle.rewinds()
    assert (rewind.to_step, rewind.reached, rewind.checkpoint) == (8, reached, handle.checkpoints()[1].id)
    history = handle.history(keys=["loss"], duplicates="all")
    redone = history[history["step"] == 8]
    assert redone["attempt"].tolist() == [0, 1]
    assert redone["loss"].iloc[0] == redone["loss"].iloc[1]  # the same batch and dropout again

    # without the callback Lightning restores no RNG: the shuffle and dropout after the resume differ
    handle.choose_for_resume(handle.checkpoints()[1].id)
    control = tmp_path / "control.pt"
    argv = ["--resume", run_id, "--which", "resume", "--no-callback", "--out", str(control)]
    _finish(_worker(store, tmp_path / "third-machine", *argv))
    assert not _equal(reference, control), "Lightning alone resumed exactly: the callback proves nothing"


@pytest.mark.slow
def test_under_ddp_each_rank_saves_and_gets_back_its_own_rng(tmp_path: Path) -> None:
    """Two gloo ranks, each with its own RNG streams (seeded by rank): resuming the chosen epoch-end checkpoint
    with two ranks ends equal to the uninterrupted two-rank run, which needs each rank's own record back."""
    store = str(tmp_path / "store")
    reference = tmp_path / "reference.pt"
    out = _finish(_worker(store, tmp_path / "first", "--devices", "2", "--out", str(reference)))
    (run_id,) = {line.split()[1] for line in out.splitlines() if line.startswith("run ") and len(line.split()) == 2}
    handle = lh.Api(store).run(run_id)
    assert [c.step for c in handle.checkpoints()] == [2, 4, 6, 8]  # each rank: half the batches
    chosen = handle.checkpoints()[1]
    saved = torch.load(next((tmp_path / "first").rglob("epoch=1-step=4.ckpt")), weights_only=True)["launchhelm"]
    assert saved["world_size"] == 2 and [r["rank"] for r in saved["rng_by_rank"]] == [0, 1]
    assert not torch.equal(saved["rng_by_rank"][0]["torch"], saved["rng_by_rank"][1]["torch"])

    handle.choose_for_resume(chosen.id)
    resumed = tmp_path / "resumed.pt"
    argv = ["--devices", "2", "--resume", run_id, "--which", "resume", "--out", str(resumed)]
    _finish(_worker(store, tmp_path / "second", *argv))
    assert _equal(reference, resumed), "a rank resumed with RNG streams other than its own"
    (rewind,) = handle.rewinds()
    assert (rewind.to_step, rewind.checkpoint) == (4, chosen.id)


def test_a_resumed_run_trained_again_from_scratch_records_a_rewind_to_step_zero(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    first = LaunchHelmLogger("pl", store=store)
    _fit(first, tmp_path / "root", 2, first.callback)
    first.run.finish(close_run=False)
    again = LaunchHelmLogger("pl", store=store, resume=first.run.id)
    _fit(again, tmp_path / "root2", 1, again.callback, ckpt_path=None)
    again.run.finish(close_run=False)
    handle = lh.Api(store).run(first.run.id)
    (rewind,) = handle.rewinds()
    assert (rewind.to_step, rewind.checkpoint) == (0, None)
    assert handle.history(keys=["loss"]).query("step == 0")["attempt"].tolist() == [0, 1]


@pytest.mark.slow
def test_an_auto_resume_job_relaunched_with_the_same_command_resumes_its_run(tmp_path: Path) -> None:
    """A scheduler's relaunch (LAUNCHHELM_RUN_ID in the job's environment, as SLURM or a Job would give an
    identity) runs the same command: the logger reopens the run and Lightning restores its newest checkpoint."""
    store = str(tmp_path / "store")
    env = {"LAUNCHHELM_RUN_ID": "lightning-job-7"}
    first = _worker(store, tmp_path / "first", "--auto", "--step-sleep", "0.1", **env)
    assert first.stdout is not None
    first_id = next(line for line in first.stdout if line.startswith("run ")).split()[1]
    for line in first.stdout:
        if line.strip() == "step 10":  # after the checkpoint at step 8
            break
    deadline = time.monotonic() + 20
    while lh.Api(store).run(first_id).step < 9 and time.monotonic() < deadline:  # Lightning logs k-1 at batch k
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = _finish(_worker(store, tmp_path / "second", "--auto", **env))
    assert "ckpt-00000008-" in second  # the path of the newest checkpoint, found with no run id given
    run_ids = {line.split()[1] for line in second.splitlines() if line.startswith("run ")}
    (run_id,) = run_ids
    assert run_id == first_id
    assert list(lh.Api(store).runs("lightning-resume")["id"]) == [run_id]
    handle = lh.Api(store).run(run_id)
    assert [r.to_step for r in handle.rewinds()] == [8]
    assert [a.ending for a in handle.attempts()] == ["crashed", "finished"]
