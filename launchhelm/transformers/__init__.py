"""LaunchHelm for Hugging Face Transformers: one callback on the ``Trainer``.

::

    from launchhelm.transformers import LaunchHelmCallback

    callback = LaunchHelmCallback("quickstart", resume=run_id)   # resume=None: a new run
    trainer = Trainer(model, args, train_dataset=data, callbacks=[callback])
    trainer.train(resume_from_checkpoint=callback.checkpoint_folder("resume"))  # None: from scratch

Needs the ``transformers`` extra (``pip install 'launchhelm[transformers]'``).
"""

from launchhelm.transformers._callback import LaunchHelmCallback

__all__ = ["LaunchHelmCallback"]
