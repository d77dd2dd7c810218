"""What a chart is built from: downsampled series that keep their spikes, the
abandoned attempt told apart from the run's line, and a Vega-Lite spec with
one panel per metric and every rewind marked."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from launchhelm.widgets._chart import build_spec
from launchhelm.widgets._chart_data import chart_rows, encode_rows, long_points, new_points, points_from_table
from launchhelm.widgets._downsample import minmax_indices


def test_downsampling_keeps_spikes_dips_first_and_last_within_the_budget() -> None:
    rng = np.random.default_rng(0)
    values = np.cumsum(rng.normal(size=1_000_000))
    values[123_457] = values.max() + 1000.0  # a spike a stride would miss
    values[876_543] = values.min() - 1000.0  # and a dip
    for budget in (2000, 500, 4):
        kept = minmax_indices(values, budget)
        assert len(kept) <= budget
        assert {0, 123_457, 876_543, len(values) - 1} <= set(kept.tolist())
        assert np.all(np.diff(kept) > 0)  # sorted, no point twice


def test_every_bucket_keeps_its_own_extremes() -> None:
    values = np.sin(np.linspace(0, 40 * np.pi, 100_000))  # 20 periods: 20 peaks, 20 troughs
    kept = minmax_indices(values, 200)
    assert values[kept].max() == pytest.approx(1.0, abs=1e-6)
    assert (values[kept] > 0.999).sum() >= 20 and (values[kept] < -0.999).sum() >= 20


def test_a_series_within_budget_is_sent_whole_and_a_tiny_budget_is_refused() -> None:
    assert minmax_indices(np.arange(10.0), 2000).tolist() == list(range(10))
    with pytest.raises(ValueError, match="at least 4"):
        minmax_indices(np.arange(10.0), 3)


def _history() -> pd.DataFrame:
    # attempt 0 reached step 6; a rewind to step 3 started attempt 1, which reached step 8
    steps = [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8]
    attempts = [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    return pd.DataFrame(
        {
            "step": steps,
            "attempt": attempts,
            "time": pd.to_datetime(np.arange(len(steps)), unit="s", utc=True),
            "abandoned": [a == 0 and s > 3 for s, a in zip(steps, attempts, strict=True)],
            "loss": [1.0, 0.9, 0.8, 0.7, 5.0, 5.0, 5.0, 0.6, 0.5, 0.4, 0.3, np.nan],
        }
    )


def test_the_abandoned_attempt_is_told_apart_from_the_runs_line() -> None:
    points = long_points(_history())
    line = points[~points["abandoned"]]
    dimmed = points[points["abandoned"]]
    # the redone steps' new values are the line; NaN is left out (a chart cannot place it)
    assert line["step"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert line.set_index("step").loc[[4, 5, 6], "value"].tolist() == [0.6, 0.5, 0.4]
    assert dimmed["step"].tolist() == [4, 5, 6] and set(dimmed["value"]) == {5.0}
    assert long_points(_history(), keys=["nope"]).empty


def test_each_series_is_bounded_and_a_zoom_gets_denser_points_inside_its_range() -> None:
    n = 50_000
    history = pd.DataFrame(
        {
            "step": np.arange(n),
            "attempt": 0,
            "time": pd.to_datetime(np.arange(n), unit="s", utc=True),
            "abandoned": False,
            "loss": np.sin(np.arange(n) / 50.0),
            "lr": np.linspace(1e-3, 1e-5, n),
        }
    )
    points = long_points(history)
    rows, counts = chart_rows(points, budget=400)
    assert set(counts) == {"loss", "lr"} and all(c <= 400 for c in counts.values())
    assert rows.groupby("key").size().max() <= 400
    overview_inside = rows[(rows["key"] == "loss") & rows["step"].between(1000, 2000)]
    zoomed, zoom_counts = chart_rows(points, budget=400, domain=(1000, 2000))
    inside = zoomed[(zoomed["key"] == "loss") & zoomed["step"].between(1000, 2000)]
    assert all(c <= 400 for c in zoom_counts.values())
    assert len(inside) > 5 * len(overview_inside)
    assert (zoomed["step"] < 1000).any() and (zoomed["step"] > 2000).any()  # an overview stays around it


def test_the_spec_has_a_panel_per_key_with_rewind_rule_label_and_a_hidden_abandoned_layer() -> None:
    spec = build_spec(["train/loss", "eval/accuracy"])
    assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/v")
    panels = spec["vconcat"]
    assert [p["title"] for p in panels] == ["train/loss", "eval/accuracy"]
    names = [[layer["name"] for layer in p["layer"]] for p in panels]
    assert names[0] == ["abandoned_0", "line_0", "points_0", "rewind_rule_0", "rewind_label_0"]
    layers = {layer["name"]: layer for p in panels for layer in p["layer"]}
    assert layers["rewind_label_0"]["encoding"]["text"]["field"] == "label"
    assert layers["rewind_rule_0"]["mark"]["type"] == "rule"
    assert layers["rewind_rule_0"]["encoding"]["tooltip"]["field"] == "label"
    assert {"filter": "datum.abandoned && show_abandoned"} in layers["abandoned_0"]["transform"]
    assert layers["points_1"]["mark"]["size"] > layers["points_0"]["mark"]["size"]  # scores: visible points
    params = {p["name"]: p for p in spec["params"]}
    assert params["show_abandoned"]["value"] is False
    assert params["zoom"]["bind"] == "scales" and params["zoom"]["views"] == ["line_0", "line_1"]
    # data arrives by messages: no inline rows in the spec
    assert all(layer["data"] in ({"name": "points"}, {"name": "rewinds"}) for layer in layers.values())


def test_a_run_without_metrics_gets_a_placeholder_not_an_empty_chart() -> None:
    spec = build_spec([])
    assert spec["mark"]["type"] == "text"
    assert spec["data"]["values"] == [{"text": "No metrics logged yet"}]


def _points_table(*chunks: list[tuple[int, int, float, str, float]]) -> pa.Table:
    """The store's long form (``step, attempt, time, key, value``), one Arrow chunk per list."""
    schema = pa.schema(
        [
            ("step", pa.int64()),
            ("attempt", pa.int32()),
            ("time", pa.float64()),
            ("key", pa.string()),
            ("value", pa.float64()),
        ]
    )
    tables = [
        pa.Table.from_pylist([dict(zip(schema.names, row, strict=True)) for row in rows], schema) for rows in chunks
    ]
    return pa.concat_tables(tables)


def test_points_go_from_the_stores_arrow_table_to_numpy_as_history_would_show_them() -> None:
    # two chunks whose key dictionaries differ in order; a rewind to step 1 started attempt 1
    table = _points_table(
        [(0, 0, 10.0, "loss", 1.0), (0, 0, 10.0, "lr", 0.1), (1, 0, 11.0, "loss", 0.9), (2, 0, 12.0, "loss", 5.0)],
        [
            (2, 0, 12.5, "loss", 6.0),  # logged again at the same step and attempt: the last value wins
            (2, 1, 13.0, "lr", 0.2),
            (2, 1, 13.0, "loss", 0.8),
            # the machine's samples, by wall time: two at one step are both kept, and one taken during the
            # abandoned attempt is no abandoned value (the machine ran then)
            (2, 0, 12.6, "system/cpu_percent", 50.0),
            (2, 0, 12.7, "system/cpu_percent", 70.0),
            (3, 1, 14.0, "loss", float("nan")),  # a chart cannot place it
        ],
    )
    points = points_from_table(table, [{"attempt": 1, "to_step": 1}])
    frame = points.to_frame()
    assert points.present_keys() == ["loss", "lr", "system/cpu_percent"]  # first-logged order
    system = frame[frame["key"] == "system/cpu_percent"]
    assert system["value"].tolist() == [50.0, 70.0] and not system["abandoned"].any()
    loss = frame[frame["key"] == "loss"]
    assert loss[["step", "attempt", "value"]].values.tolist() == [[0, 0, 1.0], [1, 0, 0.9], [2, 0, 6.0], [2, 1, 0.8]]
    assert loss["abandoned"].tolist() == [False, False, True, False]  # step 2 of attempt 0 was redone
    assert frame[frame["key"] == "lr"]["value"].tolist() == [0.1, 0.2]
    only = points_from_table(table, [], keys=["lr", "nope"])
    assert only.present_keys() == ["lr"] and len(only) == 2
    # the same rows reach the browser as from history()'s frame
    rows, counts = chart_rows(points, budget=100)
    assert counts == {"loss": 3, "loss\x00abandoned 0": 1, "lr": 2, "system/cpu_percent": 2}
    encoded = encode_rows(rows)
    assert encoded["keys"] == ["loss", "lr", "system/cpu_percent"]
    # the wall-time panels' x, in ms: sent only when a system panel is drawn
    assert encoded["time"][-2:] == [12600.0, 12700.0]
    assert "time" not in encode_rows(chart_rows(points_from_table(table, [], keys=["loss"]), budget=100)[0])


def test_a_poll_that_appended_sends_only_the_new_points_and_a_reordered_one_finds_them_all() -> None:
    old = points_from_table(_points_table([(s, 0, float(s), "loss", 1.0 / (s + 1)) for s in range(5)]), [])
    grown = points_from_table(
        _points_table(
            [(s, 0, float(s), "loss", 1.0 / (s + 1)) for s in range(5)],
            [(5, 0, 5.0, "acc", 0.5), (5, 0, 5.0, "loss", 0.1)],
        ),
        [],
    )
    fresh = new_points(grown, old)
    assert fresh.to_frame()[["key", "step"]].values.tolist() == [["acc", 5], ["loss", 5]]
    # re-read in another order (a compaction rewrote the chunks): still only what is new
    shuffled = points_from_table(
        _points_table([(5, 0, 5.0, "loss", 0.1)], [(s, 0, float(s), "loss", 1.0 / (s + 1)) for s in range(4, -1, -1)]),
        [],
    )
    assert new_points(shuffled, old).to_frame()["step"].tolist() == [5]
    assert len(new_points(old, old)) == 0
