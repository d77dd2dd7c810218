"""W&B's run API with W&B's meaning, written to a LaunchHelm run.

What maps where (see docs/compat.md for the user-facing table):

- ``init`` opens the store and fixes the run's id and name at once, but
  creates the LaunchHelm run at the first ``log()`` (or ``finish()``, or
  exit), so ``config.update()`` right after ``init`` lands in the run's own
  config (``run.json``, what ``Api.runs`` and ``RunHandle.config`` show). A
  resumed run is reopened at once.
- W&B's step is LaunchHelm's ``global_step``: each committed row is logged
  at its step in one ``Run.log`` call.
- What LaunchHelm's run has no place for (config changed after the run
  started, the W&B summary, ``define_metric`` records, tags, notes, the exit
  code) is one JSON object per run, ``runs/<id>/compat/wandb.json``, put by
  the live session from its metric flushes (at most every 10 s) and at
  ``finish()`` (single writer, as the run's summary), read back with
  :func:`stored`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import launchhelm as lh
from launchhelm._compat import RECORD_INTERVAL, read_compat
from launchhelm._compat import CompatSession as _Session
from launchhelm._compat import compat_key as _compat_key
from launchhelm._exceptions import (
    InvalidArgumentError,
    InvalidMetricError,
    InvalidTypeError,
    LaunchHelmError,
    RunNotFoundError,
)
from launchhelm._integration import plain_config, record_restore
from launchhelm._run import _default_name, _new_run_id, start_run
from launchhelm._run import _install_exit_hook as _install_launchhelm_exit_hook
from launchhelm.metrics._points import coerce_value, validate_key
from launchhelm.runlog._events import validate_project
from launchhelm.storage import Store, open_store
from launchhelm.wandb._objects import Media, Settings, WandbUsageError, refuse

__all__ = [
    "COMPAT_FORMAT",
    "Config",
    "ConfigError",
    "ConfigKeyError",
    "Metric",
    "Run",
    "StoredRun",
    "Summary",
    "compat_key",
    "init",
    "stored",
]

_log = logging.getLogger("launchhelm")

COMPAT_FORMAT = "launchhelm.wandb/1"
#: Summary modes ``define_metric(summary=...)`` takes, as W&B does.
SUMMARY_MODES = ("min", "max", "mean", "best", "last", "first", "none", "copy")
_RUN_ID_RE = re.compile(r"^[a-z0-9]{4,64}$")
_PROJECT_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_STEP_RE = re.compile(r"^([^?]+)\?_step=(\d+)$")


def compat_key(run_id: str) -> str:
    """The key of a run's W&B record (config changes, summary, metric definitions, tags, notes, exit code)."""
    return _compat_key(run_id, "wandb")


class ConfigError(InvalidArgumentError):
    """A config value changed without ``allow_val_change=True``, as W&B refuses it."""


class ConfigKeyError(LaunchHelmError, AttributeError, KeyError):
    """No such config key (``except KeyError`` and ``getattr(config, k, default)`` both work)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


# -- helpers ---------------------------------------------------------------------
def launchhelm_run_id(wandb_id: str) -> str:
    """The LaunchHelm run id for a W&B ``id=``: itself when it is one, else a stable readable digest.

    LaunchHelm ids are 4-64 lowercase letters and digits; W&B also allows
    upper case, ``-`` and ``_``. The same W&B id always maps to the same
    LaunchHelm id, so ``resume=`` finds the run again.
    """
    if not isinstance(wandb_id, str) or not wandb_id.strip():
        raise InvalidArgumentError(f"id={wandb_id!r}: pass a non-empty string")
    if _RUN_ID_RE.fullmatch(wandb_id):
        return wandb_id
    readable = re.sub(r"[^a-z0-9]", "", wandb_id.lower())[:48]
    return f"{readable}x{hashlib.sha256(wandb_id.encode()).hexdigest()[:10]}"


def project_name(project: str | None) -> str:
    """W&B's project name as a LaunchHelm project: characters LaunchHelm refuses become ``-``."""
    if project is None:
        project = os.environ.get("LAUNCHHELM_PROJECT") or os.environ.get("WANDB_PROJECT") or "uncategorized"
    if not isinstance(project, str):
        raise InvalidTypeError(f"project={project!r}: pass a string")
    name = _PROJECT_BAD.sub("-", project.strip()).strip("-._")[:128]
    return validate_project(name or "uncategorized")


def _as_mapping(values: Any, what: str) -> dict[str, Any]:
    """A config given as W&B takes it: a dict, an argparse Namespace or any object with ``__dict__``."""
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return dict(values)
    if isinstance(values, str):
        raise InvalidTypeError(
            f"{what}={values!r}: config files are not read by launchhelm.wandb; load the file and pass a dict"
        )
    if hasattr(values, "__dict__"):
        return {k: v for k, v in vars(values).items() if not k.startswith("_")}
    raise InvalidTypeError(f"{what} is a {type(values).__name__}; pass a dict or an argparse.Namespace")


def _plain(value: Any) -> Any:
    return plain_config({"v": value})["v"]


def _summary_value(value: Any) -> Any:
    """A logged value as the summary keeps it: numbers as numbers, strings and bools as they are."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value
    return coerce_value("summary", value)


def _flatten(
    data: Mapping[str, Any], path: tuple[str, ...], out: dict[str, Any], paths: dict[str, tuple[str, ...]]
) -> None:
    # history shows a nested dict's leaves as "outer.inner"; the summary keeps them nested, as W&B's
    for key, value in data.items():
        if not isinstance(key, str):
            raise InvalidTypeError(f"log() keys are strings; got {type(key).__name__} {key!r}")
        if isinstance(value, Mapping):
            _flatten(value, (*path, key), out, paths)
        else:
            name = ".".join((*path, key))
            out[name] = value
            if path:
                paths[name] = (*path, key)


# -- config and summary ---------------------------------------------------------
class Config:
    """``run.config``: W&B's config, with attribute and item access.

    Changing a value already set raises :class:`ConfigError` unless
    ``update(..., allow_val_change=True)``, as W&B does. Values are kept as
    plain JSON (numbers, strings, bools, lists, dicts; anything else as its
    ``str``).
    """

    def __init__(self, values: Mapping[str, Any] | None = None, on_change: Callable[[], None] | None = None) -> None:
        object.__setattr__(self, "_items", {})
        object.__setattr__(self, "_on_change", on_change)
        if values:
            self._items.update(plain_config(values))

    def _set(self, key: str, value: Any, allow_val_change: bool | None) -> None:
        if not isinstance(key, str):
            raise InvalidTypeError(f"config keys are strings; got {type(key).__name__} {key!r}")
        key = key.strip("-")  # W&B strips the dashes of argparse-style names
        value = _plain(value)
        if not allow_val_change and key in self._items and self._items[key] != value:
            raise ConfigError(
                f"config[{key!r}] is {self._items[key]!r}; refusing to change it to {value!r}: pass "
                "allow_val_change=True to config.update() to change it"
            )
        self._items[key] = value

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def update(self, values: Any, allow_val_change: bool | None = None) -> None:
        """Add or set keys (a dict, an argparse Namespace or an object's attributes)."""
        for key, value in _as_mapping(values, "config").items():
            self._set(key, value, allow_val_change)
        self._changed()

    def setdefaults(self, values: Mapping[str, Any]) -> None:
        """Set the keys not set yet."""
        for key, value in _as_mapping(values, "config").items():
            if key.strip("-") not in self._items:
                self._set(key, value, False)
        self._changed()

    def as_dict(self) -> dict[str, Any]:
        """A copy of the config as a plain dict."""
        return json.loads(json.dumps(self._items))  # type: ignore[no-any-return]

    _as_dict = as_dict

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        return self._items.get(key, default)

    def keys(self) -> Any:
        """The config's keys."""
        return self._items.keys()

    def items(self) -> Any:
        """The config's items."""
        return self._items.items()

    def values(self) -> Any:
        """The config's values."""
        return self._items.values()

    def __getitem__(self, key: str) -> Any:
        try:
            return self._items[key]
        except KeyError:
            raise ConfigKeyError(f"config has no key {key!r} (keys: {', '.join(sorted(self._items))})") from None

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise ConfigKeyError(key)
        return self[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._set(key, value, None)
        self._changed()

    __setattr__ = __setitem__

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"launchhelm.wandb.Config({self._items!r})"


class Summary:
    """``run.summary``: each metric's last logged value unless set explicitly (W&B's meaning).

    ``summary["best_acc"] = 0.93`` sets a value; logging ``best_acc`` later
    replaces it, as in W&B. A metric given ``define_metric(summary="max")``
    keeps ``{"max": ...}`` instead of its last value.
    """

    _owner: Run

    def __init__(self, owner: Run) -> None:
        object.__setattr__(self, "_owner", owner)

    @property
    def _items(self) -> dict[str, Any]:
        return self._owner._summary

    def __getitem__(self, key: str) -> Any:
        try:
            return self._items[key]
        except KeyError:
            raise ConfigKeyError(f"summary has no key {key!r}") from None

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise ConfigKeyError(key)
        return self[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise InvalidTypeError(f"summary keys are strings; got {type(key).__name__} {key!r}")
        plain = _plain(value) if not isinstance(value, Media) else repr(value)
        with self._owner._lock:
            self._items[key] = plain
            self._owner._dirty = True

    __setattr__ = __setitem__

    def __delitem__(self, key: str) -> None:
        with self._owner._lock:
            del self._items[key]
            self._owner._dirty = True

    def update(self, values: Mapping[str, Any]) -> None:
        """Set several values."""
        for key, value in dict(values).items():
            self[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        return self._items.get(key, default)

    def keys(self) -> Any:
        """The summary's keys."""
        return self._items.keys()

    def items(self) -> Any:
        """The summary's items."""
        return self._items.items()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"launchhelm.wandb.Summary({self._items!r})"


class Metric:
    """What ``define_metric`` recorded: ``name`` plotted against ``step_metric``, summarised by ``summary``."""

    def __init__(
        self,
        name: str,
        step_metric: str | None,
        summary: list[str],
        goal: str | None,
        hidden: bool,
        step_sync: bool,
    ) -> None:
        self.name = name
        self.step_metric = step_metric
        self.summary = summary
        self.goal = goal
        self.hidden = hidden
        self.step_sync = step_sync

    def as_record(self) -> dict[str, Any]:
        """As stored in the run's W&B record."""
        return {
            "step_metric": self.step_metric,
            "summary": list(self.summary),
            "goal": self.goal,
            "hidden": self.hidden,
            "step_sync": self.step_sync,
        }

    def __repr__(self) -> str:
        return f"<launchhelm.wandb.Metric {self.name!r} step_metric={self.step_metric!r} summary={self.summary!r}>"


class _Aggregate:
    __slots__ = ("count", "first", "last", "max", "min", "total")

    def __init__(self, value: float) -> None:
        self.first = self.last = self.min = self.max = value
        self.total = value
        self.count = 1

    def add(self, value: float) -> None:
        self.last = value
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        self.total += value
        self.count += 1

    def value(self, mode: str, goal: str | None) -> float:
        if mode == "best":
            return self.max if goal == "maximize" else self.min
        if mode == "mean":
            return self.total / self.count
        return float(getattr(self, "last" if mode == "copy" else mode))


# -- the run ---------------------------------------------------------------------
_current_lock = threading.Lock()
_on_current: list[Callable[[Run | None], None]] = []


class Run:
    """A W&B run written to LaunchHelm (what ``launchhelm.wandb.init`` returns).

    Attributes
    ----------
    id, name, project:
        ``id`` is the LaunchHelm run id (the W&B ``id=`` itself when it is
        4-64 lowercase letters and digits); ``wandb_id`` the id as given.
    config:
        :class:`Config`; ``summary``: :class:`Summary`.
    step:
        The step the next ``log()`` goes to.
    """

    def __init__(
        self,
        *,
        store: Store | None,
        project: str,
        run_id: str,
        wandb_id: str,
        name: str,
        config: Mapping[str, Any],
        tags: list[str],
        notes: str | None,
        group: str | None,
        job_type: str | None,
        directory: str | None,
        settings: Any,
        init_options: dict[str, Any],
        disabled: bool,
    ) -> None:
        self._store = store
        self.project = project
        self.id = run_id
        self.wandb_id = wandb_id
        self._name = name
        self.tags = tuple(tags)
        self.notes = notes
        self.group = group
        self.job_type = job_type
        self.settings = settings
        self.disabled = disabled
        self.offline = True
        self.entity: str | None = None
        self.url: str | None = None
        self.resumed = False
        self.start_time = time.time()
        self._directory = directory
        self._init_options = init_options
        self._lock = threading.Lock()
        self._lh: _Session | None = None
        self._created_config: dict[str, Any] = {}
        self.config = Config(config, on_change=self._config_changed)
        self._summary: dict[str, Any] = {}
        self.summary = Summary(self)
        self._metrics: dict[str, Metric] = {}
        self._resolved: dict[str, Metric | None] = {}  # metric key -> its definition (globs resolved once)
        self._aggregates: dict[str, _Aggregate] = {}
        self._keys: dict[str, str | None] = {}  # W&B key -> LaunchHelm metric key (None: not storable)
        self._paths: dict[str, tuple[str, ...]] = {}  # "outer.inner" -> where the summary keeps it
        self._step = 0
        self._pending: dict[str, Any] = {}
        self._dirty = True
        self._last_put = -math.inf  # monotonic time of the last put of the W&B record
        self._exit_code: int | None = None
        self._finished = False
        self._warned: set[str] = set()

    # -- identity ------------------------------------------------------------
    @property
    def name(self) -> str:
        """The display name (settable, as in W&B: the new name is kept in the W&B record)."""
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        if not isinstance(value, str) or not value.strip():
            raise InvalidArgumentError(f"name={value!r}: give a non-empty string")
        self._name = value
        self._dirty = True

    @property
    def step(self) -> int:
        """W&B's current step: where the next ``log()`` without ``step=`` goes."""
        return self._step

    @property
    def path(self) -> str:
        """``project/id``."""
        return f"{self.project}/{self.id}"

    @property
    def dir(self) -> str:
        """A local folder for the run's files (``<dir>/wandb/run-<id>/files``, made on first use)."""
        base = Path(self._directory or ".") / "wandb" / f"run-{self.id}" / "files"
        base.mkdir(parents=True, exist_ok=True)
        return str(base)

    @property
    def launchhelm_run(self) -> lh.Run:
        """The LaunchHelm run underneath (created now if no ``log()`` has created it yet)."""
        if self.disabled:
            raise WandbUsageError("a run started with mode='disabled' has no LaunchHelm run")
        return self._start()

    def __repr__(self) -> str:
        state = "disabled" if self.disabled else ("finished" if self._finished else "live")
        return f"<launchhelm.wandb.Run {self.project}/{self.id} {self._name!r} step={self._step} {state}>"

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.finish(exit_code=0 if exc is None else 1)

    # -- starting ------------------------------------------------------------
    def _start(self) -> _Session:
        if self._lh is not None:
            return self._lh
        assert self._store is not None
        config = self.config.as_dict()
        run = start_run(
            _Session,
            self.project,
            name=self._name,
            config=config,
            store=self._store,
            run_id=self.id,
            **self._init_options,
        )
        self._attach(run, config)
        return run

    def _attach(self, run: _Session, created_config: Mapping[str, Any]) -> None:
        self._created_config = dict(created_config)
        run.after_flush = self._put_record
        self._lh = run
        self._dirty = True
        _install_exit_hook()  # after LaunchHelm's own (installed by start_run): ours then runs first

    def _config_changed(self) -> None:
        self._dirty = True

    def _record(self) -> dict[str, Any]:
        with self._lock:
            return {
                "format": COMPAT_FORMAT,
                "run": self.id,
                "wandb_id": self.wandb_id,
                "name": self._name,
                "config": self.config.as_dict(),
                "summary": json.loads(json.dumps(self._summary)),
                "metrics": {name: metric.as_record() for name, metric in self._metrics.items()},
                "tags": list(self.tags),
                "notes": self.notes,
                "group": self.group,
                "job_type": self.job_type,
                "step": self._step,
                "exit_code": self._exit_code,
                "time": time.time(),
            }

    def _put_record(self, force: bool = False) -> None:
        """Put the W&B record if anything changed: from the session's flush thread at most every
        :data:`~launchhelm._compat.RECORD_INTERVAL` seconds, and at ``finish()`` (``force``)."""
        if not self._dirty or self._lh is None or self._store is None:
            return
        now = time.monotonic()
        if not force and now - self._last_put < RECORD_INTERVAL:
            return
        self._dirty = False
        try:
            body = json.dumps(self._record(), separators=(",", ":"), allow_nan=True).encode()
            self._store.put(compat_key(self.id), body)
            self._last_put = now
        except BaseException:
            self._dirty = True
            raise

    # -- logging -------------------------------------------------------------
    def log(
        self,
        data: Mapping[str, Any],
        step: int | None = None,
        commit: bool | None = None,
        sync: bool | None = None,
    ) -> None:
        """Log a row of values at W&B's step.

        ``step=None``: the current step; the row is committed (written, and
        the step advanced) unless ``commit=False``, which keeps adding to the
        same row. An explicit ``step`` above the current one commits the
        pending row first and moves there; its row waits for a later step,
        ``commit=True`` or ``finish()`` (W&B's default ``commit=False`` with a
        step). A ``step`` below the current one is dropped with W&B's
        warning. Numbers are stored; media, tables, histograms and strings
        are skipped (one warning per type), strings kept in the summary.
        """
        if self._finished:
            raise WandbUsageError(
                f"run {self.id} is finished; start another with launchhelm.wandb.init() (resume='allow', "
                f"id={self.wandb_id!r} to continue this one)"
            )
        if not isinstance(data, Mapping):
            raise InvalidTypeError(f"log() takes a dict of values, not {type(data).__name__}")
        flat: dict[str, Any] = {}
        _flatten(data, (), flat, self._paths)
        if step is not None:
            if isinstance(step, bool) or not hasattr(step, "__index__") or int(step) < 0:
                raise InvalidMetricError(f"step={step!r}: steps are non-negative integers")
            step = int(step)
            if step < self._step:
                _log.warning(
                    "launchhelm.wandb: tried to log to step %d that is less than the current step %d. Steps must "
                    "be monotonically increasing, so this data will be ignored (as W&B does).",
                    step,
                    self._step,
                )
                return
            if step > self._step:
                if self._pending:
                    self._commit()
                self._step = step
            self._pending.update(flat)
            if commit:
                self._commit()
            return
        self._pending.update(flat)
        if commit is None or commit:
            self._commit()

    def _commit(self) -> None:
        """Write the pending row at the current step and advance it."""
        row, self._pending = self._pending, {}
        step = self._step
        self._step = step + 1
        if self.disabled:
            self._note_summary(row)
            return
        run = self._start()
        values: dict[str, float] = {}
        for key, value in row.items():
            stored = self._store_key(key)
            if isinstance(value, Media):
                self._warn_once(type(value).__name__, key)
                continue
            if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
                number: float | None = float(value)
            else:
                try:
                    number = coerce_value(key, value)
                except InvalidTypeError:
                    number = None
                    if value is not None:
                        self._warn_once(type(value).__name__, key)
            if number is not None and stored is not None:
                values[stored] = number
        self._note_summary(row)
        if run.global_step != step:
            run.global_step = step  # a step boundary: pause, stop and tunable changes apply here
        if values:
            run.log(values)
        self._dirty = True

    def _store_key(self, key: str) -> str | None:
        known = self._keys.get(key, "")
        if known != "":
            return known
        stored: str | None = key
        try:
            validate_key(key)
        except InvalidMetricError:
            try:
                # history's own column names ("step", "time"...) are kept under wandb/; bad segments dropped
                parts = [p for p in key.split("/") if p not in ("", ".", "..")]
                stored = validate_key("wandb/" + "/".join(parts) if len(parts) == 1 else "/".join(parts))
            except InvalidMetricError:
                stored = None
                self._warn_once(f"key {key!r}", key)
        if stored is not None and stored != key:
            _log.warning("launchhelm.wandb: metric %r is stored as %r (LaunchHelm reserves the name)", key, stored)
        self._keys[key] = stored
        return stored

    def _warn_once(self, kind: str, key: str) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        _log.warning(
            "launchhelm.wandb: skipped %s value logged as %r: LaunchHelm stores numbers; further %s values are "
            "skipped without a warning (docs/compat.md)",
            kind,
            key,
            kind,
        )

    def _definition(self, key: str) -> Metric | None:
        if key in self._resolved:
            return self._resolved[key]
        found = self._metrics.get(key)
        if found is None:
            for name, metric in self._metrics.items():
                if "*" in name and fnmatch.fnmatchcase(key, name):
                    found = metric
                    break
        self._resolved[key] = found
        return found

    def _note_summary(self, row: Mapping[str, Any]) -> None:
        with self._lock:
            for key, value in row.items():
                if isinstance(value, Media):
                    continue
                try:
                    plain = _summary_value(value)
                except (InvalidTypeError, TypeError, ValueError):
                    continue
                path = self._paths.get(key)
                where, leaf = self._summary, key
                if path is not None:
                    for part in path[:-1]:
                        inner = where.get(part)
                        if not isinstance(inner, dict):
                            inner = where[part] = {}
                        where = inner
                    leaf = path[-1]
                metric = self._definition(key) if self._metrics else None
                if metric is None or not metric.summary or metric.summary == ["last"]:
                    where[leaf] = plain
                elif "none" in metric.summary:
                    where.pop(leaf, None)
                elif isinstance(plain, bool) or not isinstance(plain, (int, float)):
                    where[leaf] = plain
                else:
                    aggregate = self._aggregates.get(key)
                    if aggregate is None:
                        aggregate = self._aggregates[key] = _Aggregate(float(plain))
                    else:
                        aggregate.add(float(plain))
                    where[leaf] = {mode: aggregate.value(mode, metric.goal) for mode in metric.summary}

    def define_metric(
        self,
        name: str,
        step_metric: str | Metric | None = None,
        step_sync: bool | None = None,
        hidden: bool | None = None,
        summary: str | None = None,
        goal: str | None = None,
        overwrite: bool | None = None,
    ) -> Metric:
        """Record how a metric is plotted (against ``step_metric``) and summarised.

        ``name`` may end in ``*`` (``"eval/*"``). The record is stored in the
        run's W&B record (``stored(run_id).metrics``); values are logged as
        given (LaunchHelm does not insert the step metric into rows that lack
        it: pair them on ``step``, forward-filling the step metric).
        ``summary`` takes W&B's modes (``"min,max"``, ``"best"`` with
        ``goal``...); the summary then holds ``{"min": ..., "max": ...}``.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"define_metric() takes a metric name, not {name!r}")
        if isinstance(step_metric, Metric):
            step_metric = step_metric.name
        if step_metric is not None and not isinstance(step_metric, str):
            raise InvalidTypeError(f"step_metric={step_metric!r}: pass a metric name")
        modes = [m.strip() for m in (summary or "").split(",") if m.strip()]
        unknown = [m for m in modes if m not in SUMMARY_MODES]
        if unknown:
            raise InvalidArgumentError(
                f"define_metric({name!r}, summary={summary!r}): unknown mode {unknown[0]!r}; use "
                + ", ".join(SUMMARY_MODES)
            )
        if goal not in (None, "minimize", "maximize"):
            raise InvalidArgumentError(f"goal={goal!r}: use 'minimize' or 'maximize'")
        if "best" in modes and goal is None:
            raise InvalidArgumentError(f"define_metric({name!r}, summary='best') needs goal='minimize' or 'maximize'")
        previous = self._metrics.get(name)
        if previous is not None and not overwrite:
            step_metric = step_metric if step_metric is not None else previous.step_metric
            modes = modes or previous.summary
            goal = goal or previous.goal
        metric = Metric(name, step_metric, modes, goal, bool(hidden), step_sync is not False)
        with self._lock:
            self._metrics[name] = metric
            self._resolved.clear()
            self._dirty = True
        return metric

    # -- no-ops and refusals -------------------------------------------------
    def watch(self, models: Any = None, *args: Any, **kwargs: Any) -> None:
        """Accepted, does nothing: LaunchHelm logs no gradients or weights (``launchhelm.torch``'s ``watch()``
        is where a model and optimizer drive the step and checkpoints)."""
        return None

    def unwatch(self, models: Any = None) -> None:
        """Accepted, does nothing."""
        return None

    def save(self, glob_str: str | os.PathLike[str] | None = None, *args: Any, **kwargs: Any) -> list[str]:
        """Accepted, uploads nothing (one warning): save checkpoints with ``run.launchhelm_run.checkpoint(path)``."""
        if "save" not in self._warned:
            self._warned.add("save")
            _log.warning(
                "launchhelm.wandb: save(%r) uploads nothing; to keep a file with the run as a checkpoint use "
                "run.launchhelm_run.checkpoint(path)",
                glob_str,
            )
        return []

    def alert(self, title: str = "", text: str = "", *args: Any, **kwargs: Any) -> None:
        """Accepted: the alert is written to the log (LaunchHelm sends no notifications)."""
        _log.warning("launchhelm.wandb alert: %s: %s", title, text)

    def mark_preempting(self) -> None:
        """Accepted, does nothing (a preempted run stays resumable in LaunchHelm)."""

    def log_code(self, *args: Any, **kwargs: Any) -> None:
        """Accepted, does nothing."""

    def log_artifact(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: see :data:`launchhelm.wandb.REFUSED`."""
        refuse("log_artifact")

    def use_artifact(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: see :data:`launchhelm.wandb.REFUSED`."""
        refuse("use_artifact")

    def log_model(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: see :data:`launchhelm.wandb.REFUSED`."""
        refuse("log_model")

    def use_model(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: see :data:`launchhelm.wandb.REFUSED`."""
        refuse("use_model")

    def link_model(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: see :data:`launchhelm.wandb.REFUSED`."""
        refuse("link_model")

    # -- finishing -----------------------------------------------------------
    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        """Write the pending row and end the run.

        ``exit_code`` 0 or None closes the LaunchHelm run (W&B's
        "finished"); any other code ends the session but keeps the run
        resumable (W&B's "failed": LaunchHelm has no failed state, and a
        failed run is the one you resume). The code is kept in the W&B
        record. Calling it again does nothing.
        """
        if self._finished:
            return
        if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
            raise InvalidTypeError(f"exit_code={exit_code!r}: pass an int")
        if self._pending:
            self._commit()
        self._finished = True
        self._exit_code = int(exit_code or 0)
        self._dirty = True
        try:
            if not self.disabled:
                run = self._start()
                run.finish(close_run=self._exit_code == 0)
                self._put_record(force=True)
        finally:
            _set_current_if(self, None)


# -- module state: wandb.run and the exit hook -----------------------------------
_current: Run | None = None


def current() -> Run | None:
    """The run ``wandb.run`` names (None before ``init`` and after ``finish``)."""
    return _current


def _set_current(run: Run | None) -> None:
    global _current
    with _current_lock:
        _current = run
    for callback in list(_on_current):
        callback(run)


def _set_current_if(run: Run, new: Run | None) -> None:
    if _current is run:
        _set_current(new)


_hook_installed = False


def _install_exit_hook() -> None:
    """Finish the current run at exit as W&B does (0 if the script ended cleanly, else 1), before
    LaunchHelm's own exit hook ends the session: threading's exit hooks run last-registered first."""
    global _hook_installed
    if _hook_installed:
        return
    _install_launchhelm_exit_hook()  # LaunchHelm's first, so that ours, registered after it, runs before it
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(_at_exit)
        else:  # pragma: no cover - CPython has it
            import atexit

            atexit.register(_at_exit)
    except RuntimeError:  # the interpreter is shutting down already
        return
    _hook_installed = True


def _at_exit() -> None:
    run = _current
    if run is None or run._finished:
        return
    failed = getattr(sys, "last_value", None) is not None
    try:
        run.finish(exit_code=1 if failed else 0)
    except Exception as exc:  # the store may be gone; LaunchHelm's own hook still ends the session
        print(f"launchhelm.wandb: could not finish run {run.id} at exit: {exc}", file=sys.stderr)


# -- init --------------------------------------------------------------------------
def _exists(store: Store, run_id: str) -> str | None:
    """The project of run ``run_id``, or None if the store has no such run."""
    try:
        return lh.Api(store).run(run_id).project
    except RunNotFoundError:
        return None


def _read_record(store: Store, run_id: str) -> dict[str, Any]:
    return read_compat(store, run_id, "wandb", COMPAT_FORMAT)


def _mode(mode: str | None) -> str:
    if mode is None:
        if os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes"):
            return "disabled"
        mode = os.environ.get("WANDB_MODE") or "offline"
    if mode in ("online", "offline", "dryrun", "run", "shared"):
        return "offline"
    if mode == "disabled":
        return "disabled"
    raise InvalidArgumentError(f"mode={mode!r}: use 'online', 'offline' or 'disabled' (LaunchHelm always stores)")


def init(
    project: str | None = None,
    name: str | None = None,
    config: Any = None,
    id: str | None = None,
    resume: bool | str | None = None,
    tags: list[str] | tuple[str, ...] | None = None,
    notes: str | None = None,
    dir: str | os.PathLike[str] | None = None,
    mode: str | None = None,
    settings: Settings | Mapping[str, Any] | None = None,
    resume_from: str | None = None,
    group: str | None = None,
    job_type: str | None = None,
    reinit: bool | str | None = None,
    *,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: dict[str, Any] | None = None,
    **ignored: Any,
) -> Run:
    """Start a W&B-style run stored in LaunchHelm; see :class:`Run` and docs/compat.md.

    Parameters
    ----------
    project:
        The LaunchHelm project (default ``$LAUNCHHELM_PROJECT``, else
        ``$WANDB_PROJECT``, else ``"uncategorized"``); characters LaunchHelm
        refuses become ``-``.
    name, config, tags, notes, group, job_type:
        As in W&B. ``config`` may be a dict or an ``argparse.Namespace``.
    id, resume:
        ``resume="must"``: reopen run ``id`` (an error if there is none);
        ``"allow"``, ``"auto"`` or True: reopen it if it exists, else create
        it with that id; ``"never"`` or None: create it (an error if it
        exists). A run closed by ``finish()`` cannot be reopened.
    resume_from:
        ``"<id>?_step=N"``: reopen run ``id`` and rewind it to step N: the
        next ``log()`` goes to step N, and the points it replaces stay stored
        as the abandoned attempt (``RunHandle.rewinds()``).
    mode:
        ``"disabled"``: a run that stores nothing. ``"online"`` and
        ``"offline"`` both store to the LaunchHelm store.
    dir:
        Where ``run.dir`` makes its folder; nothing else is written there.
    store, storage_options:
        LaunchHelm's store (default ``$LAUNCHHELM_STORE``, else ``~/.launchhelm``).
    **ignored:
        W&B's other arguments (``entity``, ``sync_tensorboard``,
        ``save_code``, ``anonymous``...) are accepted and do nothing, except
        ``fork_from``, refused with :class:`~launchhelm.UnsupportedFeatureError`.

    Examples
    --------
    >>> import launchhelm.wandb as wandb
    >>> run = wandb.init(project="quickstart", config={"lr": 3e-4}, store="memory://wandb-doc")
    >>> run.log({"loss": 0.5})
    >>> run.summary["best_loss"] = 0.5
    >>> run.finish()
    """
    if ignored.get("fork_from") is not None:
        refuse("fork_from")
    previous = _current
    if previous is not None and not previous._finished:
        if reinit in (None, False, "default", "return_previous"):
            return previous
        previous.finish()
    if isinstance(settings, Mapping):
        settings = Settings(**settings)
    kind = _mode(mode)
    project_given = project is not None or "LAUNCHHELM_PROJECT" in os.environ or "WANDB_PROJECT" in os.environ
    project = project_name(project)
    name = name if name is not None else os.environ.get("WANDB_NAME")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise InvalidArgumentError(f"name={name!r}: give a non-empty string or None for a generated one")
    notes = notes if notes is not None else os.environ.get("WANDB_NOTES")
    if tags is None and os.environ.get("WANDB_TAGS"):
        tags = [t for t in os.environ["WANDB_TAGS"].split(",") if t]
    values = _as_mapping(config, "config")
    wandb_id = id if id is not None else os.environ.get("WANDB_RUN_ID")
    if resume is None and os.environ.get("WANDB_RESUME"):
        resume = os.environ["WANDB_RESUME"]
    rewind_to: int | None = None
    if resume_from is not None:
        match = _STEP_RE.match(str(resume_from))
        if match is None:
            raise InvalidArgumentError(f"resume_from={resume_from!r}: use '<run id>?_step=<step>'")
        wandb_id, rewind_to = match.group(1), int(match.group(2))
        if rewind_to < 1:
            raise InvalidArgumentError(
                f"resume_from={resume_from!r} rewinds to step 0, replacing everything: start a new run instead"
            )
        resume = "must"
    if resume not in (None, False, True, "must", "allow", "never", "auto"):
        raise InvalidArgumentError(f"resume={resume!r}: use 'must', 'allow', 'never', 'auto', True or False")
    if resume == "must" and wandb_id is None:
        raise InvalidArgumentError("resume='must' needs the run's id: init(id=..., resume='must')")
    run_id = launchhelm_run_id(wandb_id) if wandb_id is not None else _new_run_id()
    options: dict[str, Any] = {
        k: ignored[k] for k in ("system_metrics", "capture_console", "flush_interval") if k in ignored
    }

    def make(store_obj: Store | None, project_: str, config_: Mapping[str, Any], disabled: bool) -> Run:
        return Run(
            store=store_obj,
            project=project_,
            run_id=run_id,
            wandb_id=wandb_id or run_id,
            name=name or _default_name(),
            config=config_,
            tags=[str(t) for t in (tags or [])],
            notes=notes,
            group=group,
            job_type=job_type,
            directory=os.fspath(dir) if dir is not None else os.environ.get("WANDB_DIR"),
            settings=settings,
            init_options=options,
            disabled=disabled,
        )

    if kind == "disabled":
        run = make(None, project, values, True)
        _set_current(run)
        return run

    st = open_store(store, storage_options)
    existing = _exists(st, run_id) if wandb_id is not None else None
    if resume == "must" and existing is None:
        raise RunNotFoundError(
            f"resume='must': no run {run_id} (W&B id {wandb_id!r}) in {st.url}; check the id and the store "
            "(LAUNCHHELM_STORE), or pass resume='allow' to create it",
            run_id=run_id,
        )
    if existing is not None and resume in (None, False, "never"):
        raise lh.AlreadyExistsError(
            f"a run with id {wandb_id!r} ({run_id}) already exists in {st.url}; pass resume='allow' or "
            "resume='must' to continue it, or choose another id",
            url=st.url,
        )
    if existing is None:
        run = make(st, project, values, False)
        _install_exit_hook()  # a run nothing was logged to is still created (and finished) at exit
        _set_current(run)
        return run

    # reopen: the stored project unless one was given, the stored W&B record carried on
    if project_given and existing != project:
        raise InvalidArgumentError(
            f"run {run_id} belongs to project {existing!r}, not {project!r}; pass project={existing!r} or none"
        )
    record = _read_record(st, run_id)
    handle = lh.Api(st).run(run_id)
    stored_config = dict(record.get("config") or handle.config)
    run = make(st, existing, stored_config, False)
    run._name = name or str(record.get("name") or handle.name)
    if values:
        run.config.update(values, allow_val_change=True)
    with run._lock:
        run._summary.update(dict(record.get("summary") or {}))
    for metric_name, spec in dict(record.get("metrics") or {}).items():
        run._metrics[metric_name] = Metric(
            metric_name,
            spec.get("step_metric"),
            list(spec.get("summary") or []),
            spec.get("goal"),
            bool(spec.get("hidden")),
            bool(spec.get("step_sync", True)),
        )
    if tags is None:
        run.tags = tuple(record.get("tags") or ())
    if notes is None:
        run.notes = record.get("notes")
    session = start_run(_Session, existing, store=st, resume=run_id, **options)
    run._attach(session, handle.config)
    run.resumed = True
    saved_step = record.get("step")
    reached = session.reached
    if rewind_to is not None:
        record_restore(session, rewind_to - 1, None, "wandb resume_from")
        run._step = rewind_to
    elif isinstance(saved_step, int) and reached == 0:
        run._step = saved_step
    else:
        run._step = max(int(saved_step or 0), reached + 1)
    _set_current(run)
    return run


# -- reading back ------------------------------------------------------------------
class StoredRun:
    """A run's W&B record as stored, merged with the LaunchHelm run it belongs to.

    Attributes
    ----------
    id, project, name, wandb_id:
        Identity (``name`` as last set through W&B's API).
    config:
        The full W&B config: what the run was created with plus every later
        ``config.update()``.
    summary:
        W&B's summary: last logged values, ``define_metric`` summaries and
        explicit sets.
    metrics:
        ``define_metric`` records: ``{name: {"step_metric", "summary",
        "goal", "hidden", "step_sync"}}``.
    tags, notes, group, job_type, exit_code, step:
        As given; ``exit_code`` None while the run has not finished.
    handle:
        The :class:`launchhelm.RunHandle` (history, rewinds, checkpoints).
    """

    def __init__(self, handle: lh.RunHandle, record: Mapping[str, Any]) -> None:
        self.handle = handle
        self.id = handle.id
        self.project = handle.project
        self.name = str(record.get("name") or handle.name)
        self.wandb_id = str(record.get("wandb_id") or handle.id)
        self.config: dict[str, Any] = {**handle.config, **dict(record.get("config") or {})}
        self.summary: dict[str, Any] = dict(record.get("summary") or {})
        self.metrics: dict[str, dict[str, Any]] = dict(record.get("metrics") or {})
        self.tags: list[str] = list(record.get("tags") or [])
        self.notes: str | None = record.get("notes")
        self.group: str | None = record.get("group")
        self.job_type: str | None = record.get("job_type")
        self.exit_code: int | None = record.get("exit_code")
        self.step: int = int(record.get("step") or 0)

    def __repr__(self) -> str:
        return f"<launchhelm.wandb.StoredRun {self.project}/{self.id} {self.name!r}>"


def stored(
    run_id: str, store: str | os.PathLike[str] | Store | None = None, storage_options: dict[str, Any] | None = None
) -> StoredRun:
    """Read back what a ``launchhelm.wandb`` run stored: config, summary, metric definitions, tags, notes.

    ``run_id`` is the LaunchHelm id (``run.id``) or the W&B ``id=`` it was
    made from. A run written without ``launchhelm.wandb`` reads with its
    config and an empty summary.

    Examples
    --------
    >>> r = stored(run.id, store="memory://wandb-doc")   # doctest: +SKIP
    >>> r.summary["best_loss"], r.metrics["eval/acc"]["step_metric"]   # doctest: +SKIP
    """
    st = open_store(store, storage_options)
    lh_id = launchhelm_run_id(run_id)
    handle = lh.Api(st).run(lh_id)
    return StoredRun(handle, _read_record(st, lh_id))
