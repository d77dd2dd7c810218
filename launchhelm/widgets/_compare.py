"""``CompareChart``: several runs side by side, one panel per metric, a line per run.

The kernel owns the data, as for :class:`RunChart`: it reads each selected
run through the query API (:meth:`RunHandle.poll`: after the first read,
only what arrived since), keeps each run's line (the values a rewind did
not abandon), smooths it when asked (an exponential moving average with
TensorBoard's debiasing, over the whole series), downsamples each
``(run, key)`` series keeping its extremes (:func:`minmax_indices`, as
``RunChart``) and sends rows as custom messages into a Vega-Lite spec built
here, whose named datasets ``points`` and ``rewinds`` the front end changes
in place.

Each run keeps its colour whatever else is selected (the colour comes from
its id), the legend names runs by name, and each run's rewinds are dashed
rules in its colour. Beside the chart, the config diff: the ``config.`` and
``tunable.`` values that differ between the selected runs.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import traitlets

from launchhelm._api import Api, ProjectReader, RunHandle, RunView, settled_views
from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError, RunNotFoundError
from launchhelm._types import Rewind
from launchhelm.runlog._events import validate_project
from launchhelm.views._humanize import duration, local_time
from launchhelm.views._runs import _epoch, config_diff
from launchhelm.widgets._base import LiveWidget, StoreArg, front_end
from launchhelm.widgets._downsample import minmax_indices
from launchhelm.widgets._messages import (
    MSG_SNAPSHOT,
    CompareColumns,
    CompareRewind,
    CompareRun,
    CompareSnapshot,
    CompareState,
    ShownRun,
    synced_dict,
)
from launchhelm.widgets._static import table_html

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CompareChart",
    "build_compare_spec",
    "compare_points",
    "config_diff",
    "ema",
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


def ema(values: Sequence[float] | Any, weight: float) -> Any:
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

    y = np.asarray(values, dtype=float)
    if not 0 <= weight < 1:
        raise InvalidArgumentError(f"smoothing={weight!r}: give a weight from 0 (none) up to, not including, 1")
    n = len(y)
    if weight == 0 or n == 0:
        return y.copy()
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
    result: Any = out / (1 - weight ** np.arange(1, n + 1))
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


def rewind_rows(run_id: str, rewinds: Sequence[Rewind], history: pd.DataFrame | None) -> list[dict[str, Any]]:
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
    runs: Sequence[Mapping[str, object]],
    *,
    x: str = "step",
    smoothed: bool = False,
    width: int = PANEL_WIDTH,
    height: int = PANEL_HEIGHT,
) -> dict[str, Any]:
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
    config: dict[str, Any] = {"view": {"continuousWidth": 300, "continuousHeight": 300, "stroke": "#ddd"}}
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
    color = {
        "field": "label",
        "type": "nominal",
        "title": "run",
        "scale": {"domain": [r["label"] for r in runs], "range": [r["color"] for r in runs]},
    }
    if x == "step":
        x_enc: dict[str, Any] = {"field": "step", "title": "step", "type": "quantitative"}
        rule_x: dict[str, Any] = {"field": "to_step", "title": "step", "type": "quantitative"}
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
    panels = []
    for i, key in enumerate(keys):
        y = {
            "axis": {"format": "~g", "labelLimit": 160, "minExtent": 56},
            "field": "value",
            "scale": {"zero": False},
            "title": key,
            "type": "quantitative",
        }
        of_key = {"filter": {"equal": key, "field": "key"}}
        layers: list[dict[str, Any]] = []
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


def _check_names(name: str, values: Any, what: str) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        return [values]
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
        raise InvalidTypeError(f"{name}={values!r}: give a list of {what} (strings), or None")
    return list(values)


class CompareChart(LiveWidget):
    """Runs side by side: one panel per metric, a line per run, each run's rewinds marked.

    The legend names runs by name; each run keeps its colour whatever else
    is selected; each rewind is a dashed rule in its run's colour ("Resumed
    from step 64 after reaching 120" as tooltip). "x: step / wall time"
    switches the axis, "Smooth" draws an exponential moving average (with
    TensorBoard's debiasing; the raw values stay, faint). Beside the chart,
    the config diff: the config and tunable values that differ between the
    runs. Live while any of the runs is running. Each series is downsampled
    to at most ``max_points`` points, keeping its extremes (as ``RunChart``).

    Parameters
    ----------
    project:
        The project whose runs to compare.
    runs:
        Run ids (default: every run of the project, newest first).
    keys:
        Metric keys, one panel each (default: every key the runs logged).
    store:
        Store URL or path (default ``$LAUNCHHELM_STORE``, else ``~/.launchhelm``).
    x:
        ``"step"``, ``"time"`` (wall time) or ``"relative"`` (seconds since each run's first point).
    smoothing:
        The EMA weight used when smoothing is on (0 to 0.999; default 0.6).
    max_points:
        Points per ``(run, key)`` series sent to the browser, at most.
    interval:
        Seconds between reads while a run is running.

    Examples
    --------
    >>> from launchhelm.widgets import CompareChart
    >>> CompareChart("quickstart", runs=[a, b], keys=["train/loss"])   # doctest: +SKIP
    """

    spec = traitlets.Dict().tag(sync=True)
    state = synced_dict(CompareState)
    x_axis = traitlets.Unicode("step").tag(sync=True)
    smooth = traitlets.Bool(False).tag(sync=True)
    smoothing = traitlets.Float(DEFAULT_SMOOTHING).tag(sync=True)

    @classmethod
    def _reuse_key(
        cls,
        project: str,
        runs: Sequence[str] | None = None,
        keys: Sequence[str] | None = None,
        store: StoreArg | Api = None,
        *,
        x: str = "step",
        smoothing: float = DEFAULT_SMOOTHING,
        max_points: int = DEFAULT_MAX_POINTS,
        **_: object,
    ) -> tuple[tuple[Hashable, ...], Any]:
        # checked here, in __new__, so a refused chart is never built half-way (nor kept for reuse)
        if x not in X_AXES:
            raise InvalidArgumentError(f"x={x!r}: use 'step', 'time' (wall time) or 'relative' (since each run began)")
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
            raise InvalidArgumentError(f"smoothing={smoothing!r}: give a weight from 0 up to, not including, 1")
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 8:
            raise InvalidArgumentError(f"max_points={max_points!r}: give at least 8")
        if not isinstance(project, str):
            raise InvalidTypeError(f"project={project!r}: give a project name (a string)")
        validate_project(project)
        chosen_runs = _check_names("runs", runs, "run ids")
        chosen_keys = _check_names("keys", keys, "metric keys")
        api = store if isinstance(store, Api) else Api(store)
        key = (
            cls.__qualname__,
            api.store.url,
            project,
            tuple(chosen_runs) if chosen_runs is not None else None,
            tuple(chosen_keys) if chosen_keys is not None else None,
        )
        return key, (api, chosen_runs, chosen_keys)

    def __init__(
        self,
        project: str,
        runs: Sequence[str] | None = None,
        keys: Sequence[str] | None = None,
        store: StoreArg | Api = None,
        *,
        x: str = "step",
        smoothing: float = DEFAULT_SMOOTHING,
        max_points: int = DEFAULT_MAX_POINTS,
        interval: float = 2.0,
    ) -> None:
        if self._reused():
            return
        self._esm, self._css, self.missing_front_end = front_end("compare.js")
        super().__init__(interval=interval, x_axis=x, smoothing=float(smoothing))
        self._setup_live()
        self._api: Api = self._resolved[0]
        self.project = project
        self.max_points = max_points
        self._keys: list[str] | None = self._resolved[2]
        self._all_runs = self._resolved[1] is None
        self._run_ids: list[str] = []
        self._handles: dict[str, RunHandle] = {}
        self._views: dict[str, RunView] = {}
        self._rows: dict[str, dict[str, Any]] = {}
        self._project_reader = ProjectReader(self._api.store, project)
        self._from_dataset: set[str] = set()  # runs whose view came from the project dataset
        self._shown: tuple[Any, ...] | None = None
        self._last_snapshot: CompareSnapshot | None = None
        self._last_basis: tuple[Any, ...] | None = None
        self.observe(self._on_view_option, names=["x_axis", "smooth", "smoothing"])
        try:
            self.set_runs(self._resolved[1] if self._resolved[1] is not None else self._project_runs())
        except Exception:
            self._forget()
            raise

    def __repr__(self) -> str:
        return f"<launchhelm.widgets.CompareChart {self.project} runs={self._run_ids}>"

    # -- what is compared -----------------------------------------------------
    @property
    def runs(self) -> list[str]:
        """The run ids compared, in legend order."""
        return list(self._run_ids)

    def _project_runs(self) -> list[str]:
        handles = self._open(self._api.run_ids(self.project))
        return [h.id for h in sorted(handles, key=lambda h: h.created, reverse=True)]

    def _open(self, run_ids: Sequence[str]) -> list[RunHandle]:
        missing = [r for r in run_ids if r not in self._handles]
        if missing:
            opened = _parallel([lambda r=r: self._api.run(r) for r in missing])
            for handle in opened:
                if handle.project != self.project:
                    raise RunNotFoundError(
                        f"run {handle.id} belongs to project {handle.project!r}, not {self.project!r}; "
                        f"compare runs of one project (Api().runs({self.project!r}) lists them)",
                        run_id=handle.id,
                    )
                self._handles[handle.id] = handle
        return [self._handles[r] for r in run_ids]

    def set_runs(self, run_ids: Sequence[str]) -> None:
        """Compare these runs instead (what ticking runs in :class:`RunsTable` does)."""
        chosen = _check_names("runs", list(run_ids), "run ids") or []
        with self._lock:
            self._open(chosen)
            self._run_ids = list(dict.fromkeys(chosen))
            self._views = {r: v for r, v in self._views.items() if r in self._run_ids}
            self._rows = {r: v for r, v in self._rows.items() if r in self._run_ids}
            self.refresh()

    # -- reading --------------------------------------------------------------
    def is_active(self) -> bool:
        return any(row.get("status") == "running" for row in self._rows.values())

    def _read(self) -> None:
        """Each run's summary row and new points, the runs read concurrently (a few requests each).

        Settled runs the project dataset holds are read from it, as
        :meth:`Api.history` reads them (a few requests for all of them).
        """
        unread = [r for r in self._run_ids if r not in self._views]
        if self._from_dataset or len(unread) > 1:
            settled = settled_views(self._api.store, self.project, self._run_ids, self._keys, self._project_reader)
            for run_id in self._from_dataset - set(settled):
                self._views.pop(run_id, None)  # changed since (resumed, scored): read by itself again
            self._from_dataset = set(settled)
            self._views.update(settled)
        handles = [self._handles[r] for r in self._run_ids if r not in self._from_dataset]

        def one(handle: RunHandle) -> tuple[str, RunView, dict[str, Any] | None]:
            view = handle.poll(keys=self._keys)
            row = self._rows.get(handle.id)
            # a run's row (config, tunables, latest values) changes only while a session is attached
            if row is None or row.get("status") == "running" or view.summary["status"] == "running":
                row = handle.summary()
            return handle.id, view, row

        fresh = [lambda h=self._handles[r]: (h.id, h.summary()) for r in self._from_dataset if r not in self._rows]
        for run_id, view, row in _parallel([lambda h=h: one(h) for h in handles]):
            self._views[run_id] = view
            if row is not None:
                self._rows[run_id] = row
        for run_id, row in _parallel(fresh):
            self._rows[run_id] = row

    def history(self) -> pd.DataFrame:
        """The compared runs' history as :meth:`Api.history` returns it (``run`` column first)."""
        import pandas as pd

        parts = []
        for run_id in self._run_ids:
            view = self._views.get(run_id)
            if view is None:
                continue
            frame = view.history.copy()
            frame.insert(0, "run", run_id)
            parts.append(frame)
        if not parts:
            none: pd.DataFrame = pd.DataFrame({"run": pd.Series([], dtype=object)})
            return none
        result: pd.DataFrame = pd.concat(parts, ignore_index=True, sort=False)
        return result

    def shown_keys(self) -> list[str]:
        """The panels, in order."""
        if self._keys is not None:
            return list(self._keys)
        keys: list[str] = []
        for run_id in self._run_ids:
            view = self._views.get(run_id)
            if view is not None:
                keys.extend(k for k in metric_keys(view.history) if k not in keys)
        return [k for k in keys if not k.startswith("eval/")] + [k for k in keys if k.startswith("eval/")]

    def _runs_shown(self) -> list[ShownRun]:
        colors = run_colors(self._run_ids)
        labels = run_labels({r: self._handles[r].name for r in self._run_ids})
        return [{"id": r, "label": labels[r], "color": colors[r], "name": self._handles[r].name} for r in self._run_ids]

    def diff(self) -> list[dict[str, Any]]:
        """The config diff: :func:`config_diff` of the compared runs' rows."""
        return config_diff([self._rows[r] for r in self._run_ids if r in self._rows])

    def points(self, budget: int | None = None) -> pd.DataFrame:
        """The rows the browser holds (:func:`compare_points`, with a ``label`` column)."""
        weight = self.smoothing if self.smooth else 0.0
        rows = compare_points(self.history(), self.shown_keys(), budget=budget or self.max_points, smoothing=weight)
        labels = {r["id"]: r["label"] for r in self._runs_shown()}
        rows.insert(1, "label", [labels.get(r, r) for r in rows["run"].tolist()])
        return rows

    def rewinds(self) -> list[CompareRewind]:
        """Each compared run's rewind markers (``run_id``, ``label``, ``to_step``, ``time``, ``text``)."""
        labels = {r["id"]: r["label"] for r in self._runs_shown()}
        out: list[CompareRewind] = []
        for run_id in self._run_ids:
            view = self._views.get(run_id)
            if view is None:
                continue
            for m in rewind_rows(run_id, view.rewinds, view.history):
                out.append(
                    {
                        "run_id": m["run_id"],
                        "to_step": m["to_step"],
                        "reached": m["reached"],
                        "attempt": m["attempt"],
                        "time": m["time"],
                        "elapsed": m["elapsed"],
                        "text": m["label"],
                        "label": labels[run_id],
                    }
                )
        return out

    def refresh(self) -> None:
        """Re-read the runs; re-embed when the panels changed, else send the new rows."""
        with self._lock:
            self._read()
            runs = self._runs_shown()
            keys = self.shown_keys()
            shown = (tuple(keys), tuple((r["id"], r["label"]) for r in runs), self.x_axis, self.smooth)
            self.state = self._state(runs)
            if shown != self._shown:
                self._shown = shown
                self._ready = False  # the front end embeds the new spec, then says ready again
                self._last_snapshot = None
                self.spec = build_compare_spec(keys, runs, x=self.x_axis, smoothed=self.smooth)
                return
            self._send_snapshot()

    def _state(self, runs: list[ShownRun]) -> CompareState:
        described: list[CompareRun] = []
        for run in runs:
            row = self._rows.get(run["id"], {})
            created_s = _epoch(row.get("created"))
            beat_s = _epoch(row.get("last_heartbeat"))
            described.append(
                {
                    **run,
                    "status": row.get("status", ""),
                    "step": _plain(row.get("step")),
                    "created": _plain(created_s),
                    "last_heartbeat": _plain(beat_s),
                    "rewinds": _plain(row.get("rewinds")),
                }
            )
        return {
            "project": self.project,
            "runs": described,
            "diff": [{"key": d["key"], "values": [_plain(v) for v in d["values"]]} for d in self.diff()],
        }

    def _snapshot(self) -> CompareSnapshot:
        labels = {r["id"]: r["label"] for r in self._runs_shown()}
        rows = self.points()
        return {
            "type": MSG_SNAPSHOT,
            "points": encode_points(rows.drop(columns="label"), labels),
            "rewinds": [_plain(r) for r in self.rewinds()],
        }

    def _send_snapshot(self) -> None:
        with self._lock:
            if not self._ready:
                return
            basis = self._basis()
            if self._last_snapshot is not None and basis == self._last_basis:
                return  # no run has new points or rewinds: the browser already shows it all
            snapshot = self._snapshot()
            self._last_basis = basis
            if snapshot == self._last_snapshot:
                return
            self._last_snapshot = snapshot
            self.send(snapshot)

    def _basis(self) -> tuple[Any, ...]:
        """What a snapshot is made from: each run's row and rewind counts, and the smoothing."""
        counts = []
        for run_id in self._run_ids:
            view = self._views.get(run_id)
            counts.append((run_id, len(view.history), len(view.rewinds)) if view is not None else (run_id,))
        return (tuple(counts), self.smooth, self.smoothing, self.max_points)

    def snapshot_messages(self) -> list[CompareSnapshot]:
        snapshot = self._snapshot()
        self._last_snapshot, self._last_basis = snapshot, self._basis()
        return [snapshot]

    def _on_view_option(self, change: Any) -> None:
        if change["name"] == "x_axis" and change["new"] not in X_AXES:
            self.x_axis = change["old"]
            self.error = f"x axis {change['new']!r}: use 'step', 'time' or 'relative'"
            return
        if change["name"] == "smoothing" and not 0 <= float(change["new"]) < 1:
            self.smoothing = change["old"]
            self.error = f"smoothing {change['new']!r}: give a weight from 0 up to, not including, 1"
            return
        with self._lock:
            runs = self._runs_shown()
            keys = self.shown_keys()
            shown = (tuple(keys), tuple((r["id"], r["label"]) for r in runs), self.x_axis, self.smooth)
            if shown != self._shown:
                self._shown = shown
                self._ready = False
                self._last_snapshot = None
                self.spec = build_compare_spec(keys, runs, x=self.x_axis, smoothed=self.smooth)
            else:
                self._send_snapshot()

    # -- saved notebooks --------------------------------------------------------
    def static_svg(self) -> str | None:
        """The comparison as SVG (fewer points than the live view); None without vl-convert."""
        try:
            import vl_convert
        except ImportError:
            return None
        import copy

        with self._lock:
            spec = copy.deepcopy(self.spec)
            labels = {r["id"]: r["label"] for r in self._runs_shown()}
            rows = self.points(STATIC_POINTS)
            spec["datasets"] = {
                "points": _expand(encode_points(rows.drop(columns="label"), labels)),
                "rewinds": [_plain(r) for r in self.rewinds()],
            }
        try:
            svg: str = vl_convert.vegalite_to_svg(spec)
        except Exception:  # a picture is a nicety: never fail a display for it
            return None
        return svg

    def diff_html(self) -> str:
        """The config diff as an HTML table (inline styles), and each run's facts."""
        state = self.state
        runs = state.get("runs", [])
        header = ["", *[r["label"] for r in runs]]
        facts = [
            ("status", *[r["status"] for r in runs]),
            ("step", *[r["step"] for r in runs]),
            ("created", *[local_time(r["created"]) for r in runs]),
            (
                "duration",
                *[
                    duration(r["last_heartbeat"] - r["created"]) if r["last_heartbeat"] and r["created"] else "-"
                    for r in runs
                ],
            ),
        ]
        diff = [(d["key"], *["-" if v is None else v for v in d["values"]]) for d in state.get("diff", [])]
        caption = "Config diff" if diff else "Config diff: the runs' config and tunables agree"
        return table_html(header, [*facts, *diff], caption, "compare-diff")

    def static_mimebundle(self) -> dict[str, str]:
        svg = self.static_svg() or ""
        return {"text/html": f"<div class='launchhelm-static-compare'>{svg}{self.diff_html()}</div>"}


def _parallel(calls: Sequence[Any]) -> list[Any]:
    """Independent reads concurrently (each batches its own requests); results in order."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=min(16, len(calls))) as pool:
        return list(pool.map(lambda call: call(), calls))
