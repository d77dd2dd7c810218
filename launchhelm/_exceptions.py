"""The exceptions LaunchHelm raises.

Every error derives from :class:`LaunchHelmError`, and each subclass also
inherits the built-in exception a caller would naturally catch, so
``except KeyError`` or ``except OSError`` keep working::

    LaunchHelmError
    ├── StorageError (OSError)
    │   ├── AlreadyExistsError (FileExistsError)
    │   ├── ObjectNotFoundError (FileNotFoundError)
    │   ├── CoordinationUnsupportedError
    │   ├── StoreUnreachableError (ConnectionError)
    │   ├── BucketNotFoundError
    │   └── StoreAccessDeniedError (PermissionError)
    ├── RunNotFoundError (KeyError)
    ├── EvaluationNotFoundError (KeyError)
    ├── EvaluationStateError (RuntimeError)
    ├── RunClosedError (RuntimeError)
    ├── RunInUseError (RuntimeError)
    ├── RunFinishedError (RuntimeError)
    ├── RunFencedError (RuntimeError)
    ├── RunIdentityError (ValueError)
    ├── RestartLoopError (RuntimeError)
    ├── InvalidArgumentError (ValueError)
    │   ├── InvalidMetricError
    │   └── InvalidMediaError
    ├── InvalidTypeError (TypeError)
    │   └── UnknownOptionError
    ├── TunableNotFoundError (KeyError)
    ├── PathNotFoundError (FileNotFoundError)
    ├── CheckpointError (RuntimeError)
    ├── UnsupportedFeatureError (NotImplementedError)
    ├── MissingExtraError (ModuleNotFoundError)
    ├── SourceReadError (ValueError)
    └── ImportFailedError (RuntimeError)

    SystemExit
    └── RunStopped (code 0)
        └── RunPreempted (code 128 + the signal)

Each carries the context needed to act on it (``url``, ``run_id``, ``step``)
and a message that says what happened and what to do next.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExistsError",
    "BucketNotFoundError",
    "CheckpointError",
    "CoordinationUnsupportedError",
    "EvaluationNotFoundError",
    "EvaluationStateError",
    "ImportFailedError",
    "InvalidArgumentError",
    "InvalidMediaError",
    "InvalidMetricError",
    "InvalidTypeError",
    "LaunchHelmError",
    "MissingExtraError",
    "ObjectNotFoundError",
    "PathNotFoundError",
    "RestartLoopError",
    "RunClosedError",
    "RunFencedError",
    "RunFinishedError",
    "RunIdentityError",
    "RunInUseError",
    "RunNotFoundError",
    "RunPreempted",
    "RunStopped",
    "SourceReadError",
    "StorageError",
    "StoreAccessDeniedError",
    "StoreUnreachableError",
    "TunableNotFoundError",
    "UnknownOptionError",
    "UnsupportedFeatureError",
]


class LaunchHelmError(Exception):
    """Root of every error LaunchHelm raises."""


class StorageError(LaunchHelmError, OSError):
    """The store could not do what was asked.

    Attributes
    ----------
    url:
        The full URL of the object or store involved, when known.
    """

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class AlreadyExistsError(StorageError, FileExistsError):
    """``create`` found the object already there: another writer won."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object does not exist in the store."""


class CoordinationUnsupportedError(StorageError):
    """The backend cannot do put-if-absent, so it cannot coordinate writers."""


class StoreUnreachableError(StorageError, ConnectionError):
    """The store's endpoint did not answer: wrong endpoint URL, network, proxy, or the service is down."""


class BucketNotFoundError(StorageError):
    """The bucket (S3, GCS) or container (Azure) in the store URL does not exist."""


class StoreAccessDeniedError(StorageError, PermissionError):
    """The store refused the credentials, or they do not allow this operation on this prefix."""


class RunNotFoundError(LaunchHelmError, KeyError):
    """No run with this id exists in the store."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class EvaluationNotFoundError(LaunchHelmError, KeyError):
    """No evaluation with this id is queued (see ``RunHandle.evaluations()``)."""

    def __init__(self, message: str, *, evaluation_id: str | None = None) -> None:
        super().__init__(message)
        self.evaluation_id = evaluation_id

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class EvaluationStateError(LaunchHelmError, RuntimeError):
    """The evaluation is not in a state that allows this (e.g. retrying one that did not fail)."""

    def __init__(self, message: str, *, evaluation_id: str | None = None, state: str | None = None) -> None:
        super().__init__(message)
        self.evaluation_id = evaluation_id
        self.state = state


class RunClosedError(LaunchHelmError, RuntimeError):
    """The run was closed with ``finish()`` and cannot be resumed."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunInUseError(LaunchHelmError, RuntimeError):
    """Another live session is attached to the run."""

    def __init__(self, message: str, *, run_id: str | None = None, session_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.session_id = session_id


class RestartLoopError(LaunchHelmError, RuntimeError):
    """``auto_resume`` refused a launch: the attempts before it kept failing without progress.

    Attributes
    ----------
    run_id:
        The run.
    attempts:
        The failed attempts, oldest first: dicts with ``session``, ``ending``,
        ``detail``, ``step`` (where it started) and ``checkpoint`` (the one
        it resumed from, if known).
    """

    def __init__(self, message: str, *, run_id: str, attempts: list[dict[str, object]]) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.attempts = attempts


class RunFinishedError(LaunchHelmError, RuntimeError):
    """This process already ended its session with the run (``finish()``)."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunFencedError(LaunchHelmError, RuntimeError):
    """A newer attempt of this job (a scheduler's relaunch) took the run over from this session.

    Nothing this session sends from then on appears in the run; the process
    should exit (the relaunch trains in its place).
    """

    def __init__(self, message: str, *, run_id: str | None = None, session_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        #: the session that replaced this one
        self.session_id = session_id


class RunIdentityError(LaunchHelmError, ValueError):
    """``auto_resume`` found a run under this job's id that another job or script created: refused, not merged."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunStopped(SystemExit):
    """Raised at a step boundary after ``RunHandle.control("stop")`` was applied.

    The session has already ended with ``finish(close_run=False)``: every
    point logged is stored and the run is resumable. It is a
    :class:`SystemExit` (code 0), so a script that does not catch it ends
    cleanly without a traceback, and a broad ``except Exception`` in the
    training loop does not swallow it. Catch it to clean up your own state.
    """

    def __init__(self, message: str, *, run_id: str | None = None, step: int | None = None) -> None:
        super().__init__(0)
        self.message = message
        self.run_id = run_id
        self.step = step

    def __str__(self) -> str:
        return self.message


class RunPreempted(RunStopped):
    """Raised at the step boundary after a preemption notice (``preemption=True``, or ``auto_resume``).

    Every rank has saved a checkpoint together and the session has ended as
    ``preempted``: the run is resumable and the next launch of the job
    continues from that checkpoint. Its exit status is ``128 + the signal``
    (143 for SIGTERM, 138 for SIGUSR1), non-zero so that torchrun, Kubernetes
    and Ray restart the job. The process is made to exit within
    ``preemption_budget`` seconds of the notice, even if this is caught.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        step: int | None = None,
        signal: str | None = None,
        checkpoint: str | None = None,
        exit_code: int = 1,
    ) -> None:
        super().__init__(message, run_id=run_id, step=step)
        self.code = exit_code
        #: the notice's signal name (``"SIGTERM"``)
        self.signal = signal
        #: the checkpoint saved for the relaunch (rank 0; None elsewhere or if none was saved)
        self.checkpoint = checkpoint


class InvalidArgumentError(LaunchHelmError, ValueError):
    """An argument has a value LaunchHelm cannot use (a malformed name, an unknown option, NaN...).

    ``except ValueError`` keeps catching it.
    """


class InvalidTypeError(LaunchHelmError, TypeError):
    """An argument is of the wrong type (a string where a number goes, a model where an optimizer goes...).

    ``except TypeError`` keeps catching it.
    """


class UnknownOptionError(InvalidTypeError):
    """A call that starts a run got a keyword it does not take: a misspelt option, most often.

    Raised before anything is written; ``except TypeError`` keeps catching it,
    as it catches Python's own unexpected-keyword error. See
    :class:`RunOptions` for the options there are.

    Attributes
    ----------
    option:
        The keyword given.
    suggestion:
        The valid name closest to it, or None when none is close.
    """

    def __init__(self, message: str, *, option: str, suggestion: str | None = None) -> None:
        super().__init__(message)
        self.option = option
        self.suggestion = suggestion


class InvalidMetricError(InvalidArgumentError):
    """A metric key or step is malformed (values of the wrong type raise :class:`InvalidTypeError`)."""


class InvalidMediaError(InvalidArgumentError):
    """An image, table or histogram given to ``log()`` cannot be stored (its shape, a NaN, its size...).

    Wrong types raise :class:`InvalidTypeError` and missing files
    :class:`PathNotFoundError`; every one names the key, and nothing of
    that ``log()`` call is recorded.

    Attributes
    ----------
    key:
        The metric key the media was logged under.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class TunableNotFoundError(LaunchHelmError, KeyError):
    """``set_tunables()`` named a tunable the run was not started with.

    ``except KeyError`` keeps catching it.
    """

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class PathNotFoundError(LaunchHelmError, FileNotFoundError):
    """A local file or folder LaunchHelm was given (or needs) does not exist.

    Objects missing from the store raise :class:`ObjectNotFoundError`
    instead. ``except FileNotFoundError`` catches both.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:  # OSError would format (errno, strerror)
        return str(self.args[0]) if self.args else ""


class CheckpointError(LaunchHelmError, RuntimeError):
    """A checkpoint could not be saved, found, verified or restored."""

    def __init__(self, message: str, *, run_id: str | None = None, step: int | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.step = step


class UnsupportedFeatureError(LaunchHelmError, NotImplementedError):
    """A feature of another tracker's API that LaunchHelm does not offer (``launchhelm.wandb``'s ``Artifact``...).

    The message names what to use instead. ``except NotImplementedError``
    keeps catching it.

    Attributes
    ----------
    feature:
        What was asked for, as the caller wrote it (``"wandb.Artifact"``).
    """

    def __init__(self, message: str, *, feature: str | None = None) -> None:
        super().__init__(message)
        self.feature = feature


class MissingExtraError(LaunchHelmError, ModuleNotFoundError):
    """An optional package a feature needs is not installed; the message names the extra that brings it.

    ``except ImportError`` keeps catching it.
    """

    def __init__(self, message: str, *, extra: str, package: str) -> None:
        super().__init__(message, name=package)
        self.extra = extra
        self.package = package

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class SourceReadError(LaunchHelmError, ValueError):
    """A run to import could not be read: a truncated or corrupt file, or data the source's reader refused.

    Attributes
    ----------
    source:
        The file, folder or URI that failed.
    """

    def __init__(self, message: str, *, source: str | None = None) -> None:
        super().__init__(message)
        self.source = source


class ImportFailedError(LaunchHelmError, RuntimeError):
    """Some runs of an import failed; the others were imported, and nothing of a failed run is visible.

    Attributes
    ----------
    failures:
        ``{source run: the exception}`` for each run that failed.
    result:
        The :class:`launchhelm.importers.ImportResult` of the runs that did import.
    """

    def __init__(self, message: str, *, failures: dict[str, BaseException], result: object = None) -> None:
        super().__init__(message)
        self.failures = failures
        self.result = result
