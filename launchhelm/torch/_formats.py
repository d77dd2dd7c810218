"""What a bundle file is called and which formats it may carry: shared by saves and loads."""

from __future__ import annotations

__all__ = ["FORMAT_DISTRIBUTED", "FORMAT_SINGLE", "PAYLOAD_SUFFIX"]

#: Format of a single-rank bundle.
FORMAT_SINGLE = "launchhelm.torch.checkpoint/1"
#: Format of a multi-rank (DDP) bundle: one ``rng_by_rank`` record per rank.
FORMAT_DISTRIBUTED = "launchhelm.torch.checkpoint/2"
_FORMATS = (FORMAT_SINGLE, FORMAT_DISTRIBUTED)
PAYLOAD_SUFFIX = ".pt"
