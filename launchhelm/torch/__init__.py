"""LaunchHelm for PyTorch: checkpoints that restore everything, and crash resume.

::

    import launchhelm.torch as lht

    tr = lht.init("quickstart")                 # or resume=run_id after a crash
    tr.watch(model, optimizer, scheduler)       # optimizer.step() advances tr.global_step
    ...
    tr.save_checkpoint(extra={"batch": i})      # rank 0: artifact id
    extra = tr.load_checkpoint("latest")        # or "resume", an id, or a path

This is the only part of LaunchHelm that imports torch.
"""

from launchhelm._exceptions import CheckpointError
from launchhelm._types import Rewind
from launchhelm.torch._run import FORMAT_DISTRIBUTED, FORMAT_SHARDED, FORMAT_SINGLE, TorchRun, init
from launchhelm.torch._sharded import load_weights

__all__ = [
    "FORMAT_DISTRIBUTED",
    "FORMAT_SHARDED",
    "FORMAT_SINGLE",
    "CheckpointError",
    "Rewind",
    "TorchRun",
    "init",
    "load_weights",
]
