"""Sharded checkpoints (format /3): every rank writes its shards, any number of ranks reads them.

The design, the manifest and what a crash at each moment leaves are in
``docs/storage.md`` ("Sharded checkpoints"). In short: each rank writes the
chunks of the state dict it was assigned as raw bytes into one object of its
own, with a CRC64NVME per block; rank 0 writes a JSON manifest and publishes
the ``checkpoint`` event, which is the commit. A load plans, from the
manifest, the byte ranges that overlap the tensors this rank holds now, reads
them concurrently, checks every block it read, and applies nothing until
every rank has. From local files the checked bytes are not kept: once every
rank agrees they are read again, straight into the live shards, so a load
holds no second copy of the state.

The modules, by job: :mod:`._state` (the one door to torch's distributed
state dicts and DTensors), :mod:`._save` (survey, plan, write, commit),
:mod:`._reads` (where the bytes come from, the planned ranges, the checking
reader, on :mod:`launchhelm.torch._ranged`, the reads both load paths share)
and :mod:`._load` (prepare, agree, apply; ``load_weights``).
"""

from __future__ import annotations

from launchhelm.torch._manifest import FORMAT_SHARDED
from launchhelm.torch._sharded._load import load, load_weights, read_full
from launchhelm.torch._sharded._save import Survey, save, survey
from launchhelm.torch._sharded._state import has_dtensors

__all__ = ["FORMAT_SHARDED", "Survey", "has_dtensors", "load", "load_weights", "read_full", "save", "survey"]
