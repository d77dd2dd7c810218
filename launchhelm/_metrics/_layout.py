"""Where a run's metrics live, and the manifest that says which chunks segments replace.

One listing of ``runs/<id>/metrics/`` finds everything: chunks
(``<dir>/<n:08d>-<first>-<last>.arrow``), segments
(``segments/L<level>-<token>.parquet``) and manifests
(``manifest-<seq:020d>.json``). See ``docs/storage.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TypedDict

from launchhelm._exceptions import LaunchHelmError
from launchhelm.storage import Store
from launchhelm.storage._keys import (
    EVAL_CHUNK_PREFIX,
    manifest_key,
    metrics_prefix,
    parse_chunk_name,
    parse_fence_name,
    parse_manifest_name,
    parse_segment_name,
)

__all__ = ["ChunkRef", "Listing", "Manifest", "list_metrics", "metrics_prefix"]

MANIFEST_FORMAT = "launchhelm.manifest/1"


class DamagedManifestError(LaunchHelmError, ValueError):
    """A manifest object that does not parse (written by something else, or damaged)."""


@dataclass(frozen=True, order=True)
class ChunkRef:
    """One chunk, ordered as points arrived: sessions by start (their ids begin with it), then evaluations."""

    rank: int  # 0: a session's chunks, 1: an evaluation's scores (written later, at checkpoints' steps)
    dir: str
    number: int
    first_step: int = field(compare=False)
    last_step: int = field(compare=False)
    key: str = field(compare=False)  # full store key
    size: int = field(default=0, compare=False)


class SegmentRecord(TypedDict):
    """A segment as a manifest names it (``SegmentRef`` in JSON)."""

    key: str
    level: int
    rows: int
    bytes: int
    first_step: int
    last_step: int


@dataclass(frozen=True)
class SegmentRef:
    key: str  # relative to the metrics prefix, "segments/L0-....parquet"
    level: int
    rows: int
    bytes: int
    first_step: int
    last_step: int

    def to_json(self) -> SegmentRecord:
        return {
            "key": self.key,
            "level": self.level,
            "rows": self.rows,
            "bytes": self.bytes,
            "first_step": self.first_step,
            "last_step": self.last_step,
        }

    @classmethod
    def from_json(cls, raw: SegmentRecord) -> SegmentRef:
        return cls(
            str(raw["key"]),
            int(raw["level"]),
            int(raw["rows"]),
            int(raw["bytes"]),
            int(raw["first_step"]),
            int(raw["last_step"]),
        )


@dataclass(frozen=True)
class Manifest:
    """Manifest ``seq``: the segments, oldest points first, and the chunks they cover."""

    seq: int
    covered: dict[str, int]
    segments: tuple[SegmentRef, ...]
    max_step: int = 0
    created: float = 0.0
    by: str = ""

    def covers(self, chunk: ChunkRef) -> bool:
        return chunk.number <= self.covered.get(chunk.dir, -1)

    def encode(self) -> bytes:
        body = {
            "format": MANIFEST_FORMAT,
            "seq": self.seq,
            "covered": dict(sorted(self.covered.items())),
            "segments": [s.to_json() for s in self.segments],
            "max_step": self.max_step,
            "created": self.created,
            "by": self.by,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, seq: int) -> Manifest:
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise DamagedManifestError(f"manifest {seq} is not JSON ({exc})") from None
        if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT or int(raw.get("seq", -1)) != seq:
            raise DamagedManifestError(f"not a {MANIFEST_FORMAT} manifest with seq {seq}")
        return cls(
            seq=seq,
            covered={str(k): int(v) for k, v in dict(raw["covered"]).items()},
            segments=tuple(SegmentRef.from_json(s) for s in raw["segments"]),
            max_step=int(raw.get("max_step", 0)),
            created=float(raw.get("created", 0.0)),
            by=str(raw.get("by", "")),
        )


EMPTY = Manifest(seq=0, covered={}, segments=())


@dataclass
class Listing:
    """What one listing of a run's metrics found."""

    prefix: str
    chunks: list[ChunkRef]  # in arrival order
    manifests: dict[int, float | None]  # seq -> modification time
    segments: dict[str, float | None]  # relative key -> modification time

    @property
    def newest_manifest(self) -> int:
        return max(self.manifests, default=0)

    def uncovered(self, manifest: Manifest) -> list[ChunkRef]:
        return [c for c in self.chunks if not manifest.covers(c)]


def parse_chunk(prefix: str, name: str, size: int = 0) -> ChunkRef | None:
    """A chunk from its name under ``metrics/`` (``<dir>/<n>-<first>-<last>.arrow``), else None."""
    parsed = parse_chunk_name(name)
    if parsed is None:
        return None
    session, number, first, last = parsed
    rank = 1 if session.startswith(EVAL_CHUNK_PREFIX) else 0
    return ChunkRef(rank, session, number, first, last, f"{prefix}/{name}", size)


def list_metrics(store: Store, run_id: str) -> Listing:
    """One listing of ``runs/<id>/metrics/``: chunks, segments and manifests."""
    prefix = metrics_prefix(run_id)
    chunks: list[ChunkRef] = []
    manifests: dict[int, float | None] = {}
    segments: dict[str, float | None] = {}
    fences: dict[str, int] = {}
    for info in store.list_info(prefix):
        name = info.key
        if (seq := parse_manifest_name(name)) is not None:
            manifests[seq] = info.modified
        elif parse_segment_name(name):
            segments[name] = info.modified
        elif (fence := parse_fence_name(name)) is not None:
            fences[fence[0]] = min(fences.get(fence[0], fence[1]), fence[1])
        else:
            chunk = parse_chunk(prefix, name, info.size)
            if chunk is not None:
                chunks.append(chunk)
    if fences:
        # a fenced session's chunks past its watermark were sent after a newer attempt took over (or
        # recovered from its spool since): never the run's, whoever reads or compacts
        chunks = [c for c in chunks if c.number < fences.get(c.dir, c.number + 1)]
    chunks.sort()
    return Listing(prefix, chunks, manifests, segments)


def read_manifest(store: Store, run_id: str, seq: int) -> Manifest:
    """Manifest ``seq`` (0: the empty one, before any compaction)."""
    if seq == 0:
        return EMPTY
    return Manifest.decode(store.read(manifest_key(run_id, seq)), seq)
