"""A tiny Lightning training job for the resume tests (run as a script).

A small LightningModule (dropout on, AdamW, a StepLR schedule) on random data
in a shuffled DataLoader; ``ModelCheckpoint`` saves at every epoch's end and
LaunchHelmLogger publishes each file.

    python lightning_worker.py STORE ROOT_DIR --epochs N [--resume RUN_ID] [--which latest|resume]
        [--out FINAL.pt] [--step-sleep S] [--no-callback] [--devices 2]

With ``--devices 2``: DDP over gloo (Lightning starts the second process), each
rank seeded differently at setup, so each rank's RNG streams differ and a
restore that gave a rank another rank's RNG would change the result.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from launchhelm.lightning import LaunchHelmLogger


class Tiny(L.LightningModule):
    def __init__(
        self, hidden: int = 32, lr: float = 1e-2, step_sleep: float = 0.0, per_rank_seed: bool = False
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(hidden, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def setup(self, stage: str) -> None:
        if self.hparams.per_rank_seed:  # before a restore (which sets the RNG back): distinct streams per rank
            torch.manual_seed(1000 + self.global_rank)

    def on_train_start(self) -> None:
        print(f"run {self.logger.version}" if self.global_rank == 0 else "rank 1 started", flush=True)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        print(f"step {self.trainer.global_step}", flush=True)
        time.sleep(self.hparams.step_sleep)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 5, gamma=0.7)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("root_dir")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--resume")
    parser.add_argument("--which", default="latest")
    parser.add_argument("--out")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--no-callback", action="store_true")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--auto", action="store_true", help="auto_resume: the same command on every launch")
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    data_gen = torch.Generator().manual_seed(123)
    dataset = TensorDataset(torch.randn(64, 6, generator=data_gen), torch.randn(64, 1, generator=data_gen))
    loader = DataLoader(dataset, batch_size=16, shuffle=True)
    model = Tiny(step_sleep=args.step_sleep, per_rank_seed=args.devices > 1)
    if args.auto:
        logger = LaunchHelmLogger("lightning-resume", store=args.store, auto_resume=True)
    else:
        logger = LaunchHelmLogger("lightning-resume", store=args.store, resume=args.resume)
    callbacks: list[Any] = [ModelCheckpoint(every_n_epochs=1, save_top_k=-1)]
    if not args.no_callback:
        callbacks.append(logger.callback)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        logger=logger,
        callbacks=callbacks,
        default_root_dir=args.root_dir,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    path = logger.checkpoint_path(args.which) if args.resume or args.auto else None
    print(f"path {path}", flush=True)
    if args.auto and trainer.is_global_zero:
        print(f"run {logger.run.id}", flush=True)
    trainer.fit(model, loader, ckpt_path=path, weights_only=True)
    if not trainer.is_global_zero:
        return
    if args.out:
        torch.save({"model": model.state_dict(), "optimizer": trainer.optimizers[0].state_dict()}, args.out)
    logger.run.finish(close_run=False)
    print("done", flush=True)


if __name__ == "__main__":
    main()
