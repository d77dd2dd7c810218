"""Live charts at the kernel's end of the wire: nothing is sent before the
browser says ready, then every point arrives exactly once, long series stay
bounded, a zoom gets denser points, and re-running a cell reuses the chart.

Messages are read where ipywidgets hands them to the comm, and the browser's
messages go in through ipywidgets' own dispatch; the runs are real
(``lh.init`` writing a local store).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import launchhelm as lh
from launchhelm.widgets import RunChart


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[lh.Run]:
    run = lh.init("live", store=str(tmp_path / "store"), flush_interval=3600)
    yield run
    run.finish()


def _log(run: lh.Run, steps: range) -> None:
    for step in steps:
        run.log({"loss": 1.0 / (step + 1), "lr": 0.1}, step=step)
    run.flush()


class Wire:
    """What the kernel sent to the browser over a widget's comm, and a way to answer."""

    def __init__(self, widget: Any) -> None:
        self.widget = widget
        self.messages: list[dict[str, Any]] = []
        #: the ``live`` answers to each ``ready`` (hide the saved picture), kept apart from the data
        self.live: list[dict[str, Any]] = []
        publish = widget.comm.publish_msg

        def record(msg_type: str, data: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(data, dict) and data.get("method") == "custom":
                content = data["content"]
                (self.live if content.get("type") == "live" else self.messages).append(content)
            return publish(msg_type, data, *args, **kwargs)

        widget.comm.publish_msg = record

    def from_browser(self, content: dict[str, Any]) -> None:
        self.widget._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})

    def steps(self, key: str = "loss") -> list[int]:
        """Every step of ``key`` the browser holds, after replaying the messages as the front end does."""
        held: list[int] = []
        for message in self.messages:
            if message["type"] == "snapshot":
                held = []
            if message["type"] in ("snapshot", "insert"):
                points = message["points"]
                held += [s for k, s in zip(points["k"], points["step"], strict=True) if points["keys"][k] == key]
        return held


def test_nothing_is_sent_before_ready_and_the_ready_snapshot_holds_every_point(live_run: lh.Run) -> None:
    _log(live_run, range(0, 20))
    chart = RunChart(live_run.id, store=live_run.store, interval=3600)
    wire = Wire(chart)
    _log(live_run, range(20, 40))
    chart.refresh()  # what the poller does
    assert wire.messages == []  # a front end still loading its ESM would lose them
    assert not chart.polling

    wire.from_browser({"type": "ready"})
    assert [m["type"] for m in wire.messages] == ["snapshot"]
    assert wire.steps() == list(range(40))
    assert wire.live == [{"type": "live", "static": [chart.model_id]}]  # the saved picture of it hides
    assert chart.polling
    chart.close()
    assert not chart.polling


def test_new_points_stream_as_inserts_none_lost_none_twice(live_run: lh.Run) -> None:
    _log(live_run, range(0, 10))
    chart = RunChart(live_run.id, store=live_run.store, interval=3600)
    wire = Wire(chart)
    wire.from_browser({"type": "ready"})
    for start in range(10, 110, 20):
        _log(live_run, range(start, start + 20))
        chart.refresh()
    chart.refresh()  # nothing new: nothing sent
    assert [m["type"] for m in wire.messages] == ["snapshot"] + ["insert"] * 5
    assert wire.steps() == list(range(110))
    assert wire.steps("lr") == list(range(110))
    assert chart.caption.startswith("running · furthest step 109")
    chart.close()


def test_a_long_running_series_is_resampled_not_grown_past_max_points(live_run: lh.Run) -> None:
    _log(live_run, range(0, 50))
    chart = RunChart(live_run.id, store=live_run.store, interval=3600, max_points=40)
    wire = Wire(chart)
    wire.from_browser({"type": "ready"})
    for start in range(50, 1000, 50):
        _log(live_run, range(start, start + 50))
        chart.refresh()
        assert len(wire.steps()) <= 40
    assert "snapshot" in [m["type"] for m in wire.messages[1:]]  # resampled on the way
    held = wire.steps()
    assert held[0] == 0 and held[-1] == 999  # first and last kept
    chart.close()


def test_a_zoom_from_the_browser_gets_the_range_at_full_detail(live_run: lh.Run) -> None:
    _log(live_run, range(0, 5000))
    live_run.finish()
    chart = RunChart(live_run.id, store=live_run.store, interval=3600, max_points=100)
    wire = Wire(chart)
    wire.from_browser({"type": "ready"})
    assert len(wire.steps()) <= 100
    wire.from_browser({"type": "zoom", "domain": [2000, 2060]})
    zoomed = wire.steps()
    assert set(range(2000, 2061)) <= set(zoomed) and len(zoomed) <= 100
    wire.from_browser({"type": "zoom", "domain": None})  # double-click: back to the whole run
    assert len([s for s in wire.steps() if 2000 <= s <= 2060]) < 61
    chart.close()


def test_rerunning_a_cell_reuses_the_chart_and_its_single_poller(live_run: lh.Run) -> None:
    first = RunChart(live_run.id, store=live_run.store, interval=3600)
    again = RunChart(lh.Api(live_run.store).run(live_run.id))  # the same run, through a handle
    assert again is first
    assert RunChart(live_run, keys=["loss"]) is not first  # other keys: another chart
    Wire(first).from_browser({"type": "ready"})
    Wire(first).from_browser({"type": "ready"})  # a second view of the same widget
    assert first.polling
    first.close()
    assert not first.polling
    assert RunChart(live_run.id, store=live_run.store) is not first  # a closed one is not reused


def test_a_chart_collected_while_another_is_made_closes_without_deadlocking(live_run: lh.Run) -> None:
    # the garbage collector may run a dropped chart's __del__ (which closes it) inside the allocation that
    # makes another, in the same thread and under the registry's lock: that close must not wait for it
    import threading

    from launchhelm.widgets import _base

    dropped = RunChart(live_run.id, store=live_run.store, interval=3600)
    closed = threading.Event()

    def collected_while_making() -> None:
        with _base._registry_lock:  # where __new__ allocates
            dropped.close()  # what its __del__ does
        closed.set()

    thread = threading.Thread(target=collected_while_making, daemon=True)
    thread.start()
    assert closed.wait(10), "closing a chart under the registry's lock deadlocked its thread"
    assert RunChart(live_run.id, store=live_run.store) is not dropped  # it was forgotten: not reused


def test_a_new_metric_adds_a_panel_and_waits_for_the_browser_to_embed_it(live_run: lh.Run) -> None:
    chart = RunChart(live_run.id, store=live_run.store, interval=3600)
    assert chart.spec["mark"]["type"] == "text"  # "No metrics logged yet"
    wire = Wire(chart)
    wire.from_browser({"type": "ready"})
    _log(live_run, range(0, 5))
    chart.refresh()
    assert [p["title"] for p in chart.spec["vconcat"]] == ["loss", "lr"]
    _log(live_run, range(5, 10))
    chart.refresh()
    # only the placeholder's snapshot went out: the new chart is not embedded yet
    assert [m["type"] for m in wire.messages] == ["snapshot"] and wire.steps() == []
    wire.messages.clear()
    wire.from_browser({"type": "ready"})  # the front end embedded the new spec
    assert wire.steps() == list(range(10))
    chart.close()
