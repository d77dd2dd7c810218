"""``LaunchHelmCallback``: a Transformers ``TrainerCallback`` that tracks, publishes and resumes.

The ``Trainer`` writes its own checkpoint folders (weights, optimizer,
scheduler, ``trainer_state.json`` and one ``rng_state*.pth`` per process, so
every RNG of every rank is already in them); this callback publishes each
folder as a LaunchHelm checkpoint once the ``Trainer`` has written it (every
file uploaded under a fresh key, sizes and CRC64NVME recorded, then the
event: a crash mid-upload leaves no checkpoint). To resume, it fetches a
published folder back, verifying every file, for
``trainer.train(resume_from_checkpoint=...)``, and records the rewind when
training begins from it.
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

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import launchhelm
from launchhelm._exceptions import InvalidArgumentError
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

if TYPE_CHECKING:
    from typing_extensions import Unpack

_log = logging.getLogger("launchhelm")

__all__ = ["LaunchHelmCallback"]

#: What a rewind recorded by this callback names as its cause.
CAUSE = "trainer.train(resume_from_checkpoint)"


def _rank() -> int:
    """This process's rank in the world (``RANK``, as torchrun and accelerate set it; 0 alone)."""
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


class LaunchHelmCallback(TrainerCallback):
    """Track a Transformers ``Trainer`` in a LaunchHelm run, publish its checkpoints and resume from them.

    Logs what the ``Trainer`` logs (``loss``, ``learning_rate``,
    ``grad_norm``, ``eval_*``...) at its ``global_step``, records the
    ``TrainingArguments`` (and the model's config, as ``model_config``) as
    the run's config, and publishes each ``checkpoint-N`` folder the
    ``Trainer`` saves as a LaunchHelm checkpoint at step N: evaluation
    workers can score them (``ctx.download_to()`` gives the folder), and the
    checkpoint picker can choose one for resume.

    Parameters
    ----------
    project, name, config, tunables, resume, store:
        As for :func:`launchhelm.init`; the run starts when the ``Trainer``
        is created (``config`` is merged over the ``TrainingArguments``).
        ``resume=<run id>`` reopens a run after a crash.
    run:
        A run already started (then the other arguments are not used).
    **options:
        Further :func:`launchhelm.init` options (:class:`launchhelm.RunOptions`: ``storage_options``...).
        A name that is not one is refused here, before any run starts
        (:class:`launchhelm.UnknownOptionError`, a ``TypeError``).

    Examples
    --------
    >>> callback = LaunchHelmCallback("quickstart", resume=run_id)      # doctest: +SKIP
    >>> trainer = Trainer(model, args, train_dataset=data, callbacks=[callback])
    >>> trainer.train(resume_from_checkpoint=callback.checkpoint_folder("resume"))
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
        check_arguments("LaunchHelmCallback", project, run, config, resume)
        check_options("LaunchHelmCallback", options, (*RUN_PARAMETERS, "run"))
        self._run = run
        self._project = project
        self._init: dict[str, Any] = {"name": name, "tunables": tunables, "resume": resume, "store": store, **options}
        self._config = dict(config or {})
        self._output_dir: str | None = None
        self._pending: PendingRestore | None = None
        self._save_requested = False
        self._world = 1
        self._evaluating: contextlib.ExitStack | None = None  # an evaluation's section (no hang time)

    # -- the run -------------------------------------------------------------
    @property
    def run(self) -> Run:
        """The run (started on first use if the ``Trainer`` has not started it yet)."""
        return self._ensure_run()

    def _ensure_run(self, args: TrainingArguments | None = None, model: object = None) -> Run:
        if self._run is None:
            if _rank() != 0:
                raise InvalidArgumentError(
                    f"process {_rank()} has no run: under torch.distributed only the world's process zero writes "
                    "to LaunchHelm (the Trainer calls this callback there)"
                )
            config: dict[str, object] = {}
            if args is not None:
                config.update(plain_config(args.to_dict()))  # type: ignore[no-untyped-call]
            model_config = getattr(model, "config", None)
            if model_config is not None and hasattr(model_config, "to_dict"):
                config["model_config"] = plain_config(model_config.to_dict())
            config.update(self._config)
            assert self._project is not None
            self._run = launchhelm.init(self._project, config=config, **self._init)
            self._run.on_checkpoint_request(self._request_save)
        return self._run

    def _request_save(self) -> None:
        # RunHandle.control("checkpoint"): the Trainer saves at this step's end. Not under torch.distributed:
        # only process zero hears the request, and a save that the other processes do not join would hang
        if self._world > 1:
            _log.warning(
                "run %s: 'checkpoint now' is not applied to a Trainer on %d processes; the next scheduled "
                "save (save_steps) publishes a checkpoint",
                self._run.id if self._run is not None else "?",
                self._world,
            )
            return
        self._save_requested = True

    # -- resuming ------------------------------------------------------------
    def checkpoint_folder(self, which: str = "latest", directory: str | os.PathLike[str] | None = None) -> str | None:
        """Download a published checkpoint folder for ``trainer.train(resume_from_checkpoint=...)``.

        Parameters
        ----------
        which:
            ``"latest"`` (the newest), ``"resume"`` (the one chosen with
            ``RunHandle.choose_for_resume()``, consumed once training begins
            from it; else the newest), or a checkpoint id.
        directory:
            Where to put it (as ``<directory>/<checkpoint id>``); default
            ``<output_dir>/launchhelm-restored`` once the ``Trainer`` exists,
            else a temporary folder.

        Returns
        -------
        str or None
            The verified local folder; None when the run has no checkpoint
            yet (a new run, or one killed before its first save), so
            ``resume_from_checkpoint=None`` trains from scratch.

        Raises
        ------
        CheckpointError
            An unknown checkpoint id, or a file missing or damaged in the store.
        """
        resume = self._run.id if self._run is not None else self._init.get("resume")
        auto = self._run is None and bool(self._init.get("auto_resume"))
        if resume is None and not auto:
            return None  # a new run has no checkpoint
        if directory is not None:
            base = Path(directory)
        elif self._output_dir is not None:
            base = Path(self._output_dir) / "launchhelm-restored"
        else:
            base = Path(tempfile.mkdtemp(prefix="launchhelm-transformers-"))
        if _rank() != 0:
            # every process loads the folder (its own rng_state_<rank>.pth among it); the others read the
            # run without a session (process zero holds it), each into its own copy
            from launchhelm._runlog._events import EventLog

            store = open_store(self._init.get("store"), self._init.get("storage_options"))
            if resume is None:  # auto_resume: the id every launch of the job computes
                resume = job_run_id(self._project, self._init)
                if resume is None or not existing_run(store, resume):
                    return None  # no identity, or the job's first launch (process zero is creating the run)
            event, _ = find_checkpoint(EventLog(store, resume).state(), resume, which)
            if event is None:
                return None
            return str(download_checkpoint(store, resume, event, base / f"process-{_rank()}"))
        run = self._ensure_run()
        event, consume = find_checkpoint(run._events.state(), run.id, which)
        if event is None:
            return None
        path = download_checkpoint(run.store, run.id, event, base)
        self._pending = PendingRestore(str(event["checkpoint"]), int(event["step"]), consume, path)
        return str(path)

    # -- Trainer events --------------------------------------------------------
    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._output_dir = str(args.output_dir) if args.output_dir is not None else None
        self._world = int(args.world_size)
        if state.is_world_process_zero:
            self._ensure_run(args, kwargs.get("model"))

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if not state.is_world_process_zero:
            return
        run = self._ensure_run(args, kwargs.get("model"))
        step = int(state.global_step)  # the Trainer has read trainer_state.json of the folder it resumes
        pending, self._pending = self._pending, None
        if pending is not None or step < run.reached:
            record_restore(run, step, pending, CAUSE)

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        # an evaluation batch: the Trainer gives no hook before its first, so the section (Run.evaluating:
        # no hang time) opens after it and closes with on_evaluate, on_predict or the next step
        if state.is_world_process_zero and self._run is not None and self._evaluating is None:
            self._evaluating = contextlib.ExitStack()
            self._evaluating.enter_context(self._run.evaluating())

    def _evaluated(self) -> None:
        evaluating, self._evaluating = self._evaluating, None
        if evaluating is not None:
            evaluating.close()

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._evaluated()

    def on_predict(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, metrics: object, **kwargs: object
    ) -> None:
        self._evaluated()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._evaluated()
        if not state.is_world_process_zero:
            return
        # a step boundary: tunables, pause, stop and "checkpoint now" from outside apply here
        self._ensure_run(args).global_step = int(state.global_step)
        if self._save_requested:
            self._save_requested = False
            control.should_save = True

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, object] | None = None,
        **kwargs: object,
    ) -> None:
        if not state.is_world_process_zero or not logs:
            return
        values = {
            str(k): float(v)
            for k, v in logs.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
        }
        if values:
            self._ensure_run(args).log(values, step=int(state.global_step))

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object) -> None:
        import torch.distributed as dist

        if int(args.world_size) > 1 and dist.is_available() and dist.is_initialized():
            # every process writes its own rng_state_<rank>.pth into the folder, and process zero may get here
            # first: wait for all of them, or the published folder lacks some ranks' RNG (seen: rank 1's)
            dist.barrier()
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir or ".") / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            self._ensure_run(args).checkpoint(folder, step=int(state.global_step))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._evaluated()
        if state.is_world_process_zero and self._run is not None:
            self._run.flush()
