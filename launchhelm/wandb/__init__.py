"""W&B's API on LaunchHelm: ``import launchhelm.wandb as wandb``, and a W&B script runs unchanged.

The part of W&B's API that training scripts use, with W&B's meaning:
``init`` (``config``, ``id``/``resume``, ``resume_from``, ``mode``...),
``log`` with W&B's implicit and explicit steps and ``commit=False``,
``config``, ``summary``, ``define_metric``, ``finish``, ``wandb.run``.
``Image``, ``Table`` and ``Histogram`` are stored as the run's media
(``launchhelm.RunHandle.media()``); other media objects are accepted and
skipped (one warning per type); ``watch``,
``save`` and ``login`` are no-ops; artifacts, sweeps and the public API are
refused with :class:`~launchhelm.UnsupportedFeatureError` naming what to use
instead. No part of W&B's package is needed or imported. See
``docs/compat.md`` for the full table, and :func:`stored` to read back what a
run stored beyond its metrics.

Examples
--------
>>> import launchhelm.wandb as wandb
>>> run = wandb.init(project="quickstart", config={"lr": 3e-4}, store="memory://wandb-pkg-doc")
>>> wandb.config.batch_size = 64
>>> for i in range(3):
...     wandb.log({"loss": 1 / (i + 1)})
>>> wandb.summary["best_loss"] = 1 / 3
>>> wandb.finish()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import NoReturn

from launchhelm._exceptions import LaunchHelmError, UnsupportedFeatureError
from launchhelm.wandb._config import Config, ConfigError, ConfigKeyError, Metric, Summary
from launchhelm.wandb._liverun import Run, _on_current, compat_key, current
from launchhelm.wandb._objects import (
    REFUSED,
    Audio,
    Graph,
    Histogram,
    Html,
    Image,
    Media,
    Molecule,
    Object3D,
    Plotly,
    Settings,
    Table,
    Video,
    WandbUsageError,
    plot,
    refuse,
)
from launchhelm.wandb._sdk import StoredRun, init, stored

__all__ = [
    "REFUSED",
    "Api",
    "Artifact",
    "Audio",
    "Config",
    "ConfigError",
    "ConfigKeyError",
    "Error",
    "Graph",
    "Histogram",
    "Html",
    "Image",
    "Media",
    "Metric",
    "Molecule",
    "Object3D",
    "Plotly",
    "Run",
    "Settings",
    "StoredRun",
    "Summary",
    "Table",
    "UnsupportedFeatureError",
    "Video",
    "WandbUsageError",
    "agent",
    "alert",
    "compat_key",
    "config",
    "controller",
    "define_metric",
    "finish",
    "init",
    "log",
    "login",
    "plot",
    "restore",
    "run",
    "save",
    "setup",
    "stored",
    "summary",
    "sweep",
    "termerror",
    "termlog",
    "termwarn",
    "unwatch",
    "watch",
]

#: W&B's root error; every error ``launchhelm.wandb`` raises is one.
Error = LaunchHelmError


class _PreInit:
    """What ``wandb.config`` and ``wandb.summary`` are before ``init``: any use says to call ``init`` first."""

    _name: str

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise WandbUsageError(f"call launchhelm.wandb.init() before using wandb.{self._name}")

    __getitem__ = __setattr__ = __setitem__ = __contains__ = __iter__ = _refuse

    def __getattr__(self, key: str) -> NoReturn:
        if key.startswith("__"):  # introspection (hasattr, inspect, doctest) is not a use
            raise ConfigKeyError(key)
        self._refuse()

    def __repr__(self) -> str:
        return f"<wandb.{self._name} before init()>"


#: The current run (None before ``init()`` and after ``finish()``), as ``wandb.run``.
run: Run | None = None
#: The current run's config, as ``wandb.config``.
config: Config | _PreInit = _PreInit("config")
#: The current run's summary, as ``wandb.summary``.
summary: Summary | _PreInit = _PreInit("summary")


def _follow(current_run: Run | None) -> None:
    global run, config, summary
    run = current_run
    # after finish(), as in W&B, wandb.config and wandb.summary are those of no run again
    config = current_run.config if current_run is not None else _PreInit("config")
    summary = current_run.summary if current_run is not None else _PreInit("summary")


_on_current.append(_follow)


def _require() -> Run:
    found = current()
    if found is None:
        raise WandbUsageError("call launchhelm.wandb.init() before wandb.log() and the other run functions")
    return found


def log(
    data: Mapping[str, object], step: int | None = None, commit: bool | None = None, sync: bool | None = None
) -> None:
    """``wandb.log``: :meth:`Run.log` on the current run."""
    _require().log(data, step=step, commit=commit, sync=sync)


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """``wandb.finish``: :meth:`Run.finish` on the current run (nothing if there is none)."""
    found = current()
    if found is not None:
        found.finish(exit_code=exit_code, quiet=quiet)


def define_metric(
    name: str,
    step_metric: str | Metric | None = None,
    step_sync: bool | None = None,
    hidden: bool | None = None,
    summary: str | None = None,
    goal: str | None = None,
    overwrite: bool | None = None,
) -> Metric:
    """``wandb.define_metric``: :meth:`Run.define_metric` on the current run."""
    return _require().define_metric(name, step_metric, step_sync, hidden, summary, goal, overwrite)


def watch(models: object = None, *args: object, **kwargs: object) -> None:
    """``wandb.watch``: accepted, does nothing (see :meth:`Run.watch`)."""
    return None


def unwatch(models: object = None) -> None:
    """``wandb.unwatch``: accepted, does nothing."""
    return None


def save(glob_str: str | os.PathLike[str] | None = None, *args: object, **kwargs: object) -> list[str]:
    """``wandb.save``: uploads nothing (see :meth:`Run.save`)."""
    found = current()
    return found.save(glob_str, *args, **kwargs) if found is not None else []


def alert(title: str = "", text: str = "", *args: object, **kwargs: object) -> None:
    """``wandb.alert``: written to the log (see :meth:`Run.alert`)."""
    _require().alert(title, text)


def login(*args: object, **kwargs: object) -> bool:
    """``wandb.login``: nothing to log in to; returns True."""
    return True


def setup(*args: object, **kwargs: object) -> None:
    """``wandb.setup``: nothing to set up."""
    return None


def termlog(message: str = "", *args: object, **kwargs: object) -> None:
    """``wandb.termlog``: prints ``wandb: message`` to stderr."""
    print(f"wandb: {message}", file=sys.stderr)


def termwarn(message: str = "", *args: object, **kwargs: object) -> None:
    """``wandb.termwarn``: prints ``wandb: WARNING message`` to stderr."""
    print(f"wandb: WARNING {message}", file=sys.stderr)


def termerror(message: str = "", *args: object, **kwargs: object) -> None:
    """``wandb.termerror``: prints ``wandb: ERROR message`` to stderr."""
    print(f"wandb: ERROR {message}", file=sys.stderr)


class Artifact:
    """``wandb.Artifact``: refused with :class:`~launchhelm.UnsupportedFeatureError` (see :data:`REFUSED`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        refuse("Artifact")


class Api:
    """``wandb.Api``: refused; read runs with :class:`launchhelm.Api` (see :data:`REFUSED`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        refuse("Api")


def sweep(*args: object, **kwargs: object) -> NoReturn:
    """``wandb.sweep``: refused (see :data:`REFUSED`)."""
    refuse("sweep")


def agent(*args: object, **kwargs: object) -> NoReturn:
    """``wandb.agent``: refused (see :data:`REFUSED`)."""
    refuse("agent")


def controller(*args: object, **kwargs: object) -> NoReturn:
    """``wandb.controller``: refused (see :data:`REFUSED`)."""
    refuse("controller")


def restore(*args: object, **kwargs: object) -> NoReturn:
    """``wandb.restore``: refused (see :data:`REFUSED`)."""
    refuse("restore")
