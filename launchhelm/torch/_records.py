"""What a torch checkpoint carries between ranks and into a bundle, typed.

The RNG record, a rank's contribution to a save, a bundle's top-level
fields and the target a load resolved: TypedDicts so that mypy catches a
field renamed on one side only. A bundle read from a file is checked by
``_loader`` before anything treats it as one of these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypedDict

import torch

if TYPE_CHECKING:
    from typing import TypeAlias

    from typing_extensions import NotRequired

    from launchhelm._runlog._records import CheckpointFile, Json

__all__ = [
    "Bundle",
    "ControlState",
    "LoadTarget",
    "NumpyRng",
    "Offer",
    "Placement",
    "RankRecord",
    "Restored",
    "RngRecord",
    "Shared",
    "Stateful",
]


class NumpyRng(TypedDict):
    key: torch.Tensor  # 624 words as int64: the values exceed 2**31
    pos: int
    has_gauss: int
    cached_gaussian: float


class RngRecord(TypedDict):
    python: tuple[int, torch.Tensor, float | None]
    torch: torch.Tensor
    cuda: list[torch.Tensor]
    numpy: NumpyRng | None


#: What one rank offers to write of one tensor of a sharded save:
#: (key, dtype name, global shape, offset of its box, shape of its box, bytes of its box).
Offer: TypeAlias = tuple[str, str, list[int], list[int], list[int], int]
#: What a sharded save's gather carries of each rank: its offers, its problem, (rank 0) the new checkpoint id.
Shared: TypeAlias = tuple[list[Offer], str | None, str | None]


class Placement(TypedDict):
    host: str
    local_rank: int


class RankRecord(TypedDict):
    """One rank's part of a save, gathered by every rank before anything is written."""

    rank: int
    problem: str | None
    rng: RngRecord
    extra: object
    placement: Placement
    #: sharded saves only: the rank's offer, problem and (rank 0) new checkpoint id (``_sharded.Survey.shared``)
    shards: NotRequired[Shared]


class ControlState(TypedDict):
    seq: int
    paused: bool


class Bundle(TypedDict):
    """A bundle checkpoint (formats /1 and /2): one ``torch.save`` of these fields."""

    format: str
    run_id: str
    step: int
    saved_at: float
    world_size: int
    torch_version: str
    model: dict[str, torch.Tensor]
    optimizer: dict[str, object]
    scheduler: dict[str, object] | None
    scaler: dict[str, object] | None
    tunables: dict[str, Json]
    control: ControlState
    rng: NotRequired[RngRecord]
    extra: NotRequired[object]
    rng_by_rank: NotRequired[list[dict[str, object]]]
    extra_by_rank: NotRequired[list[object]]
    placement_by_rank: NotRequired[list[Placement]]


class Restored(TypedDict):
    """What a sharded load gives ``TorchRun._load`` of the checkpoint's bundle-level fields."""

    step: int
    tunables: object
    control: object


class LoadTarget(TypedDict, total=False):
    """What a load resolved on rank 0 and shared with every rank: a published checkpoint or a path."""

    checkpoint: str | None
    path: str
    key: str
    size: int
    checksums: dict[str, str]
    step: int
    format: str
    files: list[CheckpointFile] | None
    consume: bool
    nonce: str


class Stateful(Protocol):
    """What a checkpoint saves of a scheduler or scaler: torch's own ``state_dict`` pair."""

    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state_dict: dict[str, object], /) -> None: ...
