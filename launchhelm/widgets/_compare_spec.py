"""What ``CompareChart`` draws, as pure functions: run colours and labels, smoothing, the
points per (run, key) kept within a budget, and the Vega-Lite spec they go into."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError
from launchhelm._types import JSONValue, Rewind
from launchhelm.widgets._downsample import minmax_indices
from launchhelm.widgets._messages import (
    CompareColumns,
    ShownRun,
    VegaLiteSpec,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd


__all__ = [
    "build_compare_spec",
    "compare_points",
    "ema",
    "encode_points",
    "metric_keys",
    "rewind_rows",
    "run_colors",
    "run_labels",
]

#: Columns of ``history()`` that are not metrics.
META_COLUMNS = frozenset({"run", "step", "attempt", "time", "abandoned"})
#: x by step, by wall time, or by time since each run's first point (runs started hours apart line up).
X_AXES = ("step", "time", "relative")
DEFAULT_MAX_POINTS = 1000
#: TensorBoard's default smoothing weight.
DEFAULT_SMOOTHING = 0.6
PANEL_WIDTH = 380
PANEL_HEIGHT = 160
#: Panels per row of the grid.
GRID_COLUMNS = 2
#: Points per series in a saved notebook's picture.
STATIC_POINTS = 300
#: Twenty distinguishable colours (Vega's tableau20, darker shade of each pair first).
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
VEGA_LITE_SCHEMA = "https://vega.github.io/schema/vega-lite/v6.4.1.json"


# -- pure data helpers (tested on every store) ---------------------------------
def run_colors(run_ids: Sequence[str]) -> dict[str, str]:
    """A colour per run, the same whatever else is shown: chosen from the run's id.

    Each run hashes to one of the ten strong colours; where that one is
    taken by an earlier run in ``run_ids``, it takes the next free strong
    one, then a light one (so up to 20 runs never share a colour).
    """
    strong = len(PALETTE) // 2
    taken: set[int] = set()
    colors = {}
    for run_id in run_ids:
        home = zlib.crc32(run_id.encode()) % strong
        order = [(home + i) % strong for i in range(strong)] + [strong + (home + i) % strong for i in range(strong)]
        slot = next((s for s in order if s not in taken), home)
        taken.add(slot)
        colors[run_id] = PALETTE[slot]
    return colors


def run_labels(names: Mapping[str, str]) -> dict[str, str]:
    """The legend's name of each run (``id -> name``): its name, with its id where two share a name."""
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    return {run_id: (name if counts[name] == 1 else f"{name} ({run_id})") for run_id, name in names.items()}


def ema(values: Sequence[float] | npt.NDArray[np.float64], weight: float) -> npt.NDArray[np.float64]:
    """TensorBoard's smoothing: an exponential moving average, debiased so the start is not dragged to 0.

    ``s_i = w * s_(i-1) + (1 - w) * x_i`` from ``s_(-1) = 0``, shown as
    ``s_i / (1 - w^(i+1))``. ``weight`` in ``[0, 1)``: 0 returns the values
    unchanged; 0.6 is TensorBoard's default, 0.99 very smooth. Evaluated
    in numpy by blocks short enough that ``w^block`` stays well above
    underflow (a million points in milliseconds, no Python loop per point).

    Examples
    --------
    >>> ema([1.0, 1.0, 1.0], 0.9).tolist()
    [1.0, 1.0, 1.0]
    """
    import numpy as np

    y: npt.NDArray[np.float64] = np.asarray(values, dtype=float)
    if not 0 <= weight < 1:
        raise InvalidArgumentError(f"smoothing={weight!r}: give a weight from 0 (none) up to, not including, 1")
    n = len(y)
    if weight == 0 or n == 0:
        unchanged: npt.NDArray[np.float64] = y.copy()
        return unchanged
    block = max(1, min(n, int(math.log(1e-12) / math.log(weight))))
    powers = weight ** np.arange(1, block + 1)  # w^1 .. w^block, all >= 1e-12
    blocks = -(-n // block)
    padded = np.zeros(blocks * block)
    padded[:n] = y
    # within each block, from a state of 0: s_k = (1-w) * sum_(j<=k) w^(k-j) x_j = w^(k+1) * sum (1-w) x_j / w^(j+1)
    local = np.cumsum(padded.reshape(blocks, block) * ((1 - weight) / powers), axis=1) * powers
    # each block's true final state e_b = local_end_b + w^block * e_(b-1); w^block <= 1e-12, so a few rounds settle it
    ends = local[:, -1].copy()
    settled = ends.copy()
    for _ in range(3):
        settled[1:] = ends[1:] + powers[-1] * settled[:-1]
    local[1:] += np.outer(settled[:-1], powers)
    out = local.reshape(-1)[:n]
    result: npt.NDArray[np.float64] = out / (1 - weight ** np.arange(1, n + 1))
    return result


def compare_points(
    history: pd.DataFrame,
    keys: Sequence[str] | None = None,
    *,
    budget: int = DEFAULT_MAX_POINTS,
    smoothing: float = 0.0,
) -> pd.DataFrame:
    """The rows a comparison draws from :meth:`Api.history`'s frame (with its ``run`` column).

    One row per kept point: ``run``, ``key``, ``step``, ``time`` (epoch
    milliseconds), ``value`` (smoothed when ``smoothing`` > 0) and ``raw``.
    Only each run's line: values a rewind abandoned are left out. Each
    ``(run, key)`` series is smoothed over all its points, then downsampled
    to at most ``budget`` points keeping its extremes.
    """
    import numpy as np
    import pandas as pd

    if not 0 <= smoothing < 1:
        raise InvalidArgumentError(f"smoothing={smoothing!r}: give a weight from 0 (none) up to, not including, 1")
    columns = {
        "run": object,
        "key": object,
        "step": np.int64,
        "time": np.float64,
        "elapsed": np.float64,
        "value": float,
        "raw": float,
    }
    if history.empty or "run" not in history.columns:
        empty: pd.DataFrame = pd.DataFrame({c: pd.Series([], dtype=t) for c, t in columns.items()})
        return empty
    starts = _run_starts(history)
    kept = history[~history["abandoned"].to_numpy(bool)] if "abandoned" in history.columns else history
    wanted = list(keys) if keys is not None else [c for c in history.columns if c not in META_COLUMNS]
    pieces = []
    times_all = kept["time"].to_numpy("datetime64[ns]").astype(np.int64) / 1e6
    runs_all = kept["run"].to_numpy()
    steps_all = kept["step"].to_numpy(np.int64)
    for run_id in dict.fromkeys(runs_all.tolist()):
        mine = runs_all == run_id
        steps, times = steps_all[mine], times_all[mine]
        order = np.argsort(steps, kind="stable")
        for key in wanted:
            if key not in kept.columns:
                continue
            values = kept[key].to_numpy(float)[mine][order]
            ok = np.isfinite(values)
            if not ok.any():
                continue
            raw = values[ok]
            shown = ema(raw, smoothing) if smoothing else raw
            chosen = minmax_indices(shown, budget)
            pieces.append(
                pd.DataFrame(
                    {
                        "run": run_id,
                        "key": key,
                        "step": steps[order][ok][chosen],
                        "time": times[order][ok][chosen],
                        "elapsed": (times[order][ok][chosen] - starts.get(run_id, 0.0)) / 1000,
                        "value": shown[chosen],
                        "raw": raw[chosen],
                    }
                )
            )
    if not pieces:
        nothing: pd.DataFrame = pd.DataFrame({c: pd.Series([], dtype=t) for c, t in columns.items()})
        return nothing
    result: pd.DataFrame = pd.concat(pieces, ignore_index=True)
    return result


def _run_starts(history: pd.DataFrame) -> dict[str, float]:
    """Each run's first logged point (epoch ms), abandoned attempts included: where its relative time starts."""
    import numpy as np

    if history.empty or "run" not in history.columns:
        return {}
    times = history["time"].to_numpy("datetime64[ns]").astype(np.int64) / 1e6
    runs = history["run"].to_numpy()
    return {str(r): float(times[runs == r].min()) for r in dict.fromkeys(runs.tolist())}


def metric_keys(history: pd.DataFrame) -> list[str]:
    """The metric columns of a history frame: training metrics first, ``eval/`` scores after."""
    keys = [c for c in history.columns if c not in META_COLUMNS and history[c].notna().any()]
    return [k for k in keys if not k.startswith("eval/")] + [k for k in keys if k.startswith("eval/")]


class RewindMark(TypedDict):
    """One rewind of one run, where the charts mark it."""

    run_id: str
    to_step: int
    reached: int
    attempt: int
    #: when its attempt logged its first point (ms), for the wall-time axis
    time: float | None
    #: seconds from the run's first point to then, for the relative axis
    elapsed: float | None
    label: str


def rewind_rows(run_id: str, rewinds: Sequence[Rewind], history: pd.DataFrame | None) -> list[RewindMark]:
    """One marker per rewind: its step, and (for the wall-time axis) when its attempt logged its first point."""
    import numpy as np

    first_time: dict[int, float] = {}
    start = None
    if history is not None and len(history):
        times = history["time"].to_numpy("datetime64[ns]").astype(np.int64) / 1e6
        start = float(times.min())
        attempts = history["attempt"].to_numpy(np.int64)
        for attempt in {r.attempt for r in rewinds}:
            hit = attempts == attempt
            if hit.any():
                first_time[attempt] = float(times[hit].min())
    return [
        {
            "run_id": run_id,
            "to_step": r.to_step,
            "reached": r.reached,
            "attempt": r.attempt,
            "time": first_time.get(r.attempt),
            "elapsed": (first_time[r.attempt] - start) / 1000
            if r.attempt in first_time and start is not None
            else None,
            "label": r.describe(),
        }
        for r in rewinds
    ]


def build_compare_spec(
    keys: Sequence[str],
    runs: Sequence[ShownRun],
    *,
    x: str = "step",
    smoothed: bool = False,
    width: int = PANEL_WIDTH,
    height: int = PANEL_HEIGHT,
) -> VegaLiteSpec:
    """The Vega-Lite spec: a grid of panels (one per key), a line per run coloured by run.

    ``runs``: ``{"id", "label", "color"}`` in legend order. Layers per panel
    (names stable, for tests and styling): ``raw_<i>`` (the unsmoothed
    values, faint, only when ``smoothed``), ``line_<i>``, ``points_<i>``
    (tooltips) and ``rewind_rule_<i>`` (each run's rewinds, dashed, in its
    colour). ``x``: ``"step"``, ``"relative"`` (seconds since each run's
    first point) or ``"time"`` (wall time, shown in the
    browser's time zone). Built as plain dicts, like :func:`build_spec`.
    """
    if x not in X_AXES:
        raise InvalidArgumentError(f"x={x!r}: use 'step', 'time' (wall time) or 'relative' (since each run began)")
    config: VegaLiteSpec = {"view": {"continuousWidth": 300, "continuousHeight": 300, "stroke": "#ddd"}}
    if not runs or not keys:
        text = "Select runs to compare" if not runs else "No metrics logged yet"
        return {
            "config": config,
            "data": {"values": [{"text": text}]},
            "mark": {"type": "text", "color": "#666", "size": 14},
            "encoding": {"text": {"field": "text", "type": "nominal"}},
            "height": 60,
            "width": width,
            "$schema": VEGA_LITE_SCHEMA,
        }
    config["axis"] = {"labelFont": "sans-serif", "titleFont": "sans-serif"}
    # full-strength swatches whichever layer the legend is drawn from (the raw layer is faint)
    config["legend"] = {"labelFont": "sans-serif", "titleFont": "sans-serif", "orient": "top", "symbolOpacity": 1}
    color: VegaLiteSpec = {
        "field": "label",
        "type": "nominal",
        "title": "run",
        "scale": {"domain": [r["label"] for r in runs], "range": [r["color"] for r in runs]},
    }
    if x == "step":
        x_enc: VegaLiteSpec = {"field": "step", "title": "step", "type": "quantitative"}
        rule_x: VegaLiteSpec = {"field": "to_step", "title": "step", "type": "quantitative"}
        rule_filter = "true"
    elif x == "relative":
        title = "seconds since the run's first point"
        x_enc = {"field": "elapsed", "title": title, "type": "quantitative"}
        rule_x = {"field": "elapsed", "title": title, "type": "quantitative"}
        rule_filter = "isValid(datum.elapsed)"
    else:
        x_enc = {"field": "time", "title": "wall time", "type": "temporal"}
        rule_x = {"field": "time", "title": "wall time", "type": "temporal"}
        rule_filter = "isValid(datum.time)"
    panels: list[JSONValue] = []
    for i, key in enumerate(keys):
        y: VegaLiteSpec = {
            "axis": {"format": "~g", "labelLimit": 160, "minExtent": 56},
            "field": "value",
            "scale": {"zero": False},
            "title": key,
            "type": "quantitative",
        }
        of_key: VegaLiteSpec = {"filter": {"equal": key, "field": "key"}}
        layers: list[JSONValue] = []
        if smoothed:
            layers.append(
                {
                    "data": {"name": "points"},
                    "mark": {"type": "line", "opacity": 0.25, "strokeWidth": 1},
                    "encoding": {"color": dict(color), "x": dict(x_enc), "y": {**y, "field": "raw"}},
                    "name": f"raw_{i}",
                    "transform": [dict(of_key)],
                }
            )
        layers += [
            {
                "data": {"name": "points"},
                "mark": {"type": "line", "strokeWidth": 1.6},
                "encoding": {"color": dict(color), "x": dict(x_enc), "y": dict(y)},
                "name": f"line_{i}",
                "transform": [dict(of_key)],
            },
            {
                "data": {"name": "points"},
                "mark": {"type": "circle", "size": 14, "opacity": 0.0},
                "encoding": {
                    "color": dict(color),
                    "tooltip": [
                        {"field": "label", "title": "run", "type": "nominal"},
                        {"field": "step", "title": "step", "type": "quantitative"},
                        {"field": "value", "format": ".6g", "title": key, "type": "quantitative"},
                    ],
                    "x": dict(x_enc),
                    "y": dict(y),
                },
                "name": f"points_{i}",
                "transform": [dict(of_key)],
            },
            {
                "data": {"name": "rewinds"},
                "mark": {"type": "rule", "strokeDash": [6, 3], "strokeWidth": 1.5},
                "encoding": {
                    "color": dict(color),
                    "tooltip": [
                        {"field": "label", "title": "run", "type": "nominal"},
                        {"field": "text", "title": "rewind", "type": "nominal"},
                    ],
                    "x": dict(rule_x),
                },
                "name": f"rewind_rule_{i}",
                "transform": [{"filter": rule_filter}],
            },
        ]
        panels.append({"height": height, "layer": layers, "title": key, "width": width})
    return {
        "config": config,
        "autosize": {"type": "pad", "resize": True},
        "padding": {"left": 12, "right": 12, "top": 6, "bottom": 6},
        "columns": GRID_COLUMNS if len(keys) > 1 else 1,
        "concat": panels,
        "resolve": {"scale": {"color": "shared"}, "legend": {"color": "shared"}},
        "spacing": 18,
        "$schema": VEGA_LITE_SCHEMA,
    }


def encode_points(rows: pd.DataFrame, labels: Mapping[str, str]) -> CompareColumns:
    """Rows as compact columns for a custom message (the front end expands them)."""
    run_ids = list(dict.fromkeys(rows["run"].tolist()))
    keys = list(dict.fromkeys(rows["key"].tolist()))
    run_code = {r: i for i, r in enumerate(run_ids)}
    key_code = {k: i for i, k in enumerate(keys)}
    return {
        "labels": [labels.get(r, r) for r in run_ids],
        "keys": keys,
        "r": [run_code[r] for r in rows["run"].tolist()],
        "k": [key_code[k] for k in rows["key"].tolist()],
        "step": rows["step"].astype(int).tolist(),
        "time": rows["time"].astype(float).tolist(),
        "elapsed": rows["elapsed"].astype(float).tolist(),
        "value": rows["value"].astype(float).tolist(),
        "raw": rows["raw"].astype(float).tolist(),
    }


def _expand(points: CompareColumns) -> list[dict[str, object]]:
    labels, keys = points["labels"], points["keys"]
    return [
        {"label": labels[r], "key": keys[k], "step": s, "time": t, "elapsed": e, "value": v, "raw": w}
        for r, k, s, t, e, v, w in zip(
            points["r"],
            points["k"],
            points["step"],
            points["time"],
            points["elapsed"],
            points["value"],
            points["raw"],
            strict=True,
        )
    ]


def _plain(value: Any) -> Any:
    """A value as JSON carries it (NaN: None; numpy scalars: Python numbers)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _check_names(name: str, values: object, what: str) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        return [values]
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
        raise InvalidTypeError(f"{name}={values!r}: give a list of {what} (strings), or None")
    return list(values)
