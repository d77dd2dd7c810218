"""The media index: one row per logged item, in Parquet objects a session writes and merges itself.

A session's index objects are numbered chunks ``first..last`` under
``media/index/<session>/``: a flush writes one chunk (``n-n``); every
:data:`FANOUT` adjacent objects of the same span are merged into one
covering them all (``first-last``), so a session of any length leaves at
most ``FANOUT - 1`` objects per level. Readers take, per session, the
widest objects that cover ``0..last`` without overlap: names alone say what
an object covers, so no manifest is needed (see docs/storage.md, "Media").
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, TypedDict

from launchhelm.storage._keys import parse_fence_name, parse_media_index_name

if TYPE_CHECKING:
    import pyarrow as pa

    from launchhelm.storage import ObjectInfo

__all__ = [
    "FANOUT",
    "INDEX_COLUMNS",
    "IndexRow",
    "choose_index_objects",
    "decode_index",
    "encode_index",
    "fenced_after",
    "merged_away",
]

#: Adjacent index objects of one span merged into one.
FANOUT = 8


class IndexRow(TypedDict):
    """One logged item (an image of a list, a table, a histogram)."""

    key: str
    step: int
    attempt: int
    time: float
    kind: str  # "image" | "table" | "histogram"
    index: int  # its place in the list logged under the key at that step
    caption: str | None
    object: str  # the object's name under media/objects/
    size: int  # the object's bytes
    thumbnail: str | None  # a small PNG's name under media/objects/ (images)
    height: int | None  # images: pixels; tables: rows
    width: int | None  # images: pixels; tables: columns


#: Column order of the index objects.
INDEX_COLUMNS = tuple(IndexRow.__annotations__)


def index_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.string()),
            ("step", pa.int64()),
            ("attempt", pa.int32()),
            ("time", pa.float64()),
            ("kind", pa.string()),
            ("index", pa.int32()),
            ("caption", pa.string()),
            ("object", pa.string()),
            ("size", pa.int64()),
            ("thumbnail", pa.string()),
            ("height", pa.int32()),
            ("width", pa.int32()),
        ]
    )


def encode_index(rows: list[IndexRow] | pa.Table) -> bytes:
    """Parquet bytes (zstd) of index rows: DuckDB and Polars read them as they are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=index_schema())
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def decode_index(data: bytes) -> pa.Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(data))
    return table.select(list(INDEX_COLUMNS)).cast(index_schema())


def choose_index_objects(names: list[str]) -> list[tuple[str, str, int, int]]:
    """The index objects to read, ``(name, session, first, last)``, in session then chunk order.

    Per session: from chunk 0, the object starting there that reaches
    furthest, then from the chunk after it, and so on; objects that others
    cover (merged away, deleted after the grace period) are skipped.
    """
    fences = fenced_after(names)
    by_session: dict[str, dict[int, tuple[int, str]]] = defaultdict(dict)
    for name in names:
        parsed = parse_media_index_name(name)
        if parsed is None:
            continue
        session, first, last = parsed
        if last < first or last >= fences.get(session, last + 1):
            continue  # past a fence: stored by a session after a newer attempt replaced it
        best = by_session[session].get(first)
        if best is None or last > best[0]:
            by_session[session][first] = (last, name)
    chosen: list[tuple[str, str, int, int]] = []
    for session in sorted(by_session):  # session ids begin with their start time
        starts = by_session[session]
        at = 0
        for first in sorted(starts):
            if first < at:
                continue  # inside an object already chosen
            last, name = starts[first]
            chosen.append((name, session, first, last))
            at = last + 1
    return chosen


def fenced_after(names: list[str]) -> dict[str, int]:
    """Per fenced session, the first index chunk number that is not the run's (``fenced-after-<n>.json``
    in the listing itself: see docs/storage.md, "the fence")."""
    fences: dict[str, int] = {}
    for name in names:
        fence = parse_fence_name(name)
        if fence is not None:
            fences[fence[0]] = min(fence[1], fences.get(fence[0], fence[1]))
    return fences


def merge_tables(datas: list[bytes]) -> Any:
    import pyarrow as pa

    return pa.concat_tables([decode_index(data) for data in datas])


def merged_away(infos: list[ObjectInfo], grace: float, now: float) -> list[str]:
    """Names (relative to the index prefix) of objects a wider one of their session covers, that one older
    than ``grace`` seconds: what a session that ended before the grace period passed left for gc."""
    fences = fenced_after([info.key for info in infos])
    by_session: dict[str, list[tuple[int, int, float | None, str]]] = defaultdict(list)
    for info in infos:
        parsed = parse_media_index_name(info.key)
        if parsed is not None:
            session, first, last = parsed
            if last < fences.get(session, last + 1):  # a merge past a fence covers nothing readers take
                by_session[session].append((first, last, info.modified, info.key))
    doomed = []
    for objects in by_session.values():
        wide = [(f, la) for f, la, when, _ in objects if when is not None and now - when >= grace]
        for first, last, _, key in objects:
            if any(f <= first and last <= la and (f, la) != (first, last) for f, la in wide):
                doomed.append(key)
    return doomed
