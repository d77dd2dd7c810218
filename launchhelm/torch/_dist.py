"""The few collective operations checkpoints need, and their single-process stand-ins."""

from __future__ import annotations

import os
from typing import TypeVar, cast

import torch.distributed as dist

from launchhelm._exceptions import LaunchHelmError
from launchhelm.torch._records import Placement

__all__ = ["all_gather", "barrier", "broadcast", "broadcast_flag", "local_rank", "placement", "rank_and_world"]

T = TypeVar("T")


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` outside ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        raise LaunchHelmError(
            f"WORLD_SIZE={world} but torch.distributed is not initialised: call "
            "torch.distributed.init_process_group() before launchhelm.torch.init(), so rank 0 "
            "can open the run and the other ranks join it"
        )
    return 0, 1


def placement(rank: int) -> Placement:
    """Where this rank runs: its host and its local rank there (``LOCAL_RANK``, set by torchrun).

    Saved per rank with a distributed checkpoint. The local rank picks the
    device, and each process's CUDA RNG states belong to its devices, so a
    restore where global ranks sit at other local ranks (a swapped mapping)
    would hand each rank another's streams: it is refused. The host is kept
    for the message only (a job restarted on other nodes is fine).
    """
    import socket

    local = os.environ.get("LOCAL_RANK")
    return {"host": socket.gethostname(), "local_rank": int(local) if local and local.isdigit() else rank}


def local_rank() -> int | None:
    """This process's rank on its node (torchrun's ``LOCAL_RANK``); None when not told."""
    text = os.environ.get("LOCAL_RANK", "").strip()
    return int(text) if text.isdigit() else None


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def broadcast(value: T | None, world: int) -> T:
    """Rank 0's ``value`` on every rank (the others pass None; between our own processes only)."""
    box: list[T | None] = [value]
    if world > 1:
        dist.broadcast_object_list(box, src=0)
    return cast(T, box[0])


def all_gather(value: T, world: int) -> list[T]:
    """Every rank's ``value``, indexed by rank."""
    if world == 1:
        return [value]
    out: list[T | None] = [None] * world
    dist.all_gather_object(out, value)
    return out  # type: ignore[return-value]  # every slot filled by all_gather_object


def broadcast_flag(flag: bool, world: int) -> bool:
    """Rank 0's ``flag`` on every rank: one 1-byte broadcast, cheap enough for every step."""
    if world == 1:
        return flag
    import torch

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    box = torch.tensor([1 if flag else 0], dtype=torch.uint8, device=device)
    dist.broadcast(box, src=0)
    return bool(box.item())
