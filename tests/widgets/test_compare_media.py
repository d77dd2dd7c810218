"""CompareChart's media section: the same image key at the same step, each run's picture side by side.

If these fail, two runs' validation pictures at a step show another step's,
another attempt's, or another run's picture, a run with none there shows an
empty box instead of saying so, a caption from a shared store runs as HTML,
or opening the comparison reads every run's pictures instead of its index
once and the thumbnails in view. The browser test is in
test_browser_widgets.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from http_proxy import RequestCounter
from lhtest import BUCKET
from media_runs import HOSTILE_CAPTION, REWIND_TO, Wire, media_run, pixels

import launchhelm as lh
from launchhelm._api import RunHandle
from launchhelm._exceptions import InvalidArgumentError
from launchhelm.media._read import decode_image
from launchhelm.storage import open_store
from launchhelm.widgets import CompareChart

#: Run "a" logs steps 1-8, run "b" steps 1-6; both rewind to step 5 and redo what follows.
A_END, B_END = 8, 6


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    store = str(tmp_path_factory.mktemp("compare-media") / "store")
    return store, media_run(store, "cmpmedia", A_END), media_run(store, "cmpmedia", B_END)


def _fetch(what: str, step: int, keys: list[str], **more: Any) -> dict[str, Any]:
    return {"type": "fetch", "what": what, "step": step, "keys": keys, "attempt": -1, "index": -1, **more}


def _captions(run: dict[str, Any]) -> list[str]:
    return [p["caption"] for p in run["pictures"]]


def test_the_section_lists_image_keys_over_the_union_of_the_runs_steps(two_runs: tuple[str, str, str]) -> None:
    store, a, b = two_runs
    chart = CompareChart("cmpmedia", runs=[a, b], store=store, interval=3600)
    try:
        keys = {k["key"]: k for k in chart.media["keys"]}
        assert list(keys) == ["samples", "val/grid"]  # images only: the table and the histogram are left out
        assert keys["samples"]["steps"] == list(range(1, A_END + 1))
        assert keys["samples"]["runs"] == [a, b]
        assert chart.shown_media() == ("samples", A_END)  # the first key at its newest step
    finally:
        chart.close()


def test_each_runs_pictures_at_one_step_side_by_side_in_the_charts_order(two_runs: tuple[str, str, str]) -> None:
    store, a, b = two_runs
    chart = CompareChart("cmpmedia", runs=[b, a], store=store, interval=3600)
    wire = Wire(chart)
    try:
        labels = [r["label"] for r in chart.state["runs"]]
        ((message, buffers),) = wire.say(_fetch("thumbnails", 3, ["samples"]))
        assert message["type"] == "pictures" and message["key"] == "samples" and message["step"] == 3
        assert [r["id"] for r in message["runs"]] == [b, a]  # the legend's order and labels
        assert [r["label"] for r in message["runs"]] == labels
        for run in message["runs"]:
            assert _captions(run) == ["step 3 attempt 0 #0", "step 3 attempt 0 #1"]
            assert run["empty"] == "" and not run["redone"]
        assert len(buffers) == 4
        assert np.array_equal(decode_image(buffers[message["runs"][1]["pictures"][1]["buffer"]]), pixels(3, 0, 255))

        # step 7: run a redid it after its rewind (its newest attempt shows, noted); run b never got there
        ((message, buffers),) = wire.say(_fetch("thumbnails", 7, ["samples"]))
        shown_b, shown_a = message["runs"]
        assert shown_a["redone"] and _captions(shown_a) == ["step 7 attempt 1 #0", "step 7 attempt 1 #1"]
        assert [p["abandoned"] for p in shown_a["pictures"]] == [False, False]
        assert np.array_equal(decode_image(buffers[shown_a["pictures"][0]["buffer"]]), pixels(7, 1, 0))
        assert shown_b["pictures"] == [] and shown_b["empty"] == "nothing logged at step 7"
        assert len(buffers) == 2

        # a click: the full image of one run's picture
        fetch = _fetch("image", REWIND_TO + 1, ["val/grid"], run=b)
        fetch["attempt"], fetch["index"] = 1, 0
        ((full, data),) = wire.say(fetch)
        assert full["full"] and [r["id"] for r in full["runs"]] == [b]
        assert np.array_equal(decode_image(data[0]), pixels(REWIND_TO + 1, 1, 128))
    finally:
        chart.close()


def test_bad_choices_say_what_to_give(two_runs: tuple[str, str, str]) -> None:
    store, a, b = two_runs
    chart = CompareChart("cmpmedia", runs=[a, b], store=store, interval=3600)
    wire = Wire(chart)
    try:
        with pytest.raises(InvalidArgumentError, match=r"media_key='loss'.*use one of \['samples', 'val/grid'\]"):
            chart.media_key = "loss"
        with pytest.raises(InvalidArgumentError, match="media_step=-5"):
            chart.media_step = -5
        assert chart.shown_media() == ("samples", A_END)
        # a fetch for a picture that is not there is an error in the widget, never a dead comm
        fetch = _fetch("image", 3, ["samples"], run="nope")
        assert wire.say(fetch) == []
        assert "no image 'samples' of run 'nope' at step 3" in chart.error
    finally:
        chart.close()


def test_the_saved_notebooks_copy_shows_the_section_with_captions_as_text(two_runs: tuple[str, str, str]) -> None:
    store, a, b = two_runs
    chart = CompareChart("cmpmedia", runs=[a, b], store=store, interval=3600)
    try:
        chart.media_key, chart.media_step = "val/grid", 2
        page = chart.static_mimebundle()["text/html"]
        section = page[page.index("launchhelm-static-compare-media") :]
        assert "val/grid at step 2" in section and section.count("data:image/png;base64,") == 2
        assert HOSTILE_CAPTION not in section and "&lt;img src=x onerror=" in section
        chart.media_step = 7
        section = chart.media_html()
        assert "nothing logged at step 7" in section and "an earlier attempt redone" in section
    finally:
        chart.close()


def test_runs_without_images_have_no_section(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = lh.init("plain", store=store)
    run.log({"loss": 1.0}, step=1)
    run.finish()
    chart = CompareChart("plain", store=store, interval=3600)
    try:
        assert chart.media == {"keys": []} and chart.shown_media() == ("", -1)
        assert (
            chart.media_html() == "" and "launchhelm-static-compare-media" not in chart.static_mimebundle()["text/html"]
        )
    finally:
        chart.close()


def test_a_running_runs_new_pictures_join_at_a_later_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launchhelm.widgets import _compare

    monkeypatch.setattr(_compare, "MEDIA_INTERVAL", 3600.0)
    store = str(tmp_path / "store")
    run = lh.init("live", store=store, flush_interval=3600)
    try:
        run.log({"loss": 1.0, "samples": lh.Image(pixels(1, 0))}, step=1)
        run.flush()
        chart = CompareChart("live", store=store, interval=3600)
        try:
            assert chart.media["keys"][0]["steps"] == [1]
            run.log({"loss": 0.5, "samples": lh.Image(pixels(2, 0))}, step=2)
            run.flush()
            chart.refresh()  # within MEDIA_INTERVAL of the last read: its index is not read again yet
            assert chart.media["keys"][0]["steps"] == [1]
            monkeypatch.setattr(_compare, "MEDIA_INTERVAL", 0.0)
            chart.refresh()
            assert chart.media["keys"][0]["steps"] == [1, 2] and chart.shown_media() == ("samples", 2)
        finally:
            chart.close()
    finally:
        run.finish()


@pytest.fixture
def on_s3(two_runs: tuple[str, str, str], moto_endpoint: str) -> Iterator[tuple[str, str, str]]:
    """The two runs copied to moto S3 under a fresh prefix."""
    store, a, b = two_runs
    prefix = f"cmpmedia-{os.urandom(3).hex()}"
    direct = open_store(f"s3://{BUCKET}/{prefix}")
    for path in Path(store).rglob("*"):
        if path.is_file():
            direct.create(path.relative_to(store).as_posix(), path.read_bytes())
    yield prefix, a, b


def test_reads_are_bounded_the_index_once_per_run_thumbnails_in_view_and_kept(
    on_s3: tuple[str, str, str], moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix, a, b = on_s3
    indexes: list[str] = []
    media = RunHandle.media

    def counted(self: RunHandle, *args: Any, **kwargs: Any) -> Any:
        indexes.append(self.id)
        return media(self, *args, **kwargs)

    monkeypatch.setattr(RunHandle, "media", counted)
    proxy = RequestCounter(int(moto_endpoint.rsplit(":", 1)[1]))
    store = open_store(f"s3://{BUCKET}/{prefix}", {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
    try:
        chart = CompareChart("cmpmedia", runs=[a, b], store=lh.Api(store), interval=3600)
        wire = Wire(chart)
        try:
            chart.refresh()
            chart.refresh()
            assert sorted(indexes) == sorted([a, b])  # settled runs: each index read once
            # a step in view: its four thumbnails in one round, no more
            proxy.reset()
            ((message, buffers),) = wire.say(_fetch("thumbnails", 4, ["samples"]))
            assert len(buffers) == 4 and proxy.total <= 4, proxy.snapshot()
            # back to it: the kernel kept them
            proxy.reset()
            wire.say(_fetch("thumbnails", 4, ["samples"]))
            assert proxy.total == 0, proxy.snapshot()
            # a step only run a reached: its one thumbnail
            proxy.reset()
            ((message, buffers),) = wire.say(_fetch("thumbnails", 8, ["val/grid"]))
            assert [len(r["pictures"]) for r in message["runs"]] == [1, 0]
            assert len(buffers) == 1 and proxy.total <= 1, proxy.snapshot()
        finally:
            chart.close()
    finally:
        proxy.close()
