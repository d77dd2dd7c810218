"""``LaunchHelmLogger`` and its ``LaunchHelmCallback``: Lightning training in a LaunchHelm run.

Lightning writes its own checkpoint files (``ModelCheckpoint``); the logger
publishes each one as a LaunchHelm checkpoint once written
(``after_save_checkpoint``: uploaded under a fresh key, size and CRC64NVME
recorded, then the event, so a crash mid-upload leaves no checkpoint).

Lightning's checkpoint holds model, optimizers, schedulers, loops and
callbacks, but no RNG state. The callback adds every RNG of every rank
(Python, torch CPU and CUDA, numpy; the same record ``launchhelm.torch``
saves) under the checkpoint's ``"launchhelm"`` key when it is saved, and
sets this rank's back when Lightning restores it, before the fit loop draws
anything (the dataloader's shuffle and worker seeds, dropout). It also
records the LightningModule's hyperparameters as the run's config and the
rewind when ``trainer.fit(ckpt_path=...)`` goes back.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

import launchhelm
from launchhelm._exceptions import CheckpointError, InvalidArgumentError, InvalidTypeError
from launchhelm._integration import (
    PendingRestore,
    check_arguments,
    download_checkpoint,
    existing_run,
    find_checkpoint,
    job_run_id,
    plain_config,
    record_restore,
)
from launchhelm._options import RUN_PARAMETERS, RunOptions, check_options
from launchhelm._run import Run
from launchhelm.storage import Store, open_store
from launchhelm.torch._rng import capture_rng, restore_rng, validate_rng

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.utilities.types import STEP_OUTPUT
    from typing_extensions import Unpack

_log = logging.getLogger("launchhelm")

__all__ = ["RNG_FORMAT", "LaunchHelmCallback", "LaunchHelmLogger"]

#: Format of the RNG record the callback adds to a Lightning checkpoint (key ``"launchhelm"``).
RNG_FORMAT = "launchhelm.lightning.rng/1"
#: What a rewind recorded on a Lightning restore names as its cause.
CAUSE = "trainer.fit(ckpt_path)"


def _rank() -> int:
    """This process's global rank as Lightning knows it (from the environment, before DDP starts)."""
    return int(getattr(rank_zero_only, "rank", 0) or 0)


class _RunWhenUsed:
    """What ``logger.experiment`` gives before the run has started: the run, started on first use.

    Lightning touches ``logger.experiment`` early in ``fit`` (before any
    callback's ``setup``); starting the run then would record it without the
    LightningModule's hyperparameters, which the callback adds a moment later.
    """

    def __init__(self, logger: LaunchHelmLogger) -> None:
        self._logger = logger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger.run, name)

    def __repr__(self) -> str:
        return f"<launchhelm run of {self._logger.name!r}, not started yet>"


class LaunchHelmLogger(Logger):
    """A Lightning logger that writes a LaunchHelm run, publishes checkpoints and resumes from them.

    Metrics go to the run at Lightning's step; the LightningModule's (and
    datamodule's) hyperparameters become the run's config; each file
    ``ModelCheckpoint`` saves is published as a LaunchHelm checkpoint on
    the run's store (any store: local, S3, GCS, Azure). ``log_image`` and
    ``log_table`` store images and tables as ``WandbLogger``'s do;
    ``log_graph`` does nothing. Add :attr:`callback` to the ``Trainer``'s callbacks: it puts
    every RNG into the checkpoints, so resuming is exact.

    Parameters
    ----------
    project, name, config, tunables, resume, store:
        As for :func:`launchhelm.init`. ``resume=<run id>`` reopens a run
        after a crash; then :meth:`checkpoint_path` fetches its checkpoint.
    run:
        A run already started (the other arguments are then not used).
    **options:
        Further :func:`launchhelm.init` options (:class:`launchhelm.RunOptions`: ``storage_options``...).
        A name that is not one is refused here, before any run starts
        (:class:`launchhelm.UnknownOptionError`, a ``TypeError``).

    Examples
    --------
    >>> logger = LaunchHelmLogger("quickstart", resume=run_id)          # doctest: +SKIP
    >>> trainer = L.Trainer(logger=logger, callbacks=[ModelCheckpoint(every_n_epochs=1), logger.callback])
    >>> trainer.fit(model, data, ckpt_path=logger.checkpoint_path("resume"), weights_only=True)
    """

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        config: Mapping[str, object] | None = None,
        tunables: Mapping[str, object] | None = None,
        resume: str | None = None,
        store: str | os.PathLike[str] | Store | None = None,
        *,
        run: Run | None = None,
        **options: Unpack[RunOptions],
    ) -> None:
        super().__init__()
        check_arguments("LaunchHelmLogger", project, run, config, resume)
        check_options("LaunchHelmLogger", options, (*RUN_PARAMETERS, "run"))
        self._run = run
        self._project = project if run is None else run.project
        self._resume = resume if run is None else run.id
        # auto_resume: every launch of the job computes the same run id, on every rank (no broadcast needed)
        self._auto = run is None and bool(options.get("auto_resume"))
        self._store_arg = store
        self._init: dict[str, Any] = {"name": name, "tunables": tunables, "resume": resume, "store": store, **options}
        self._config = dict(config or {})
        self._hparams: dict[str, object] = {}
        self._pending: PendingRestore | None = None
        self._published: set[int] = set()
        self._callback = LaunchHelmCallback(self)

    # -- the run -------------------------------------------------------------
    @property
    def run(self) -> Run:
        """The run (started on first use; only rank 0 starts one)."""
        if self._run is None:
            if _rank() != 0:
                raise InvalidArgumentError(f"rank {_rank()} has no run: under DDP only rank 0 writes to LaunchHelm")
            assert self._project is not None
            config = {**plain_config(self._hparams), **self._config}
            self._run = launchhelm.init(self._project, config=config, **self._init)
        return self._run

    @property
    def callback(self) -> LaunchHelmCallback:
        """The callback to add to ``Trainer(callbacks=[...])``: RNG in checkpoints, hyperparameters, rewinds."""
        return self._callback

    def _start(self, hparams: Mapping[str, object]) -> None:
        if self._run is None:
            self._hparams.update(hparams)
        _ = self.run

    # -- Lightning's Logger interface -----------------------------------------
    @property
    def name(self) -> str:
        """The project."""
        return str(self._project)

    @property
    def version(self) -> str:
        """The run id (names ``ModelCheckpoint``'s default folder)."""
        if self._run is not None:
            return self._run.id
        if _rank() != 0:
            return self._resume or self._job_run_id() or ""
        return self.run.id

    @property
    def save_dir(self) -> str | None:
        return None

    @property
    def experiment(self) -> Run | _RunWhenUsed:
        """The :class:`launchhelm.Run` (on rank 0)."""
        if self._run is not None:
            return self._run
        return _RunWhenUsed(self)

    @rank_zero_only
    def log_hyperparams(self, params: object, *args: object, **kwargs: object) -> None:
        """Hyperparameters become the run's config when they arrive before it starts (the callback sees to it)."""
        values = dict(vars(params)) if not isinstance(params, Mapping) and hasattr(params, "__dict__") else params
        if not isinstance(values, Mapping):
            return
        if self._run is None:
            self._hparams.update(values)
            return
        missing = [k for k in values if k not in self._run.config]
        if missing and not self._run.resumed:
            _log.warning(
                "run %s started before Lightning logged the hyperparameters %s, so its config lacks them: add "
                "logger.callback to Trainer(callbacks=[...]) to record them",
                self._run.id,
                ", ".join(map(str, missing[:5])),
            )

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, object], step: int | None = None) -> None:
        values: dict[str, float] = {}
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    continue
                value = value.item()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
                values[str(key)] = float(value)
        if values:
            self.run.log(values, step=step)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log images under ``key`` at ``step`` (default: the run's step), as ``WandbLogger.log_image`` takes them.

        ``images`` is a list of numpy arrays, tensors, PIL images or file
        paths (see :class:`launchhelm.Image`); ``caption=[...]`` gives one
        caption per image. W&B's other per-image lists (``masks``, ``boxes``)
        are not kept.
        """
        if not isinstance(images, list):
            raise InvalidTypeError(f"log_image({key!r}): images must be a list, not {type(images).__name__}")
        captions = kwargs.get("caption")
        if captions is not None and (not isinstance(captions, list) or len(captions) != len(images)):
            raise InvalidArgumentError(f"log_image({key!r}): caption must be a list of {len(images)} captions")
        items = [
            launchhelm.Image(image, caption=None if captions is None else captions[i]) for i, image in enumerate(images)
        ]
        self.run.log({key: items}, step=step)

    @rank_zero_only
    def log_table(
        self,
        key: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log a table under ``key`` at ``step``, as ``WandbLogger.log_table`` takes it: ``columns`` and
        ``data`` (rows), or a pandas ``dataframe`` (see :class:`launchhelm.Table`)."""
        table = launchhelm.Table(dataframe) if dataframe is not None else launchhelm.Table(columns=columns, rows=data)
        self.run.log({key: table}, step=step)

    def log_graph(self, model: object, input_array: object = None) -> None:
        """Does nothing: LaunchHelm keeps no model graphs."""

    @rank_zero_only
    def save(self) -> None:
        if self._run is not None:
            self._run.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Write what is buffered; the run stays open (``logger.run.finish()`` closes it)."""
        if self._run is not None:
            self._run.flush()

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        """Publish the file ``ModelCheckpoint`` has just written (Lightning calls this on rank 0)."""
        path = getattr(checkpoint_callback, "_last_checkpoint_saved", "") or ""
        step = getattr(checkpoint_callback, "_last_global_step_saved", None)
        if not path or not Path(path).is_file():
            return
        step = int(step) if isinstance(step, int) else self.run.global_step
        if step in self._published:
            return  # save_last (or a second ModelCheckpoint) saved this step again: publish it once
        self._published.add(step)
        self.run.checkpoint(path, step=step)

    # -- resuming --------------------------------------------------------------
    def checkpoint_path(self, which: str = "latest", directory: str | os.PathLike[str] | None = None) -> str | None:
        """Download a published checkpoint for ``trainer.fit(model, ckpt_path=...)``.

        Parameters
        ----------
        which:
            ``"latest"`` (the newest), ``"resume"`` (the one chosen with
            ``RunHandle.choose_for_resume()``, consumed once Lightning has
            restored it; else the newest), or a checkpoint id.
        directory:
            Where to put it (as ``<directory>/<checkpoint id>/``); default a
            temporary folder.

        Returns
        -------
        str or None
            The verified local file; None when the run has no checkpoint yet
            (a new run, or one killed before its first save), so
            ``ckpt_path=None`` trains from scratch.

        Raises
        ------
        CheckpointError
            An unknown checkpoint id, or a file missing or damaged in the store.
        """
        if self._run is None and self._resume is None and not self._auto:
            return None  # a new run has no checkpoint
        base = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="launchhelm-lightning-"))
        if _rank() != 0:
            # other DDP ranks read the run without a session of their own: rank 0 holds it
            from launchhelm._runlog._events import EventLog

            store = open_store(self._store_arg, self._init.get("storage_options"))
            run_id = self._resume or self._job_run_id()
            if run_id is None or (self._resume is None and not existing_run(store, run_id)):
                return None  # no identity, or the job's first launch (rank 0 is creating the run)
            event, _ = find_checkpoint(EventLog(store, run_id).state(), run_id, which)
            if event is None:
                return None
            return str(download_checkpoint(store, run_id, event, base))
        run = self.run
        event, consume = find_checkpoint(run._events.state(), run.id, which)
        if event is None:
            return None
        path = download_checkpoint(run.store, run.id, event, base)
        self._pending = PendingRestore(str(event["checkpoint"]), int(event["step"]), consume, path)
        return str(path)

    def _job_run_id(self) -> str | None:
        """With ``auto_resume``: the run id this job's launches share (None: no job identity found)."""
        return job_run_id(self._project, self._init) if self._auto else None

    def _restored(self, step: int) -> None:
        pending, self._pending = self._pending, None
        record_restore(self.run, step, pending, CAUSE)


class LaunchHelmCallback(Callback):
    """Every RNG of every rank in Lightning's checkpoints, restored on resume; hyperparameters; rewinds.

    Get it from :attr:`LaunchHelmLogger.callback` (or create it with no
    argument: it finds the trainer's LaunchHelmLogger).
    """

    def __init__(self, logger: LaunchHelmLogger | None = None) -> None:
        self._logger = logger
        self._loaded = False  # this fit restored a checkpoint
        self._evaluating: contextlib.ExitStack | None = None  # a validation pass's section (no hang time)

    def _logger_of(self, trainer: pl.Trainer) -> LaunchHelmLogger | None:
        if self._logger is None:
            self._logger = next((lg for lg in trainer.loggers if isinstance(lg, LaunchHelmLogger)), None)
        return self._logger

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # before ModelCheckpoint's setup (Lightning runs checkpoint callbacks last), which names its folder
        # after the run: start the run now, with the hyperparameters as config
        self._loaded = False
        logger = self._logger_of(trainer)
        if logger is None or not trainer.is_global_zero:
            return
        hparams: dict[str, object] = {}
        datamodule = getattr(trainer, "datamodule", None)
        for source in (datamodule, pl_module):
            initial = getattr(source, "hparams_initial", None)
            if isinstance(initial, Mapping):
                hparams.update(initial)
        logger._start(hparams)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, object]
    ) -> None:
        # Lightning builds the checkpoint on every rank and writes rank 0's: gather each rank's RNG into it
        world = int(getattr(trainer, "world_size", 1) or 1)
        mine = {"rank": int(trainer.global_rank), **capture_rng()}
        records: list[object] = [mine]
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            records = [None] * world
            torch.distributed.all_gather_object(records, mine)
        checkpoint["launchhelm"] = {"format": RNG_FORMAT, "world_size": world, "rng_by_rank": records}

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Lightning restores modules and callbacks before the fit loop makes its dataloader iterator:
        # setting the RNG here gives the same shuffle, worker seeds and dropout as the run that saved it
        record = checkpoint.get("launchhelm")
        rank, world = int(trainer.global_rank), int(getattr(trainer, "world_size", 1) or 1)
        if not isinstance(record, dict) or record.get("format") != RNG_FORMAT:
            _log.warning(
                "this Lightning checkpoint holds no LaunchHelm RNG record (saved without logger.callback): "
                "the RNG is not restored, so the resumed run will not repeat the original exactly"
            )
        else:
            by_rank = record.get("rng_by_rank")
            if int(record.get("world_size", 0)) != world or not isinstance(by_rank, list) or len(by_rank) != world:
                raise CheckpointError(
                    f"this checkpoint was saved by {record.get('world_size')} rank(s) and cannot restore the RNG of "
                    f"{world}: resume with the same number of devices and nodes as the save"
                )
            mine = by_rank[rank]
            if not isinstance(mine, dict) or mine.get("rank") != rank:
                raise CheckpointError(f"this checkpoint's RNG record {rank} is not rank {rank}'s: it is damaged")
            validate_rng(mine, f"checkpoint rng_by_rank[{rank}]")
            restore_rng(mine)
        self._loaded = True
        logger = self._logger_of(trainer)
        if logger is not None and trainer.is_global_zero:
            logger._restored(int(checkpoint.get("global_step", 0)))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        logger = self._logger_of(trainer)
        if self._loaded or logger is None or not trainer.is_global_zero or logger._run is None:
            return
        if trainer.global_step < logger._run.reached:
            logger._restored(int(trainer.global_step))  # a resumed run trained again from scratch: a rewind too

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a validation pass makes no training step: its time is no hang (Run.evaluating)
        logger = self._logger_of(trainer)
        if logger is not None and trainer.is_global_zero and logger._run is not None and self._evaluating is None:
            self._evaluating = contextlib.ExitStack()
            self._evaluating.enter_context(logger._run.evaluating())

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        evaluating, self._evaluating = self._evaluating, None
        if evaluating is not None:
            evaluating.close()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: object, batch_idx: int
    ) -> None:
        logger = self._logger_of(trainer)
        if logger is not None and trainer.is_global_zero and logger._run is not None:
            # a step boundary: tunable changes and pause/stop from outside apply here
            logger._run.global_step = int(trainer.global_step)
