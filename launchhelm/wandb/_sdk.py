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

import hashlib
import os
import re
from collections.abc import Mapping
from typing import cast

import launchhelm as lh
from launchhelm._compat import CompatSession as _Session
from launchhelm._compat import SessionOptions, read_compat
from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError, RunNotFoundError
from launchhelm._integration import record_restore
from launchhelm._runlog._events import validate_project
from launchhelm._runlog._names import default_name as _default_name
from launchhelm._runlog._names import new_run_id as _new_run_id
from launchhelm._start import start_run
from launchhelm._types import JSONValue
from launchhelm.storage import Store, open_store
from launchhelm.wandb._config import Metric, MetricRecord, _as_mapping
from launchhelm.wandb._liverun import COMPAT_FORMAT, Run, WandbRecord, _install_exit_hook, _set_current, current
from launchhelm.wandb._objects import Settings, refuse

__all__ = [
    "StoredRun",
    "init",
    "stored",
]

_RUN_ID_RE = re.compile(r"^[a-z0-9]{4,64}$")
_PROJECT_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_STEP_RE = re.compile(r"^([^?]+)\?_step=(\d+)$")


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


# -- init --------------------------------------------------------------------------
def _exists(store: Store, run_id: str) -> str | None:
    """The project of run ``run_id``, or None if the store has no such run."""
    try:
        return lh.Api(store).run(run_id).project
    except RunNotFoundError:
        return None


def _read_record(store: Store, run_id: str) -> WandbRecord:
    return cast("WandbRecord", read_compat(store, run_id, "wandb", COMPAT_FORMAT))


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
    config: object = None,
    id: str | None = None,
    resume: bool | str | None = None,
    tags: list[str] | tuple[str, ...] | None = None,
    notes: str | None = None,
    dir: str | os.PathLike[str] | None = None,
    mode: str | None = None,
    settings: Settings | Mapping[str, object] | None = None,
    resume_from: str | None = None,
    group: str | None = None,
    job_type: str | None = None,
    reinit: bool | str | None = None,
    *,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
    **ignored: object,
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
    previous = current()
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
    # W&B's arguments of these names set LaunchHelm's (unchecked here, as start_run checks them)
    options = cast(
        "SessionOptions",
        {k: ignored[k] for k in ("system_metrics", "capture_console", "flush_interval") if k in ignored},
    )

    def make(store_obj: Store | None, project_: str, config_: Mapping[str, object], disabled: bool) -> Run:
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

    def __init__(self, handle: lh.RunHandle, record: WandbRecord) -> None:
        self.handle = handle
        self.id = handle.id
        self.project = handle.project
        self.name = str(record.get("name") or handle.name)
        self.wandb_id = str(record.get("wandb_id") or handle.id)
        self.config: dict[str, JSONValue] = {**handle.config, **dict(record.get("config") or {})}
        self.summary: dict[str, JSONValue] = dict(record.get("summary") or {})
        self.metrics: dict[str, MetricRecord] = dict(record.get("metrics") or {})
        self.tags: list[str] = list(record.get("tags") or [])
        self.notes: str | None = record.get("notes")
        self.group: str | None = record.get("group")
        self.job_type: str | None = record.get("job_type")
        self.exit_code: int | None = record.get("exit_code")
        self.step: int = int(record.get("step") or 0)

    def __repr__(self) -> str:
        return f"<launchhelm.wandb.StoredRun {self.project}/{self.id} {self.name!r}>"


def stored(
    run_id: str,
    store: str | os.PathLike[str] | Store | None = None,
    storage_options: Mapping[str, object] | None = None,
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
