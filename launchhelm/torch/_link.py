"""What a checkpoint needs of its run, typed: the whole of that surface.

The checkpointer (:mod:`._checkpointer`) never sees a :class:`~launchhelm.torch.TorchRun`:
the run hands it a :class:`RunLink` (its id, store, event log, rank and world, step, control
state and tunables, a way to publish and to report an outage) and what ``watch()`` named
(:class:`Watched`). Writing format /3's objects and manifest needs less again
(:class:`Publisher`), so an import (``launchhelm import dcp``) publishes through a plain run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from launchhelm._runlog._events import EventLog
    from launchhelm.storage import Store
    from launchhelm.torch._records import ControlState, Stateful

__all__ = ["Publisher", "RunLink", "Watched"]


class Publisher(Protocol):
    """What writing and publishing a checkpoint's files needs of a run."""

    @property
    def run_id(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def world(self) -> int:
        """Ranks that save the checkpoint (what its event records)."""
        ...

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
        """Append the ``checkpoint`` event: the commit (a checkpoint exists only once it does)."""
        ...


class RunLink(Publisher, Protocol):
    """What saving and loading checkpoints needs of a live run, besides publishing."""

    @property
    def events(self) -> EventLog:
        """The run's event log: a load resolves ``"latest"``, ``"resume"`` and ids in it."""
        ...

    @property
    def rank(self) -> int: ...

    @property
    def step(self) -> int:
        """The run's current step: what a save records."""
        ...

    def control(self) -> ControlState:
        """The control sequence number and pause state in force: what a save records."""
        ...

    def tunables(self) -> Mapping[str, Any]:
        """The tunables in force: what a save records."""
        ...

    def store_failed(self, exc: BaseException) -> None:
        """Say an outage once, with the session's other outage lines."""
        ...

    def step_hooks_off(self, optimizer: torch.optim.Optimizer) -> AbstractContextManager[None]:
        """The run's optimizer step hooks off for the duration (a step that is not a training step)."""
        ...


@dataclass(frozen=True)
class Watched:
    """What ``TorchRun.watch()`` named: what checkpoints save and restore, and in which format."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Stateful | None = None
    scaler: Stateful | None = None
    #: format /3: every rank writes its own shards (see ``_sharded``)
    sharded: bool = False
