"""One checkpoint load, owned by one object: resolve, fetch, plan, read and verify, apply.

:class:`CheckpointLoader` follows a ``TorchRun.load_checkpoint`` call from
the name it was given to the state applied, on every rank together:

1. **resolve** (rank 0, shared by broadcast): ``"latest"``, ``"resume"``, an
   id or a path becomes a target: the store key or path, its recorded size
   and checksums.
2. **fetch**: a local store's file is read where it lies; a remote one is
   downloaded (under DDP once per node); size and zip checked.
3. **plan** (:mod:`launchhelm.torch._inplace`): the pickle alone, each
   tensor matched to the live one it loads into.
4. **read and verify**: all but the matched tensors into fresh memory and
   validated (format, world size, RNG records); every rank agrees before
   anything is applied; then the matched tensors' bytes straight into the
   model and optimizer, the whole file's CRC64NVME checked as they land.
5. **apply**: ``load_state_dict`` where needed, scheduler, scaler, RNG; every
   rank agrees it applied.

The run then restores its own state (step, tunables, control, the rewind).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from launchhelm._exceptions import CheckpointError
from launchhelm.storage import LocalStore
from launchhelm.storage._checksum import CRC64NVME, file_checksums, mismatches, recorded, verifying_algorithms
from launchhelm.torch import _dist, _inplace
from launchhelm.torch._formats import _FORMATS, FORMAT_SINGLE, PAYLOAD_SUFFIX
from launchhelm.torch._inplace import InPlaceLoad, plan_in_place
from launchhelm.torch._manifest import FORMAT_SHARDED, MANIFEST_NAME
from launchhelm.torch._records import Bundle, LoadTarget
from launchhelm.torch._rng import restore_rng, validate_rng
from launchhelm.torch._torch_private import fast_path_available

if TYPE_CHECKING:
    from torch.serialization import MAP_LOCATION

    from launchhelm._runlog._records import CheckpointEvent
    from launchhelm.torch._checkpointer import Checkpointer
    from launchhelm.torch._link import Watched

_log = logging.getLogger("launchhelm")

__all__ = ["CheckpointLoader"]


class CheckpointLoader:
    """One ``load_checkpoint`` of a :class:`~launchhelm.torch.TorchRun`'s checkpointer: see the module docstring.

    Made per load, on every rank; it reads what it needs of the run (through
    the checkpointer's link) when made and writes back only what the
    checkpointer keeps of a load: the error a failed load leaves pending, and
    how much went in place (tests read it).
    """

    def __init__(self, checkpointer: Checkpointer, watched: Watched, map_location: MAP_LOCATION) -> None:
        self._checkpointer = checkpointer
        link = checkpointer.link
        self.id = link.run_id
        self._store, self._events = link.store, link.events
        self._rank, self._world = link.rank, link.world
        self._scheduler, self._scaler = watched.scheduler, watched.scaler
        self._model, self._optimizer, self._map_location = watched.model, watched.optimizer, map_location

    def resolve(self, checkpoint: str | os.PathLike[str]) -> LoadTarget:
        """Step 1: what to load, resolved on rank 0 and shared with every rank (a failure too)."""
        target: LoadTarget | None = None
        error = None
        if self._rank == 0:
            try:
                target = self._resolve(checkpoint)
                # the nonce names the node-local copy under DDP (see _download_once_per_node)
                target["nonce"] = os.urandom(4).hex()
            except Exception as exc:  # any failure here must reach every rank, or the others hang
                error = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
        target, error = _dist.broadcast((target, error), self._world)
        if error is not None:
            self._checkpointer.pending_error = CheckpointError(error, run_id=self.id)
            raise self._checkpointer.pending_error
        assert target is not None
        return target

    def restore(self, target: LoadTarget) -> tuple[Bundle, object]:
        """Steps 2 to 5 for a resolved ``target``; the bundle applied, and its ``extra``."""
        model, optimizer, map_location = self._model, self._optimizer, self._map_location
        # a download's folder; a local store is read where it lies and needs none
        local = isinstance(self._store, LocalStore)
        with contextlib.nullcontext("") if local else tempfile.TemporaryDirectory(prefix="launchhelm-load-") as tmp:
            shared = self._download_once_per_node(target, Path(tmp))
            try:
                bundle, plan, problem = None, None, None
                try:
                    bundle, plan = self._fetch_and_verify(target, Path(tmp), map_location, model, optimizer, shared)
                except Exception as exc:  # a store error on one rank too: every rank must hear of it
                    problem = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
                self._checkpointer.agree(problem, "was not restored (nothing was applied)")
                assert bundle is not None
                problem = None
                try:
                    if plan is not None:  # tensor bytes straight into the model, checked as they land
                        self._read_in_place(plan, target)
                    in_place = plan is not None and plan.model_in_place  # the plan checked the modules
                    extra = self._apply(
                        bundle, model, optimizer, model_in_place=in_place, optimizer_in_place=plan is not None
                    )
                except Exception as exc:
                    problem = f"{type(exc).__name__}: {exc}" if not isinstance(exc, CheckpointError) else str(exc)
                self._checkpointer.agree(
                    problem, "failed part-way while being applied; training state is mixed", pending=True
                )
            finally:
                if shared is not None and _dist.local_rank() == 0:
                    shared.unlink(missing_ok=True)  # every rank has read it: the agreements above are collective
        return bundle, extra

    def _resolve(self, checkpoint: str | os.PathLike[str]) -> LoadTarget:
        """What to load: a published checkpoint's record, or a local path."""
        state = self._events.state()
        if isinstance(checkpoint, str) and checkpoint in ("latest", "resume"):
            event = state.latest_checkpoint if checkpoint == "latest" else state.resume_checkpoint
            if event is None:
                raise CheckpointError(
                    f"run {self.id} has no checkpoint yet: nothing to restore for {checkpoint!r}; "
                    "save one with save_checkpoint()",
                    run_id=self.id,
                )
            consume = checkpoint == "resume" and state.resume_choice == event["checkpoint"]
            return {**_target(event), "consume": consume}
        if isinstance(checkpoint, str) and state.checkpoint(checkpoint) is not None:
            return _target(state.checkpoint(checkpoint))  # type: ignore[arg-type]
        path = Path(os.fspath(checkpoint)).expanduser()
        if path.name == MANIFEST_NAME and path.is_file():
            path = path.parent
        if path.is_dir() and (path / MANIFEST_NAME).is_file():  # a sharded checkpoint's folder
            known = state.checkpoint(path.name)
            folder: LoadTarget = _target(known) if known is not None else {"checkpoint": None}
            folder["path"], folder["format"] = str(path.absolute()), FORMAT_SHARDED
            return folder
        if not path.is_file():
            raise CheckpointError(
                f"no checkpoint {str(checkpoint)!r}: not 'latest', 'resume', a checkpoint id of run "
                f"{self.id}, nor an existing file",
                run_id=self.id,
            )
        target: LoadTarget = {"path": str(path.absolute()), "checkpoint": None}
        # a downloaded copy of a published checkpoint is verified against its record
        known = state.checkpoint(path.name.removesuffix(PAYLOAD_SUFFIX))
        if known is not None:
            target = {**_target(known), "path": str(path.absolute())}
        return target

    def _download_once_per_node(self, target: LoadTarget, tmp: Path) -> Path | None:
        """Under DDP on a remote store, local rank 0 of each node downloads into a node-local file.

        Every rank reads that one copy: a node downloads a checkpoint once,
        not once per GPU. Returns its path (None: each rank fetches its own,
        as outside DDP, or reads the local store in place). Called on every
        rank: it holds a barrier.
        """
        if self._world == 1 or target.get("path") or isinstance(self._store, LocalStore):
            return None
        local_rank = _dist.local_rank()
        if local_rank is None:
            return None  # no LOCAL_RANK (not torchrun): which ranks share a disk is unknown
        name = f"launchhelm-{self.id}-{target['checkpoint']}-{target['nonce']}{PAYLOAD_SUFFIX}"
        shared = Path(tempfile.gettempdir()) / name
        if local_rank == 0:
            try:
                self._store.download(target["key"], shared)
            except Exception as exc:  # every rank finds the file missing and says so together
                _log.warning("checkpoint %s: download failed: %s", target["checkpoint"], exc)
        _dist.barrier(self._world)
        return shared

    def _fetch_and_verify(
        self,
        target: LoadTarget,
        tmp: Path,
        map_location: MAP_LOCATION,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        shared: Path | None = None,
    ) -> tuple[Bundle, InPlaceLoad | None]:
        """The validated bundle, and the plan for its tensors still to be read in place (or None)."""
        if target.get("path"):
            local = Path(target["path"])
        elif shared is not None:
            local = shared
        elif isinstance(self._store, LocalStore):
            local = self._store.root / target["key"]  # read in place: no copy
        else:
            local = self._store.download(target["key"], tmp / Path(target["key"]).name)
        where = target.get("checkpoint") or str(local)
        try:
            size = local.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {where}: its file {local} is missing", run_id=self.id) from None
        if size == 0:
            raise CheckpointError(f"checkpoint {where} is an empty file (0 bytes)", run_id=self.id)
        if target.get("size") is not None and size != target["size"]:
            raise CheckpointError(
                f"checkpoint {where} is {size} bytes but was saved as {target['size']}: truncated or replaced",
                run_id=self.id,
            )
        # A sha256-recorded checkpoint (or a file loaded by path with no
        # record): hash on a second thread while torch.load reads the same
        # file, so verifying costs about one read, not two. The load fills
        # fresh tensors; nothing reaches the model before the hash is checked.
        if not zipfile.is_zipfile(local):
            raise CheckpointError(
                f"checkpoint {where} is not a readable torch file (not a zip archive: truncated, or not a "
                "checkpoint); nothing was loaded",
                run_id=self.id,
            )
        expected = target.get("checksums") or {}
        # in place only on a torch the fast path was tested with; any other loads the file with
        # torch.load, its CRC64NVME computed on a second thread as below
        if CRC64NVME in expected and fast_path_available():
            return self._plan_and_verify(local, where, expected, map_location, model, optimizer)
        found: dict[str, str] = {}
        hasher = None
        if expected:
            algorithms = verifying_algorithms(expected)
            hasher = threading.Thread(target=lambda: found.update(file_checksums(local, algorithms)), daemon=True)
            hasher.start()
        try:
            bundle = torch.load(local, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            error: CheckpointError | None = CheckpointError(
                f"checkpoint {where} was refused by torch.load(weights_only=True): it holds pickled code or "
                f"objects a checkpoint may not contain; nothing in it was executed ({_unpickler_reason(exc)})",
                run_id=self.id,
            )
        except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as exc:
            error = CheckpointError(
                f"checkpoint {where} is not a readable torch file (truncated or not a checkpoint): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}",
                run_id=self.id,
            )
        else:
            error = None
        if hasher is not None:
            hasher.join()
            # a corrupted file is reported as such, whatever torch.load made of it
            self._check_checksums(where, expected, found)
        if error is not None:
            raise error
        return cast("Bundle", dict(self._validate(bundle, where))), None

    def _plan_and_verify(
        self,
        local: Path,
        where: str,
        expected: Mapping[str, str],
        map_location: MAP_LOCATION,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> tuple[Bundle, InPlaceLoad | None]:
        """Plan with a meta load, read all but the in-place tensors, validate (see ``_inplace``)."""
        # the C unpickler with three harmless globals of our own; for anything else (or a file it
        # cannot read) torch's weights-only unpickler plans, and its rules and errors decide
        planned = _inplace.load_plan(local)
        try:
            if planned is None:
                planned = _inplace.plan_from_meta(torch.load(local, map_location="meta", weights_only=True))
        except pickle.UnpicklingError as exc:
            self._check_checksums(where, expected, file_checksums(local, (CRC64NVME,)))
            raise CheckpointError(
                f"checkpoint {where} was refused by torch.load(weights_only=True): it holds pickled code or "
                f"objects a checkpoint may not contain; nothing in it was executed ({_unpickler_reason(exc)})",
                run_id=self.id,
            ) from None
        except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as exc:
            self._check_checksums(where, expected, file_checksums(local, (CRC64NVME,)))
            raise CheckpointError(
                f"checkpoint {where} is not a readable torch file (truncated or not a checkpoint): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}",
                run_id=self.id,
            ) from None
        if planned is None:  # this torch gives no storage offsets: the usual load, CRC64NVME verified
            self._check_checksums(where, expected, file_checksums(local, (CRC64NVME,)))
            bundle = torch.load(local, map_location=map_location, weights_only=True)
            return cast("Bundle", dict(self._validate(bundle, where))), None
        meta, storages = planned
        if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
            self._validate(meta, where)  # the usual refusal for a file that is no bundle
        # Small checkpoints are read whole and checked before anything is applied (a
        # corrupted one then changes nothing); large ones go straight into the model.
        in_place = local.stat().st_size >= _inplace.IN_PLACE_MIN_BYTES
        # _validate refused anything but a bundle's dict
        plan = plan_in_place(
            local, cast("dict[str, object]", meta), model, optimizer, match=in_place, storages=storages
        )
        try:
            bundle = plan.read_rest(map_location)
        except OSError as exc:
            raise CheckpointError(f"checkpoint {where} could not be read: {exc}", run_id=self.id) from None
        except _inplace.LayoutMismatch as exc:
            raise CheckpointError(
                f"checkpoint {where} is corrupted: {exc}; nothing was applied", run_id=self.id
            ) from None
        plan.where, plan.expected = where, dict(expected)
        if plan.matched_bytes == 0:
            self._read_in_place(plan, {})  # nothing goes in place: the whole CRC is known now
            return self._validate(bundle, where), None
        return self._validate(bundle, where), plan

    def _read_in_place(self, plan: InPlaceLoad, target: LoadTarget) -> None:
        self._checkpointer.loaded_in_place = plan.matched_bytes
        try:
            whole = plan.read_matched()
        except OSError as exc:
            raise CheckpointError(f"checkpoint {plan.where} could not be read: {exc}", run_id=self.id) from None
        except _inplace.LayoutMismatch as exc:
            raise CheckpointError(
                f"checkpoint {plan.where} is corrupted: {exc}; its tensors were read straight into the model and "
                "optimizer, which may now hold damaged values; the next optimizer step raises this error: load "
                "another checkpoint (or call clear_checkpoint_error() to train on deliberately)",
                run_id=self.id,
            ) from None
        found = {CRC64NVME: f"{whole:016x}"}
        if plan.matched_bytes == 0:
            self._check_checksums(plan.where, plan.expected, found)
            return
        wrong = mismatches(plan.expected, found)
        if wrong:
            raise CheckpointError(
                f"checkpoint {plan.where} does not match its crc64nvme ({plan.expected[CRC64NVME][:12]}…): the "
                "file is corrupted, and its tensors were read straight into the model and optimizer, which now "
                "hold damaged values; the next optimizer step raises this error: load another checkpoint (or "
                "call clear_checkpoint_error() to train on deliberately)",
                run_id=self.id,
            )

    def _check_checksums(self, where: str, expected: Mapping[str, str], found: Mapping[str, str]) -> None:
        wrong = mismatches(expected, found)
        if wrong or not found:
            algorithm = wrong[0] if wrong else next(iter(expected))
            raise CheckpointError(
                f"checkpoint {where} does not match its {algorithm} ({expected[algorithm][:12]}…): the file is "
                "corrupted (torch.load would not notice: it ignores the zip CRC)",
                run_id=self.id,
            )

    def _validate(self, bundle: object, where: str) -> Bundle:
        """``bundle`` once the fields a restore reads are checked; else CheckpointError."""
        if not isinstance(bundle, dict) or bundle.get("format") not in _FORMATS:
            found = bundle.get("format") if isinstance(bundle, dict) else type(bundle).__name__
            raise CheckpointError(
                f"checkpoint {where} is not a LaunchHelm torch checkpoint (format {found!r}; expected one of "
                f"{', '.join(_FORMATS)})",
                run_id=self.id,
            )
        saved_world = int(bundle.get("world_size", 1))
        if saved_world != self._world:
            raise CheckpointError(
                f"checkpoint {where} was saved by {saved_world} rank(s) and cannot be restored with "
                f"{self._world}: restore a distributed checkpoint with the same world size and rank mapping",
                run_id=self.id,
            )
        for field in ("model", "optimizer"):
            if not isinstance(bundle.get(field), dict):
                raise CheckpointError(f"checkpoint {where} has no {field} state", run_id=self.id)
        if not isinstance(bundle.get("step"), int) or bundle["step"] < 0:
            raise CheckpointError(f"checkpoint {where} has no valid step", run_id=self.id)
        if bundle["format"] == FORMAT_SINGLE:
            validate_rng(bundle.get("rng"), f"checkpoint {where} rng")
        else:
            by_rank = bundle.get("rng_by_rank")
            if not isinstance(by_rank, list) or len(by_rank) != self._world:
                raise CheckpointError(f"checkpoint {where} has no rng_by_rank record per rank", run_id=self.id)
            if by_rank[self._rank].get("rank") != self._rank:
                raise CheckpointError(
                    f"checkpoint {where}: record {self._rank} belongs to rank {by_rank[self._rank].get('rank')}; "
                    "restore with the same rank mapping as the save",
                    run_id=self.id,
                )
            validate_rng(by_rank[self._rank], f"checkpoint {where} rng_by_rank[{self._rank}]")
            self._check_placement(bundle.get("placement_by_rank"), where)
        for name, obj in (("scheduler", self._scheduler), ("scaler", self._scaler)):
            if obj is not None and bundle.get(name) is None:
                raise CheckpointError(
                    f"checkpoint {where} holds no {name} state, but a {name} is watched", run_id=self.id
                )
        return cast("Bundle", bundle)  # every field a restore reads was checked above

    def _check_placement(self, saved: object, where: str) -> None:
        """Refuse a restore where this global rank sits at another local rank than at the save."""
        if not isinstance(saved, list) or len(saved) != self._world or not isinstance(saved[self._rank], dict):
            return  # saved before placements were recorded: nothing to compare
        then, now = saved[self._rank], _dist.placement(self._rank)
        if then.get("local_rank") != now["local_rank"]:
            raise CheckpointError(
                f"checkpoint {where}: rank {self._rank} was local rank {then.get('local_rank')} on "
                f"{then.get('host')} when it was saved and is local rank {now['local_rank']} on {now['host']} now "
                "(a swapped rank mapping: each rank would restore another device's RNG streams); restore with "
                "the same rank mapping as the save",
                run_id=self.id,
            )

    def _apply(
        self,
        bundle: Bundle,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        model_in_place: bool = False,
        optimizer_in_place: bool = False,
    ) -> object:
        """Restore what the bundle holds. ``model_in_place``: every tensor of the model's state dict
        (and no other key) was read into the live tensor of its key, and the model loads the stock
        way (:func:`~launchhelm.torch._inplace.stock_targets`), so ``load_state_dict`` would only
        copy each tensor onto itself: it is skipped (its per-key work adds up over many tensors).
        Each tensor is still copied onto itself (no bytes move), as ``load_state_dict`` would: that
        bumps its autograd version, so a graph built before the load refuses to backpropagate
        through the new values. ``optimizer_in_place``: tensors were read in place, so the
        optimizer's may all be its live ones already, and
        :func:`~launchhelm.torch._inplace.load_optimizer_in_place` does ``load_state_dict``'s work
        without its per-value casts (where it cannot, ``load_state_dict`` runs)."""
        if model_in_place:
            with torch.no_grad():
                for tensor in bundle["model"].values():
                    tensor.copy_(tensor)
        else:
            model.load_state_dict(bundle["model"])
        self._checkpointer.optimizer_in_place = optimizer_in_place and _inplace.load_optimizer_in_place(
            optimizer, bundle["optimizer"]
        )
        if not self._checkpointer.optimizer_in_place:
            optimizer.load_state_dict(bundle["optimizer"])
        if self._scheduler is not None:
            # _validate refused a bundle without the state of a watched scheduler or scaler
            self._scheduler.load_state_dict(cast("dict[str, object]", bundle["scheduler"]))
        if self._scaler is not None:
            self._scaler.load_state_dict(cast("dict[str, object]", bundle["scaler"]))
        if bundle["format"] == FORMAT_SINGLE:
            restore_rng(bundle["rng"])
            extra = bundle.get("extra")
        else:
            restore_rng(bundle["rng_by_rank"][self._rank])
            extra = bundle["extra_by_rank"][self._rank]
        return extra


def _unpickler_reason(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if "WeightsUnpickler error" in line:
            return line.strip()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the duration (as it was before, after).

    A load makes a few objects per tensor (meta tensors, views, scatter-read
    buffers), nearly all freed by reference counting before it returns. With
    the collector on, those allocations trigger collections that walk every
    tracked object of the process (all of torch's), which can cost more than
    the load's own work. Off, what the load leaves behind is what counts
    towards the next one.
    """
    if not gc.isenabled():  # the caller's choice: leave it
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _target(event: CheckpointEvent | Mapping[str, Any]) -> LoadTarget:
    file = event["files"][0]
    return {
        "checkpoint": event["checkpoint"],
        "key": f"{event['prefix']}/{file['name']}",
        "size": int(file["size"]),
        "checksums": recorded(file),
        "step": int(event["step"]),
        "format": event["format"],
        "files": event["files"] if event["format"] == FORMAT_SHARDED else None,
    }
