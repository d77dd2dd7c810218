"""What a widget leaves in a saved notebook: a static picture of itself.

A notebook opened without a kernel (GitHub, nbviewer, ``jupyter nbconvert
--to html``) cannot draw a widget view, so each widget's MIME bundle also
carries a static fallback rendered in the kernel: the chart as SVG (drawn by
``vl-convert``, which needs no browser, from the same Vega-Lite spec and the
same downsampled rows), the picker, the evaluation table and the Details tab
as HTML tables. A live front end prefers the widget view; a saved one shows
the run as it was when the cell ran.

Everything here is best effort: a fallback that cannot be made is left out,
never an error in the cell.
"""

from __future__ import annotations

import copy
import html
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["chart_svg", "details_html", "evaluations_html", "picker_html", "table_html"]

#: Points per series in the saved picture (the live chart sends more).
STATIC_POINTS = 300

_STYLE = "border-collapse:collapse;font-family:sans-serif;font-size:12px;margin:4px 0; border:1px solid #ddd"


def _cell(value: Any, tag: str = "td") -> str:
    return f"<{tag} style='border:1px solid #ddd;padding:2px 6px;text-align:left'>{html.escape(str(value))}</{tag}>"


def table_html(columns: Sequence[str], rows: Iterable[Sequence[Any]], caption: str = "", kind: str = "") -> str:
    """A plain HTML table (inline styles only: a saved notebook has no stylesheet of ours)."""
    head = "".join(_cell(c, "th") for c in columns)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    title = f"<caption style='text-align:left;padding:2px 0'>{html.escape(caption)}</caption>" if caption else ""
    return (
        f"<table class='launchhelm-static {kind}' style='{_STYLE}'>{title}"
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def picker_html(state: dict[str, Any]) -> str:
    """The "Resume…" picker as it stood: how the run ended, its checkpoints, what resume restores."""
    run = state.get("run", {})
    rows = []
    for c in state.get("checkpoints", []):
        marks = [m for m, on in (("latest", c["latest"]), ("chosen", c["chosen"])) if on]
        if c["before_last_control_change"]:
            marks.append("before the last control change")
        rows.append((c["step"], c["saved_at"], c["size"], c["steps_to_redo"], ", ".join(marks), c["id"]))
    parts = [
        f"<div class='launchhelm-static-picker'><b>Resume… {html.escape(str(run.get('name', '')))}</b> "
        f"<code>{html.escape(str(run.get('id', '')))}</code>: {html.escape(state.get('sentence', ''))}",
        table_html(["step", "saved", "size", "steps to redo", "", "checkpoint"], rows, kind="picker"),
        f"<div>{html.escape(state.get('restores', ''))}</div>",
    ]
    if state.get("confirmation"):
        parts.append(f"<div><b>{html.escape(state['confirmation'])}</b></div>")
    return "".join(parts) + "</div>"


def evaluations_html(state: dict[str, Any]) -> str:
    """The evaluation table as it stood: one row per checkpoint, its state and scores or error."""
    rows = [(r["run_name"], r["step"], r["state"], r["detail"], r["attempts"], r["checkpoint"]) for r in state["rows"]]
    scope = f"run {state['run']['name']}" if state.get("run") else f"project {state.get('project', '')}"
    rule = "on" if state.get("rule") else "off"
    caption = f"Evaluations of {scope} (evaluate every checkpoint: {rule})"
    return table_html(
        ["run", "step", "state", "scores or error", "attempts", "checkpoint"], rows, caption, "evaluations"
    )


def details_html(state: dict[str, Any]) -> str:
    """The Details tab as it stood: status, config and tunables."""
    rows = [("status", state.get("status", ""))]
    rows += [(f"config {k}", v) for k, v in dict(state.get("config") or {}).items()]
    rows += [(f"tunable {k}", v) for k, v in dict(state.get("tunables") or {}).items()]
    return table_html(["", "value"], rows, "Details", "details")


def chart_svg(spec: dict[str, Any], points: dict[str, Any], rewinds: list[dict[str, Any]]) -> str | None:
    """The chart as SVG: ``spec`` with its named datasets filled in (``points`` as :func:`encode_rows` makes).

    None where ``vl-convert`` is not installed or cannot draw it.
    """
    try:
        import vl_convert
    except ImportError:
        return None
    static = copy.deepcopy(spec)
    keys = points.get("keys", [])
    static["datasets"] = {
        "points": [
            {"key": keys[k], "step": s, "value": v, "attempt": a, "abandoned": d}
            for k, s, v, a, d in zip(
                points.get("k", []),
                points.get("step", []),
                points.get("value", []),
                points.get("attempt", []),
                points.get("abandoned", []),
                strict=True,
            )
        ],
        "rewinds": rewinds,
    }
    # the zoom binds scales to the mouse: nothing to bind in a picture
    static["params"] = [p for p in static.get("params", []) if p.get("name") != "zoom"]
    try:
        svg: str = vl_convert.vegalite_to_svg(static)
    except Exception:  # a picture is a nicety: never fail a display for it
        return None
    return svg
