"""``RunChart``: a run's metrics, one panel per key, with its rewinds marked.

The kernel owns the data: it reads :meth:`RunHandle.history` (both
attempts at a redone step, with its ``abandoned`` column), downsamples each
series to at most :attr:`RunChart.max_points` points keeping extremes, and
sends rows to the browser as custom messages. The browser only holds what
is on screen: a Vega-Lite chart built here (as Altair would build it), whose two named
datasets (``points``, ``rewinds``) it changes in place with ``view.change``
(a snapshot replaces them, a batch of new points is inserted): the chart is
embedded once, not again per update.

Rows sent carry ``key``, ``step``, ``value``, ``attempt`` and ``abandoned``.
The run's line is every non-abandoned value (the redone steps' new values
included); "Show the abandoned attempt" draws the abandoned ones, dimmed.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import traitlets

from launchhelm._api import Api, RunHandle
from launchhelm._exceptions import InvalidArgumentError
from launchhelm._types import Rewind, RunLike
from launchhelm.metrics._system import SYSTEM_PREFIX
from launchhelm.runlog._sessions import run_status
from launchhelm.widgets._base import LiveWidget, StoreArg, front_end, resolve_run, run_key
from launchhelm.widgets._downsample import minmax_indices
from launchhelm.widgets._messages import (
    MSG_INSERT,
    MSG_SNAPSHOT,
    MSG_ZOOM,
    ChartColumns,
    ChartRewind,
    ChartSnapshot,
    ZoomMessage,
)
from launchhelm.widgets._static import STATIC_POINTS, chart_svg

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

__all__ = ["Points", "RunChart", "build_spec", "chart_rows", "long_points", "points_from_table"]

#: Columns of ``history()`` that are not metrics.
META_COLUMNS = frozenset({"step", "attempt", "time", "abandoned"})
#: Metric keys under this prefix are evaluation scores, drawn as points at their checkpoints' steps.
EVAL_PREFIX = "eval/"

DEFAULT_MAX_POINTS = 2000
PANEL_WIDTH = 560
PANEL_HEIGHT = 150
LINE_COLOR = "#1f77b4"
ABANDONED_COLOR = "#7f7f7f"
#: The abandoned attempt: grey, dashed, half opaque, wider than a hairline, so a person sees a line.
ABANDONED_OPACITY = 0.55
ABANDONED_DASH = [6, 3]
#: Room for the y labels (vega measures text in a canvas font that a notebook's CSS may not match).
Y_AXIS_MIN_EXTENT = 64
#: Room around the panels (``autosize: pad`` grows the view to fit its axes inside it).
CHART_PADDING = {"left": 12, "right": 12, "top": 6, "bottom": 6}
REWIND_COLOR = "#d62728"
#: The machine's samples (``system/``): another colour, so a wall-time panel is not read as a metric.
SYSTEM_COLOR = "#6a51a3"


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


def _column(table: pa.Table, name: str, dtype: Any) -> np.ndarray:
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


def points_from_table(table: pa.Table, rewinds: Sequence[dict[str, Any]], keys: Sequence[str] | None = None) -> Points:
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


def chart_rows(
    points: Points | pd.DataFrame, budget: int, domain: tuple[float, float] | None = None
) -> tuple[Any, dict[str, int]]:
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


def ordered_keys(keys: Sequence[str]) -> list[str]:
    """Training metrics first (as logged), evaluation scores after them, the machine's samples last."""
    system = [k for k in keys if k.startswith(SYSTEM_PREFIX)]
    rest = [k for k in keys if not k.startswith(SYSTEM_PREFIX)]
    return [k for k in rest if not k.startswith(EVAL_PREFIX)] + [k for k in rest if k.startswith(EVAL_PREFIX)] + system


VEGA_LITE_SCHEMA = "https://vega.github.io/schema/vega-lite/v6.4.1.json"


def build_spec(keys: Sequence[str], width: int = PANEL_WIDTH, height: int = PANEL_HEIGHT) -> dict[str, Any]:
    """The Vega-Lite spec: one panel per key, rewinds marked on each.

    Each panel layers, over the shared named datasets ``points`` and
    ``rewinds``: the abandoned attempts (grey, dashed, half opaque, shown
    only while the ``show_abandoned`` parameter is true), the run's line, its
    points (with tooltips), and per rewind a rule at ``to_step`` with the
    sentence "Resumed from step 64 after reaching 352" as tooltip and as a
    label. Keys under ``eval/`` draw points at the steps they were scored at.
    The panels share a ``zoom`` interval on step (drag, wheel), which the
    front end reports so the kernel can send denser points for it. Keys
    under ``system/`` (the session's sampler) are on wall time instead: a
    line and points over the ``time`` field, no rewinds, zoomed on their own.

    Built as plain dicts, not with Altair: importing Altair takes longer
    (about 1.5 s) than the whole chart may take to open. The tests check that
    the spec is exactly what Altair builds from the same description.

    Mark names (``line_0``, ``points_0``, ``abandoned_0``, ``rewind_rule_0``,
    ``rewind_label_0`` for panel 0) are stable, for tests and styling.
    """
    config: dict[str, Any] = {"view": {"continuousWidth": 300, "continuousHeight": 300}}
    if not keys:
        return {
            "config": config,
            "data": {"values": [{"text": "No metrics logged yet"}]},
            "mark": {"type": "text", "color": "#666", "size": 14},
            "encoding": {"text": {"field": "text", "type": "nominal"}},
            "height": 60,
            "width": width,
            "$schema": VEGA_LITE_SCHEMA,
        }
    config["view"]["stroke"] = "#ddd"
    config["axis"] = {"labelFont": "sans-serif", "titleFont": "sans-serif"}
    x = {"field": "step", "title": "step", "type": "quantitative"}
    rewind_x = {"field": "to_step", "title": "step", "type": "quantitative"}
    panels = []
    for i, key in enumerate(keys):
        is_eval = key.startswith(EVAL_PREFIX)
        y = {
            "axis": {"format": "~g", "labelFont": "sans-serif", "labelLimit": 160, "minExtent": Y_AXIS_MIN_EXTENT},
            "field": "value",
            "scale": {"zero": False},
            "title": key,
            "type": "quantitative",
        }
        of_key = {"filter": {"equal": key, "field": "key"}}
        points = {"name": "points"}
        if key.startswith(SYSTEM_PREFIX):
            # both layers read the points: the data sits on the panel (as Altair puts it)
            layer = _system_layers(i, key, y)
            panels.append({"data": points, "height": height, "layer": layer, "title": key, "width": width})
            continue
        layers = [
            {
                "data": points,
                "mark": {
                    "type": "line",
                    "color": ABANDONED_COLOR,
                    "opacity": ABANDONED_OPACITY,
                    "strokeDash": list(ABANDONED_DASH),
                    "strokeWidth": 2,
                },
                "encoding": {"detail": {"field": "attempt", "type": "ordinal"}, "x": dict(x), "y": dict(y)},
                "name": f"abandoned_{i}",
                "transform": [dict(of_key), {"filter": "datum.abandoned && show_abandoned"}],
            },
            {
                "data": points,
                "mark": {"type": "line", "color": LINE_COLOR, "opacity": 0.5 if is_eval else 1.0, "strokeWidth": 1.5},
                "encoding": {"x": dict(x), "y": dict(y)},
                "name": f"line_{i}",
                "transform": [dict(of_key), {"filter": "!datum.abandoned"}],
            },
            {
                "data": points,
                "mark": {
                    "type": "circle",
                    "color": LINE_COLOR,
                    "opacity": 1.0 if is_eval else 0.6,
                    "size": 60 if is_eval else 10,
                },
                "encoding": {
                    "tooltip": [
                        {"field": "step", "title": "step", "type": "quantitative"},
                        {"field": "value", "format": ".6g", "title": key, "type": "quantitative"},
                        {"field": "attempt", "title": "attempt", "type": "quantitative"},
                    ],
                    "x": dict(x),
                    "y": dict(y),
                },
                "name": f"points_{i}",
                "transform": [dict(of_key), {"filter": "!datum.abandoned"}],
            },
            {
                "data": {"name": "rewinds"},
                "mark": {"type": "rule", "color": REWIND_COLOR, "strokeDash": [6, 3], "strokeWidth": 1.5},
                "encoding": {
                    "tooltip": {"field": "label", "title": "rewind", "type": "nominal"},
                    "x": dict(rewind_x),
                },
                "name": f"rewind_rule_{i}",
            },
            {
                "data": {"name": "rewinds"},
                "mark": {
                    "type": "text",
                    "align": "left",
                    "baseline": "top",
                    "color": REWIND_COLOR,
                    "dx": 4,
                    "fontSize": 11,
                },
                "encoding": {"text": {"field": "label", "type": "nominal"}, "x": dict(rewind_x), "y": {"value": 2}},
                "name": f"rewind_label_{i}",
            },
        ]
        panels.append({"height": height, "layer": layers, "title": key, "width": width})
    return {
        "config": config,
        # resize: the data arrives after the embed (view.change), so the layout must follow it, or the
        # axes keep the room they had with no data and their labels are clipped
        "autosize": {"type": "pad", "resize": True},
        "padding": dict(CHART_PADDING),
        # the parameter lives at the top: one checkbox shows or hides every panel's abandoned attempt
        "params": [
            {"name": "show_abandoned", "value": False},
            # One zoom shared by the panels, defined on their run lines only: a
            # scale-bound interval on every layer would also bind the rewinds' to_step.
            {
                "name": "zoom",
                "select": {"type": "interval", "encodings": ["x"]},
                "bind": "scales",
                "views": [f"line_{i}" for i in range(len(keys))],
            },
        ],
        # one step axis for every panel: a rewind or a score lines up across them (the machine's
        # samples are on wall time, an axis of their own: then each panel has its own x scale)
        "resolve": {"scale": {"x": "independent" if any(k.startswith(SYSTEM_PREFIX) for k in keys) else "shared"}},
        "spacing": 18,
        "vconcat": panels,
        "$schema": VEGA_LITE_SCHEMA,
    }


def _system_layers(i: int, key: str, y: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``system/`` panel's layers: the samples by wall time, as a line and points (no step, no rewinds)."""
    x = {"axis": {"format": "%H:%M:%S"}, "field": "time", "title": "wall time", "type": "temporal"}
    of_key = {"filter": {"equal": key, "field": "key"}}
    return [
        {
            "mark": {"type": "line", "color": SYSTEM_COLOR, "strokeWidth": 1.5},
            "encoding": {"x": dict(x), "y": dict(y)},
            "name": f"line_{i}",
            "transform": [dict(of_key)],
        },
        {
            "mark": {"type": "circle", "color": SYSTEM_COLOR, "opacity": 0.6, "size": 10},
            "encoding": {
                "tooltip": [
                    {"field": "time", "format": "%H:%M:%S", "title": "time", "type": "temporal"},
                    {"field": "value", "format": ".6g", "title": key, "type": "quantitative"},
                    {"field": "step", "title": "step", "type": "quantitative"},
                ],
                "x": dict(x),
                "y": dict(y),
            },
            "name": f"points_{i}",
            "transform": [dict(of_key)],
        },
    ]


class RunChart(LiveWidget):
    """A run's metrics in a notebook: one panel per key, x = step, rewinds marked.

    A rewind shows as a dashed rule at the step the run resumed from, with
    "Resumed from step 64 after reaching 352" as a label and tooltip; the
    redone steps' new values are the run's line, and "Show the abandoned
    attempt" draws the values they replaced, dimmed. ``eval/<name>`` scores
    appear as points at their checkpoints' steps. While the run is running,
    new points stream in. Drag or scroll to zoom a step range: the kernel
    sends it at full detail (each series is downsampled to at most
    ``max_points`` points, keeping minima and maxima).

    Parameters
    ----------
    run_or_id:
        A :class:`launchhelm.Run`, a :class:`launchhelm.RunHandle` or a run id.
    keys:
        Metric keys to chart (default: every key, including ones logged later).
    store:
        Store URL or path for a run id (default ``$LAUNCHHELM_STORE``, else ``~/.launchhelm``).
    max_points:
        Points per series sent to the browser, at most.
    interval:
        Seconds between reads of the store while the run is running.

    Examples
    --------
    >>> from launchhelm.widgets import RunChart
    >>> RunChart(run_id, keys=["train/loss", "eval/accuracy"])   # doctest: +SKIP
    """

    spec = traitlets.Dict().tag(sync=True)
    show_abandoned = traitlets.Bool(False).tag(sync=True)
    caption = traitlets.Unicode("").tag(sync=True)
    #: When the newest point shown was logged (epoch seconds; 0 before any): the caption says how long ago.
    last_point = traitlets.Float(0.0).tag(sync=True)

    @classmethod
    def _reuse_key(
        cls,
        run_or_id: RunLike | str,
        keys: Sequence[str] | str | None = None,
        store: StoreArg = None,
        max_points: int = DEFAULT_MAX_POINTS,
        **_: object,
    ) -> tuple[tuple[Hashable, ...], Any]:
        # checked here, in __new__, so a refused chart is never built half-way (nor kept for reuse)
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 8:
            raise InvalidArgumentError(f"max_points={max_points!r}: give at least 8")
        api, handle = resolve_run(run_or_id, store)
        chosen = (keys,) if isinstance(keys, str) else (tuple(keys) if keys is not None else None)
        return run_key(cls, api, handle, chosen), (api, handle)

    def __init__(
        self,
        run_or_id: RunLike | str,
        keys: Sequence[str] | str | None = None,
        store: StoreArg = None,
        *,
        max_points: int = DEFAULT_MAX_POINTS,
        interval: float = 2.0,
    ) -> None:
        if self._reused():
            return
        self._esm, self._css, self.missing_front_end = front_end("chart.js")
        super().__init__(interval=interval)
        self._setup_live()
        self._api: Api = self._resolved[0]
        self._handle: RunHandle = self._resolved[1]
        self._keys: list[str] | None = [keys] if isinstance(keys, str) else (list(keys) if keys else None)
        self.max_points = max_points
        self._domain: tuple[float, float] | None = None
        self._rewinds: list[Rewind] = []
        self._shown: list[str] | None = None
        self._status = ""
        self._counts: dict[str, int] = {}
        self._points = Points.empty()
        self.refresh()

    @property
    def run(self) -> RunHandle:
        """The run shown."""
        return self._handle

    def __repr__(self) -> str:
        return f"<launchhelm.widgets.RunChart {self._handle.project}/{self._handle.id}>"

    # -- reading the run ----------------------------------------------------
    def is_active(self) -> bool:
        return self._status == "running"

    def fetch(self) -> tuple[dict[str, Any], list[Rewind], Points]:
        """Everything one poll reads from the store: the run's status and furthest step, rewinds and points.

        What :meth:`RunHandle.poll` reads (the log, the last heartbeat and
        only the metric chunks that arrived since the last poll: a few
        requests whatever the run's length, ``docs/storage.md``), taken
        before it becomes a pandas frame: the points go from Arrow buffers
        to the downsampler as numpy arrays, so opening a chart on a long run
        neither imports pandas nor pivots a million rows and back.
        """
        handle = self._handle
        state, live, table, step = handle._poll_parts()  # RunHandle.poll()'s reads, without its frame
        summary = {"status": run_status(state, live), "step": step}
        points = points_from_table(table, state.rewinds, self._keys)
        return summary, handle._rewinds_of(state), points

    def refresh(self) -> None:
        """Re-read the run; stream what is new, or send a snapshot when history changed shape."""
        with self._lock:
            summary, rewinds, points = self.fetch()
            self._status = str(summary["status"])
            shown = self._keys if self._keys is not None else ordered_keys(points.present_keys())
            self.caption = _caption(summary, len(rewinds))
            self.last_point = _last_metric_time(points)
            if shown != self._shown:
                # new panels: the front end embeds the new spec, then says ready again
                self._shown, self._points, self._rewinds = shown, points, rewinds
                self._ready = False
                self.spec = build_spec(shown)
                return
            if rewinds != self._rewinds:
                self._points, self._rewinds = points, rewinds
                self._send_snapshot()
                return
            fresh = new_points(points, self._points)
            self._points = points
            if not len(fresh):
                return
            grown = series_counts(fresh)
            if any(self._counts.get(sid, 0) + n > self.max_points for sid, n in grown.items()):
                self._send_snapshot()
                return
            if self.send_when_ready({"type": MSG_INSERT, "points": encode_rows(fresh)}):
                for sid, n in grown.items():
                    self._counts[sid] = self._counts.get(sid, 0) + n

    def _budget(self) -> int:
        # a running run's series keep room to grow before they are resampled
        return self.max_points // 2 if self._status == "running" else self.max_points

    def _snapshot(self) -> ChartSnapshot:
        rows, counts = chart_rows(self._points, self._budget(), self._domain)
        self._counts = counts
        return {
            "type": MSG_SNAPSHOT,
            "points": encode_rows(rows),
            "rewinds": encode_rewinds(self._rewinds),
            "domain": list(self._domain) if self._domain else None,
        }

    def _send_snapshot(self) -> None:
        with self._lock:
            if self._ready:
                self.send(self._snapshot())

    def snapshot_messages(self) -> list[ChartSnapshot]:
        return [self._snapshot()]

    def handle_message(self, message: ZoomMessage) -> None:
        domain = message["domain"]
        with self._lock:
            if domain is not None and len(domain) == 2:
                low, high = sorted(domain)
                self._domain = (low, high)
            else:
                self._domain = None
            self._send_snapshot()

    def zoom(self, low: float | None = None, high: float | None = None) -> None:
        """Resample for the step range ``[low, high]`` (both None: the whole run), as zooming does."""
        domain = None if low is None or high is None else [float(low), float(high)]
        self.handle_message({"type": MSG_ZOOM, "domain": domain})

    def static_svg(self) -> str | None:
        """The chart as it stands, as SVG (fewer points than the live view); None without vl-convert."""
        with self._lock:
            rows, _ = chart_rows(self._points, STATIC_POINTS, None)
            return chart_svg(self.spec, encode_rows(rows), encode_rewinds(self._rewinds))

    def static_mimebundle(self) -> dict[str, str]:
        svg = self.static_svg()
        return {"image/svg+xml": svg} if svg else {}

    def shown_rows(self) -> pd.DataFrame:
        """The rows the browser holds now: each series downsampled (for checks and debugging)."""
        with self._lock:
            rows: Points = chart_rows(self._points, self._budget(), self._domain)[0]
            return rows.to_frame()


def _last_metric_time(points: Points) -> float:
    """When the run last logged a metric (the machine's samples go on while training is stuck: not them)."""
    import numpy as np

    system = np.array([k.startswith(SYSTEM_PREFIX) for k in points.keys] or [False], dtype=bool)
    times = points.time[~system[points.code]] if len(points) else points.time
    return float(times.max()) if len(times) else 0.0


def _caption(summary: dict[str, Any], rewinds: int) -> str:
    parts = [str(summary["status"]), f"furthest step {summary['step']}"]
    if rewinds:
        parts.append(f"{rewinds} rewind" + ("s" if rewinds != 1 else ""))
    if summary["status"] == "running":
        parts.append("live")
    return " · ".join(parts)
