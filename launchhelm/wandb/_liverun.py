"""The W&B run object (``log`` and W&B's steps, the summary, the W&B record) and ``wandb.run``'s state."""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn, TypedDict

import launchhelm as lh
from launchhelm._compat import RECORD_INTERVAL, SessionOptions
from launchhelm._compat import CompatSession as _Session
from launchhelm._compat import compat_key as _compat_key
from launchhelm._exceptions import InvalidArgumentError, InvalidMetricError, InvalidTypeError
from launchhelm._metrics._points import coerce_value, validate_key
from launchhelm._runlog._live_sessions import install_exit_hook as _install_launchhelm_exit_hook
from launchhelm._start import start_run
from launchhelm._types import JSONValue
from launchhelm.media import Media as LaunchHelmMedia
from launchhelm.storage import Store
from launchhelm.wandb._config import SUMMARY_MODES, Config, Metric, MetricRecord, Summary, _Aggregate
from launchhelm.wandb._objects import Media, Settings, WandbUsageError, refuse

__all__ = [
    "COMPAT_FORMAT",
    "Run",
    "compat_key",
    "current",
]

_log = logging.getLogger("launchhelm")

COMPAT_FORMAT = "launchhelm.wandb/1"


class WandbRecord(TypedDict, total=False):
    """``runs/<id>/compat/wandb.json``: what a run keeps that LaunchHelm has no place for.

    The live run writes every key; read back, any may be missing (``read_compat``
    answers ``{}`` for a run written without ``launchhelm.wandb``).
    """

    format: str
    run: str
    wandb_id: str
    name: str
    config: dict[str, JSONValue]
    summary: dict[str, JSONValue]
    metrics: dict[str, MetricRecord]
    tags: list[str]
    notes: str | None
    group: str | None
    job_type: str | None
    step: int
    exit_code: int | None
    time: float


def compat_key(run_id: str) -> str:
    """The key of a run's W&B record (config changes, summary, metric definitions, tags, notes, exit code)."""
    return _compat_key(run_id, "wandb")


def _summary_value(value: object) -> JSONValue:
    """A logged value as the summary keeps it: numbers as numbers, strings and bools as they are."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value
    return coerce_value("summary", value)


def _flatten(
    data: Mapping[str, object], path: tuple[str, ...], out: dict[str, object], paths: dict[str, tuple[str, ...]]
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
        config: Mapping[str, object],
        tags: list[str],
        notes: str | None,
        group: str | None,
        job_type: str | None,
        directory: str | None,
        settings: Settings | None,
        init_options: SessionOptions,
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
        self._created_config: dict[str, object] = {}
        self.config = Config(config, on_change=self._config_changed)
        self._summary: dict[str, JSONValue] = {}
        self.summary = Summary(self)
        self._metrics: dict[str, Metric] = {}
        self._resolved: dict[str, Metric | None] = {}  # metric key -> its definition (globs resolved once)
        self._aggregates: dict[str, _Aggregate] = {}
        self._keys: dict[str, str | None] = {}  # W&B key -> LaunchHelm metric key (None: not storable)
        self._paths: dict[str, tuple[str, ...]] = {}  # "outer.inner" -> where the summary keeps it
        self._step = 0
        self._pending: dict[str, object] = {}
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

    def _attach(self, run: _Session, created_config: Mapping[str, object]) -> None:
        self._created_config = dict(created_config)
        run.after_flush = self._put_record
        self._lh = run
        self._dirty = True
        _install_exit_hook()  # after LaunchHelm's own (installed by start_run): ours then runs first

    def _config_changed(self) -> None:
        self._dirty = True

    def _record(self) -> WandbRecord:
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
        data: Mapping[str, object],
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
        warning. Numbers, ``Image`` (one or a list), ``Table`` and
        ``Histogram`` are stored; other media and strings are skipped (one
        warning per type), strings kept in the summary. A bad image or table
        raises here (when the row is committed), and nothing of the row is
        stored.
        """
        if self._finished:
            raise WandbUsageError(
                f"run {self.id} is finished; start another with launchhelm.wandb.init() (resume='allow', "
                f"id={self.wandb_id!r} to continue this one)"
            )
        if not isinstance(data, Mapping):
            raise InvalidTypeError(f"log() takes a dict of values, not {type(data).__name__}")
        flat: dict[str, object] = {}
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
        values: dict[str, object] = {}
        for key, value in row.items():
            stored = self._store_key(key)
            if _is_media(value):  # Image, Table, Histogram (or a list of them): stored by run.log
                if stored is not None:
                    values[stored] = value
                continue
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

    def _note_summary(self, row: Mapping[str, object]) -> None:
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
    def watch(self, models: object = None, *args: object, **kwargs: object) -> None:
        """Accepted, does nothing: LaunchHelm logs no gradients or weights (``launchhelm.torch``'s ``watch()``
        is where a model and optimizer drive the step and checkpoints)."""
        return None

    def unwatch(self, models: object = None) -> None:
        """Accepted, does nothing."""
        return None

    def save(self, glob_str: str | os.PathLike[str] | None = None, *args: object, **kwargs: object) -> list[str]:
        """Accepted, uploads nothing (one warning): save checkpoints with ``run.launchhelm_run.checkpoint(path)``."""
        if "save" not in self._warned:
            self._warned.add("save")
            _log.warning(
                "launchhelm.wandb: save(%r) uploads nothing; to keep a file with the run as a checkpoint use "
                "run.launchhelm_run.checkpoint(path)",
                glob_str,
            )
        return []

    def alert(self, title: str = "", text: str = "", *args: object, **kwargs: object) -> None:
        """Accepted: the alert is written to the log (LaunchHelm sends no notifications)."""
        _log.warning("launchhelm.wandb alert: %s: %s", title, text)

    def mark_preempting(self) -> None:
        """Accepted, does nothing (a preempted run stays resumable in LaunchHelm)."""

    def log_code(self, *args: object, **kwargs: object) -> None:
        """Accepted, does nothing."""

    def log_artifact(self, *args: object, **kwargs: object) -> NoReturn:
        """Refused: see :data:`launchhelm.wandb.REFUSED`."""
        refuse("log_artifact")

    def use_artifact(self, *args: object, **kwargs: object) -> NoReturn:
        """Refused: see :data:`launchhelm.wandb.REFUSED`."""
        refuse("use_artifact")

    def log_model(self, *args: object, **kwargs: object) -> NoReturn:
        """Refused: see :data:`launchhelm.wandb.REFUSED`."""
        refuse("log_model")

    def use_model(self, *args: object, **kwargs: object) -> NoReturn:
        """Refused: see :data:`launchhelm.wandb.REFUSED`."""
        refuse("use_model")

    def link_model(self, *args: object, **kwargs: object) -> NoReturn:
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


def _is_media(value: object) -> bool:
    """A value ``launchhelm.Run.log`` stores as media: an Image, Table or Histogram, or a list of them."""
    if isinstance(value, LaunchHelmMedia):
        return True
    return type(value) in (list, tuple) and bool(value) and isinstance(value[0], LaunchHelmMedia)  # type: ignore[index]
