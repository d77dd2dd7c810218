"""What ``RunChart`` draws from: a run's points as columns, read from its history, and the
rows kept within a budget per series (extremes first) and encoded for the front end."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

from launchhelm._metrics._system import SYSTEM_PREFIX
from launchhelm._runlog._records import RewindEvent
from launchhelm._types import Rewind
from launchhelm.widgets._downsample import minmax_indices
from launchhelm.widgets._messages import (
    ChartColumns,
    ChartRewind,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd
    import pyarrow as pa


__all__ = [
    "Points",
    "chart_rows",
    "encode_rewinds",
    "encode_rows",
    "long_points",
    "new_points",
    "points_from_table",
    "series_counts",
]

#: Columns of ``history()`` that are not metrics.
META_COLUMNS = frozenset({"step", "attempt", "time", "abandoned"})
#: Metric keys under this prefix are evaluation scores, drawn as points at their checkpoints' steps.
EVAL_PREFIX = "eval/"


@dataclass(frozen=True)
class Points:
    """Long-form points as numpy columns: what the chart holds, downsamples and sends.

    One entry per finite logged value; ``code`` indexes ``keys`` (metric
    names). ``time`` is the log time in seconds since the epoch. Kept in the
    order the store returned the points, so a poll that only appended new
    chunks is told apart from one that changed history by comparing prefixes.
    No pandas here: importing it would cost a chart's open a third of its
    budget (``benchmarks/bench_chart.py``).
    """

    keys: list[str]
    code: np.ndarray
    step: np.ndarray
    attempt: np.ndarray
    time: np.ndarray
    value: np.ndarray
    abandoned: np.ndarray

    @classmethod
    def empty(cls) -> Points:
        import numpy as np

        i64 = np.zeros(0, dtype=np.int64)
        return cls([], i64, i64, i64, np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool))

    def __len__(self) -> int:
        return len(self.step)

    def take(self, positions: np.ndarray) -> Points:
        """The points at ``positions`` (a subset, in that order)."""
        return Points(
            self.keys,
            self.code[positions],
            self.step[positions],
            self.attempt[positions],
            self.time[positions],
            self.value[positions],
            self.abandoned[positions],
        )

    def present_keys(self) -> list[str]:
        """Names that have at least one point, in first-logged order."""
        import numpy as np

        return [self.keys[c] for c in np.flatnonzero(np.bincount(self.code, minlength=len(self.keys)))]

    def to_frame(self) -> pd.DataFrame:
        """As a pandas frame: ``key, step, attempt, time`` (int ns), ``value, abandoned``."""
        import numpy as np
        import pandas as pd

        names = np.array(self.keys, dtype=object)
        frame: pd.DataFrame = pd.DataFrame(
            {
                "key": pd.Series(names[self.code] if len(self) else [], dtype=object),
                "step": self.step.astype(np.int64),
                "attempt": self.attempt.astype(np.int64),
                "time": (self.time * 1e9).astype(np.int64),
                "value": self.value.astype(float),
                "abandoned": self.abandoned.astype(bool),
            }
        )
        return frame

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> Points:
        """From :func:`long_points`' frame."""
        import numpy as np
        import pandas as pd

        codes, names = pd.factorize(frame["key"], sort=False)
        return cls(
            [str(k) for k in names],
            np.asarray(codes, dtype=np.int64),
            frame["step"].to_numpy(np.int64),
            frame["attempt"].to_numpy(np.int64),
            frame["time"].to_numpy(np.int64) / 1e9,
            frame["value"].to_numpy(float),
            frame["abandoned"].to_numpy(bool),
        )


def long_points(history: pd.DataFrame, keys: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per finite logged value: ``key, step, attempt, time, value, abandoned``.

    ``abandoned`` is ``history()``'s column: True for a value of an attempt
    that a later rewind went back before. Non-finite values are left out: a
    chart cannot place them.
    """
    import numpy as np
    import pandas as pd

    steps = history["step"].to_numpy(np.int64)
    attempts = history["attempt"].to_numpy(np.int64)
    times = history["time"].to_numpy("datetime64[ns]").astype(np.int64)
    abandoned = history["abandoned"].to_numpy(bool)
    wanted = list(keys) if keys is not None else [c for c in history.columns if c not in META_COLUMNS]
    pieces = []
    for key in wanted:
        if key not in history.columns:
            continue
        values = history[key].to_numpy(float)
        ok = np.isfinite(values)
        pieces.append(
            pd.DataFrame(
                {
                    "key": key,
                    "step": steps[ok],
                    "attempt": attempts[ok],
                    "time": times[ok],
                    "value": values[ok],
                    "abandoned": abandoned[ok],
                }
            )
        )
    if not pieces:
        return Points.empty().to_frame()
    result: pd.DataFrame = pd.concat(pieces, ignore_index=True)
    return result


def _column(table: pa.Table, name: str, dtype: npt.DTypeLike) -> np.ndarray:
    """A numeric column as one numpy array, straight from its Arrow buffers.

    ``pyarrow.Array.to_numpy`` imports pandas (a third of a second) on first
    use; a column without nulls is its data buffer.
    """
    import numpy as np

    parts = []
    for chunk in table.column(name).chunks:
        if chunk.null_count:
            parts.append(chunk.to_numpy(zero_copy_only=False).astype(dtype))
            continue
        width = np.dtype(chunk.type.to_pandas_dtype()).itemsize
        raw = np.frombuffer(
            chunk.buffers()[1], dtype=chunk.type.to_pandas_dtype(), count=len(chunk), offset=chunk.offset * width
        )
        parts.append(raw.astype(dtype, copy=False))
    if not parts:
        return np.zeros(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def points_from_table(table: pa.Table, rewinds: Sequence[RewindEvent], keys: Sequence[str] | None = None) -> Points:
    """The run's points, as the store holds them (``step, attempt, time, key, value``), for a chart.

    Non-finite values are left out; with ``keys``, only those keys. A key
    logged twice in one attempt at one step keeps its last value, as
    ``history()`` does. ``rewinds`` (the event log's) mark the abandoned
    points. ``system/`` samples (the session's sampler) are kept, with their
    own panels on a wall-time axis (:func:`build_spec`): a machine's load is
    never an abandoned attempt, so they are never marked.
    """
    import numpy as np

    names: list[str] = []
    index: dict[str, int] = {}
    code_parts = []
    for chunk in table.column("key").chunks:
        encoded = chunk.dictionary_encode()
        local = encoded.dictionary.to_pylist()
        remap = np.array([index.setdefault(n, len(index)) for n in local] or [0], dtype=np.int64)
        if len(index) > len(names):
            names.extend(list(index)[len(names) :])
        indices = encoded.indices
        raw = np.frombuffer(
            indices.buffers()[1],
            dtype=indices.type.to_pandas_dtype(),
            count=len(indices),
            offset=indices.offset * indices.type.bit_width // 8,
        )
        code_parts.append(remap[raw])
    code = np.concatenate(code_parts) if code_parts else np.zeros(0, dtype=np.int64)
    step = _column(table, "step", np.int64)
    attempt = _column(table, "attempt", np.int64)
    time = _column(table, "time", np.float64)
    value = _column(table, "value", np.float64)
    wanted = [k for k in keys if k in index] if keys is not None else list(names)
    allowed = np.zeros(max(len(names), 1), dtype=bool)
    allowed[[index[k] for k in wanted]] = True
    keep = allowed[code] & np.isfinite(value)
    system = np.array([n.startswith(SYSTEM_PREFIX) for n in names] or [False], dtype=bool)
    # last write wins per (key, step, attempt): only where a series' steps do not strictly increase
    # np.bincount, not np.unique: numpy's unique imports numpy.ma (slow on a chart's first open)
    for c in np.flatnonzero(np.bincount(code[keep], minlength=len(names))):
        if system[c]:
            continue  # samples by wall time: several at one step are all kept
        at = np.flatnonzero(keep & (code == c))
        if len(at) < 2 or (np.diff(step[at]) > 0).all():
            continue
        order = at[np.lexsort((at, attempt[at], step[at]))]
        same_as_next = (step[order][1:] == step[order][:-1]) & (attempt[order][1:] == attempt[order][:-1])
        keep[order[:-1][same_as_next]] = False
    positions = np.flatnonzero(keep)
    step, attempt = step[positions], attempt[positions]
    abandoned = np.zeros(len(positions), dtype=bool)
    for rewind in rewinds:
        abandoned |= (attempt < int(rewind["attempt"])) & (step > int(rewind["to_step"]))
    abandoned &= ~system[code[positions]]
    return Points(names, code[positions], step, attempt, time[positions], value[positions], abandoned)


def new_points(points: Points, seen: Points) -> Points:
    """Points of ``points`` not in ``seen`` (identified by key, step, attempt and log time).

    The store appends (new chunks come after the ones read), so ``seen`` is
    nearly always a prefix of ``points`` and this is a comparison of arrays;
    otherwise each point's identity is looked up.
    """
    import numpy as np

    if not len(seen):
        return points
    index = {n: i for i, n in enumerate(points.keys)}
    remap = np.array([index.get(n, -1) for n in seen.keys] or [0], dtype=np.int64)
    old_code = remap[seen.code]
    n = len(seen)
    if n <= len(points) and all(
        np.array_equal(a[:n], b)
        for a, b in (
            (points.code, old_code),
            (points.step, seen.step),
            (points.attempt, seen.attempt),
            (points.time, seen.time),
        )
    ):
        return points.take(np.arange(n, len(points)))

    def identity(code: np.ndarray, p: Points) -> np.ndarray:
        rows = np.stack([code, p.step, p.attempt, p.time.view(np.int64)], axis=1).astype(np.int64)
        return np.ascontiguousarray(rows).view(np.dtype((np.void, 32))).ravel()

    fresh = ~np.isin(identity(points.code, points), identity(old_code, seen))
    return points.take(np.flatnonzero(fresh))


def _series(points: Points) -> list[tuple[str, np.ndarray]]:
    """Each line's id and positions: per key (by name) its run line, then each abandoned attempt."""
    import numpy as np

    out = []
    by_key = np.argsort(points.code, kind="stable")
    codes = points.code[by_key]
    present = np.flatnonzero(np.bincount(codes, minlength=len(points.keys))).tolist()
    for c in sorted(present, key=lambda c: points.keys[c]):
        key = points.keys[c]
        of_key = by_key[np.searchsorted(codes, c, "left") : np.searchsorted(codes, c, "right")]
        gone = points.abandoned[of_key]
        out.append((key, of_key[~gone]))
        if gone.any():
            old = of_key[gone]
            for attempt in sorted(set(points.attempt[old].tolist())):
                out.append((f"{key}\x00abandoned {attempt}", old[points.attempt[old] == attempt]))
    return [(sid, at) for sid, at in out if len(at)]


def series_counts(points: Points) -> dict[str, int]:
    """How many points each line (see :func:`chart_rows`) has."""
    return {sid: len(at) for sid, at in _series(points)}


@overload
def chart_rows(
    points: Points, budget: int, domain: tuple[float, float] | None = None
) -> tuple[Points, dict[str, int]]: ...


@overload
def chart_rows(
    points: pd.DataFrame, budget: int, domain: tuple[float, float] | None = None
) -> tuple[pd.DataFrame, dict[str, int]]: ...


def chart_rows(
    points: Points | pd.DataFrame, budget: int, domain: tuple[float, float] | None = None
) -> tuple[Points | pd.DataFrame, dict[str, int]]:
    """The rows a chart shows: each series downsampled to at most ``budget`` points.

    With a zoomed ``domain`` (``(low, high)`` steps), three quarters of the
    budget go to the points inside it, a quarter to an overview of the rest,
    so panning out does not show a hole.

    Returns the rows (sorted by series then step; a frame for a frame, else
    :class:`Points`) and each series' count.
    """
    import numpy as np

    if not isinstance(points, Points):
        rows, of_series = chart_rows(Points.from_frame(points), budget, domain)
        return rows.to_frame(), of_series
    if not len(points):
        return points, {}
    # numpy over positions: a 1M-point series must take milliseconds here (series come in step
    # order from the store, so sorting is the exception)
    steps = points.step
    keep: list[np.ndarray] = []
    counts: dict[str, int] = {}
    for sid, positions in _series(points):
        on_time = sid.startswith(SYSTEM_PREFIX)  # a wall-time panel: ordered by time, not zoomed by step
        if on_time:
            if len(positions) > 1 and not (np.diff(points.time[positions]) >= 0).all():
                positions = positions[np.argsort(points.time[positions], kind="stable")]
        elif len(positions) > 1 and not (np.diff(steps[positions]) >= 0).all():
            positions = positions[np.lexsort((points.time[positions], points.attempt[positions], steps[positions]))]
        ys = points.value[positions]
        if domain is None or on_time:
            chosen = positions[minmax_indices(ys, budget)]
        else:
            low, high = domain
            at = steps[positions]
            inside = (at >= low) & (at <= high)
            near = positions[inside][minmax_indices(ys[inside], max(4, budget * 3 // 4))]
            overview = minmax_indices(ys, max(4, budget // 4))
            far = positions[overview][~inside[overview]]
            chosen = np.concatenate([near, far])
        keep.append(chosen)
        counts[sid] = len(chosen)
    chosen = np.concatenate(keep)
    rank = np.argsort(np.argsort(np.array(points.keys, dtype=object)))
    c = points.code[chosen]
    order = np.lexsort((points.time[chosen], steps[chosen], points.attempt[chosen], points.abandoned[chosen], rank[c]))
    return points.take(chosen[order]), counts


def encode_rows(rows: Points | pd.DataFrame) -> ChartColumns:
    """Rows as compact columns for a custom message (the front end expands them)."""
    import numpy as np

    if not isinstance(rows, Points):
        rows = Points.from_frame(rows)
    used = list(dict.fromkeys(rows.code.tolist()))
    recode = np.zeros(max(len(rows.keys), 1), dtype=np.int64)
    recode[used] = np.arange(len(used))
    encoded: ChartColumns = {
        "keys": [rows.keys[c] for c in used],
        "k": recode[rows.code].tolist(),
        "step": rows.step.tolist(),
        "value": rows.value.astype(float).tolist(),
        "attempt": rows.attempt.tolist(),
        "abandoned": rows.abandoned.tolist(),
    }
    if any(rows.keys[c].startswith(SYSTEM_PREFIX) for c in used):
        # wall-time panels' x: milliseconds since the epoch (Vega's time), sent only when one is drawn
        encoded["time"] = (rows.time * 1000.0).tolist()
    return encoded


def encode_rewinds(rewinds: Sequence[Rewind]) -> list[ChartRewind]:
    """The ``rewinds`` dataset: one rule and label per rewind."""
    return [
        {
            "to_step": r.to_step,
            "reached": r.reached,
            "attempt": r.attempt,
            "checkpoint": r.checkpoint or "",
            "label": r.describe(),
        }
        for r in rewinds
    ]
