"""Crash resume with Hugging Face Transformers: LaunchHelmCallback and ``trainer.train(resume_from_checkpoint=...)``.

    python examples/transformers_resume.py STORE OUTPUT_DIR                   # 30 steps, a checkpoint every 10
    python examples/transformers_resume.py STORE OUTPUT_DIR --crash-at 25     # SIGKILLs itself once step 25 is stored
    python examples/transformers_resume.py STORE OUTPUT_DIR --resume RUN_ID   # the chosen checkpoint (else the newest)

A two-layer GPT-2 built from a config in code (nothing downloaded) learns a
toy language: counting modulo 16. ``callback.checkpoint_folder("resume")`` is
None for a new run; for a resumed one it is the checkpoint folder chosen in
the notebook's "Resume…" picker (else the newest), fetched from the store and
verified, so OUTPUT_DIR may be empty (another machine).
"""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from launchhelm.transformers import LaunchHelmCallback

PROJECT = "transformers-quickstart"
VOCAB = 16


def counting(n: int, length: int = 16, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Sequences ``s, s+1, s+2, ...`` modulo 16, from random starts: a language a tiny model can learn."""
    starts = torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
    rows = (starts + torch.arange(length)) % VOCAB
    return [{"input_ids": row, "labels": row} for row in rows]


def build() -> GPT2LMHeadModel:
    """The model: two layers, 32 wide (the notebook's evaluation worker loads checkpoints into the same)."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


class CrashAt(TrainerCallback):  # type: ignore[misc]
    """SIGKILL this process once step ``step`` is stored (as an OOM killer would: no cleanup)."""

    def __init__(self, launchhelm: LaunchHelmCallback, step: int) -> None:
        self.launchhelm, self.step = launchhelm, step

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            self.launchhelm.run.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("output_dir")
    parser.add_argument("--resume", help="id of the run to resume")
    parser.add_argument("--crash-at", type=int)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        logging_steps=1,
        save_steps=10,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = LaunchHelmCallback(PROJECT, store=args.store, resume=args.resume)
    callbacks: list[Any] = [callback]
    if args.crash_at is not None:
        callbacks.append(CrashAt(callback, args.crash_at))
    trainer = Trainer(model=build(), args=training, train_dataset=counting(256), callbacks=callbacks)
    print(f"run {callback.run.id}", flush=True)
    trainer.train(resume_from_checkpoint=callback.checkpoint_folder("resume"))  # None: from scratch
    print(f"run {callback.run.id} finished at step {trainer.state.global_step}", flush=True)
    callback.run.finish(close_run=False)


if __name__ == "__main__":
    main()
