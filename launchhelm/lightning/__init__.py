"""LaunchHelm for PyTorch Lightning: a logger, and a callback that makes resume exact.

::

    from launchhelm.lightning import LaunchHelmLogger

    logger = LaunchHelmLogger("quickstart", resume=run_id)      # resume=None: a new run
    trainer = L.Trainer(logger=logger, callbacks=[ModelCheckpoint(every_n_epochs=1), logger.callback])
    trainer.fit(model, data, ckpt_path=logger.checkpoint_path("resume"), weights_only=True)

Needs the ``lightning`` extra (``pip install 'launchhelm[lightning]'``).
"""

from launchhelm.lightning._logger import RNG_FORMAT, LaunchHelmCallback, LaunchHelmLogger

__all__ = ["RNG_FORMAT", "LaunchHelmCallback", "LaunchHelmLogger"]
