"""The one in-memory copy a non-blocking save makes, into host buffers reused from save to save.

A non-blocking save copies the state once and lets training go on while a
thread writes the copy out. Fresh memory for that copy is slow to touch the
first time (every page faults in), and a copy from CUDA into pageable memory
runs at a fraction of the bus's speed and cannot overlap. So the copy goes
into buffers kept between saves: pinned (page-locked) memory for CUDA
tensors, every device-to-host copy issued ``non_blocking`` and one
synchronisation at the end, as torch's own async checkpointing does; plain
pre-touched memory for CPU tensors. A buffer is reused only once the save
that wrote from it has been published (the next save waits for it first).
"""

from __future__ import annotations

from typing import TypeVar, cast

import torch

__all__ = ["SnapshotBuffers"]


T = TypeVar("T")


class SnapshotBuffers:
    """Host buffers for the tensors of successive snapshots, matched by position, shape and dtype."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._next = 0
        self._devices: set[int] = set()  # the CUDA devices the current snapshot copies from

    def snapshot(self, value: T) -> T:
        """A copy of ``value`` whose tensors live in this object's host buffers (containers rebuilt)."""
        self._next = 0
        self._devices = set()
        copied = self._copy(value)
        for device in sorted(self._devices):  # the one wait per device: every non-blocking copy has landed
            torch.cuda.synchronize(device)
        del self._buffers[self._next :]  # buffers of tensors no longer saved
        return cast(T, copied)  # the same containers, tensors in host buffers

    def _buffer_for(self, t: torch.Tensor) -> torch.Tensor:
        pinned = t.device.type == "cuda"
        i = self._next
        self._next += 1
        if i < len(self._buffers):
            old = self._buffers[i]
            if old.shape == t.shape and old.dtype == t.dtype and old.is_pinned() == pinned:
                return old
        buffer = torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned)
        if i < len(self._buffers):
            self._buffers[i] = buffer
        else:
            self._buffers.append(buffer)
        return buffer

    def _copy(self, value: object) -> object:
        if isinstance(value, torch.Tensor):
            t = value.detach()
            if t.layout != torch.strided or t.device.type not in ("cpu", "cuda"):
                return t.to("cpu", copy=True)  # sparse, meta, other devices: a plain copy
            buffer = self._buffer_for(t)
            if t.device.type == "cuda":
                self._devices.add(t.device.index if t.device.index is not None else torch.cuda.current_device())
                buffer.copy_(t, non_blocking=True)
            else:
                buffer.copy_(t)
            return buffer
        if isinstance(value, dict):
            copied = {k: self._copy(v) for k, v in value.items()}
            return copied if type(value) is dict else type(value)(copied)
        if isinstance(value, list):
            return [self._copy(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._copy(v) for v in value)
        return value
