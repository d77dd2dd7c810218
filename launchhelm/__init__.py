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

import importlib
from typing import TYPE_CHECKING, Any

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
from launchhelm._version import __version__

if TYPE_CHECKING:
    from launchhelm._api import Api, RunHandle
    from launchhelm._evaluation._handles import EvaluationHandle, ProjectHandle
    from launchhelm._evaluation._worker import EvaluationContext, EvaluationWorker, evaluate
    from launchhelm._ipython import IPythonShell
    from launchhelm._run import Run
    from launchhelm._start import init
    from launchhelm._types import Attempt, Checkpoint, Evaluation, Rewind
    from launchhelm.media import Histogram, Image, Media, MediaItem, Table

#: Names loaded on first use (PEP 562): ``import launchhelm`` stays a few modules, and a process that only
#: writes (the helper, a worker) never loads the readers, nor a notebook that only reads the writer.
_LAZY = {
    "Api": "launchhelm._api",
    "RunHandle": "launchhelm._api",
    "EvaluationHandle": "launchhelm._evaluation._handles",
    "ProjectHandle": "launchhelm._evaluation._handles",
    "EvaluationContext": "launchhelm._evaluation._worker",
    "EvaluationWorker": "launchhelm._evaluation._worker",
    "evaluate": "launchhelm._evaluation._worker",
    "Run": "launchhelm._run",
    "init": "launchhelm._start",
    "Attempt": "launchhelm._types",
    "Checkpoint": "launchhelm._types",
    "Evaluation": "launchhelm._types",
    "Rewind": "launchhelm._types",
    "Histogram": "launchhelm.media",
    "Image": "launchhelm.media",
    "Media": "launchhelm.media",
    "MediaItem": "launchhelm.media",
    "Table": "launchhelm.media",
}


# not seen by type checkers: a misspelt name (``lh.inti``) must stay an error there, not an Any
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
            globals()[name] = value  # once: later reads are plain attribute reads
            return value
        try:  # a submodule read as an attribute (``lh.storage``) before anything imported it
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})


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
