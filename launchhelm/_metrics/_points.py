"""Metric points: validation on the hot path, immutable chunks in the store.

A point is ``(step, attempt, time, key, value)``. ``attempt`` counts the
rewinds before the point was logged, so a step redone after a resume holds
both values: the abandoned attempt's and the new one's.

Each session writes its points as immutable chunks under its own prefix
(``runs/<id>/metrics/<session>/<n>.arrow``), so writers never contend. The
chunks are Arrow IPC files with lz4 buffers: read back here they were the
fastest of the formats tried (Parquet decodes slower for small files, JSON
lines far slower), and pyarrow is already needed to hand pandas a table.
"""

from __future__ import annotations

import io
import numbers
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from launchhelm._exceptions import InvalidArgumentError, InvalidMetricError, InvalidTypeError
from launchhelm._metrics._pause import pause
from launchhelm.storage._keys import chunk_key as chunk_key  # re-exported: the writers import it from here

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from launchhelm._metrics._buffer import PointBuffer

__all__ = ["abandoned_mask", "coerce_value", "decode_chunks", "encode_chunk", "history_frame", "validate_key"]

CHUNK_FORMAT = b"launchhelm.metrics/1"
MAX_KEY_LENGTH = 256
#: Column names ``history()`` frames already hold (``run`` in a multi-run
#: history); a metric of that name would clash with them, so ``log()`` refuses it.
RESERVED_KEYS = frozenset({"step", "time", "attempt", "abandoned", "run"})

# a row as buffered by Run.log(): (step, attempt, wall time, {key: float})
Row = tuple[int, int, float, dict[str, float]]


def validate_key(key: object) -> str:
    """Return ``key`` if it is a valid metric name, else raise.

    Keys are non-empty strings of at most 256 characters; ``/`` separates
    namespaces (``eval/accuracy``) but segments may not be empty, ``.`` or
    ``..``, and control characters are refused, and so are the names of
    the history frame's own columns (:data:`RESERVED_KEYS`: ``step``,
    ``time``, ``attempt``, ``abandoned``, ``run``); ``train/step`` is fine.
    """
    if not isinstance(key, str):
        raise InvalidTypeError(
            f"metric key {key!r} is a {type(key).__name__}; keys must be strings such as 'loss' or 'eval/accuracy'"
        )
    if not key:
        raise InvalidMetricError("metric key is empty; name the metric, e.g. 'loss'")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidMetricError(f"metric key {key[:40]!r}... is {len(key)} characters; the limit is {MAX_KEY_LENGTH}")
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise InvalidMetricError(f"metric key {key!r} contains a control character; use printable characters")
    if key in RESERVED_KEYS:
        raise InvalidMetricError(
            f"metric key {key!r} is reserved: history() already has a {key!r} column; "
            f"log it under another name, e.g. 'train/{key}'"
        )
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidMetricError(
            f"metric key {key!r} has an empty, '.' or '..' segment; use '/' only between names, as in 'eval/accuracy'"
        )
    return key


def coerce_value(key: str, value: object) -> float:
    """Turn a scalar into a float, or raise ``TypeError`` naming ``key``.

    Accepts bool, int, float, numpy scalars and 0-d arrays, torch tensors with
    one element (``.item()`` is called), and other :class:`numbers.Real`.
    NaN and infinities are kept as they are.
    """
    if isinstance(value, numbers.Real):  # bool, int, float, numpy scalars, Fraction
        return float(value)
    kind = type(value)
    module = kind.__module__ or ""
    if module.startswith("torch") and hasattr(value, "numel") and hasattr(value, "item"):
        tensor: Any = value
        count = tensor.numel()
        if count != 1:
            raise InvalidTypeError(
                f"metric {key!r} is a torch tensor with {count} elements; log a scalar, e.g. loss.item() or x.mean()"
            )
        if tensor.is_complex():
            raise InvalidTypeError(f"metric {key!r} is a complex tensor; log a real number")
        return float(tensor.detach().cpu().item())
    if module.startswith("numpy") and hasattr(value, "ndim") and hasattr(value, "item"):
        array: Any = value
        if array.ndim == 0:
            item = array.item()
            if isinstance(item, numbers.Real):
                return float(item)
        raise InvalidTypeError(
            f"metric {key!r} is a numpy {kind.__name__} of shape {getattr(value, 'shape', '?')}; "
            "log a real scalar, e.g. float(x.mean())"
        )
    raise InvalidTypeError(
        f"metric {key!r} has a value of type {kind.__name__}; "
        "values must be real numbers (int, float, bool, numpy or torch scalars)"
    )


def _single_threaded() -> pa.ipc.IpcReadOptions:
    import pyarrow as pa

    return pa.ipc.IpcReadOptions(use_threads=False)


def encode_chunk(rows: Sequence[Row]) -> bytes:
    """Encode buffered rows as one Arrow IPC file (lz4)."""
    from launchhelm._metrics._buffer import KeyIds, PointBuffer

    buffer = PointBuffer(KeyIds(), 1 << 62)
    for step, attempt, when, row in rows:
        buffer.append(step, attempt, when, row)
    return encode_buffer(buffer)


def _column(kind: pa.DataType, values: Any) -> pa.Array:
    """An Arrow array over a contiguous numpy array's memory.

    Not ``pa.array``: it asks whether its input is a pandas object, which
    imports pandas (~0.4 s, ~60 MB) into the training process.
    """
    import pyarrow as pa

    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def _strings(names: Sequence[str]) -> pa.Array:
    import numpy as np
    import pyarrow as pa

    raw = [name.encode() for name in names]
    offsets = np.zeros(len(raw) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(raw), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))])


#: Values encoded at a time: the background thread pauses between such pieces (see :func:`pause`).
SLICE_VALUES = 1 << 15


def encode_buffer(buffer: PointBuffer) -> bytes:
    """Encode a :class:`~launchhelm._metrics._buffer.PointBuffer` as one chunk: numpy and Arrow over its
    columns, no Python loop per value, a record batch of at most :data:`SLICE_VALUES` values at a time."""
    import numpy as np
    import pyarrow as pa

    names = buffer.keys.names
    # the chunk's dictionary holds only the keys it uses, in order of their ids (first logged first);
    # one dictionary for every batch (an IPC file cannot replace it)
    used = buffer.key_ids_used()
    renumber = np.zeros(len(names), dtype=np.int32)
    renumber[used] = np.arange(len(used), dtype=np.int32)
    dictionary = _strings([names[i] for i in used])
    schema = pa.schema(
        [
            ("step", pa.int64()),
            ("attempt", pa.int32()),
            ("time", pa.float64()),
            ("key", pa.dictionary(pa.int32(), pa.string())),
            ("value", pa.float64()),
        ],
        metadata={b"format": CHUNK_FORMAT},
    )
    ends = np.cumsum(buffer.counts())
    sink = io.BytesIO()
    # no Arrow thread pool in a training process: see decode_segment
    options = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)
    with pa.ipc.new_file(sink, schema, options=options) as writer:
        first = first_value = 0
        while first < len(ends) or not first:
            stop = max(first + 1, int(np.searchsorted(ends, first_value + SLICE_VALUES, side="right")))
            stop = min(stop, len(ends))
            steps, attempts, times, kids, values = buffer.columns(first, stop, first_value)
            keys = pa.DictionaryArray.from_arrays(_column(pa.int32(), np.ascontiguousarray(renumber[kids])), dictionary)
            batch = pa.RecordBatch.from_arrays(
                [
                    _column(pa.int64(), np.ascontiguousarray(steps, dtype=np.int64)),
                    _column(pa.int32(), np.ascontiguousarray(attempts, dtype=np.int32)),
                    _column(pa.float64(), np.ascontiguousarray(times, dtype=np.float64)),
                    keys,
                    _column(pa.float64(), np.ascontiguousarray(values, dtype=np.float64)),
                ],
                schema=schema,
            )
            writer.write_batch(batch)
            if stop >= len(ends):
                break
            first, first_value = stop, int(ends[stop - 1])
            pause()
    return sink.getvalue()


def decode_chunks(blobs: Iterable[bytes]) -> pa.Table:
    """Concatenate chunks (in arrival order) into one table with string keys."""
    import pyarrow as pa

    tables = []
    for blob in blobs:
        table = pa.ipc.open_file(pa.py_buffer(blob), options=_single_threaded()).read_all()
        tables.append(table.set_column(3, "key", table.column("key").cast(pa.string())))
    if not tables:
        from launchhelm._metrics._segments import empty_points

        return empty_points()
    return pa.concat_tables(tables)


#: Points pivoted at a time by :func:`history_frame`: its temporaries are a few times this many
#: 8-byte values, whatever the run's length.
PIVOT_BATCH = 1 << 20


def history_frame(table: pa.Table, keys: Sequence[str] | None = None, duplicates: str = "all") -> pd.DataFrame:
    """Pivot long points into the wide history frame.

    Columns: ``step``, ``attempt``, ``time`` (UTC), then one per metric key in
    first-logged order. With ``duplicates="all"`` there is one row per
    ``(step, attempt)``; a key logged twice in one attempt at one step keeps
    its last value. With ``duplicates="last"`` there is one row per step and
    each key holds its value from the newest attempt that logged it there;
    ``attempt`` is then the newest attempt at that step.

    The points are pivoted :data:`PIVOT_BATCH` at a time, in arrival order,
    straight into the frame's columns: beyond the frame itself, memory does
    not grow with the run (a long run's history must not need many times its
    size).
    """
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    if duplicates not in ("all", "last"):
        raise InvalidArgumentError(
            f"duplicates={duplicates!r}: use 'all' (every attempt) or 'last' (newest attempt per step)"
        )
    if keys is not None:
        if isinstance(keys, str):
            keys = [keys]
        table = table.filter(pc.is_in(table.column("key"), value_set=pa.array(list(keys), pa.string())))
    n = table.num_rows
    batches = [b for b in table.to_batches(max_chunksize=PIVOT_BATCH) if b.num_rows]
    width = int(pc.max(table.column("attempt")).as_py()) + 1 if n else 1
    last = duplicates == "last"

    # pass 1: the rows ((step, attempt) or step), sorted; key names in first-logged order
    key_index = {name: i for i, name in enumerate(pc.unique(table.column("key")).to_pylist())}
    pieces = []
    for batch in batches:
        step = batch.column("step").to_numpy()
        pieces.append(np.unique(step if last else step * width + batch.column("attempt").to_numpy().astype(np.int64)))
    rows = np.unique(np.concatenate(pieces)) if pieces else np.zeros(0, dtype=np.int64)
    del pieces
    nrows, nkeys = len(rows), len(key_index)
    key_names = list(key_index)
    order_names = key_names if keys is None else [k for k in keys if k in key_index]

    # pass 2: each batch's values into the columns. Last write wins per cell: the newest attempt,
    # then the latest arrival; batches go in arrival order, so a later batch wins a tie.
    grid = np.full((max(nkeys, 1), nrows), np.nan)
    times = np.full(nrows, -np.inf)
    row_attempt = np.full(nrows, -1, dtype=np.int64)
    cell_attempt = np.full((max(nkeys, 1), nrows), -1, dtype=np.int32) if last else None
    for batch in batches:
        encoded = batch.column("key").dictionary_encode()
        lookup = np.array([key_index[name] for name in encoded.dictionary.to_pylist()], dtype=np.int64)
        codes = lookup[encoded.indices.to_numpy(zero_copy_only=False)]
        step = batch.column("step").to_numpy()
        attempt = batch.column("attempt").to_numpy()
        row_of = np.searchsorted(rows, step if last else step * width + attempt.astype(np.int64))
        np.maximum.at(times, row_of, batch.column("time").to_numpy())
        if last:
            np.maximum.at(row_attempt, row_of, attempt)
        cell = codes * nrows + row_of
        del codes, row_of
        value = batch.column("value").to_numpy()
        if last:
            assert cell_attempt is not None
            # this batch's winner per cell: newest attempt, then latest arrival
            order = np.lexsort((np.arange(len(cell)), attempt))[::-1]
            _, first = np.unique(cell[order], return_index=True)
            chosen = order[first]
            cell, won_attempt = cell[chosen], attempt[chosen]
            newer = won_attempt >= cell_attempt.reshape(-1)[cell]
            cell = cell[newer]
            cell_attempt.reshape(-1)[cell] = won_attempt[newer]
            grid.reshape(-1)[cell] = value[chosen[newer]]
        else:
            # one attempt per row: the latest arrival wins
            _, first = np.unique(cell[::-1], return_index=True)
            chosen = len(cell) - 1 - first
            grid.reshape(-1)[cell[chosen]] = value[chosen]
    if not last:
        row_attempt = rows % width
        rows = rows // width
    columns: dict[str, object] = {
        "step": rows.astype(np.int64),
        "attempt": row_attempt.astype(np.int64),
        "time": pd.to_datetime(times if nrows else np.array([], dtype=float), unit="s", utc=True),
    }
    columns.update({name: grid[key_index[name]] for name in order_names})
    frame: pd.DataFrame = pd.DataFrame(columns, copy=False)  # the columns are ours: no second copy
    return frame


def abandoned_mask(step: Any, attempt: Any, state: Any) -> Any:
    """True where a point belongs to an abandoned attempt.

    A rewind to ``to_step`` that starts attempt ``a`` abandons every point of
    an earlier attempt logged after ``to_step``: history went back past it.
    """
    import numpy as np

    mask = np.zeros(len(step), dtype=bool)
    for rewind in state.rewinds:
        mask |= (attempt < int(rewind["attempt"])) & (step > int(rewind["to_step"]))
    return mask
