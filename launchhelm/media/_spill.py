"""Media that wait for the store on local disk: in the session's spool, never dropped.

``log()`` keeps media in memory up to the session's bound; past it (the store
is slower than the logging) each further call's media go to a file in the
spool instead of making ``log()`` wait, and the media thread reads them back
in turn. What ``finish()`` could not store in its time goes there too. A
file is ``<session>.media-<seq>.lhm``: a JSON header (key, step, attempt,
time, each item's kind, caption, format and shape) and the raw pixel bytes,
written under a temporary name and renamed, so a kill mid-write leaves no
half file. Never pickle: a reader of a spool runs nothing from it.

A dead or ended session's files are stored by
:func:`launchhelm.media._recover.recover_media`.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from launchhelm._exceptions import SourceReadError
from launchhelm.media._types import Prepared, PreparedHistogram, PreparedImage, PreparedTable

__all__ = [
    "BATCH",
    "RECOVERED_BASE",
    "handoff_name",
    "is_handoff",
    "read_spilled",
    "spill_name",
    "spill_paths",
    "write_spilled",
]

_MAGIC = b"LHMEDIA1"
_LEN = struct.Struct("<I")
#: Index chunk numbers of recovered media start here (a session's own flushes never get near it).
RECOVERED_BASE = 50_000_000
#: Spilled files per recovered index chunk.
BATCH = 1_000
_SUFFIX = ".lhm"


#: What tells a file handed to the helper (:mod:`launchhelm.media._handoff`) from one the training process
#: reads back itself: ``<session>.media-h<seq>.lhm``. Both kinds share one sequence.
_HANDOFF = "h"


def spill_name(session_id: str, seq: int) -> str:
    return f"{session_id}.media-{seq:08d}{_SUFFIX}"


def handoff_name(session_id: str, seq: int) -> str:
    """A file the helper process encodes and stores (same format as a spilled one)."""
    return f"{session_id}.media-{_HANDOFF}{seq:08d}{_SUFFIX}"


def is_handoff(path: Path) -> bool:
    return ".media-" + _HANDOFF in path.name


def spill_paths(directory: Path, session_id: str) -> list[tuple[int, Path]]:
    """A session's media files in the spool (spilled and handed to the helper), oldest first, as ``(seq, path)``."""
    found = []
    for path in directory.glob(f"{session_id}.media-*{_SUFFIX}"):
        number = path.name[len(session_id) + 7 : -len(_SUFFIX)].removeprefix(_HANDOFF)
        try:
            found.append((int(number), path))
        except ValueError:
            continue
    return sorted(found)


def write_spilled(path: Path, key: str, step: int, attempt: int, now: float, items: list[Prepared]) -> None:
    """Write one ``log()`` call's items of ``key`` to ``path`` (atomically: a temporary name, then renamed)."""
    buffers: list[memoryview] = []

    def image(item: PreparedImage) -> dict[str, Any]:
        buffers.append(item.pixels.data.cast("B"))  # C-contiguous: log() made the copy
        return {
            "caption": item.caption,
            "format": item.format,
            "quality": item.quality,
            "shape": list(item.pixels.shape),
        }

    described: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, PreparedImage):
            described.append({"kind": "image", **image(item)})
        elif isinstance(item, PreparedTable):
            rows = [[{"image": image(c)} if isinstance(c, PreparedImage) else c for c in row] for row in item.rows]
            described.append({"kind": "table", "columns": item.columns, "rows": rows, "caption": item.caption})
        else:
            described.append({"kind": "histogram", "counts": item.counts, "edges": item.edges, "caption": item.caption})
    header = json.dumps({"key": key, "step": step, "attempt": attempt, "time": now, "items": described}).encode()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(_MAGIC + _LEN.pack(len(header)) + header)
        for buffer in buffers:
            out.write(buffer)
    os.replace(tmp, path)


def read_spilled(path: Path) -> tuple[str, int, int, float, list[Prepared]]:
    """``(key, step, attempt, time, items)`` of a file :func:`write_spilled` wrote.

    Raises :class:`SourceReadError` (a ``ValueError``) for a file that is not one, or is cut short.
    """
    import numpy as np

    data = path.read_bytes()
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _LEN.size:
        raise SourceReadError(f"{path} is not a spilled media file", source=str(path))
    (length,) = _LEN.unpack_from(data, len(_MAGIC))
    at = len(_MAGIC) + _LEN.size
    head = json.loads(data[at : at + length])
    at += length

    def image(desc: dict[str, Any]) -> PreparedImage:
        nonlocal at
        shape = tuple(int(n) for n in desc["shape"])
        if len(shape) != 3:
            raise SourceReadError(f"{path}: an image of shape {shape}", source=str(path))
        size = shape[0] * shape[1] * shape[2]
        if at + size > len(data):
            raise SourceReadError(f"{path} is cut short", source=str(path))
        pixels = np.frombuffer(data, dtype=np.uint8, count=size, offset=at).reshape(shape).copy()
        at += size
        return PreparedImage(pixels, desc["caption"], str(desc["format"]), desc["quality"])

    items: list[Prepared] = []
    for desc in head["items"]:
        if desc["kind"] == "image":
            items.append(image(desc))
        elif desc["kind"] == "table":
            rows = [
                [image(c["image"]) if isinstance(c, dict) else c for c in row]
                for row in desc["rows"]  # cells are plain JSON: a dict is always our image marker
            ]
            items.append(PreparedTable(list(desc["columns"]), rows, desc["caption"]))
        elif desc["kind"] == "histogram":
            items.append(PreparedHistogram(list(desc["counts"]), list(desc["edges"]), desc["caption"]))
        else:
            raise SourceReadError(f"{path}: an item of kind {desc['kind']!r}", source=str(path))
    return str(head["key"]), int(head["step"]), int(head["attempt"]), float(head["time"]), items
