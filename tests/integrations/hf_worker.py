"""A tiny Transformers training job for the resume tests (run as a script).

A two-layer GPT-2 built from a config in code (dropout on, so the restored
RNG matters), random token data, AdamW with a linear schedule; the
``Trainer`` saves a checkpoint folder every few steps and LaunchHelmCallback
publishes it.

    python hf_worker.py STORE OUTPUT_DIR --steps N --save-every K [--resume RUN_ID] [--which latest|resume]
        [--out FINAL.pt] [--step-sleep S] [--reseed-after-load]
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from launchhelm.transformers import LaunchHelmCallback


class Steps(TrainerCallback):  # type: ignore[misc]
    """Says each step on stdout (the test kills on it); optionally slows training down."""

    def __init__(self, sleep: float, reseed: bool) -> None:
        self.sleep, self.reseed = sleep, reseed

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        print(f"begin {state.global_step}", flush=True)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.reseed:  # negative control: throw the restored RNG away
            self.reseed = False
            torch.manual_seed(999)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        print(f"step {state.global_step}", flush=True)
        time.sleep(self.sleep)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("output_dir")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--resume")
    parser.add_argument("--which", default="latest")
    parser.add_argument("--out")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--reseed-after-load", action="store_true")
    parser.add_argument("--auto", action="store_true", help="auto_resume: the same command on every launch")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    data_gen = torch.Generator().manual_seed(123)
    tokens = torch.randint(0, 64, (40, 16), generator=data_gen)
    dataset = [{"input_ids": row, "labels": row} for row in tokens]
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.save_every,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_backend="gloo" if "RANK" in os.environ else None,
    )
    if args.auto:
        callback = LaunchHelmCallback("hf-resume", store=args.store, auto_resume=True)
    else:
        callback = LaunchHelmCallback("hf-resume", store=args.store, resume=args.resume)
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=dataset,
        callbacks=[callback, Steps(args.step_sleep, args.reseed_after_load)],
    )
    rank = int(os.environ.get("RANK", "0"))  # under torchrun: process zero holds the run
    if rank == 0:
        print(f"run {callback.run.id}", flush=True)
    folder = callback.checkpoint_folder(args.which) if args.resume or args.auto else None
    print(f"folder {folder}", flush=True)
    trainer.train(resume_from_checkpoint=folder)
    if rank != 0:
        return
    if args.out:
        torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()}, args.out)
    callback.run.finish(close_run=False)
    print("done", flush=True)


if __name__ == "__main__":
    main()
    if "RANK" in os.environ:
        # as tests/torch/ddp_worker.py: gloo's threads outlive the process group in torch 2.13, and their
        # teardown during interpreter finalization now and then aborts a rank ("terminate called without an
        # active exception"), failing the torchrun job after everything was written. Run the exit hooks
        # (the run's own finish among them), then leave without that teardown.
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
