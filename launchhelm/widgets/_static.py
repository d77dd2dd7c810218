"""What a widget leaves in a saved notebook: a static picture of itself.

A notebook opened without a kernel (GitHub, nbviewer, ``jupyter nbconvert
--to html``) cannot draw a widget view, so each widget also leaves a static
fallback rendered in the kernel: the chart as SVG (drawn by ``vl-convert``,
which needs no browser, from the same Vega-Lite spec and the same
downsampled rows), the picker, the evaluation table and the Details tab as
HTML tables. The saved notebook shows the run as it was when the cell ran.

In a Jupyter kernel the fallback is an output of its own, published just
before the widget's view (:func:`split_fallback`), not another MIME type of
the view's bundle: a renderer shows one type per output, and where the
notebook was saved with its widget state (JupyterLab's "save widget state",
``nbclient`` with ``store_widget_state``) nbconvert's HTML exporter picks
the widget view and drops every other type, so a fallback inside the bundle
never shows. The fallback's HTML carries the model ids of the widgets it
stands for (``data-lh-static``); a live view hides it once the kernel
answers its ``ready`` (a ``live`` message: :func:`live_message`), so a
running notebook shows the widget alone, while an export whose widgets draw
from saved state without a kernel keeps the picture beside them.

Everything here is best effort: a fallback that cannot be made is left out,
never an error in the cell.
"""

from __future__ import annotations

import base64
import copy
import html
from collections.abc import Iterable, Mapping, Sequence

from launchhelm.widgets._messages import (
    MSG_LIVE,
    ChartColumns,
    ChartRewind,
    DetailsState,
    EvaluationsState,
    LiveMessage,
    PickerState,
    VegaLiteSpec,
)

__all__ = [
    "FALLBACK_CLASS",
    "chart_svg",
    "details_html",
    "evaluations_html",
    "fallback_html",
    "live_message",
    "picker_html",
    "split_fallback",
    "table_html",
]

#: The class of a fallback output's outer element (the front ends hide it by ``data-lh-static``).
FALLBACK_CLASS = "launchhelm-static-fallback"

#: Points per series in the saved picture (the live chart sends more).
STATIC_POINTS = 300

_STYLE = "border-collapse:collapse;font-family:sans-serif;font-size:12px;margin:4px 0; border:1px solid #ddd"


def _cell(value: object, tag: str = "td") -> str:
    return f"<{tag} style='border:1px solid #ddd;padding:2px 6px;text-align:left'>{html.escape(str(value))}</{tag}>"


def table_html(columns: Sequence[str], rows: Iterable[Sequence[object]], caption: str = "", kind: str = "") -> str:
    """A plain HTML table (inline styles only: a saved notebook has no stylesheet of ours)."""
    head = "".join(_cell(c, "th") for c in columns)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    title = f"<caption style='text-align:left;padding:2px 0'>{html.escape(caption)}</caption>" if caption else ""
    return (
        f"<table class='launchhelm-static {kind}' style='{_STYLE}'>{title}"
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def picker_html(state: PickerState) -> str:
    """The "Resume…" picker as it stood: how the run ended, its checkpoints, what resume restores."""
    run = state.get("run", {})
    rows = []
    for c in state.get("checkpoints", []):
        marks = [m for m, on in (("latest", c["latest"]), ("chosen", c["chosen"])) if on]
        if c["before_last_control_change"]:
            marks.append("before the last control change")
        rows.append(
            (c["step"], c["saved_at"], c["size"], c.get("layout", ""), c["steps_to_redo"], ", ".join(marks), c["id"])
        )
    parts = [
        f"<div class='launchhelm-static-picker'><b>Resume… {html.escape(str(run.get('name', '')))}</b> "
        f"<code>{html.escape(str(run.get('id', '')))}</code>: {html.escape(state.get('sentence', ''))}",
        f"<div><b>Relaunches are refused: {html.escape(state['restart_loop'])}</b></div>"
        if state.get("restart_loop")
        else "",
        "<ol>" + "".join(f"<li>{html.escape(line)}</li>" for line in state.get("attempts", [])) + "</ol>"
        if state.get("attempts")
        else "",
        table_html(["step", "saved", "size", "shards", "steps to redo", "", "checkpoint"], rows, kind="picker"),
        f"<div>{html.escape(state.get('restores', ''))}</div>",
    ]
    if state.get("confirmation"):
        parts.append(f"<div><b>{html.escape(state['confirmation'])}</b></div>")
    elif state.get("earlier"):
        parts.append(f"<div>{html.escape(state['earlier'])}</div>")
    return "".join(parts) + "</div>"


def evaluations_html(state: EvaluationsState) -> str:
    """The evaluation table as it stood: one row per checkpoint, its state and scores or error."""
    rows = [(r["run_name"], r["step"], r["state"], r["detail"], r["attempts"], r["checkpoint"]) for r in state["rows"]]
    run = state.get("run")
    scope = f"run {run['name']}" if run else f"project {state.get('project', '')}"
    rule = "on" if state.get("rule") else "off"
    caption = f"Evaluations of {scope} (evaluate every checkpoint: {rule})"
    return table_html(
        ["run", "step", "state", "scores or error", "attempts", "checkpoint"], rows, caption, "evaluations"
    )


def details_html(state: DetailsState) -> str:
    """The Details tab as it stood: status, config and tunables."""
    rows: list[tuple[str, object]] = [("status", state.get("status", ""))]
    rows += [(f"config {k}", v) for k, v in dict(state.get("config") or {}).items()]
    rows += [(f"tunable {k}", v) for k, v in dict(state.get("tunables") or {}).items()]
    return table_html(["", "value"], rows, "Details", "details")


def chart_svg(spec: VegaLiteSpec, points: ChartColumns, rewinds: list[ChartRewind]) -> str | None:
    """The chart as SVG: ``spec`` with its named datasets filled in (``points`` as :func:`encode_rows` makes).

    None where ``vl-convert`` is not installed or cannot draw it.
    """
    try:
        import vl_convert
    except ImportError:
        return None
    static: dict[str, object] = dict(copy.deepcopy(spec))
    keys = points.get("keys", [])
    rows = [
        {"key": keys[k], "step": s, "value": v, "attempt": a, "abandoned": d}
        for k, s, v, a, d in zip(
            points.get("k", []),
            points.get("step", []),
            points.get("value", []),
            points.get("attempt", []),
            points.get("abandoned", []),
            strict=True,
        )
    ]
    for row, t in zip(rows, points.get("time") or [], strict=False):
        row["time"] = t  # the wall-time panels' x (ms), when there are any
    static["datasets"] = {"points": rows, "rewinds": rewinds}
    # the zoom binds scales to the mouse: nothing to bind in a picture
    params = static.get("params", [])
    if isinstance(params, list):
        static["params"] = [p for p in params if not (isinstance(p, dict) and p.get("name") == "zoom")]
    try:
        svg: str = vl_convert.vegalite_to_svg(static)
    except Exception:  # a picture is a nicety: never fail a display for it
        return None
    return svg


def svg_img(svg: str, alt: str = "") -> str:
    """An SVG as an ``<img>`` (a data URI: inline ``<svg>`` ids would clash between charts on one page)."""
    encoded = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f"<img src='data:image/svg+xml;base64,{encoded}' alt='{html.escape(alt, quote=True)}'>"


def fallback_html(static: Mapping[str, str], model_ids: Sequence[str], alt: str = "") -> str | None:
    """The fallback bundle (``text/html`` and/or ``image/svg+xml``) as one HTML block tagged with ``model_ids``."""
    parts = []
    if static.get("image/svg+xml"):
        parts.append(svg_img(str(static["image/svg+xml"]), alt))
    if static.get("text/html"):
        parts.append(str(static["text/html"]))
    if not parts:
        return None
    ids = html.escape(" ".join(model_ids), quote=True)
    return f"<div class='{FALLBACK_CLASS}' data-lh-static='{ids}'>" + "".join(parts) + "</div>"


def split_fallback(
    data: dict[str, object], static: Mapping[str, str], model_ids: Sequence[str], alt: str = ""
) -> dict[str, object]:
    """The widget view's bundle; its fallback published before it as an output of its own in a kernel.

    Outside a Jupyter kernel (marimo, a plain IPython), nothing is
    published: the fallback's MIME types join ``data``, as before.
    """
    from launchhelm.widgets._kernel import in_kernel

    if not static:
        return data
    if not in_kernel():
        return {**static, **data}
    block = fallback_html(static, model_ids, alt)
    if block is not None:
        from IPython.display import display

        display({"text/html": block}, raw=True)  # type: ignore[no-untyped-call]
    return data


def live_message(model_ids: Sequence[str]) -> LiveMessage:
    """What the kernel answers a view's ``ready`` with first: hide the saved pictures of these models."""
    return {"type": MSG_LIVE, "static": list(model_ids)}
