"""Comparing runs: what CompareChart draws, on every store.

If these fail, runs put side by side show another run's values, the
abandoned attempt instead of the run's line, a rewind in the wrong place,
colours that change when another run is ticked, smoothing unlike
TensorBoard's, or a config diff that misses what differs.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from rewound_runs import BACK_TO, END, REACHED, rewound_run

import launchhelm as lh
from launchhelm.widgets import CompareChart
from launchhelm.widgets._compare_spec import PALETTE, build_compare_spec, compare_points, ema, run_colors, run_labels
from launchhelm.widgets._downsample import minmax_indices

pytest.importorskip("torch")


@pytest.mark.slow
def test_two_rewound_runs_compare_alike_on_every_store(store_url: str) -> None:
    a = rewound_run(store_url, "cmp", "alpha", 0.1)
    b = rewound_run(store_url, "cmp", "beta", 0.01, close=False, tunables={"clip": 0.5})
    chart = CompareChart("cmp", runs=[a, b], store=store_url)
    try:
        assert chart.runs == [a, b]
        assert chart.shown_keys() == ["train/loss", "acc"]
        points = chart.points()
        # one line per run and key: every step once, the redone steps with their new values
        for run_id in (a, b):
            mine = points[(points["run"] == run_id) & (points["key"] == "train/loss")]
            assert mine["step"].tolist() == list(range(1, END + 1))
            assert (mine["value"] < 5).all()  # never the abandoned attempt's values (10 higher)
            last = lh.Api(store_url).run(run_id).history(keys=["train/loss"], duplicates="last")
            np.testing.assert_allclose(mine["value"].to_numpy(), last["train/loss"].to_numpy())
        assert set(points.loc[points["run"] == a, "label"]) == {"alpha"}
        # the same rows as from Api.history, the one parallel read of many runs
        direct = compare_points(lh.Api(store_url).history("cmp", runs=[a, b]), ["train/loss", "acc"])
        np.testing.assert_allclose(direct["value"].to_numpy(), points["value"].to_numpy())
        # each run's rewind marked, in its colour, with its sentence
        rewinds = chart.rewinds()
        assert [(r["run_id"], r["to_step"], r["reached"]) for r in rewinds] == [(a, BACK_TO, REACHED)] * 1 + [
            (b, BACK_TO, REACHED)
        ]
        assert rewinds[0]["text"] == f"Resumed from step {BACK_TO} after reaching {REACHED}"
        assert [r["label"] for r in rewinds] == ["alpha", "beta"]
        # the config diff: lr and the tunable differ; model does not
        assert chart.diff() == [
            {"key": "config.lr", "values": [0.1, 0.01]},
            {"key": "tunable.clip", "values": [1.0, 0.5]},
        ]
        assert [r["status"] for r in chart.state["runs"]] == ["closed", "resumable"]
        spec = chart.spec
        assert [p["title"] for p in spec["concat"]] == ["train/loss", "acc"]
        color = spec["concat"][0]["layer"][0]["encoding"]["color"]
        assert color["scale"]["domain"] == ["alpha", "beta"]
        assert color["scale"]["range"] == [run_colors([a, b])[a], run_colors([a, b])[b]]
    finally:
        chart.close()


def test_wall_and_relative_time_place_each_rewind_at_its_new_attempt(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    a = rewound_run(store, "cmp", "alpha", 0.1)
    chart = CompareChart("cmp", runs=[a], store=store, x="time")
    try:
        assert chart.spec["concat"][0]["layer"][0]["encoding"]["x"] == {
            "field": "time",
            "title": "wall time",
            "type": "temporal",
        }
        history = lh.Api(store).run(a).history()
        first_new = history.loc[history["attempt"] == 1, "time"].min().timestamp() * 1000
        (rewind,) = chart.rewinds()
        assert rewind["time"] == pytest.approx(first_new)
        # time since the run's first point: runs started hours apart line up
        chart.x_axis = "relative"
        assert chart.spec["concat"][0]["layer"][0]["encoding"]["x"]["field"] == "elapsed"
        start = history["time"].min().timestamp() * 1000
        points = chart.points()
        assert points["elapsed"].min() == pytest.approx(0.0)
        np.testing.assert_allclose(points["elapsed"], (points["time"] - start) / 1000, atol=1e-5)
        (rewind,) = chart.rewinds()
        assert rewind["elapsed"] == pytest.approx((first_new - start) / 1000, abs=1e-5)
        # the x axis switches from the front end: a new spec on step
        chart.x_axis = "step"
        assert chart.spec["concat"][0]["layer"][0]["encoding"]["x"]["field"] == "step"
        assert chart.spec["concat"][0]["layer"][-1]["encoding"]["x"]["field"] == "to_step"
    finally:
        chart.close()


def test_smoothing_is_tensorboards_debiased_ema_and_keeps_the_raw_values() -> None:
    def tensorboard(values: list[float], weight: float) -> list[float]:
        # TensorBoard's smoothing, as its front end computes it
        last, out = 0.0, []
        for i, v in enumerate(values):
            last = last * weight + (1 - weight) * v
            out.append(last / (1 - weight ** (i + 1)))
        return out

    rng = np.random.default_rng(0)
    y = rng.normal(3.0, 1.0, 10_000)
    for weight in (0.0, 0.3, 0.6, 0.9, 0.99, 0.999):
        np.testing.assert_allclose(ema(y, weight), tensorboard(y.tolist(), weight), rtol=1e-12, atol=1e-12)
    with pytest.raises(lh.InvalidArgumentError, match=r"smoothing=1\.0"):
        ema(y, 1.0)


def test_smoothing_and_downsampling_per_run_keep_each_series_extremes(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ids = []
    for spike_at in (1234, 4321):
        with lh.init("long", store=store, flush_interval=3600) as run:
            for step in range(10_000):
                run.log({"loss": 5.0 if step == spike_at else float(np.sin(step / 100))}, step=step)
        ids.append(run.id)
    chart = CompareChart("long", runs=ids, store=store, max_points=200)
    try:
        points = chart.points()
        for run_id, spike_at in zip(ids, (1234, 4321), strict=True):
            mine = points[points["run"] == run_id]
            assert 100 < len(mine) <= 200  # downsampled as RunChart does, per run
            assert spike_at in mine["step"].tolist()  # the spike survives
        chart.smooth = True  # the toggle: smoothed over the whole series, then downsampled
        smoothed = chart.points()
        assert (smoothed["raw"].max(), smoothed["value"].max() < 5.0) == (5.0, True)
        assert chart.spec["concat"][0]["layer"][0]["name"] == "raw_0"  # the raw values stay, faint
        full = lh.Api(store).history("long", runs=ids[:1])
        expected = ema(full["loss"].to_numpy(), chart.smoothing)
        mine = smoothed[smoothed["run"] == ids[0]]
        np.testing.assert_allclose(mine["value"].to_numpy(), expected[mine["step"].to_numpy()])
        assert minmax_indices(expected, 200).tolist() == mine["step"].tolist()
    finally:
        chart.close()


def test_a_runs_colour_stays_whatever_else_is_compared() -> None:
    ids = [f"run{i:05d}" for i in range(20)]
    alone = {r: run_colors([r])[r] for r in ids}
    together = run_colors(ids)
    assert len(set(together.values())) == 20  # twenty runs, twenty colours
    # a run keeps its colour beside any run that does not hash to the same one
    for a in ids[:5]:
        for b in ids:
            if b != a and alone[b] != alone[a]:
                pair = run_colors([a, b])
                assert (pair[a], pair[b]) == (alone[a], alone[b])
    assert set(alone.values()) <= set(PALETTE[:10])  # the strong colours first
    assert run_labels({"a1": "base", "b2": "base", "c3": "other"}) == {
        "a1": "base (a1)",
        "b2": "base (b2)",
        "c3": "other",
    }


def test_a_live_run_streams_into_the_comparison(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    done = rewound_run(store, "live", "done", 0.1)
    run = lh.init("live", name="training", store=store, flush_interval=3600)
    try:
        for step in range(1, 11):
            run.log({"acc": step / 10}, step=step)
        run.flush()
        chart = CompareChart("live", runs=[done, run.id], store=store, interval=0.2)
        try:
            assert chart.is_active()  # a run is running: poll at full speed
            before = chart.points()
            assert (before["run"] == run.id).sum() == 10
            for step in range(11, 31):
                run.log({"acc": step / 10}, step=step)
            run.flush()
            chart.refresh()
            after = chart.points()
            assert after.loc[after["run"] == run.id, "step"].max() == 30
            assert chart.state["runs"][1]["status"] == "running"
        finally:
            chart.close()
    finally:
        run.finish()


@pytest.mark.slow
def test_the_saved_notebook_shows_the_chart_and_the_diff(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    a = rewound_run(store, "cmp", "alpha", 0.1)
    b = rewound_run(store, "cmp", "beta", 0.01)
    chart = CompareChart("cmp", runs=[a, b], store=store)
    try:
        html = chart.static_mimebundle()["text/html"]
        assert "<svg" in html and "config.lr" in html and "alpha" in html and "beta" in html
        assert "Config diff" in html and "created" in html and "resumable" not in html
    finally:
        chart.close()


def test_bad_arguments_say_what_to_give(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    a = rewound_run(store, "cmp", "alpha", 0.1)
    other = rewound_run(store, "elsewhere", "other", 0.1)
    with pytest.raises(lh.InvalidArgumentError):
        CompareChart("bad/name", store=store)
    with pytest.raises(lh.InvalidTypeError, match="runs="):
        CompareChart("cmp", runs=[1, 2], store=store)  # type: ignore[list-item]
    with pytest.raises(lh.InvalidArgumentError, match="x='epoch'"):
        CompareChart("cmp", runs=[a], store=store, x="epoch")
    with pytest.raises(lh.InvalidArgumentError, match="smoothing=1"):
        CompareChart("cmp", runs=[a], store=store, smoothing=1)
    with pytest.raises(lh.RunNotFoundError, match="belongs to project 'elsewhere'"):
        CompareChart("cmp", runs=[a, other], store=store)
    with pytest.raises(lh.InvalidArgumentError, match="x='epoch'"):
        build_compare_spec(["loss"], [{"id": a, "label": "alpha", "color": "#000"}], x="epoch")
    # every run of the project by default, newest first
    b = rewound_run(store, "cmp", "beta", 0.01)
    time.sleep(0.01)
    chart = CompareChart("cmp", store=store)
    try:
        assert chart.runs == [b, a]
        assert CompareChart("cmp", store=store) is chart  # re-running the cell: the same widget
    finally:
        chart.close()
