"""Transformers' ``Trainer`` with LaunchHelmCallback: what it logs and records, the checkpoint folders it
publishes (scored by an evaluation worker), and a SIGKILLed training job that resumes through the callback
and ends bitwise identical to one that never crashed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the transformers extra is not installed (pip install -e '.[transformers]')")
pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (the transformers extra)")

import torch
from lhtest import child_env, make_store_url
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import launchhelm as lh
from launchhelm.transformers import LaunchHelmCallback

WORKER = Path(__file__).with_name("hf_worker.py")
STEPS, SAVE_EVERY = 20, 6  # 10 batches an epoch: the kill lands in the second epoch


def _tiny() -> tuple[GPT2LMHeadModel, list[dict[str, torch.Tensor]]]:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
    tokens = torch.randint(0, 64, (16, 16), generator=torch.Generator().manual_seed(1))
    return GPT2LMHeadModel(config), [{"input_ids": row, "labels": row} for row in tokens]


def _args(output_dir: Path, steps: int, save_every: int) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_steps=save_every,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )


@pytest.mark.slow
def test_callback_logs_records_config_and_publishes_each_checkpoint_folder(tmp_path: Path) -> None:
    model, data = _tiny()
    callback = LaunchHelmCallback("hf", store=str(tmp_path / "store"), config={"note": "tiny"})
    trainer = Trainer(model=model, args=_args(tmp_path / "out", 4, 2), train_dataset=data, callbacks=[callback])
    trainer.train()
    callback.run.finish()

    handle = lh.Api(str(tmp_path / "store")).run(callback.run.id)
    config = handle.config
    assert config["learning_rate"] == 1e-3 and config["max_steps"] == 4 and config["note"] == "tiny"
    assert config["model_config"]["n_layer"] == 2
    history = handle.history()
    assert history["step"].tolist()[:4] == [1, 2, 3, 4]  # Trainer's global_step
    assert {"loss", "learning_rate", "grad_norm"} <= set(history.columns)
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert history["loss"].dropna().tolist()[:4] == pytest.approx(logged[:4])
    checkpoints = handle.checkpoints()
    assert [c.step for c in checkpoints] == [2, 4]
    local = tmp_path / "out" / "checkpoint-4"
    assert set(checkpoints[1].files) == {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()}
    assert "model.safetensors" in checkpoints[1].files and "optimizer.pt" in checkpoints[1].files


class _SlowEvaluation(TrainerCallback):  # type: ignore[misc]
    """Each evaluation batch takes 2 s; notes whether the run's hang clock was stopped then."""

    def __init__(self, ours: LaunchHelmCallback) -> None:
        self.ours = ours
        self.clock_stopped: list[bool] = []

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: object) -> None:
        time.sleep(2.0)
        self.clock_stopped.append(self.ours.run._beacon.counting_paused)


@pytest.mark.slow
def test_an_evaluation_longer_than_the_hang_timeout_is_no_hang(tmp_path: Path) -> None:
    model, data = _tiny()
    # 4 s: a training step of this tiny model took more than 2 s on a loaded CI machine (its first AdamW
    # step); each evaluation (3 batches of 2 s) is still longer than the timeout
    callback = LaunchHelmCallback("hf", store=str(tmp_path / "store"), hang_timeout=4)
    slow = _SlowEvaluation(callback)
    args = _args(tmp_path / "out", 4, 100)
    args.eval_strategy = "steps"
    args.eval_steps = 2
    args.per_device_eval_batch_size = 4
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:12], callbacks=[callback, slow])
    trainer.train()  # two evaluations of 6 s, at steps 2 and 4
    assert slow.clock_stopped == [True] * 6
    assert not callback.run._beacon.counting_paused  # each evaluation's section closed
    handle = lh.Api(str(tmp_path / "store")).run(callback.run.id)
    assert handle.status != "hung"
    assert not handle._store.list(f"runs/{callback.run.id}/hangs")
    callback.run.finish()


@pytest.mark.slow
def test_an_evaluation_worker_scores_a_published_checkpoint_folder(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url("s3", tmp_path, request)  # published to and fetched from (moto) S3
    model, data = _tiny()
    callback = LaunchHelmCallback("hf-eval", store=store)
    trainer = Trainer(model=model, args=_args(tmp_path / "out", 2, 2), train_dataset=data, callbacks=[callback])
    trainer.train()
    callback.run.finish(close_run=False)
    handle = lh.Api(store).run(callback.run.id)
    (checkpoint,) = handle.checkpoints()
    handle.evaluate(checkpoint.id)

    batch = torch.stack([d["input_ids"] for d in data[:4]])

    @lh.evaluate(project="hf-eval", store=store)
    def score(ctx: lh.EvaluationContext) -> dict[str, float]:
        folder = ctx.download_to()
        scored = GPT2LMHeadModel.from_pretrained(folder).eval()
        with torch.no_grad():
            return {"loss": float(scored(input_ids=batch, labels=batch).loss)}

    assert score.serve(stop_when_idle=True) == 1
    (evaluation,) = handle.evaluations()
    assert evaluation.state == "done", evaluation.error
    assert Path(tmp_path / "out" / "checkpoint-2").is_dir()
    direct = GPT2LMHeadModel.from_pretrained(tmp_path / "out" / "checkpoint-2").eval()
    with torch.no_grad():
        expected = float(direct(input_ids=batch, labels=batch).loss)
    assert evaluation.scores["loss"] == pytest.approx(expected, rel=0, abs=0)
    assert handle.history(keys=["eval/loss"])["eval/loss"].dropna().tolist() == [expected]


@pytest.mark.slow
def test_checkpoint_folder_refuses_unknown_ids_and_damaged_files(tmp_path: Path) -> None:
    store = tmp_path / "store"
    model, data = _tiny()
    callback = LaunchHelmCallback("hf-bad", store=str(store))
    trainer = Trainer(model=model, args=_args(tmp_path / "out", 2, 2), train_dataset=data, callbacks=[callback])
    trainer.train()
    callback.run.finish(close_run=False)
    assert LaunchHelmCallback("hf-bad", store=str(store)).checkpoint_folder() is None  # a new run: from scratch
    with pytest.raises(lh.InvalidArgumentError, match="project name"):
        LaunchHelmCallback()

    resumed = LaunchHelmCallback("hf-bad", store=str(store), resume=callback.run.id)
    with pytest.raises(lh.CheckpointError, match="no checkpoint 'ckpt-nope'"):
        resumed.checkpoint_folder("ckpt-nope")
    (stored,) = [p for p in store.rglob("optimizer.pt") if "artifacts" in p.parts]
    raw = bytearray(stored.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    stored.write_bytes(bytes(raw))
    with pytest.raises(lh.CheckpointError, match=r"optimizer\.pt.*does not match its crc64nvme"):
        resumed.checkpoint_folder("latest", directory=tmp_path / "restore")
    resumed.run.finish(close_run=False)


@pytest.mark.slow
def test_checkpoint_now_from_outside_makes_the_trainer_save_and_publish(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    model, data = _tiny()
    callback = LaunchHelmCallback("hf-now", store=store, control_interval=0.05)

    class AskAtStepTwo(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                lh.Api(store).run(callback.run.id).control("checkpoint")  # what the Details tab's button does
                time.sleep(0.5)  # the run's poller delivers it; it applies at the next step boundary

    trainer = Trainer(
        model=model, args=_args(tmp_path / "out", 5, 100), train_dataset=data, callbacks=[callback, AskAtStepTwo()]
    )
    trainer.train()
    callback.run.finish()
    assert [c.step for c in lh.Api(store).run(callback.run.id).checkpoints()] == [3, 5]  # 5: the final save


# -- SIGKILL and resume -------------------------------------------------------------------------------


def _worker(store: str, output_dir: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            store,
            str(output_dir),
            "--steps",
            str(STEPS),
            "--save-every",
            str(SAVE_EVERY),
            *args,
        ],
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
        torch.equal(opt_l[p][k], opt_r[p][k]) if isinstance(opt_l[p][k], torch.Tensor) else opt_l[p][k] == opt_r[p][k]
        for p in opt_l
        for k in opt_l[p]
    )
    return model and optimizer and left["optimizer"]["param_groups"] == right["optimizer"]["param_groups"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The weights and optimizer state of the same job run without a crash."""
    where = tmp_path_factory.mktemp("hf-reference")
    out = where / "final.pt"
    _finish(_worker(str(where / "store"), where / "output", "--out", str(out)))
    return out


@pytest.mark.slow
def test_sigkill_then_resume_through_the_callback_is_bitwise_identical(reference: Path, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    kill_at = 15  # three steps after the checkpoint at step 12
    crashing = _worker(store, tmp_path / "first-machine", "--step-sleep", "0.1")
    assert crashing.stdout is not None
    run_id = next(line for line in crashing.stdout if line.startswith("run ")).split()[1]
    handle = lh.Api(store).run(run_id)
    for line in crashing.stdout:
        if line.strip() == f"step {kill_at}":
            break
    deadline = time.monotonic() + 20
    while handle.step < kill_at and time.monotonic() < deadline:  # the store knows it got this far
        time.sleep(0.02)
    crashing.send_signal(signal.SIGKILL)
    crashing.wait()
    assert crashing.returncode == -signal.SIGKILL
    reached = handle.step
    assert reached >= kill_at
    assert [c.step for c in handle.checkpoints()] == [6, 12]

    # another machine: an empty output_dir, the checkpoint folder comes from the store
    resumed = tmp_path / "resumed.pt"
    out = _finish(_worker(store, tmp_path / "second-machine", "--resume", run_id, "--out", str(resumed)))
    assert "begin 12" in out and "launchhelm-restored" in out
    assert _equal(reference, resumed), "the resumed run diverged from the uninterrupted one"

    (rewind,) = handle.rewinds()
    assert (rewind.to_step, rewind.reached, rewind.checkpoint) == (12, reached, handle.checkpoints()[1].id)
    history = handle.history(keys=["loss"], duplicates="all")
    redone = history[history["step"] == 13]
    assert redone["attempt"].tolist() == [0, 1]
    # the redone step computed the same loss: same weights, same batch, same dropout
    assert redone["loss"].iloc[0] == redone["loss"].iloc[1]
    last = handle.history(keys=["loss"], duplicates="last")
    assert last["step"].max() == STEPS

    # negative control: the same resume with the RNG thrown away after the restore must differ
    checkpoint = handle.checkpoints()[1]
    handle.choose_for_resume(checkpoint.id)
    control = tmp_path / "control.pt"
    argv = ["--resume", run_id, "--which", "resume", "--reseed-after-load", "--out", str(control)]
    _finish(_worker(store, tmp_path / "third-machine", *argv))
    assert not _equal(reference, control), "the comparison cannot tell a wrong RNG apart"
    assert not handle.checkpoints()[1].chosen_for_resume  # the "resume" choice was consumed
    assert (handle.rewinds()[-1].to_step, handle.rewinds()[-1].checkpoint) == (12, checkpoint.id)


@pytest.mark.slow
def test_under_torchrun_every_process_rng_is_published_and_resume_is_bitwise(tmp_path: Path) -> None:
    """Two gloo processes: each writes its own rng_state_<rank>.pth, so a folder published before every
    process had written (seen before the callback waited for them) would resume one rank with a fresh RNG."""
    store = str(tmp_path / "store")

    def torchrun(output_dir: Path, *args: str) -> str:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        argv = [str(WORKER), store, str(output_dir), "--steps", str(STEPS), "--save-every", str(SAVE_EVERY), *args]
        done = subprocess.run(
            command + argv, capture_output=True, text=True, timeout=300, env=child_env(OMP_NUM_THREADS="1")
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stdout

    reference = tmp_path / "reference.pt"
    out = torchrun(tmp_path / "first", "--out", str(reference))
    run_id = next(line for line in out.splitlines() if line.startswith("run ")).split()[1]
    handle = lh.Api(store).run(run_id)
    checkpoints = handle.checkpoints()
    assert [c.step for c in checkpoints] == [6, 12, 18, 20]
    for checkpoint in checkpoints:
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(checkpoint.files), checkpoint.step

    handle.choose_for_resume(checkpoints[1].id)
    resumed = tmp_path / "resumed.pt"
    out = torchrun(tmp_path / "second", "--resume", run_id, "--which", "resume", "--out", str(resumed))
    assert out.count("begin 12") == 2  # both processes began at the chosen checkpoint
    assert _equal(reference, resumed), "a process resumed with RNG state other than its own"
    (rewind,) = handle.rewinds()
    assert (rewind.to_step, rewind.reached, rewind.checkpoint) == (12, 20, checkpoints[1].id)


@pytest.mark.slow
def test_an_auto_resume_job_relaunched_with_the_same_command_resumes_its_run(reference: Path, tmp_path: Path) -> None:
    """A scheduler's relaunch (a job identity in the environment) runs the same command: the callback reopens
    the run and the Trainer restarts from its newest checkpoint folder, bitwise as if never stopped."""
    store = str(tmp_path / "store")
    env = {"LAUNCHHELM_RUN_ID": "hf-job-3"}
    crashing = _worker(store, tmp_path / "first-machine", "--auto", "--step-sleep", "0.1", **env)
    assert crashing.stdout is not None
    run_id = next(line for line in crashing.stdout if line.startswith("run ")).split()[1]
    handle = lh.Api(store).run(run_id)
    for line in crashing.stdout:
        if line.strip() == "step 15":  # three steps after the checkpoint at step 12
            break
    deadline = time.monotonic() + 20
    while handle.step < 15 and time.monotonic() < deadline:
        time.sleep(0.02)
    crashing.send_signal(signal.SIGKILL)
    crashing.wait()
    resumed = tmp_path / "resumed.pt"
    out = _finish(_worker(store, tmp_path / "second-machine", "--auto", "--out", str(resumed), **env))
    assert f"run {run_id}" in out and "begin 12" in out
    assert _equal(reference, resumed), "the relaunched job diverged from the uninterrupted one"
    assert list(lh.Api(store).runs("hf-resume")["id"]) == [run_id]
    assert [r.to_step for r in handle.rewinds()] == [12]
    assert [a.ending for a in handle.attempts()] == ["crashed", "finished"]
