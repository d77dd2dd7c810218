"""The chart's Vega-Lite spec is what Altair builds, without importing Altair
(its import alone takes longer than a chart may take to open), and gives a
person what they need to read it: room for every y label, the abandoned
attempt as a visible grey dashed line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from launchhelm.widgets._chart import (
    ABANDONED_COLOR,
    ABANDONED_DASH,
    ABANDONED_OPACITY,
    CHART_PADDING,
    EVAL_PREFIX,
    LABEL_ALIGN,
    LABEL_DX,
    LINE_COLOR,
    REWIND_COLOR,
    SYSTEM_COLOR,
    Y_AXIS_MIN_EXTENT,
    build_spec,
)


def altair_spec(keys: Sequence[str], width: int = 560, height: int = 150) -> dict[str, Any]:
    """The same chart, described with Altair (which also validates it against the Vega-Lite schema)."""
    import altair as alt

    if not keys:
        alt.data_transformers.consolidate_datasets = False  # the placeholder's one row, inline
        empty = (
            alt.Chart(alt.InlineData(values=[{"text": "No metrics logged yet"}]))
            .mark_text(size=14, color="#666")
            .encode(text="text:N")
            .properties(width=width, height=60)
        )
        try:
            return dict(empty.to_dict())
        finally:
            alt.data_transformers.consolidate_datasets = True
    points = alt.NamedData(name="points")
    rewinds = alt.NamedData(name="rewinds")
    show = alt.param(name="show_abandoned", value=False)
    panels = []
    for i, key in enumerate(keys):
        is_eval = key.startswith(EVAL_PREFIX)
        step_axis = alt.Axis(format="d", tickMinStep=1)
        x = alt.X("step:Q", title="step", axis=step_axis)
        axis = alt.Axis(format="~g", labelLimit=160, minExtent=Y_AXIS_MIN_EXTENT, labelFont="sans-serif")
        y = alt.Y("value:Q", title=key, scale=alt.Scale(zero=False), axis=axis)
        of_key = alt.FieldEqualPredicate(field="key", equal=key)
        if key.startswith("system/"):  # the machine's samples: by wall time, no attempts, no rewinds
            when = alt.X("time:T", title="wall time", axis=alt.Axis(format="%H:%M:%S"))
            system_line = (
                alt.Chart(points, name=f"line_{i}")
                .transform_filter(of_key)
                .mark_line(color=SYSTEM_COLOR, strokeWidth=1.5)
                .encode(x=when, y=y)
            )
            system_dots = (
                alt.Chart(points, name=f"points_{i}")
                .transform_filter(of_key)
                .mark_circle(color=SYSTEM_COLOR, size=10, opacity=0.6)
                .encode(
                    x=when,
                    y=y,
                    tooltip=[
                        alt.Tooltip("time:T", title="time", format="%H:%M:%S"),
                        alt.Tooltip("value:Q", title=key, format=".6g"),
                        alt.Tooltip("step:Q", title="step"),
                    ],
                )
            )
            panels.append(alt.layer(system_line, system_dots).properties(width=width, height=height, title=key))
            continue
        abandoned = (
            alt.Chart(points, name=f"abandoned_{i}")
            .transform_filter(of_key)
            .transform_filter("datum.abandoned && show_abandoned")
            .mark_line(color=ABANDONED_COLOR, opacity=ABANDONED_OPACITY, strokeDash=ABANDONED_DASH, strokeWidth=2)
            .encode(x=x, y=y, detail="attempt:O")
        )
        line = (
            alt.Chart(points, name=f"line_{i}")
            .transform_filter(of_key)
            .transform_filter("!datum.abandoned")
            .mark_line(color=LINE_COLOR, strokeWidth=1.5, opacity=0.5 if is_eval else 1.0)
            .encode(x=x, y=y)
        )
        tooltip = [
            alt.Tooltip("step:Q", title="step"),
            alt.Tooltip("value:Q", title=key, format=".6g"),
            alt.Tooltip("attempt:Q", title="attempt"),
        ]
        dots = (
            alt.Chart(points, name=f"points_{i}")
            .transform_filter(of_key)
            .transform_filter("!datum.abandoned")
            .mark_circle(color=LINE_COLOR, size=60 if is_eval else 10, opacity=1.0 if is_eval else 0.6)
            .encode(x=x, y=y, tooltip=tooltip)
        )
        rule = (
            alt.Chart(rewinds, name=f"rewind_rule_{i}")
            .mark_rule(color=REWIND_COLOR, strokeDash=[6, 3], strokeWidth=1.5)
            .encode(x=alt.X("to_step:Q", title="step", axis=step_axis), tooltip=alt.Tooltip("label:N", title="rewind"))
        )
        label = (
            alt.Chart(rewinds, name=f"rewind_label_{i}")
            .mark_text(
                color=REWIND_COLOR,
                align=alt.ExprRef(LABEL_ALIGN),
                baseline="top",
                dx=alt.ExprRef(LABEL_DX),
                fontSize=11,
            )
            .encode(x=alt.X("to_step:Q", title="step", axis=step_axis), y=alt.value(2), text="label:N")
        )
        panels.append(alt.layer(abandoned, line, dots, rule, label).properties(width=width, height=height, title=key))
    chart = (
        alt.vconcat(*panels, spacing=18)
        .resolve_scale(x="independent" if any(k.startswith("system/") for k in keys) else "shared")
        .add_params(show)
        .configure_view(stroke="#ddd")
        .configure_axis(labelFont="sans-serif", titleFont="sans-serif")
        .properties(padding=CHART_PADDING, autosize={"type": "pad", "resize": True})
    )
    result = dict(chart.to_dict())
    result["params"].append(
        {
            "name": "zoom",
            "select": {"type": "interval", "encodings": ["x"]},
            "bind": "scales",
            "views": [f"line_{i}" for i in range(len(keys))],
        }
    )
    return result


@pytest.mark.slow
def test_the_spec_is_exactly_what_altair_builds() -> None:
    for keys in ([], ["train/loss"], ["train/loss", "lr", "eval/accuracy"], ["loss", "system/cpu_percent"]):
        assert build_spec(keys) == altair_spec(keys), keys


@pytest.mark.slow
def test_opening_a_chart_does_not_import_altair() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from launchhelm.widgets._chart import build_spec; build_spec(['a', 'eval/b']); "
            "print('altair' in sys.modules)",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_every_axis_has_room_and_the_abandoned_attempt_is_a_visible_line() -> None:
    spec = build_spec(["train/loss", "lr"])
    assert spec["autosize"] == {"type": "pad", "resize": True} and min(spec["padding"].values()) >= 6
    for panel in spec["vconcat"]:
        abandoned, line = panel["layer"][0], panel["layer"][1]
        assert line["encoding"]["y"]["axis"]["minExtent"] >= 60
        assert line["encoding"]["y"]["axis"]["labelLimit"] >= 120
        assert abandoned["mark"]["strokeDash"] and abandoned["mark"]["opacity"] >= 0.5
        assert abandoned["mark"]["strokeWidth"] >= 2 and abandoned["mark"]["color"] == ABANDONED_COLOR
