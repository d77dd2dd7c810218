"""Logging metrics: what users log comes back from history(), bad input is refused
without losing anything, and a redone step keeps both values."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import torch

import launchhelm as lh
from launchhelm._metrics._points import decode_chunks, encode_chunk, history_frame


def test_logged_points_come_back_as_a_wide_frame(store_url: str) -> None:
    run = lh.init("metrics", store=store_url)
    for step in range(1, 51):
        run.global_step = step
        run.log({"loss": 1.0 / step, "lr": 0.1})
        if step % 10 == 0:
            run.log({"eval/accuracy": step / 100})  # a second call at the same step merges
    run.finish()
    frame = lh.Api(store_url).run(run.id).history()
    assert list(frame.columns) == ["step", "attempt", "time", "abandoned", "loss", "lr", "eval/accuracy"]
    assert not frame["abandoned"].any()
    assert frame["step"].tolist() == list(range(1, 51))
    assert (frame["attempt"] == 0).all()
    assert frame["loss"].tolist() == pytest.approx([1.0 / s for s in range(1, 51)])
    assert frame["eval/accuracy"].dropna().tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert str(frame["time"].dtype) == "datetime64[ns, UTC]"
    assert frame["time"].is_monotonic_increasing
    assert lh.Api(store_url).run(run.id).history(keys=["lr"]).columns.tolist() == [
        "step",
        "attempt",
        "time",
        "abandoned",
        "lr",
    ]


def test_explicit_steps_and_step_validation(store_url: str) -> None:
    run = lh.init("metrics", store=store_url)
    run.log({"x": 1.0}, step=5)
    run.log({"x": 2.0}, step=np.int64(7))
    with pytest.raises(lh.InvalidMetricError, match="negative"):
        run.log({"x": 3.0}, step=-1)
    with pytest.raises(TypeError, match="step"):
        run.log({"x": 3.0}, step="8")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step"):
        run.global_step = 2.5  # type: ignore[assignment]
    run.finish()
    assert lh.Api(store_url).run(run.id).history()["step"].tolist() == [5, 7]
    assert lh.Api(store_url).run(run.id).step == 7


def test_every_kind_of_real_scalar_is_accepted_and_nan_inf_survive(store_url: str) -> None:
    run = lh.init("metrics", store=store_url)
    values = {
        "bool": True,
        "int": 3,
        "big_int": 2**70,
        "float": 0.25,
        "np_float32": np.float32(1.5),
        "np_int64": np.int64(-4),
        "np_0d": np.array(2.5),
        "torch_0d": torch.tensor(0.75),
        "torch_1elem": torch.tensor([6.0], dtype=torch.float64),
        "torch_int": torch.tensor(9),
        "fraction": Fraction(1, 4),
        "nan": float("nan"),
        "inf": float("inf"),
        "ninf": -math.inf,
        "np_nan": np.float64("nan"),
    }
    run.log(values)
    run.finish()
    row = lh.Api(store_url).run(run.id).history().iloc[0]
    assert row["bool"] == 1.0 and row["int"] == 3.0 and row["big_int"] == float(2**70)
    assert row["np_float32"] == 1.5 and row["np_int64"] == -4.0 and row["np_0d"] == 2.5
    assert row["torch_0d"] == 0.75 and row["torch_1elem"] == 6.0 and row["torch_int"] == 9.0
    assert row["fraction"] == 0.25
    assert math.isnan(row["nan"]) and math.isnan(row["np_nan"])
    assert row["inf"] == math.inf and row["ninf"] == -math.inf


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        ("0.5", "str"),
        (None, "NoneType"),
        ([1.0], "list"),
        ({"a": 1}, "dict"),
        (1 + 2j, "complex"),
        (np.array([1.0, 2.0]), "ndarray"),
        (torch.ones(3), "3 elements"),
        (torch.tensor(1 + 1j), "complex"),
        (object(), "object"),
    ],
)
def test_a_non_number_raises_typeerror_naming_key_and_type_and_loses_nothing(
    store_url: str, value: object, type_name: str
) -> None:
    run = lh.init("metrics", store=store_url)
    run.log({"loss": 1.0}, step=1)
    run.flush()
    run.log({"loss": 2.0}, step=2)  # buffered, not yet flushed
    with pytest.raises(TypeError) as info:
        run.log({"ok": 3.0, "weird": value}, step=3)
    assert "'weird'" in str(info.value) and type_name in str(info.value)
    run.log({"loss": 4.0}, step=4)  # the run goes on
    run.finish()
    frame = lh.Api(store_url).run(run.id).history()
    assert frame["step"].tolist() == [1, 2, 4]
    assert frame["loss"].tolist() == [1.0, 2.0, 4.0]
    assert "ok" not in frame.columns and "weird" not in frame.columns


@pytest.mark.parametrize(
    ("key", "error", "needle"),
    [
        ("", lh.InvalidMetricError, "empty"),
        ("eval//acc", lh.InvalidMetricError, "segment"),
        ("../up", lh.InvalidMetricError, "segment"),
        ("a/..", lh.InvalidMetricError, "segment"),
        ("/lead", lh.InvalidMetricError, "segment"),
        ("tab\there", lh.InvalidMetricError, "control character"),
        ("x" * 300, lh.InvalidMetricError, "limit"),
        (42, TypeError, "strings"),
    ],
)
def test_malformed_keys_are_refused_and_nothing_is_lost(store_url: str, key: object, error: type, needle: str) -> None:
    run = lh.init("metrics", store=store_url)
    run.log({"loss": 1.0}, step=1)
    with pytest.raises(error, match=needle):
        run.log({"loss": 2.0, key: 1.0}, step=2)  # type: ignore[dict-item]
    run.finish()
    frame = lh.Api(store_url).run(run.id).history()
    assert frame["loss"].tolist() == [1.0]
    assert lh.Api(store_url).run(run.id).history().columns.tolist() == ["step", "attempt", "time", "abandoned", "loss"]


def test_namespaced_keys_are_fine(store_url: str) -> None:
    run = lh.init("metrics", store=store_url)
    run.log({"eval/accuracy": 0.9, "train/loss/smoothed": 0.1, "weird name (ok)": 1.0})
    run.finish()
    assert lh.Api(store_url).run(run.id).history().columns.tolist()[4:] == [
        "eval/accuracy",
        "train/loss/smoothed",
        "weird name (ok)",
    ]


def test_log_takes_a_mapping() -> None:
    run = lh.init("metrics", store="memory://lh-mapping")
    with pytest.raises(TypeError, match="mapping"):
        run.log([("loss", 1.0)])  # type: ignore[arg-type]
    run.finish()


def _table(rows: list[tuple[int, int, float, dict[str, float]]]) -> object:
    return decode_chunks([encode_chunk(rows[:2]), encode_chunk(rows[2:])])


def test_a_redone_step_keeps_both_attempts_unless_duplicates_last() -> None:
    # attempt 0 reached step 3; a rewind to step 1 redid steps 2-3 as attempt 1
    rows = [
        (1, 0, 10.0, {"loss": 1.0, "acc": 0.1}),
        (2, 0, 11.0, {"loss": 2.0, "acc": 0.2}),
        (3, 0, 12.0, {"loss": 3.0, "acc": 0.3}),
        (2, 1, 20.0, {"loss": 2.5}),
        (3, 1, 21.0, {"loss": 3.5, "acc": 0.35}),
        (3, 1, 22.0, {"loss": 3.6}),  # logged twice in one attempt: the later value wins
    ]
    table = _table(rows)
    every = history_frame(table)  # type: ignore[arg-type]
    assert list(zip(every["step"], every["attempt"], strict=True)) == [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1)]
    assert every["loss"].tolist() == [1.0, 2.0, 2.5, 3.0, 3.6]
    assert every.loc[2, "acc"] != every.loc[2, "acc"]  # attempt 1 logged no acc at step 2 (NaN)
    assert every["time"].iloc[-1] == pd.Timestamp(22.0, unit="s", tz="UTC")
    last = history_frame(table, duplicates="last")  # type: ignore[arg-type]
    assert last["step"].tolist() == [1, 2, 3]
    assert last["attempt"].tolist() == [0, 1, 1]
    assert last["loss"].tolist() == [1.0, 2.5, 3.6]
    # a key the newest attempt did not log at a step keeps the older attempt's value
    assert last["acc"].tolist() == [0.1, 0.2, 0.35]
    only = history_frame(table, keys=["acc"], duplicates="last")  # type: ignore[arg-type]
    assert only.columns.tolist() == ["step", "attempt", "time", "acc"]
    with pytest.raises(ValueError, match="duplicates"):
        history_frame(table, duplicates="first")  # type: ignore[arg-type]


def test_history_of_a_run_with_no_points_is_an_empty_frame(store_url: str) -> None:
    run = lh.init("metrics", store=store_url)
    run.finish()
    frame = lh.Api(store_url).run(run.id).history()
    assert frame.empty and frame.columns.tolist() == ["step", "attempt", "time", "abandoned"]


def test_duplicates_argument_is_checked_on_the_handle(store_url: str) -> None:
    run = lh.init("metrics", store=store_url)
    run.finish()
    with pytest.raises(ValueError, match="duplicates='newest'"):
        lh.Api(store_url).run(run.id).history(duplicates="newest")


def test_points_from_two_sessions_read_in_order(store_url: str) -> None:
    run = lh.init("metrics", store=store_url)
    for s in range(3):
        run.log({"x": float(s)}, step=s)
    run.finish(close_run=False)
    again = lh.init("metrics", resume=run.id, store=store_url)
    assert again.global_step == 2
    for s in range(3, 6):
        again.log({"x": float(s)}, step=s)
    again.finish()
    frame = lh.Api(store_url).run(run.id).history()
    assert frame["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def _pivot_by_hand(rows: list[tuple[int, int, float, dict[str, float]]], duplicates: str) -> dict[object, object]:
    """The history's definition, one point at a time: the newest attempt wins a cell, then the latest arrival."""
    cells: dict[object, dict[str, tuple[int, float]]] = {}
    times: dict[object, float] = {}
    attempts: dict[object, int] = {}
    for step, attempt, t, values in rows:
        row = step if duplicates == "last" else (step, attempt)
        times[row] = max(times.get(row, -math.inf), t)
        attempts[row] = max(attempts.get(row, -1), attempt)
        for key, value in values.items():
            held = cells.setdefault(row, {}).get(key)
            if held is None or attempt >= held[0]:
                cells[row][key] = (attempt, value)
    return {row: (attempts[row], times[row], {k: v for k, (_, v) in cells[row].items()}) for row in sorted(times)}


@pytest.mark.parametrize("duplicates", ["all", "last"])
@pytest.mark.parametrize("batch", [1, 3, 1 << 20])
def test_the_pivot_agrees_with_its_definition_however_the_points_are_batched(
    duplicates: str, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launchhelm._metrics import _points

    monkeypatch.setattr(_points, "PIVOT_BATCH", batch)  # cells won across batches, not only within one
    rng = np.random.default_rng(7 + batch)
    keys = ["loss", "acc", "lr", "z"]
    rows = [
        (
            int(rng.integers(0, 12)),
            int(rng.integers(0, 3)),
            float(rng.integers(0, 50)),
            {k: float(rng.integers(0, 1000)) for k in keys if rng.random() < 0.6} or {"loss": -1.0},
        )
        for _ in range(300)
    ]
    table = decode_chunks([encode_chunk(rows[i : i + 37]) for i in range(0, len(rows), 37)])
    _agrees(history_frame(table, duplicates=duplicates), rows, duplicates)  # type: ignore[arg-type]
    # a subset of keys: rows only where one of them was logged, their columns in the order asked
    wanted = ["z", "acc"]
    some = [(s, a, t, {k: v for k, v in values.items() if k in wanted}) for s, a, t, values in rows]
    some = [row for row in some if row[3]]
    subset = history_frame(table, keys=wanted, duplicates=duplicates)  # type: ignore[arg-type]
    assert subset.columns.tolist() == ["step", "attempt", "time", *wanted]
    _agrees(subset[["step", "attempt", "time", *dict.fromkeys(k for *_, v in some for k in v)]], some, duplicates)


def _agrees(frame: pd.DataFrame, rows: list[tuple[int, int, float, dict[str, float]]], duplicates: str) -> None:
    first_logged = list(dict.fromkeys(k for *_, values in rows for k in values))
    assert frame.columns.tolist() == ["step", "attempt", "time", *first_logged]
    expected = _pivot_by_hand(rows, duplicates)
    assert len(frame) == len(expected)
    for (row, (attempt, t, cells)), got in zip(expected.items(), frame.itertuples(index=False), strict=True):
        step = row if duplicates == "last" else row[0]  # type: ignore[index]
        assert (got.step, got.attempt, got.time) == (step, attempt, pd.Timestamp(t, unit="s", tz="UTC"))
        for key in first_logged:
            value = getattr(got, key)
            assert (value == cells[key]) if key in cells else math.isnan(value), (row, key)


@pytest.mark.slow
def test_the_pivot_of_a_long_run_needs_little_more_than_the_frame_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    import tracemalloc

    import pyarrow as pa

    from launchhelm._metrics import _points
    from launchhelm._metrics._segments import points_schema

    monkeypatch.setattr(_points, "PIVOT_BATCH", 1 << 16)
    steps, keys = 400_000, ["loss", "lr", "grad_norm", "acc", "tput"]
    step = np.repeat(np.arange(steps, dtype=np.int64), len(keys))
    table = pa.Table.from_arrays(
        [
            pa.array(step),
            pa.array(np.zeros(len(step), dtype=np.int32)),
            pa.array(step.astype(np.float64)),
            pa.array(keys * steps, pa.string()),
            pa.array(-step.astype(np.float64)),
        ],
        schema=points_schema(),
    )
    del step
    tracemalloc.start()  # numpy's allocations are traced; the Arrow table above is not counted
    try:
        frame = history_frame(table)  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(frame) == steps and (frame["tput"].to_numpy() == -np.arange(steps)).all()
    size = int(frame.memory_usage(index=False).sum())
    assert peak < 2.5 * size, f"the pivot peaked at {peak / size:.1f}x the frame's {size / 2**20:.0f} MiB"
