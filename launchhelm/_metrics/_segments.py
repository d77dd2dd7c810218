"""Segments: many chunks' points as one immutable Parquet file (zstd).

The columns are exactly the chunks' (``step``, ``attempt``, ``time``,
``key``, ``value``), one row per point in arrival order, so DuckDB, Polars or
pyarrow read a run's compacted metrics straight from the store.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["decode_chunk", "decode_segment", "empty_points", "encode_segment", "plain_points", "points_schema"]

SEGMENT_FORMAT = b"launchhelm.segment/1"


def points_schema() -> pa.Schema:
    """The five columns, keys as plain strings."""
    import pyarrow as pa

    return pa.schema(
        [
            ("step", pa.int64()),
            ("attempt", pa.int32()),
            ("time", pa.float64()),
            ("key", pa.string()),
            ("value", pa.float64()),
        ]
    )


# Built with Table.from_arrays and Schema.empty_table, not pa.table({...}): that asks whether each
# column is a pandas object, which imports pandas into the training process (compaction runs there).
def empty_points() -> pa.Table:
    return points_schema().empty_table()


def _plain(table: pa.Table) -> pa.Table:
    """The five columns with string keys, whatever the encoding they came in."""
    schema = points_schema()
    return type(table).from_arrays([table.column(f.name).cast(f.type) for f in schema], schema=schema)


def plain_points(table: pa.Table | None) -> pa.Table:
    """:func:`_plain` of ``table``; None gives the empty table (for its schema)."""
    return empty_points() if table is None else _plain(table)


def decode_chunk(blob: bytes) -> pa.Table:
    """One Arrow IPC chunk as a table with string keys."""
    import pyarrow as pa

    return _plain(pa.ipc.open_file(pa.py_buffer(blob), options=pa.ipc.IpcReadOptions(use_threads=False)).read_all())


def decode_segment(blob: bytes) -> pa.Table:
    """One Parquet segment as a table with string keys."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Single-threaded on purpose: Arrow's CPU pool, once started, can abort a
    # process at exit ("terminate called without an active exception",
    # apache/arrow#34314), and a training script must exit 0; a large segment
    # decodes a little slower this way.
    return _plain(pq.ParquetFile(pa.BufferReader(blob)).read(use_threads=False))


def concat(tables: Sequence[pa.Table]) -> pa.Table:
    import pyarrow as pa

    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty_points()
    return pa.concat_tables(tables)


def encode_segment(table: pa.Table) -> bytes:
    """Points (in arrival order) as Parquet bytes: zstd, keys dictionary-encoded."""
    import pyarrow.parquet as pq

    table = _plain(table).replace_schema_metadata({b"format": SEGMENT_FORMAT})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", use_dictionary=["key"], row_group_size=1 << 20)
    return sink.getvalue()
