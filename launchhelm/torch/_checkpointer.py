"""The checkpointer a :class:`~launchhelm.torch.TorchRun` holds: saves and loads, with state of its own.

As torchtitan's trainer holds a checkpointer, the run holds a :class:`Checkpointer`
and asks it to save and load; the checkpointer sees the run only through a
:class:`~launchhelm.torch._link.RunLink`. It owns what saving and loading keep
between calls: the background save's thread and its outcome, the error a failed
load or save leaves pending (every watched optimizer step raises it), the host
buffers non-blocking saves copy into, and the process group sharded background
saves gather on.

Two formats lie behind :class:`CheckpointFormat`: bundles (formats /1 and /2:
one ``torch.save`` file that rank 0 writes, :class:`BundleFormat`) and sharded
checkpoints (format /3: every rank writes its shards, :class:`ShardedFormat`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from launchhelm._exceptions import CheckpointError
from launchhelm._runlog._checkpoints import ChecksumWriter, artifact_prefix, checksum_algorithms, new_artifact_id
from launchhelm.torch import _dist, _sharded
from launchhelm.torch._formats import FORMAT_DISTRIBUTED, FORMAT_SINGLE, PAYLOAD_SUFFIX
from launchhelm.torch._loader import CheckpointLoader
from launchhelm.torch._manifest import FORMAT_SHARDED
from launchhelm.torch._payload import check_payload
from launchhelm.torch._records import Bundle, LoadTarget, RankRecord, Restored, RngRecord
from launchhelm.torch._rng import capture_rng
from launchhelm.torch._snapshot import SnapshotBuffers
from launchhelm.torch._torch_private import zip_crc32_skipped

if TYPE_CHECKING:
    import os

    from torch.distributed import ProcessGroup
    from torch.serialization import MAP_LOCATION

    from launchhelm.torch._link import RunLink, Watched
    from launchhelm.torch._sharded import Survey

__all__ = ["BundleFormat", "CheckpointFormat", "Checkpointer", "ShardedFormat"]


class CheckpointFormat(Protocol):
    """One layout of a checkpoint in the store: the whole of what the checkpointer asks of it."""

    def survey(self, watched: Watched) -> Survey | None:
        """What this rank adds to the save's one gather (None: nothing), taken before it."""
        ...

    def save(self, watched: Watched, records: list[RankRecord], blocking: bool, survey: Survey | None) -> str | None:
        """Write and publish, on every rank after the gather; the artifact id on rank 0."""
        ...

    def load(
        self, target: LoadTarget, watched: Watched, map_location: MAP_LOCATION, strict: bool
    ) -> tuple[Bundle | Restored, object]:
        """Read, verify and apply ``target`` on every rank together; its run-level fields and ``extra``."""
        ...


class Checkpointer:
    """Saves and loads the checkpoints of one run on this rank: see the module docstring.

    Parameters
    ----------
    link:
        What it needs of the run; read when a save or load needs it, never kept apart.
    """

    def __init__(self, link: RunLink) -> None:
        self.link = link
        self.watched: Watched | None = None
        #: A failed load's (or background save's) error: every watched step and save raises it until cleared.
        self.pending_error: CheckpointError | None = None
        self._save_thread: threading.Thread | None = None
        self._save_error: CheckpointError | None = None
        #: A sharded background save's failure, known on every rank; it becomes the pending error of
        #: every rank at the same step boundary (see TorchRun._after_optimizer_step), never of one rank alone.
        self._save_failed: CheckpointError | None = None
        self._save_artifact: str | None = None  # the id the background save publishes under
        self._save_group: ProcessGroup | None = None
        #: Bytes the last load read straight into live tensors (0: all through fresh memory).
        self.loaded_in_place = 0
        self.optimizer_in_place = False  # the last load did load_state_dict's work itself (tests)
        self.snapshots = SnapshotBuffers()  # host buffers of non-blocking saves, reused save to save
        self.bundles = BundleFormat(self)
        self.shards = ShardedFormat(self)
        #: A preemption save published at the next step's start, from the end of the step before:
        #: that step's RNG states and model buffers (a forward since has drawn from the one and may
        #: have updated the other, BatchNorm's running statistics), used by the next save only.
        self.as_of: tuple[RngRecord, dict[str, torch.Tensor]] | None = None

    # -- what is watched --------------------------------------------------------------
    def require_watch(self, what: str) -> Watched:
        if self.watched is None:
            raise CheckpointError(
                f"{what} needs the model and optimizer: call run.watch(model, optimizer) first",
                run_id=self.link.run_id,
            )
        return self.watched

    # -- errors -----------------------------------------------------------------------
    def check_before_step(self) -> None:
        """Raise the pending error before a watched optimizer step trains on state that may be wrong."""
        if self.link.world == 1 and self._save_failed is not None:
            self.take_save_failure()
        if self.pending_error is not None:
            raise self.pending_error

    @property
    def save_failed(self) -> bool:
        """A background save failed and no step has made it the pending error yet."""
        return self._save_failed is not None

    def take_save_failure(self) -> None:
        """Make a failed background save the pending error (the next step raises it), on every rank.

        Under DDP rank 0 reported it: the other ranks' save threads ended with the
        same outcome (the commit shares it), or are about to.
        """
        if self._save_thread is not None:
            self._save_thread.join()
            self._save_thread = None
        failure = self._save_failed or self._save_error
        self._save_failed = self._save_error = None  # raised once through the pending error, cleared with it
        if failure is not None:
            self.pending_error = failure

    def clear_error(self) -> CheckpointError | None:
        """Forget the pending error; return it (see ``TorchRun.clear_checkpoint_error``)."""
        error, self.pending_error = self.pending_error, None
        return error

    def agree(self, problem: str | None, outcome: str, pending: bool = True) -> None:
        """Raise on every rank if any rank had a problem, and keep the error for the next steps.

        The product page's rule: after a failed load, the next step raises
        the stored error instead of training on, even when the caller catches
        the first raise (nothing applied is as wrong as half applied: the
        model is not in the state that was asked for).
        """
        world = self.link.world
        problems = _dist.all_gather(problem, world)
        failed = [(r, p) for r, p in enumerate(problems) if p]
        if not failed:
            return
        detail = "; ".join(f"rank {r}: {p}" if world > 1 else str(p) for r, p in failed)
        error = CheckpointError(f"checkpoint {outcome}: {detail}", run_id=self.link.run_id)
        if pending:
            self.pending_error = error
        raise error

    # -- the background save ------------------------------------------------------------
    def start_background(self, artifact: str, work: Callable[[], None]) -> None:
        """Run a non-blocking save's ``work`` on the save thread (one save in flight at a time)."""
        self._save_thread = threading.Thread(target=work, name=f"launchhelm-save-{artifact}", daemon=False)
        self._save_artifact = artifact
        self._save_thread.start()

    def in_flight(self) -> str | None:
        """The artifact id of a non-blocking save still being written (None: none, or it is done)."""
        thread = self._save_thread
        return self._save_artifact if thread is not None and thread.is_alive() else None

    def background_failed(self, failure: CheckpointError, *, every_rank: bool) -> None:
        """Record the save thread's failure; ``every_rank``: the ranks learnt it together (sharded)."""
        self._save_error = failure
        if every_rank:
            self._save_failed = failure

    def saving_elsewhere(self) -> bool:
        """A background save is in flight on a thread other than this one."""
        return self._save_thread is not None and threading.current_thread() is not self._save_thread

    def wait(self) -> None:
        """Wait for a background save in flight; raise its error (see ``TorchRun.wait_for_checkpoint``)."""
        thread, self._save_thread = self._save_thread, None
        if thread is not None:
            thread.join()
        error, self._save_error = self._save_error, None
        if self._save_failed is not None:  # every rank waits here together: the next steps raise it too
            self.pending_error, self._save_failed = self._save_failed, None
        if error is not None:
            raise error

    def save_group(self) -> ProcessGroup | None:
        """A gloo group of all ranks for background saves, created once, together, in the foreground.

        The commit's collectives run on the save thread while training runs its
        own (FSDP2's all-gathers) on the default group; sharing one group would
        interleave them.
        """
        if self._save_group is None and self.link.world > 1:
            self._save_group = torch.distributed.new_group(backend="gloo")
        return self._save_group

    # -- save and load ----------------------------------------------------------------
    def save(self, extra: object, blocking: bool) -> str | None:
        """``TorchRun.save_checkpoint`` once the run is known live: see there."""
        if self.pending_error is not None:
            raise self.pending_error
        self.wait()
        watched = self.require_watch("save_checkpoint()")
        link = self.link
        problem = None
        try:
            check_payload(extra, "extra")
            check_payload(dict(link.tunables()), "tunables")
        except CheckpointError as exc:
            problem = str(exc)
        _dist.barrier(link.world)
        layout = self.format_for(watched)
        # sharded: what each rank holds travels in this one gather (a non-blocking save's only collective)
        survey = layout.survey(watched)
        mine: RankRecord = {
            "rank": link.rank,
            "problem": problem,
            "rng": self.as_of[0] if self.as_of is not None else capture_rng(),
            "extra": extra,
            "placement": _dist.placement(link.rank),
        }
        if survey is not None:
            mine["shards"] = survey.shared()
        records = _dist.all_gather(mine, link.world) if link.world > 1 else [mine]
        problems = [f"rank {r['rank']}: {r['problem']}" for r in records if r["problem"]]
        if problems:
            raise CheckpointError("checkpoint not saved: " + "; ".join(problems), run_id=link.run_id, step=link.step)
        return layout.save(watched, records, blocking, survey)

    def model_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (a model's state dict) with the buffers of :attr:`as_of` in place of the live ones."""
        if self.as_of is None:
            return state
        buffers = self.as_of[1]
        return {k: buffers.get(k, v) for k, v in state.items()}

    def format_for(self, watched: Watched) -> CheckpointFormat:
        """The format a save of ``watched`` writes."""
        return self.shards if watched.sharded else self.bundles

    def load(
        self, checkpoint: str | os.PathLike[str], watched: Watched, map_location: MAP_LOCATION, strict: bool
    ) -> tuple[LoadTarget, Bundle | Restored, object]:
        """Resolve, read, verify and apply ``checkpoint``: what it was, its run-level fields and ``extra``.

        ``TorchRun.load_checkpoint`` has checked its arguments, waited for a save in flight,
        and restores the run's own state (step, tunables, control, the rewind) afterwards.
        """
        target = CheckpointLoader(self, watched, map_location).resolve(checkpoint)
        layout: CheckpointFormat = self.shards if target.get("format") == FORMAT_SHARDED else self.bundles
        bundle, extra = layout.load(target, watched, map_location, strict)
        self.pending_error = None
        return target, bundle, extra


class BundleFormat:
    """Formats /1 and /2: one ``torch.save`` file of everything, written by rank 0.

    Rank 0 streams it straight into the store (never a whole in-memory copy),
    then publishes it by an event with its size and whole-file CRC64NVME
    (computed as the bytes are written). Loads go through
    :class:`~launchhelm.torch._loader.CheckpointLoader`.
    """

    def __init__(self, checkpointer: Checkpointer) -> None:
        self._checkpointer = checkpointer

    def survey(self, watched: Watched) -> Survey | None:
        return None  # rank 0 writes all: the other ranks add their RNG and extra only

    def save(self, watched: Watched, records: list[RankRecord], blocking: bool, survey: Survey | None) -> str | None:
        link = self._checkpointer.link
        artifact: str | None = None
        error: str | None = None
        if link.rank == 0:
            try:
                if blocking:
                    artifact = self._write_bundle(watched, records)
                else:
                    artifact = self._start_background_save(watched, records)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, ConnectionError):
                    # said once with the session's other outage lines; nothing was published
                    link.store_failed(exc)
                    error += (
                        "; nothing was published (the previous checkpoint is still the latest): "
                        "save again once the store answers"
                    )
        artifact, error = _dist.broadcast((artifact, error), link.world)
        if error is not None:
            raise CheckpointError(f"checkpoint at step {link.step} was not saved: {error}", run_id=link.run_id)
        return artifact if link.rank == 0 else None

    def load(
        self, target: LoadTarget, watched: Watched, map_location: MAP_LOCATION, strict: bool
    ) -> tuple[Bundle | Restored, object]:
        return CheckpointLoader(self._checkpointer, watched, map_location).restore(target)

    def _bundle(self, watched: Watched, records: list[RankRecord]) -> Bundle:
        link = self._checkpointer.link
        bundle: Bundle = {
            "format": FORMAT_SINGLE if link.world == 1 else FORMAT_DISTRIBUTED,
            "run_id": link.run_id,
            "step": link.step,
            "saved_at": time.time(),
            "world_size": link.world,
            "torch_version": str(torch.__version__),
            "model": self._checkpointer.model_state(watched.model.state_dict()),
            "optimizer": watched.optimizer.state_dict(),
            "scheduler": watched.scheduler.state_dict() if watched.scheduler is not None else None,
            "scaler": watched.scaler.state_dict() if watched.scaler is not None else None,
            "tunables": dict(link.tunables()),
            "control": link.control(),
        }
        if link.world == 1:
            bundle["rng"] = records[0]["rng"]
            bundle["extra"] = records[0]["extra"]
        else:
            bundle["rng_by_rank"] = [{"rank": r["rank"], **r["rng"]} for r in records]
            bundle["extra_by_rank"] = [r["extra"] for r in records]
            bundle["placement_by_rank"] = [r["placement"] for r in records]
        return bundle

    def _write_bundle(self, watched: Watched, records: list[RankRecord]) -> str:
        link = self._checkpointer.link
        bundle = self._bundle(watched, records)
        check_payload(bundle, "checkpoint")  # e.g. a scheduler whose state holds an object
        artifact = new_artifact_id(link.step)
        self._write(bundle, artifact, link.step, link.control()["seq"])
        return artifact

    def _start_background_save(self, watched: Watched, records: list[RankRecord]) -> str:
        checkpointer = self._checkpointer
        link = checkpointer.link
        bundle = self._bundle(watched, records)
        check_payload(bundle, "checkpoint")
        snapshot = checkpointer.snapshots.snapshot(bundle)  # the one in-memory copy training waits for
        artifact = new_artifact_id(link.step)
        step, control_seq = link.step, link.control()["seq"]

        def work() -> None:
            try:
                self._write(snapshot, artifact, step, control_seq)
            except BaseException as exc:
                if isinstance(exc, ConnectionError):
                    link.store_failed(exc)  # said once with the session's other outage lines
                failure = CheckpointError(
                    f"background save of checkpoint {artifact} (step {step}) failed: {type(exc).__name__}: {exc}",
                    run_id=link.run_id,
                    step=step,
                )
                checkpointer.background_failed(failure, every_rank=False)

        checkpointer.start_background(artifact, work)
        return artifact

    def _write(self, bundle: Bundle, artifact: str, step: int, control_seq: int) -> None:
        link = self._checkpointer.link
        name = f"{artifact}{PAYLOAD_SUFFIX}"
        key = f"{artifact_prefix(link.run_id, artifact)}/{name}"
        with link.store.writer(key) as raw:
            out = ChecksumWriter(raw, checksum_algorithms(link.store))
            try:
                # the zip CRC32s cost a pass over the bytes and torch.load never checks them;
                # the CRC64NVME recorded with the checkpoint is what loads verify
                with zip_crc32_skipped():
                    torch.save(bundle, out)  # type: ignore[arg-type]  # write-only is all torch.save needs
            finally:
                out.close()
        checksums = out.checksum.hexdigests()
        link.publish(
            artifact,
            step=step,
            fmt=bundle["format"],
            files=[{"name": name, "size": out.size, **checksums}],
            checksums=checksums,
            size=out.size,
            world_size=link.world,
            control_seq=control_seq,
        )


class ShardedFormat:
    """Format /3: every rank writes the shards it holds; rank 0 the manifest and the commit (see ``_sharded``)."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        self._checkpointer = checkpointer

    def survey(self, watched: Watched) -> Survey | None:
        return _sharded.survey(self._checkpointer.link, watched, self._checkpointer.model_state)

    def save(self, watched: Watched, records: list[RankRecord], blocking: bool, survey: Survey | None) -> str | None:
        return _sharded.save(self._checkpointer, watched, records, blocking, survey)

    def load(
        self, target: LoadTarget, watched: Watched, map_location: MAP_LOCATION, strict: bool
    ) -> tuple[Bundle | Restored, object]:
        return _sharded.load(self._checkpointer, target, watched, strict)
