"""Loading a bundle straight into the watched model's and optimizer's tensors.

``torch.load`` fills fresh memory (slow to touch, and a checksum would read
it again) and ``load_state_dict`` then copies it again. Instead:

1. **Plan**: :func:`meta_load` reads only the pickle, with the C unpickler
   given three sealed globals of our own, and makes each tensor a plain
   record (:class:`_Planned`: dtype, geometry, and its storage's byte offset
   in the file), no torch object per tensor. The offsets follow from the zip's
   central directory where the file is laid out as torch writes one
   (:func:`_sequential_layout`), so no local header is read to plan (and the
   pickle is read where the directory puts it: torch's zip reader is not
   opened, see :func:`load_plan`); each
   storage's local header is checked (its record's name, where its data
   starts) when steps 2 and 3 read its bytes anyway. Other zips: one
   ``get_record_offset`` a storage, headers prefetched when cold. Anything
   the planner does not take: ``torch.load(map_location="meta",
   weights_only=True)`` plans, as it did before, and :func:`planned_from_meta`
   turns its meta tensors into the same records (offsets from
   ``_checkpoint_offset``, as ``torch.serialization`` sets it). Each saved
   tensor that fills its storage is matched to the live tensor it will be
   loaded into: the model's parameter or buffer of the same key, the
   optimizer's state tensor of the parameter its saved index stands for (as
   ``Optimizer.load_state_dict`` maps them) and the same name. A match needs
   the same shape and dtype, a plain contiguous live tensor on CPU or CUDA
   whose memory no other match overlaps, and a storage no other saved tensor
   shares.
2. **Everything else first** (the pickle, zip headers, RNG states, ``extra``,
   unmatched tensors): read into fresh memory, each range's CRC64NVME kept.
   The bundle is then whole and real, so it is validated (format, world size,
   RNG records) before a single byte reaches the model.
3. **Matched tensors**: ``os.preadv`` straight into their memory, scatter
   reads of 4 MiB pieces that fill every tensor (and zip header) they span,
   on two threads (CUDA tensors: per tensor, through a reused pinned
   buffer), each piece's CRC computed as it lands. The chunks' and step 2's CRCs are
   combined in file order into the whole file's CRC64NVME, compared with the
   record: one pass over the bytes, at the disk's speed. A file that is not
   in the page cache (``mincore`` probes, :func:`_cached`) is read as one
   stream of big requests instead, each piece's CRC taken on the other
   thread while the next is read (:func:`_stream`): what the disk's
   read-ahead wants.

Unmatched tensors (different shape, dtype or layout, tied weights, a fresh
optimizer without state yet) fall back to today's path for that tensor:
fresh memory, then ``load_state_dict`` copies it (and reports a mismatch as
it always has). When every entry of the model's state dict went in place
and the model loads the stock way, ``load_state_dict`` (which would copy
each tensor onto itself) is skipped; where every optimizer state tensor went
in place, :func:`load_optimizer_in_place` does ``Optimizer.load_state_dict``'s
work without its per-value casts. A CRC mismatch found in step 3 means corrupted bytes may now
sit in the model: the caller raises a :class:`CheckpointError` that also
poisons the next optimizer step.

The torch internals this relies on are reached only through
:mod:`launchhelm.torch._torch_private`; the loader takes this path only where
its ``fast_path_available()`` says so.
"""

from __future__ import annotations

from launchhelm.torch._inplace._match import plan_in_place
from launchhelm.torch._inplace._plan import load_plan, meta_load, plan_from_meta, planned_from_meta
from launchhelm.torch._inplace._reads import InPlaceLoad
from launchhelm.torch._inplace._zip import LayoutMismatch
from launchhelm.torch._torch_private import load_optimizer_in_place, stock_targets

__all__ = [
    "IN_PLACE_MIN_BYTES",
    "InPlaceLoad",
    "LayoutMismatch",
    "load_optimizer_in_place",
    "load_plan",
    "meta_load",
    "plan_from_meta",
    "plan_in_place",
    "planned_from_meta",
    "stock_targets",
]


#: Files smaller than this are read whole into fresh memory and verified before anything is
#: applied, so a corrupted small checkpoint changes nothing; it costs milliseconds at this size.
IN_PLACE_MIN_BYTES = 64 * 2**20
