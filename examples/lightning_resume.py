"""Crash resume with PyTorch Lightning: LaunchHelmLogger, its callback, and ``trainer.fit(ckpt_path=...)``.

    python examples/lightning_resume.py STORE                   # 6 epochs, a checkpoint at each epoch's end
    python examples/lightning_resume.py STORE --crash-at 20     # SIGKILLs itself once step 20 is stored
    python examples/lightning_resume.py STORE --resume RUN_ID   # the chosen checkpoint (else the newest), to the end

The same script starts and resumes: ``logger.checkpoint_path("resume")`` is
None for a new run, so ``fit`` starts from scratch; for a resumed one it is
the verified local copy of the checkpoint chosen in the notebook's
"Resume…" picker (else the newest). ``--crash-at`` ends the process the way
an OOM killer or a lost node does: no exception, no cleanup.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from launchhelm.lightning import LaunchHelmLogger

PROJECT = "lightning-quickstart"


def two_moons(n: int, seed: int) -> TensorDataset:
    """A two-class toy data set: two interleaved half circles."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=generator)
    angle = torch.rand(n, generator=generator) * math.pi
    x = torch.stack([torch.cos(angle) + labels, torch.sin(angle) * (1 - 2 * labels) + 0.3 * labels], dim=1)
    return TensorDataset(x + 0.1 * torch.randn(x.shape, generator=generator), labels.float())


class Classifier(L.LightningModule):
    def __init__(self, hidden: int = 32, lr: float = 0.05, dropout: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()  # recorded as the run's config
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(hidden, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        self.log_dict({"train/loss": loss, "train/accuracy": ((logits > 0).float() == y).float().mean()})
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class CrashAt(Callback):
    """SIGKILL this process once step ``step`` is stored (as an OOM killer would: no cleanup)."""

    def __init__(self, logger: LaunchHelmLogger, step: int) -> None:
        self.logger, self.step = logger, step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.logger.run.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--resume", help="id of the run to resume")
    parser.add_argument("--crash-at", type=int)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--root", default=None, help="where Lightning writes its local files")
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    loader = DataLoader(two_moons(256, seed=1), batch_size=64, shuffle=True)
    logger = LaunchHelmLogger(PROJECT, store=args.store, resume=args.resume)
    callbacks: list[Any] = [ModelCheckpoint(every_n_epochs=1, save_top_k=-1), logger.callback]
    if args.crash_at is not None:
        callbacks.append(CrashAt(logger, args.crash_at))
    trainer = L.Trainer(
        max_epochs=args.epochs,
        logger=logger,
        callbacks=callbacks,
        default_root_dir=args.root,
        accelerator="cpu",
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    ckpt_path = logger.checkpoint_path("resume")  # None for a new run: from scratch
    trainer.fit(Classifier(), loader, ckpt_path=ckpt_path, weights_only=True)
    print(f"run {logger.version} finished at step {trainer.global_step}", flush=True)
    logger.run.finish(close_run=False)


if __name__ == "__main__":
    main()
