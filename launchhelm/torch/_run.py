"""``TorchRun``: checkpoints that restore everything, single process and DDP.

A bundle is one ``torch.save`` file holding model, optimizer, scheduler,
scaler, step, RNG states, tunables, control state and ``extra``; it loads
with ``torch.load(weights_only=True)``. Loads read tensor bytes straight into
the watched model and optimizer (``_loader``, ``_inplace``), verify size,
checksum, format and world size on every rank, and apply nothing unless every
rank validated; if applying fails on any rank (a CRC mismatch found once bytes
are in the model included), every rank raises :class:`CheckpointError` and
the next watched optimizer step raises it again rather than train on mixed
state.

The run holds a :class:`~launchhelm.torch._checkpointer.Checkpointer`, which
saves and loads (both formats) and owns their state; it sees the run through
:class:`_Link`, the run's side of :class:`~launchhelm.torch._link.RunLink`.
The run keeps what is the run's: the step hooks, control requests, and the
step, tunables, control state and rewind a restore brings back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import types
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from launchhelm._exceptions import CheckpointError, InvalidArgumentError, InvalidTypeError, LaunchHelmError
from launchhelm._options import RUN_PARAMETERS, RunOptions, check_options
from launchhelm._run import Run, _not_step_time
from launchhelm._runlog._control import in_force
from launchhelm._runlog._events import CONTROL_ACTION
from launchhelm._runlog._preempt import PREEMPT_ACTION, preemption_settings
from launchhelm._runlog._runinfo import read_run_record
from launchhelm._runlog._watchdog import AUTO, hang_setting
from launchhelm._start import start_run
from launchhelm.storage import Store, open_store
from launchhelm.torch import _dist, _sharded, _torch_private
from launchhelm.torch._checkpointer import Checkpointer
from launchhelm.torch._formats import FORMAT_DISTRIBUTED, FORMAT_SINGLE
from launchhelm.torch._link import Watched
from launchhelm.torch._loader import _gc_paused
from launchhelm.torch._manifest import FORMAT_SHARDED
from launchhelm.torch._records import ControlState, RngRecord, Stateful
from launchhelm.torch._rng import capture_rng

if TYPE_CHECKING:
    from torch.serialization import MAP_LOCATION
    from torch.utils.hooks import RemovableHandle
    from typing_extensions import Unpack

    from launchhelm._runlog._events import EventLog

_log = logging.getLogger("launchhelm")

__all__ = ["FORMAT_DISTRIBUTED", "FORMAT_SHARDED", "FORMAT_SINGLE", "TorchRun", "init"]


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel / DataParallel wrapper."""
    inner = getattr(model, "module", None)
    if isinstance(inner, torch.nn.Module) and type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
        return inner
    return model


class TorchRun(Run):
    """A :class:`launchhelm.Run` that checkpoints and restores PyTorch training.

    Create it with :func:`launchhelm.torch.init` on every rank.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rank = 0
        self._world = 1
        self._hooks: list[RemovableHandle] = []
        # saves and loads, their thread, errors and buffers: the checkpointer's (it sees the run through _Link)
        self._checkpointer = Checkpointer(_Link(self))
        self._in_step_hook = False  # inside the watched optimizer's step post-hook
        #: a preemption noticed at a step's end: (signal, that step's RNG states, its model buffers)
        self._deferred_preempt: tuple[str, RngRecord, dict[str, torch.Tensor]] | None = None
        self._saved_at_step: tuple[int, str | None] | None = None  # a save the loop made while one waits

    # -- DDP followers ------------------------------------------------------
    @classmethod
    def _join(cls, store: Store, record: dict[str, Any], rank: int, world: int) -> TorchRun:
        """A rank > 0 view of rank 0's run: no session of its own, logs nothing."""
        from launchhelm._runlog._events import EventLog

        run = cls(
            store=store,
            record=record,
            session_id=f"rank{rank}",
            events=EventLog(store, record["id"]),
            global_step=0,
            attempt=0,
            resumed=False,
            flush_interval=3600.0,
            heartbeat_interval=3600.0,
            control_interval=3600.0,  # rank 0 polls and shares requests at step boundaries
        )
        run._rank, run._world = rank, world
        return run

    def _plan_helper(
        self,
        timeout: float | str | None,
        storage_options: Mapping[str, Any] | None,
        *,
        end_hung: bool,
        session: str | None = None,
        rank: int = 0,
        world: int | None = None,
    ) -> None:
        """:meth:`Run._plan_helper`, and where torch records collectives, its flight recorder for a hang's
        record (read at the hang by a thread of this process; the recorder's settings stay the user's)."""
        super()._plan_helper(timeout, storage_options, end_hung=end_hung, session=session, rank=rank, world=world)
        if self._helper_plan is not None and timeout is not None and _torch_private.flight_recorder_on():
            self._helper_plan["flight_recorder"] = _torch_private.flight_recorder_json

    def _follow_hangs(self) -> None:
        """A rank > 0 has no background worker: a short-lived thread starts its helper (the spawn stays off
        the training thread)."""
        if self._helper_plan is not None:
            threading.Thread(target=self._start_helper, name="launchhelm-helper-start", daemon=True).start()

    @property
    def rank(self) -> int:
        """This process's rank (0 outside DDP)."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of ranks (1 outside DDP)."""
        return self._world

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Like :meth:`launchhelm.Run.log`; under DDP only rank 0's calls are recorded."""
        if self._rank == 0:
            super().log(metrics, step)

    def flush(self) -> None:
        if self._rank == 0:
            super().flush()

    def finish(self, close_run: bool = True) -> None:
        """End the session (rank 0 records it; other ranks just stop).

        Waits for a non-blocking save in progress first; if that failed, the
        session still ends and the save's :class:`CheckpointError` is raised.
        """
        if not isinstance(close_run, bool):  # before anything ends: a truthy "no" would close the run
            raise InvalidTypeError(f"close_run={close_run!r}: pass True or False")
        if self._deferred_preempt is not None and not self._finished:
            self._publish_preemption()  # the notice came at the last step: save it, exit as preempted
        failed: CheckpointError | None = None
        try:
            self.wait_for_checkpoint()
        except CheckpointError as exc:
            failed = exc
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._rank == 0:
            super().finish(close_run)
        else:
            self._finished = True
            self._stop_helper()
            self._close_preemption()
            self._close_store()
        if failed is not None:
            raise failed

    def _end_session(
        self, *, close_run: bool, reason: str, ending: str | None = None, detail: str | None = None
    ) -> None:
        if self._checkpointer.saving_elsewhere():
            try:
                self.wait_for_checkpoint()  # at exit: publish what was being saved
            except CheckpointError as exc:
                _log.error("%s", exc)
        super()._end_session(close_run=close_run, reason=reason, ending=ending, detail=detail)

    def __repr__(self) -> str:
        where = f" rank {self._rank}/{self._world}" if self._world > 1 else ""
        return f"<launchhelm.torch.TorchRun {self.project}/{self.id} step={self._step}{where}>"

    # -- watching -----------------------------------------------------------
    def watch(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Stateful | None = None,
        scaler: Stateful | None = None,
        *,
        sharded: bool | None = None,
    ) -> None:
        """Name what checkpoints save and restore; the optimizer's ``step()`` advances ``global_step``.

        Parameters
        ----------
        model:
            The module (a DDP wrapper is unwrapped, so checkpoints hold plain keys).
        optimizer:
            Its ``step()`` advances :attr:`global_step` by one.
        scheduler:
            An LR scheduler: anything with ``state_dict``/``load_state_dict``.
        scaler:
            A ``torch.amp.GradScaler``.
        sharded:
            Save sharded checkpoints (format ``launchhelm.torch.checkpoint/3``:
            every rank writes its own shards; they load on any number of
            ranks). None (default): when the model has DTensor parameters
            (FSDP2 ``fully_shard``, tensor parallel). True forces it for a
            DDP or single-process run.
        """
        if not isinstance(model, torch.nn.Module):
            raise InvalidTypeError(f"watch() takes a torch.nn.Module first, not {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidTypeError(f"watch() takes a torch.optim.Optimizer second, not {type(optimizer).__name__}")
        for name, obj in (("scheduler", scheduler), ("scaler", scaler)):
            if obj is not None and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise InvalidTypeError(f"{name} {type(obj).__name__} has no state_dict()/load_state_dict()")
        has_dtensors = _sharded.has_dtensors(model)
        if sharded is False and has_dtensors:
            raise InvalidArgumentError(
                "watch(..., sharded=False): the model has DTensor parameters (FSDP2, tensor parallel), which only "
                "sharded checkpoints hold; leave sharded unset"
            )
        for handle in self._hooks:
            handle.remove()
        self._checkpointer.watched = Watched(
            _unwrap(model), optimizer, scheduler, scaler, sharded=bool(sharded) or has_dtensors
        )
        self._hooks = self._register_step_hooks(optimizer)

    def _register_step_hooks(self, optimizer: torch.optim.Optimizer) -> list[RemovableHandle]:
        return [
            optimizer.register_step_pre_hook(self._before_optimizer_step),
            optimizer.register_step_post_hook(self._after_optimizer_step),
        ]

    @contextlib.contextmanager
    def _step_hooks_off(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """torch's ``get_state_dict`` steps a stateless optimizer once (lr 0) to make its state:
        that step is not a training step, so the run's step hooks must not see it."""
        for handle in self._hooks:
            handle.remove()
        try:
            yield
        finally:
            self._hooks = self._register_step_hooks(optimizer)

    def _before_optimizer_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        self._checkpointer.check_before_step()
        if self._deferred_preempt is not None:
            self._publish_preemption()  # raises RunPreempted: this step is not applied

    def _after_optimizer_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        self._in_step_hook = True
        try:
            self._step_ended()
        finally:
            self._in_step_hook = False

    # -- preemption (see launchhelm._runlog._preempt) ---------------------------------------
    def _preempt(self, request_seq: int, signal_name: str) -> None:
        watched = self._checkpointer.watched
        if not self._in_step_hook or watched is None or self._deferred_preempt is not None:
            super()._preempt(request_seq, signal_name)
            return
        # What the loop does after optimizer.step() belongs to this step (scheduler.step(), an EMA
        # update, log()): the save waits for the next step's start, with this step's RNG states and
        # model buffers, taken now, before the next forward draws from the one and updates the other.
        listener = self._preemption
        if listener is not None:
            listener.arm(int(getattr(signal.Signals, signal_name, signal.SIGTERM)))
        self._preempted_by = signal_name
        self._paused = False
        if request_seq > 0:  # a request in the log (another rank's notice): applied, not pending
            self._record_applied(request_seq, "control", action=PREEMPT_ACTION, signal=signal_name)
        buffers = {name: b.detach().clone() for name, b in watched.model.named_buffers()}
        self._deferred_preempt = (signal_name, capture_rng(), buffers)

    def _publish_preemption(self) -> None:
        """Save, end as preempted and exit (``RunPreempted``), as of the step the notice followed."""
        assert self._deferred_preempt is not None
        signal_name, rng, buffers = self._deferred_preempt
        self._deferred_preempt = None
        self._checkpointer.as_of = (rng, buffers)
        try:
            Run._preempt(self, 0, signal_name)
        finally:
            self._checkpointer.as_of = None
            self._saved_at_step = None

    def _step_ended(self) -> None:
        self.global_step = self._step + 1
        # under DDP every rank applies control requests, and learns that a background save failed,
        # at the same step: rank 0 says whether either happened (one 1-byte broadcast per step).
        # A rank raising at a step its peers train through would hang them in the next collective.
        if self._world > 1 and not self._finished:
            control, failed = self._control_flag, self._checkpointer.save_failed
            if _dist.broadcast_flag(control or failed, self._world):
                control, failed = _dist.broadcast((control, failed), self._world)
                if failed:
                    self._checkpointer.take_save_failure()
                if control:
                    Run._step_boundary(self)

    # -- tunables and control (see launchhelm._runlog._control) ---------------------
    @property
    def _records_events(self) -> bool:
        return self._rank == 0

    def _step_boundary(self) -> None:
        if self._world == 1:
            super()._step_boundary()
        # under DDP the optimizer hook applies requests on every rank together

    def _take_requests(self) -> list[dict[str, Any]]:
        if self._world == 1:
            return super()._take_requests()
        mine = super()._take_requests() if self._rank == 0 else None
        shared: list[dict[str, Any]] = _dist.broadcast(mine, self._world)
        return shared

    def _wait_while_paused(self) -> None:
        if self._rank == 0:
            super()._wait_while_paused()
        # other ranks wait in the next _take_requests broadcast

    def _tunables_changed(self, changes: dict[str, Any], *, restored: bool) -> None:
        watched = self._checkpointer.watched
        if not restored and watched is not None:
            _apply_to_optimizer(watched.optimizer, watched.scheduler, changes)
        super()._tunables_changed(changes, restored=restored)

    def _checkpoint_requested(self) -> str | None:
        if self._checkpointer.watched is not None:
            return self.save_checkpoint()
        return super()._checkpoint_requested()

    def _stop_session(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._rank == 0:
            super()._stop_session()
        else:
            self._finished = True
            self._close_preemption()

    # -- preemption -----------------------------------------------------------
    def _pass_notice_on(self, signal_name: str) -> None:
        # only rank 0's control flag reaches every rank at a step boundary: another rank's notice
        # goes through the log, where rank 0's poller finds it (no collective per step)
        if self._world > 1 and self._rank != 0:
            self._events.append(CONTROL_ACTION, {"action": PREEMPT_ACTION, "signal": signal_name, "rank": self._rank})

    def _checkpoint_for_preemption(self) -> tuple[bool, str | None]:
        if self._checkpointer.watched is None:
            return super()._checkpoint_for_preemption()
        # a save still being written is the one to wait for (rank 0 says, so every rank does alike)
        mine = (self._checkpointer.in_flight(),) if self._rank == 0 else None
        in_flight = _dist.broadcast(mine, self._world)[0]
        if in_flight is not None:
            self.wait_for_checkpoint()
            return True, in_flight if self._rank == 0 else None
        saved = self._saved_at_step
        if self._checkpointer.as_of is not None and saved is not None and saved[0] == self._step:
            # the loop saved this very step after the notice (every rank did: a save is collective)
            return True, saved[1]
        return True, self.save_checkpoint()

    def _end_preempted(self, detail: str) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._rank == 0:
            super()._end_preempted(detail)
        else:
            self._finished = True
            self._close_preemption()

    def clear_checkpoint_error(self) -> CheckpointError | None:
        """Forget a failed ``load_checkpoint``, so training may go on; return the error forgotten.

        After any failed :meth:`load_checkpoint`, every watched optimizer step
        and :meth:`save_checkpoint` raise the stored :class:`CheckpointError`,
        so a caught error cannot silently leave training on the wrong state.
        Call this when you have decided the state the model is in is the one
        you want: for instance you caught the error for a missing or damaged
        checkpoint and chose to start from fresh weights, or you re-initialised
        the model and optimizer yourself. Under DDP call it on every rank (each
        keeps its own copy of the error). A later successful
        ``load_checkpoint`` clears it too.

        Returns
        -------
        CheckpointError or None
            The error that was stored, or None if there was none.

        Examples
        --------
        >>> try:                                           # doctest: +SKIP
        ...     tr.load_checkpoint("latest")
        ... except lht.CheckpointError as exc:
        ...     print("starting from scratch:", exc)
        ...     tr.clear_checkpoint_error()
        """
        return self._checkpointer.clear_error()

    # -- saving ---------------------------------------------------------------
    @_not_step_time  # a save is no hang (nor is a load, below)
    def save_checkpoint(self, extra: object = None, *, blocking: bool = True) -> str | None:
        """Save model, optimizer, scheduler, scaler, step, RNG, tunables, control state and ``extra``.

        Under DDP every rank calls it: a barrier comes first, each rank
        captures its own RNG (and ``extra``) at that point, and rank 0 uploads
        one bundle. For a sharded checkpoint (see :meth:`watch`) every rank
        writes the shards it holds instead, and rank 0 publishes once all are
        stored; with ``blocking=False`` each rank copies its own shards.
        Metrics logged before the call are flushed by the time it returns (by
        the time it is published, with ``blocking=False``).

        Parameters
        ----------
        extra:
            Anything ``torch.load(weights_only=True)`` can load (tensors,
            numbers, strings, lists, dicts): a data position, a sampler's
            generator state... Refused here, naming the key path, if it holds
            anything else.
        blocking:
            False: copy the state once into host buffers reused from save to
            save (pinned memory for CUDA tensors) and return; a background
            thread writes, checksums and publishes it while training goes on.
            Training blocks only for that copy; it needs memory for one more
            copy of the state. The next save, ``load_checkpoint``,
            ``finish`` and interpreter exit wait for it;
            :meth:`wait_for_checkpoint` does so explicitly and raises if it
            failed. A failed sharded save also stops training: every rank's
            next watched optimizer step raises it (the same step on every
            rank) until :meth:`clear_checkpoint_error`. A crash before it is
            published leaves no checkpoint (never a partial one).

        Returns
        -------
        str or None
            The artifact id on rank 0 (with ``blocking=False``, the id it will
            be published under), None on other ranks.
        """
        self._check_live()
        artifact = self._checkpointer.save(extra, blocking)
        if self._deferred_preempt is not None:
            self._saved_at_step = (self._step, artifact)  # a preemption's save at this step reuses it
        return artifact

    def wait_for_checkpoint(self) -> None:
        """Wait until a ``save_checkpoint(blocking=False)`` in progress is published.

        Raises
        ------
        CheckpointError
            It failed (the checkpoint was not published; earlier ones stand).
        """
        self._checkpointer.wait()

    # -- loading --------------------------------------------------------------
    @_not_step_time
    def load_checkpoint(
        self, checkpoint: str | os.PathLike[str] = "latest", map_location: MAP_LOCATION = "cpu", strict: bool = False
    ) -> Any:
        """Restore everything a checkpoint holds and return its ``extra``.

        Parameters
        ----------
        checkpoint:
            ``"latest"``: the newest published checkpoint. ``"resume"``: the
            one chosen with ``RunHandle.choose_for_resume()`` (the choice is
            consumed), else the newest; with none saved it restores nothing
            and returns None (a first launch; a relaunch of a run that crashed
            before its first checkpoint starts over at step 0, recorded as a
            rewind), so ``tr.load_checkpoint("resume")`` right after
            ``watch()`` works on every launch. A checkpoint id of this run, or
            a path to a bundle file.
        map_location:
            Where tensors that are not loaded into a watched tensor land
            (``extra``, tensors whose shape or dtype changed); ``"cpu"`` by
            default so peers do not inherit the saving rank's device. Model
            and optimizer tensors are read into the live ones, on their device.
        strict:
            For a sharded checkpoint (format /3) saved by another number of
            ranks: True refuses it rather than give each rank r the RNG and
            ``extra`` of saved rank ``r mod N`` (model and optimizer always
            reshard exactly). Other formats load only on the world size that
            saved them.

        Notes
        -----
        Tensor bytes go straight from the file into the model's and
        optimizer's existing tensors, the CRC64NVME updated as they land. A
        tensor loads the usual way (fresh memory, then ``load_state_dict``)
        when its shape, dtype or layout differs from the live one, when
        several saved tensors share its storage, or when the optimizer has no
        state yet. Files under 64 MiB are verified whole before anything is
        applied. Checkpoints recorded with sha256 (earlier versions) load
        with ``torch.load`` and verify with sha256.

        Raises
        ------
        CheckpointError
            On every rank together, if any rank could not find, fetch, verify
            or apply it (missing, truncated, corrupted, wrong format or world
            size, pickled code). Nothing is applied unless every rank
            verified. Whatever the failure, each rank keeps the error and
            every later watched optimizer step (and ``save_checkpoint``)
            raises it, so training never goes on from state that may be mixed
            or not the one asked for, until a later ``load_checkpoint``
            succeeds or :meth:`clear_checkpoint_error` is called.
        InvalidTypeError
            ``checkpoint`` is not a string or path; raised before anything is
            read, and nothing is kept for later steps.
        """
        self._check_live()
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise InvalidTypeError(
                f"load_checkpoint({checkpoint!r}): pass 'latest', 'resume', a checkpoint id or a path, "
                f"not a {type(checkpoint).__name__}"
            )
        watched = self._checkpointer.require_watch("load_checkpoint()")
        self.wait_for_checkpoint()  # "latest" includes a save still being written
        if checkpoint == "resume" and self._nothing_to_resume():
            return self._restore_nothing()
        with _gc_paused():
            return self._load(checkpoint, map_location, watched, strict)

    def _nothing_to_resume(self) -> bool:
        """Whether the run has no checkpoint for ``"resume"`` (rank 0 reads the log; every rank hears)."""
        nothing = self._events.state().resume_checkpoint is None if self._rank == 0 else None
        return bool(_dist.broadcast(nothing, self._world))

    def _restore_nothing(self) -> None:
        """``"resume"`` with nothing saved: a first launch starts at step 0 as it is; a relaunch of a run
        that crashed before its first checkpoint starts over at step 0 too, and says so with a rewind."""
        rewind = None
        with self._one_summary():
            if self._rank == 0:
                rewind = self._record_rewind(0, None, "load_checkpoint", self.reached)
            rewind = _dist.broadcast(rewind, self._world)
            if rewind is not None:
                self._attempt = rewind.attempt
            self._step = 0
        if rewind is not None:
            self._run_rewind_callbacks(rewind)
        return None

    def _load(
        self, checkpoint: str | os.PathLike[str], map_location: MAP_LOCATION, watched: Watched, strict: bool = False
    ) -> Any:
        """load_checkpoint's work, once its arguments are checked (see there)."""
        target, bundle, extra = self._checkpointer.load(checkpoint, watched, map_location, strict)
        step = int(bundle["step"])
        tunables = bundle.get("tunables")
        saved = bundle.get("control")
        rewind = None
        # the rewind and the restore: one summary after both, put while training goes on
        with self._one_summary():
            if self._rank == 0:
                rewind = self._record_rewind(step, target.get("checkpoint"), "load_checkpoint", self.reached)
                chosen = target.get("checkpoint")
                if target.get("consume") and chosen is not None:
                    self._consume_resume_choice(chosen)
            rewind = _dist.broadcast(rewind, self._world)
            if rewind is not None:
                self._attempt = rewind.attempt
            self._step = step  # not a step boundary: requests wait for the next optimizer step
            self._reached = max(self._reached, step)
            control: Mapping[str, object] = saved if isinstance(saved, dict) else {}
            seq = control.get("seq")
            self._restore_control(
                dict(tunables) if isinstance(tunables, dict) else None,
                seq if isinstance(seq, int) else None,
                bool(control.get("paused", False)),
            )
        if rewind is not None:
            self._run_rewind_callbacks(rewind)
        return extra


class _Link:
    """The run as its checkpointer sees it: a :class:`~launchhelm.torch._link.RunLink`, read live."""

    def __init__(self, run: TorchRun) -> None:
        self._run = run

    @property
    def run_id(self) -> str:
        return self._run.id

    @property
    def store(self) -> Store:
        return self._run._store

    @property
    def events(self) -> EventLog:
        return self._run._events

    @property
    def rank(self) -> int:
        return self._run._rank

    @property
    def world(self) -> int:
        return self._run._world

    @property
    def step(self) -> int:
        return self._run._step

    def control(self) -> ControlState:
        return {"seq": self._run._control_seq, "paused": self._run._paused}

    def tunables(self) -> Mapping[str, Any]:
        return self._run.tunables

    def publish(
        self,
        artifact_id: str,
        *,
        step: int,
        fmt: str,
        files: list[dict[str, Any]],
        checksums: dict[str, str],
        size: int,
        world_size: int,
        control_seq: int,
    ) -> object:
        return self._run._publish_checkpoint(
            artifact_id,
            step=step,
            fmt=fmt,
            files=files,
            checksums=checksums,
            size=size,
            world_size=world_size,
            control_seq=control_seq,
        )

    def store_failed(self, exc: BaseException) -> None:
        self._run._store_failed(exc)

    def step_hooks_off(self, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager[None]:
        return self._run._step_hooks_off(optimizer)


def _apply_to_optimizer(optimizer: torch.optim.Optimizer, scheduler: object, changes: Mapping[str, object]) -> None:
    """Write tunables named like the optimizer's hyperparameters into every param group.

    ``lr`` is the base learning rate: with a scheduler that keeps
    ``base_lrs`` the current rate is scaled by new/old base (the schedule's
    shape is kept) and the scheduler's bases become the new value; without
    one, every group's ``lr`` becomes the value.
    """
    groups = optimizer.param_groups
    for name, value in changes.items():
        if name == "params" or not groups or name not in groups[0]:
            continue
        bases = getattr(scheduler, "base_lrs", None) if name == "lr" else None
        for i, group in enumerate(groups):
            old = group[name]
            if isinstance(old, (int, float)) and not isinstance(old, bool) and isinstance(value, (int, float)):
                if bases is not None and i < len(bases) and bases[i]:
                    group[name] = float(old) * float(value) / float(bases[i])
                    bases[i] = float(value)
                    if "initial_lr" in group:
                        group["initial_lr"] = float(value)
                else:
                    group[name] = float(value)
            elif isinstance(old, tuple) and isinstance(value, list) and len(value) == len(old):
                group[name] = tuple(value)


def init(
    project: str,
    name: str | None = None,
    config: Mapping[str, object] | None = None,
    tunables: Mapping[str, object] | None = None,
    resume: str | None = None,
    store: str | os.PathLike[str] | Store | None = None,
    **options: Unpack[RunOptions],
) -> TorchRun:
    """Start or resume a run for PyTorch training: :func:`launchhelm.init` plus checkpoints.

    Under ``torch.distributed`` every rank calls it with the same arguments:
    rank 0 creates or reopens the run, the other ranks join it (they receive
    its id), so training code is the same on every rank. Initialise the
    process group first. The arguments and keyword options
    (:class:`launchhelm.RunOptions`) are those of :func:`launchhelm.init`.

    Examples
    --------
    >>> import launchhelm.torch as lht                      # doctest: +SKIP
    >>> tr = lht.init("quickstart")
    >>> tr.watch(model, optimizer)
    >>> tr.save_checkpoint(extra={"epoch": 3})
    """
    # on every rank, before the collective: all ranks refuse a misspelt option alike, and nothing is written
    check_options("launchhelm.torch.init", options, RUN_PARAMETERS)
    preemption = preemption_settings(options)
    rank, world = _dist.rank_and_world()
    if world == 1:
        return start_run(
            TorchRun, project, name=name, config=config, tunables=tunables, resume=resume, store=store, **options
        )
    run: TorchRun | None = None
    outcome: tuple[str, str, bool, str] | None = None
    if rank == 0:
        try:
            run = start_run(
                TorchRun, project, name=name, config=config, tunables=tunables, resume=resume, store=store, **options
            )
            outcome = ("ok", run.id, run.resumed, run.session_id)
        except Exception as exc:
            outcome = ("error", f"{type(exc).__name__}: {exc}", False, "")
            _dist.broadcast(outcome, world)
            raise
    outcome = _dist.broadcast(outcome, world)
    assert outcome is not None
    if outcome[0] != "ok":
        raise LaunchHelmError(f"rank 0 could not start the run, so rank {rank} cannot join it: {outcome[1]}")
    if run is None:
        shared = open_store(store, options.get("storage_options"))
        run = TorchRun._join(shared, read_run_record(shared, outcome[1]), rank, world)
    run._rank, run._world = rank, world
    # the same answer on every rank (rank 0's: auto_resume reopens without resume=): `if tr.resumed: load`
    # stays collective
    run.resumed = bool(outcome[2])
    # every rank starts from the run's furthest step (rank 0 computed it at resume)
    run._step = run._reached = int(_dist.broadcast(run._step, world))
    if rank != 0:
        state = run._events.state()
        run._attempt = state.attempt
        tunables, run._control_seq, _ = in_force(dict(run._tunables), state)
        run._tunables = types.MappingProxyType(tunables)
        run._listen_for_preemption(preemption)  # rank 0's listens from start_run
        # hangs: every rank's stacks are stored under rank 0's session, and rank 0's watchdog names the odd one out
        run._plan_helper(
            hang_setting(options.get("hang_timeout", AUTO)),
            options.get("storage_options"),
            end_hung=bool(options.get("auto_resume")),
            session=outcome[3],
            rank=rank,
            world=world,
        )
        run._follow_hangs()
    return run
