"""Lightning's ``logger.log_image`` and ``log_table`` (WandbLogger's signatures) store exact media.

What a user would notice if these failed: a LightningModule that logs its
samples with ``self.logger.log_image(...)`` (as it would with WandbLogger)
breaks, or its pictures and tables are missing or changed in the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import launchhelm as lh
from launchhelm.lightning import LaunchHelmLogger

SAMPLE = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)


class Sampler(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def on_train_epoch_end(self) -> None:
        epoch = self.current_epoch
        self.logger.log_image(  # type: ignore[union-attr]
            "samples", [SAMPLE + epoch, torch.zeros(3, 4, 5)], step=self.global_step, caption=[f"e{epoch}", "blank"]
        )
        self.logger.log_table(  # type: ignore[union-attr]
            "preds", columns=["epoch", "text"], data=[[epoch, f"<i>{epoch}</i>"]], step=self.global_step
        )

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_log_image_and_log_table_from_a_lightning_module(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    logger = LaunchHelmLogger("lightning-media", store=store)
    gen = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(16, 3, generator=gen), torch.randn(16, 1, generator=gen)), 8)
    trainer = L.Trainer(
        max_epochs=2,
        logger=logger,
        default_root_dir=str(tmp_path),
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Sampler(), loader)
    logger.run.finish()
    handle = lh.Api(store).run(logger.run.id)
    samples = handle.media("samples")
    assert [(i.step, i.index, i.caption) for i in samples] == [
        (2, 0, "e0"),
        (2, 1, "blank"),
        (4, 0, "e1"),
        (4, 1, "blank"),
    ]
    np.testing.assert_array_equal(samples[2].load(), SAMPLE + 1)
    np.testing.assert_array_equal(samples[1].load(), np.zeros((4, 5, 3), np.uint8))
    preds = handle.media("preds")
    assert [i.step for i in preds] == [2, 4]
    pd.testing.assert_frame_equal(preds[1].load(), pd.DataFrame({"epoch": [1], "text": ["<i>1</i>"]}))


def test_log_image_refuses_what_wandb_logger_would(tmp_path: Path) -> None:
    logger = LaunchHelmLogger("lightning-media", store=str(tmp_path / "store"))
    with pytest.raises(TypeError, match="list"):
        logger.log_image("samples", SAMPLE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="caption"):
        logger.log_image("samples", [SAMPLE], caption=["a", "b"])
    with pytest.raises(lh.InvalidMediaError, match="samples"):
        logger.log_image("samples", [np.zeros((2, 2, 5), np.uint8)])
    logger.run.finish()
    assert lh.Api(str(tmp_path / "store")).run(logger.run.id).media() == []
