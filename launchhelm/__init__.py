"""LaunchHelm: experiment tracking that survives crashes.

Write a run with :func:`init`, read and steer runs with :class:`Api`::

    import launchhelm as lh

    run = lh.init("quickstart", config={"lr": 3e-4})
    for step in range(100):
        run.global_step = step
        run.log({"loss": 1 / (step + 1)})
    run.finish()

    lh.Api().run(run.id).history()

Importing this package is cheap: torch, pandas, pyarrow, altair and IPython
are imported only where first needed.
"""

from typing import TYPE_CHECKING

from launchhelm._api import Api, RunHandle
from launchhelm._evaluation._handles import EvaluationHandle, ProjectHandle
from launchhelm._evaluation._worker import EvaluationContext, EvaluationWorker, evaluate
from launchhelm._exceptions import (
    AlreadyExistsError,
    BucketNotFoundError,
    CheckpointError,
    CoordinationUnsupportedError,
    EvaluationNotFoundError,
    EvaluationStateError,
    InvalidArgumentError,
    InvalidMediaError,
    InvalidMetricError,
    InvalidTypeError,
    LaunchHelmError,
    ObjectNotFoundError,
    PathNotFoundError,
    RestartLoopError,
    RunClosedError,
    RunFencedError,
    RunFinishedError,
    RunIdentityError,
    RunInUseError,
    RunNotFoundError,
    RunPreempted,
    RunStopped,
    StorageError,
    StoreAccessDeniedError,
    StoreUnreachableError,
    TunableNotFoundError,
    UnknownOptionError,
    UnsupportedFeatureError,
)
from launchhelm._options import RunOptions
from launchhelm._run import Run
from launchhelm._start import init
from launchhelm._types import Attempt, Checkpoint, Evaluation, Rewind
from launchhelm._version import __version__
from launchhelm.media import Histogram, Image, Media, MediaItem, Table

if TYPE_CHECKING:
    from launchhelm._ipython import IPythonShell

__all__ = [
    "AlreadyExistsError",
    "Api",
    "Attempt",
    "BucketNotFoundError",
    "Checkpoint",
    "CheckpointError",
    "CoordinationUnsupportedError",
    "Evaluation",
    "EvaluationContext",
    "EvaluationHandle",
    "EvaluationNotFoundError",
    "EvaluationStateError",
    "EvaluationWorker",
    "Histogram",
    "Image",
    "InvalidArgumentError",
    "InvalidMediaError",
    "InvalidMetricError",
    "InvalidTypeError",
    "LaunchHelmError",
    "Media",
    "MediaItem",
    "ObjectNotFoundError",
    "PathNotFoundError",
    "ProjectHandle",
    "RestartLoopError",
    "Rewind",
    "Run",
    "RunClosedError",
    "RunFencedError",
    "RunFinishedError",
    "RunHandle",
    "RunIdentityError",
    "RunInUseError",
    "RunNotFoundError",
    "RunOptions",
    "RunPreempted",
    "RunStopped",
    "StorageError",
    "StoreAccessDeniedError",
    "StoreUnreachableError",
    "Table",
    "TunableNotFoundError",
    "UnknownOptionError",
    "UnsupportedFeatureError",
    "__version__",
    "evaluate",
    "init",
]


def load_ipython_extension(ipython: "IPythonShell") -> None:
    """``%load_ext launchhelm``: register the ``%launchhelm`` magic (IPython is imported only here)."""
    from launchhelm._ipython import load_ipython_extension as load

    load(ipython)
