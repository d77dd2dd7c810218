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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import traitlets

from launchhelm._api import Api, RunHandle
from launchhelm._exceptions import InvalidArgumentError
from launchhelm._run import Run
from launchhelm._types import Rewind
from launchhelm.widgets._base import LiveWidget, front_end, resolve_run, run_key
from launchhelm.widgets._downsample import minmax_indices
from launchhelm.widgets._static import STATIC_POINTS, chart_svg

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RunChart", "build_spec", "chart_rows", "long_points"]

#: Columns of ``history()`` that are not metrics.
META_COLUMNS = frozenset({"step", "attempt", "time", "abandoned"})
#: Metric keys under this prefix are evaluation scores, drawn as points at their checkpoints' steps.
EVAL_PREFIX = "eval/"
#: Message types, kernel -> front end.
MSG_SNAPSHOT = "snapshot"
MSG_INSERT = "insert"
MSG_ZOOM = "zoom"

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
        empty: pd.DataFrame = pd.DataFrame(
            {
                "key": pd.Series([], dtype=object),
                "step": pd.Series([], dtype=np.int64),
                "attempt": pd.Series([], dtype=np.int64),
                "time": pd.Series([], dtype=np.int64),
                "value": pd.Series([], dtype=float),
                "abandoned": pd.Series([], dtype=bool),
            }
        )
        return empty
    result: pd.DataFrame = pd.concat(pieces, ignore_index=True)
    return result


def series_ids(points: pd.DataFrame) -> pd.Series[str]:
    """Which line each row belongs to: the key's run line, or one abandoned attempt of it."""
    line = points["key"].astype(str)
    attempt = points["attempt"].astype(str)
    ids: pd.Series[str] = line.where(~points["abandoned"], line + "\x00abandoned " + attempt)
    return ids


def chart_rows(
    points: pd.DataFrame, budget: int, domain: tuple[float, float] | None = None
) -> tuple[pd.DataFrame, dict[str, int]]:
    """The rows a chart shows: each series downsampled to at most ``budget`` points.

    With a zoomed ``domain`` (``(low, high)`` steps), three quarters of the
    budget go to the points inside it, a quarter to an overview of the rest,
    so panning out does not show a hole.

    Returns the rows (sorted by series then step) and each series' count.
    """
    import numpy as np
    import pandas as pd

    if points.empty:
        return points, {}
    # numpy over positions, not pandas groupby/sort over the whole frame: a 1M-point series must take
    # milliseconds here (series come from history() already in step order, so sorting is the exception)
    codes, keys = pd.factorize(points["key"], sort=True)
    steps = points["step"].to_numpy()
    attempts = points["attempt"].to_numpy()
    abandoned = points["abandoned"].to_numpy(bool)
    values = points["value"].to_numpy(float)
    keep: list[np.ndarray] = []
    counts: dict[str, int] = {}
    by_key = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[by_key], np.arange(len(keys) + 1))
    for c, key in enumerate(keys):
        of_key = by_key[bounds[c] : bounds[c + 1]]
        gone = abandoned[of_key]
        series = [(str(key), of_key[~gone])]
        if gone.any():
            old = of_key[gone]
            for attempt in np.unique(attempts[old]):
                series.append((f"{key}\x00abandoned {attempt}", old[attempts[old] == attempt]))
        for sid, positions in series:
            if len(positions) == 0:
                continue
            if len(positions) > 1 and not (np.diff(steps[positions]) >= 0).all():
                times = points["time"].to_numpy()[positions]
                positions = positions[np.lexsort((times, attempts[positions], steps[positions]))]
            ys = values[positions]
            if domain is None:
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
    rows: pd.DataFrame = points.iloc[np.concatenate(keep)] if keep else points
    rows = rows.sort_values(["key", "abandoned", "attempt", "step"], kind="stable")
    return pd.DataFrame(rows), counts


def encode_rows(rows: pd.DataFrame) -> dict[str, Any]:
    """Rows as compact columns for a custom message (the front end expands them)."""
    keys = list(dict.fromkeys(rows["key"].tolist()))
    code = {k: i for i, k in enumerate(keys)}
    return {
        "keys": keys,
        "k": [code[k] for k in rows["key"].tolist()],
        "step": rows["step"].astype(int).tolist(),
        "value": rows["value"].astype(float).tolist(),
        "attempt": rows["attempt"].astype(int).tolist(),
        "abandoned": [bool(a) for a in rows["abandoned"].tolist()],
    }


def encode_rewinds(rewinds: Sequence[Rewind]) -> list[dict[str, Any]]:
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
    """Training metrics first (as logged), evaluation scores after them."""
    return [k for k in keys if not k.startswith(EVAL_PREFIX)] + [k for k in keys if k.startswith(EVAL_PREFIX)]


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
    front end reports so the kernel can send denser points for it.

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
        # one step axis for every panel: a rewind or a score lines up across them
        "resolve": {"scale": {"x": "shared"}},
        "spacing": 18,
        "vconcat": panels,
        "$schema": VEGA_LITE_SCHEMA,
    }


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

    @classmethod
    def _reuse_key(
        cls,
        run_or_id: Run | RunHandle | str,
        keys: Sequence[str] | str | None = None,
        store: Any = None,
        max_points: int = DEFAULT_MAX_POINTS,
        **_: Any,
    ) -> tuple[tuple[Any, ...], Any]:
        # checked here, in __new__, so a refused chart is never built half-way (nor kept for reuse)
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 8:
            raise InvalidArgumentError(f"max_points={max_points!r}: give at least 8")
        api, handle = resolve_run(run_or_id, store)
        chosen = (keys,) if isinstance(keys, str) else (tuple(keys) if keys is not None else None)
        return run_key(cls, api, handle, chosen), (api, handle)

    def __init__(
        self,
        run_or_id: Run | RunHandle | str,
        keys: Sequence[str] | str | None = None,
        store: Any = None,
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
        self._points = long_points(_empty_history())
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

    def fetch(self) -> tuple[dict[str, Any], list[Rewind], pd.DataFrame]:
        """Everything one poll reads from the store: the run's summary, rewinds and points (long form).

        The only place the chart reads run data, through the public query API:
        :meth:`RunHandle.poll` reads the log, the last heartbeat and only the
        metric chunks that arrived since the last poll (a few requests,
        whatever the run's length: ``docs/storage.md``).
        """
        view = self._handle.poll(keys=self._keys)
        return view.summary, view.rewinds, long_points(view.history, self._keys)

    def refresh(self) -> None:
        """Re-read the run; stream what is new, or send a snapshot when history changed shape."""
        with self._lock:
            summary, rewinds, points = self.fetch()
            self._status = str(summary["status"])
            shown = self._keys if self._keys is not None else ordered_keys(list(dict.fromkeys(points["key"])))
            self.caption = _caption(summary, len(rewinds))
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
            fresh = _new_rows(points, self._points)
            self._points = points
            if fresh.empty:
                return
            fresh_ids = series_ids(fresh)
            grown = fresh_ids.value_counts()
            if any(self._counts.get(str(sid), 0) + int(n) > self.max_points for sid, n in grown.items()):
                self._send_snapshot()
                return
            if self.send_when_ready({"type": MSG_INSERT, "points": encode_rows(fresh)}):
                for sid, n in grown.items():
                    self._counts[str(sid)] = self._counts.get(str(sid), 0) + int(n)

    def _budget(self) -> int:
        # a running run's series keep room to grow before they are resampled
        return self.max_points // 2 if self._status == "running" else self.max_points

    def _snapshot(self) -> dict[str, Any]:
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

    def snapshot_messages(self) -> list[dict[str, Any]]:
        return [self._snapshot()]

    def handle_message(self, content: dict[str, Any]) -> None:
        if content.get("type") != MSG_ZOOM:
            return
        domain = content.get("domain")
        with self._lock:
            if isinstance(domain, list) and len(domain) == 2 and all(isinstance(v, (int, float)) for v in domain):
                low, high = sorted(float(v) for v in domain)
                self._domain = (low, high)
            else:
                self._domain = None
            self._send_snapshot()

    def zoom(self, low: float | None = None, high: float | None = None) -> None:
        """Resample for the step range ``[low, high]`` (both None: the whole run), as zooming does."""
        self.handle_message({"type": MSG_ZOOM, "domain": None if low is None or high is None else [low, high]})

    def static_svg(self) -> str | None:
        """The chart as it stands, as SVG (fewer points than the live view); None without vl-convert."""
        with self._lock:
            rows, _ = chart_rows(self._points, STATIC_POINTS, None)
            return chart_svg(self.spec, encode_rows(rows), encode_rewinds(self._rewinds))

    def static_mimebundle(self) -> dict[str, Any]:
        svg = self.static_svg()
        return {"image/svg+xml": svg} if svg else {}

    def shown_rows(self) -> pd.DataFrame:
        """The rows the browser holds now: each series downsampled (for checks and debugging)."""
        with self._lock:
            return chart_rows(self._points, self._budget(), self._domain)[0]


def _empty_history() -> pd.DataFrame:
    import pandas as pd

    frame: pd.DataFrame = pd.DataFrame(
        {
            "step": pd.Series([], dtype="int64"),
            "attempt": pd.Series([], dtype="int64"),
            "time": pd.to_datetime(pd.Series([], dtype="float64"), unit="s", utc=True),
            "abandoned": pd.Series([], dtype=bool),
        }
    )
    return frame


def _new_rows(points: pd.DataFrame, seen: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``points`` not in ``seen`` (identified by key, step, attempt and log time)."""
    import pandas as pd

    columns = ["key", "step", "attempt", "time"]
    if seen.empty:
        return points
    known = pd.MultiIndex.from_frame(seen[columns])
    mask = ~pd.MultiIndex.from_frame(points[columns]).isin(known)
    result: pd.DataFrame = points[mask]
    return result


def _caption(summary: dict[str, Any], rewinds: int) -> str:
    parts = [str(summary["status"]), f"furthest step {summary['step']}"]
    if rewinds:
        parts.append(f"{rewinds} rewind" + ("s" if rewinds != 1 else ""))
    if summary["status"] == "running":
        parts.append("live")
    return " · ".join(parts)
