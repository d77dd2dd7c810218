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
The points themselves, as columns, are ``_chart_data.py``'s.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, TypedDict

import traitlets

from launchhelm._api import Api, RunHandle
from launchhelm._exceptions import InvalidArgumentError
from launchhelm._metrics._system import SYSTEM_PREFIX
from launchhelm._runlog._sessions import run_status
from launchhelm._types import JSONValue, Rewind, RunLike
from launchhelm.widgets._base import LiveWidget, StoreArg, front_end, resolve_run, run_key
from launchhelm.widgets._chart_data import (
    EVAL_PREFIX,
    Points,
    chart_rows,
    encode_rewinds,
    encode_rows,
    long_points,
    new_points,
    points_from_table,
    series_counts,
)
from launchhelm.widgets._messages import (
    MSG_INSERT,
    MSG_SNAPSHOT,
    MSG_ZOOM,
    ChartSnapshot,
    VegaLiteSpec,
    ZoomMessage,
)
from launchhelm.widgets._static import STATIC_POINTS, chart_svg

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Points", "RunChart", "build_spec", "chart_rows", "long_points", "points_from_table"]


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


def ordered_keys(keys: Sequence[str]) -> list[str]:
    """Training metrics first (as logged), evaluation scores after them, the machine's samples last."""
    system = [k for k in keys if k.startswith(SYSTEM_PREFIX)]
    rest = [k for k in keys if not k.startswith(SYSTEM_PREFIX)]
    return [k for k in rest if not k.startswith(EVAL_PREFIX)] + [k for k in rest if k.startswith(EVAL_PREFIX)] + system


VEGA_LITE_SCHEMA = "https://vega.github.io/schema/vega-lite/v6.4.1.json"


class RunStatus(TypedDict):
    """What the chart's caption says of its run: its status and furthest step."""

    status: str
    step: int


#: Where a rewind's label goes: on the side of its rule with more room (``x`` is the rule's position).
LABEL_ALIGN = "scale('x', datum.to_step) > width / 2 ? 'right' : 'left'"
LABEL_DX = "scale('x', datum.to_step) > width / 2 ? -4 : 4"


def build_spec(keys: Sequence[str], width: int = PANEL_WIDTH, height: int = PANEL_HEIGHT) -> VegaLiteSpec:
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
    view: VegaLiteSpec = {"continuousWidth": 300, "continuousHeight": 300}
    config: VegaLiteSpec = {"view": view}
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
    view["stroke"] = "#ddd"
    config["axis"] = {"labelFont": "sans-serif", "titleFont": "sans-serif"}
    # steps are whole numbers: a one-point chart must not read "64.000000"
    step_axis: VegaLiteSpec = {"format": "d", "tickMinStep": 1}
    x: VegaLiteSpec = {"axis": step_axis, "field": "step", "title": "step", "type": "quantitative"}
    rewind_x: VegaLiteSpec = {"axis": step_axis, "field": "to_step", "title": "step", "type": "quantitative"}
    panels: list[JSONValue] = []
    for i, key in enumerate(keys):
        is_eval = key.startswith(EVAL_PREFIX)
        y: VegaLiteSpec = {
            "axis": {"format": "~g", "labelFont": "sans-serif", "labelLimit": 160, "minExtent": Y_AXIS_MIN_EXTENT},
            "field": "value",
            "scale": {"zero": False},
            "title": key,
            "type": "quantitative",
        }
        of_key: VegaLiteSpec = {"filter": {"equal": key, "field": "key"}}
        points: VegaLiteSpec = {"name": "points"}
        if key.startswith(SYSTEM_PREFIX):
            # both layers read the points: the data sits on the panel (as Altair puts it)
            layer = _system_layers(i, key, y)
            panels.append({"data": points, "height": height, "layer": layer, "title": key, "width": width})
            continue
        layers: list[JSONValue] = [
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
                    # right of the rule in the chart's left half, left of it in its right half: the
                    # sentence stays whole wherever the rewind falls
                    "align": {"expr": LABEL_ALIGN},
                    "baseline": "top",
                    "color": REWIND_COLOR,
                    "dx": {"expr": LABEL_DX},
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


def _system_layers(i: int, key: str, y: VegaLiteSpec) -> list[JSONValue]:
    """A ``system/`` panel's layers: the samples by wall time, as a line and points (no step, no rewinds)."""
    x: VegaLiteSpec = {"axis": {"format": "%H:%M:%S"}, "field": "time", "title": "wall time", "type": "temporal"}
    of_key: VegaLiteSpec = {"filter": {"equal": key, "field": "key"}}
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


class RunChart(LiveWidget[tuple[Api, RunHandle]]):
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
    ) -> tuple[tuple[Hashable, ...], tuple[Api, RunHandle]]:
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

    def fetch(self) -> tuple[RunStatus, list[Rewind], Points]:
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
        summary: RunStatus = {"status": run_status(state, live), "step": step}
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


def _caption(summary: RunStatus, rewinds: int) -> str:
    parts = [str(summary["status"]), f"furthest step {summary['step']}"]
    if rewinds:
        parts.append(f"{rewinds} rewind" + ("s" if rewinds != 1 else ""))
    if summary["status"] == "running":
        parts.append("live")
    return " · ".join(parts)
