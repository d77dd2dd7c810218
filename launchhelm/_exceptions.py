"""The exceptions LaunchHelm raises.

Every error derives from :class:`LaunchHelmError`, and each subclass also
inherits the built-in exception a caller would naturally catch, so
``except KeyError`` or ``except OSError`` keep working::

    LaunchHelmError
    ├── StorageError (OSError)
    │   ├── AlreadyExistsError (FileExistsError)
    │   ├── ObjectNotFoundError (FileNotFoundError)
    │   └── CoordinationUnsupportedError
    ├── RunNotFoundError (KeyError)
    ├── RunClosedError (RuntimeError)
    ├── RunInUseError (RuntimeError)
    ├── RunFinishedError (RuntimeError)
    ├── InvalidMetricError (ValueError)
    └── CheckpointError (RuntimeError)

Each carries the context needed to act on it (``url``, ``run_id``, ``step``)
and a message that says what happened and what to do next.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExistsError",
    "CheckpointError",
    "CoordinationUnsupportedError",
    "InvalidMetricError",
    "LaunchHelmError",
    "ObjectNotFoundError",
    "RunClosedError",
    "RunFinishedError",
    "RunInUseError",
    "RunNotFoundError",
    "StorageError",
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


class RunNotFoundError(LaunchHelmError, KeyError):
    """No run with this id exists in the store."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


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


class RunFinishedError(LaunchHelmError, RuntimeError):
    """This process already ended its session with the run (``finish()``)."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class InvalidMetricError(LaunchHelmError, ValueError):
    """A metric key or step is malformed (values of the wrong type raise TypeError)."""


class CheckpointError(LaunchHelmError, RuntimeError):
    """A checkpoint could not be saved, found, verified or restored."""

    def __init__(self, message: str, *, run_id: str | None = None, step: int | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.step = step
