"""Images, tables and histograms logged beside numbers: what a user reads back is exactly what was logged.

If this fails, `RunHandle.media()` returns other pixels or cells than the
script logged, a bad input is stored half (or not refused at `log()`), or a
long run's media index costs more requests the longer the run.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from lhtest import make_store_url

import launchhelm as lh
from launchhelm.media._handoff import HANDOFF_BASE
from launchhelm.media._png import decode_png, encode_png
from launchhelm.storage import open_store
from launchhelm.storage._keys import media_index_prefix

RNG = np.random.default_rng(0)


def _image(h: int = 40, w: int = 30, c: int = 3) -> np.ndarray:
    return RNG.integers(0, 256, (h, w, c), dtype=np.uint8)


def test_images_read_back_pixel_exact_in_every_layout(tmp_path: Path) -> None:
    import PIL.Image
    import torch

    store = str(tmp_path / "store")
    rgb, rgba, grey = _image(), _image(c=4), _image(c=1)
    floats = RNG.random((20, 10, 3)).astype(np.float32)
    chw = torch.from_numpy(_image(12, 9).transpose(2, 0, 1).copy())
    batch = torch.from_numpy(np.stack([_image(8, 6) for _ in range(10)]).transpose(0, 3, 1, 2).copy())
    path = tmp_path / "pic.png"
    PIL.Image.fromarray(rgb).save(path)
    run = lh.init("media", store=store)
    run.log(
        {
            "loss": 0.5,
            "rgb": lh.Image(rgb, caption="seed 0"),
            "list": [lh.Image(rgba), lh.Image(grey[:, :, 0]), lh.Image(floats)],
            "torch": [lh.Image(chw), lh.Image(batch)],
            "pil": lh.Image(PIL.Image.fromarray(rgba)),
            "file": lh.Image(str(path)),
        },
        step=3,
    )
    rgb[:] = 0  # log() copied the pixels: changing the array after it changes nothing stored
    run.finish()
    handle = lh.Api(store).run(run.id)
    items = {(i.key, i.index): i for i in handle.media()}
    assert set(items) == {("rgb", 0), ("list", 0), ("list", 1), ("list", 2), ("torch", 0), ("torch", 1)} | {
        ("pil", 0),
        ("file", 0),
    }
    first = items[("rgb", 0)]
    assert (first.step, first.attempt, first.abandoned, first.kind, first.caption) == (3, 0, False, "image", "seed 0")
    assert (first.height, first.width) == (40, 30)
    np.testing.assert_array_equal(first.load(), np.array(PIL.Image.open(path)))
    np.testing.assert_array_equal(items[("list", 0)].load(), rgba)
    np.testing.assert_array_equal(items[("list", 1)].load(), grey)
    np.testing.assert_array_equal(items[("list", 2)].load(), np.rint(floats * 255).astype(np.uint8))
    np.testing.assert_array_equal(items[("torch", 0)].load(), chw.numpy().transpose(1, 2, 0))
    grid = items[("torch", 1)].load()
    assert grid.shape == (2 * (8 + 2) + 2, 8 * (6 + 2) + 2, 3)  # torchvision's make_grid: 8 across, 2 px padding
    np.testing.assert_array_equal(grid[2:10, 2:8], batch[0].numpy().transpose(1, 2, 0))
    np.testing.assert_array_equal(grid[12:20, 2:8], batch[8].numpy().transpose(1, 2, 0))
    np.testing.assert_array_equal(items[("pil", 0)].load(), rgba)
    np.testing.assert_array_equal(items[("file", 0)].load(), np.array(PIL.Image.open(path)))
    assert handle.history()["loss"].tolist() == [0.5]


def test_a_big_image_has_a_thumbnail_and_jpeg_is_smaller(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    smooth = np.tile(np.linspace(0, 240, 1000, dtype=np.uint8)[None, :, None], (600, 1, 3))
    smooth += RNG.integers(0, 8, smooth.shape, dtype=np.uint8)  # a photo's noise: PNG keeps it, JPEG not
    run = lh.init("media", store=store)
    run.log({"png": lh.Image(smooth), "jpeg": lh.Image(smooth, format="jpeg", quality=80)})
    run.finish()
    items = {i.key: i for i in lh.Api(store).run(run.id).media()}
    assert items["png"].load_thumbnail().shape == (154, 256, 3)
    np.testing.assert_array_equal(items["png"].load(), smooth)
    jpeg = items["jpeg"].load()
    assert jpeg.shape == smooth.shape and np.abs(jpeg.astype(int) - smooth).mean() < 6
    assert items["jpeg"].size < items["png"].size


def test_png_encoder_gives_the_same_bytes_for_the_same_pixels_and_pillow_reads_them() -> None:
    import PIL.Image

    for channels in (1, 2, 3, 4):
        pixels = _image(17, 23, channels)
        data = encode_png(pixels)
        assert encode_png(pixels.copy()) == data
        with PIL.Image.open(io.BytesIO(data)) as image:
            read = np.array(image)
        np.testing.assert_array_equal(read.reshape(pixels.shape), pixels)
        decoded = decode_png(data)
        assert decoded is not None
        np.testing.assert_array_equal(decoded, pixels)


def test_decoder_undoes_every_png_filter_pillow_writes() -> None:
    import PIL.Image

    pixels = _image(9, 11, 3)
    pixels[:, :5] = 7  # flat parts make Pillow pick several filters
    out = io.BytesIO()
    PIL.Image.fromarray(pixels).save(out, format="PNG", optimize=True)
    decoded = decode_png(out.getvalue())
    assert decoded is not None
    np.testing.assert_array_equal(decoded, pixels)


def test_tables_and_histograms_read_back_cell_exact(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    pic = _image(5, 4)
    rows = [
        ["a <script>alert(1)</script>", 1, 0.1, True, lh.Image(pic, caption="x")],
        ["b", None, math.inf, False, None],
        ["c", 3, float("nan"), None, lh.Image(pic)],
    ]
    frame = pd.DataFrame({"prompt": ["p1", "p2"], "reward": [0.25, -1.5], "n": [1, 2]})
    run = lh.init("media", store=store)
    run.log({"t": lh.Table(columns=["s", "i", "f", "b", "img"], rows=rows)}, step=1)
    run.log({"df": lh.Table(frame), "h": lh.Histogram(np.arange(10.0), bins=5)}, step=2)
    run.log({"h": lh.Histogram(counts=[1.5, 2.0], edges=[0.0, 0.5, 1.0])}, step=3)
    run.finish()
    items = lh.Api(store).run(run.id).media()
    table = next(i for i in items if i.key == "t")
    assert (table.kind, table.height, table.width) == ("table", 3, 5)
    got = table.load()
    assert list(got.columns) == ["s", "i", "f", "b", "img"]
    assert got["s"].tolist() == ["a <script>alert(1)</script>", "b", "c"]
    assert got["i"].tolist() == [1, None, 3]
    assert got["f"].tolist()[:2] == [0.1, math.inf] and math.isnan(got["f"].tolist()[2])
    assert got["b"].tolist() == [True, False, None]
    np.testing.assert_array_equal(got["img"][0], pic)
    assert got["img"][1] is None
    pd.testing.assert_frame_equal(next(i for i in items if i.key == "df").load(), frame)
    histograms = [i for i in items if i.key == "h"]
    counts, edges = histograms[0].load()
    assert counts.tolist() == [2, 2, 2, 2, 2] and edges.tolist() == [0.0, 1.8, 3.6, 5.4, 7.2, 9.0]
    counts, edges = histograms[1].load()
    assert counts.tolist() == [1.5, 2.0] and edges.tolist() == [0.0, 0.5, 1.0]


def _bad_inputs(tmp_path: Path) -> list[tuple[object, type[Exception]]]:
    return [
        (lh.Image(np.zeros((4, 4, 2), np.uint8)), ValueError),  # two channels
        (lh.Image(np.zeros((2, 3, 4, 5), np.uint8)), ValueError),  # 4-d numpy
        (lh.Image(np.zeros((4, 4), np.int32)), TypeError),  # dtype
        (lh.Image(np.full((4, 4), np.nan, np.float32)), ValueError),  # NaN image
        (lh.Image(np.full((4, 4), 2.0)), ValueError),  # float outside [0, 1]
        (lh.Image(np.zeros((0, 4), np.uint8)), ValueError),  # empty
        (lh.Image(str(tmp_path / "missing.png")), FileNotFoundError),
        (lh.Image("not-an-image.txt"), FileNotFoundError),
        (lh.Image({"pixels": 1}), TypeError),
        (lh.Image(np.zeros((4, 4), np.uint8), caption=3), TypeError),  # type: ignore[arg-type]
        (lh.Image(np.zeros((4, 4), np.uint8), format="gif"), ValueError),
        (lh.Table(columns=["a"], rows=[[{"nested": 1}]]), TypeError),  # a cell of another type
        (lh.Table(columns=["a"], rows=[[[1, 2]]]), TypeError),
        (lh.Table(columns=["a", "b"], rows=[[1]]), ValueError),  # a short row
        (lh.Table(columns=["a"], rows=[[i] for i in range(10_001)]), ValueError),  # over the documented size
        (lh.Table(columns=["a", "a"], rows=[]), ValueError),
        (lh.Histogram([1.0, float("nan")]), ValueError),
        (lh.Histogram([1.0], bins=0), ValueError),
        (lh.Histogram(counts=[1, 2], edges=[0.0, 1.0]), ValueError),
        (lh.Histogram(counts=[1, 2], edges=[0.0, 2.0, 1.0]), ValueError),
        ([lh.Image(np.zeros((2, 2), np.uint8)), lh.Histogram([1.0])], TypeError),  # a mixed list
    ]


def test_bad_inputs_are_refused_at_log_naming_the_key_and_nothing_of_the_call_is_stored(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = lh.init("media", store=store)
    good = lh.Image(_image())
    for n, (bad, builtin) in enumerate(_bad_inputs(tmp_path)):
        with pytest.raises(lh.LaunchHelmError) as caught:
            run.log({"loss": 1.0, "fine": good, f"bad{n}": bad}, step=n)
        assert isinstance(caught.value, builtin), (n, caught.value)
        assert f"bad{n}" in str(caught.value), (n, str(caught.value))
    run.log({"after": 2.0}, step=100)
    run.finish()
    handle = lh.Api(store).run(run.id)
    assert handle.media() == []
    assert handle.history()["step"].tolist() == [100]
    assert not open_store(store).list(f"runs/{run.id}/media")  # no object either


def test_an_image_waiting_in_the_queue_is_not_lost_and_log_returns_before_it_is_stored(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = lh.init("media", store=store, flush_interval=3600)
    for step in range(30):
        run.log({"img": lh.Image(_image(64, 64))}, step=step)
    run.flush()  # waits for the media thread, then writes the index
    assert [i.step for i in lh.Api(store).run(run.id).media()] == list(range(30))
    run.finish()


@pytest.mark.slow
def test_a_long_runs_media_index_stays_a_few_objects_and_reads_in_two_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHHELM_COMPACTION_GRACE", "0")  # merged-away index objects go at once
    store = str(tmp_path / "store")
    run = lh.init("media", store=store, flush_interval=3600)
    pixels = _image(4, 4)
    for step in range(200):  # 200 flushes with media: 200 index chunks written, merged by 8s
        run.log({"img": lh.Image(pixels), "h": lh.Histogram([step, step + 1.0], bins=2)}, step=step)
        run.flush()
    listed = open_store(store).list(media_index_prefix(run.id))
    assert len(listed) <= 7 * 3, listed  # at most 7 per level: 200 = 3*64 + 1*8 + 0 ... levels of 1, 8, 64
    items = lh.Api(store).run(run.id).media()
    assert [(i.key, i.step) for i in items if i.key == "img"] == [("img", s) for s in range(200)]
    assert len({i.object for i in items if i.key == "img"}) == 1  # the same content is one object
    run.finish()


def test_a_store_written_before_media_reads_as_no_media(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = lh.init("media", store=store)
    run.log({"loss": 1.0})
    run.finish()
    assert lh.Api(store).run(run.id).media() == []


@pytest.mark.parametrize("backend", ["memory", "s3"])
def test_media_on_object_stores(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = make_store_url(backend, tmp_path, request)
    pixels = _image(30, 20)
    run = lh.init("media", store=store)
    run.log({"img": [lh.Image(pixels), lh.Image(pixels[::-1])], "t": lh.Table(columns=["a"], rows=[["x"]])})
    run.finish()
    items = lh.Api(store).run(run.id).media(key="img")
    assert [i.index for i in items] == [0, 1]
    np.testing.assert_array_equal(items[1].load(), pixels[::-1])
    assert lh.Api(store).run(run.id).media("t")[0].load()["a"].tolist() == ["x"]


def test_media_refuses_an_unknown_duplicates_mode(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = lh.init("media", store=store)
    run.finish()
    with pytest.raises(lh.InvalidArgumentError, match="duplicates"):
        lh.Api(store).run(run.id).media(duplicates="first")


def test_gc_deletes_the_index_objects_a_session_merged_and_reads_stay_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launchhelm._gc import collect_garbage

    store = str(tmp_path / "store")
    run = lh.init("media", store=store, flush_interval=3600)
    for step in range(20):  # 20 chunks: two merges of 8, whose 16 small objects wait for the grace period
        run.log({"h": lh.Histogram([float(step)], bins=1)}, step=step)
        run.flush()
    prefix = media_index_prefix(run.id)
    assert len(open_store(store).list(prefix)) == 20 + 2
    run.finish()  # seals the session: one object covering 0-19 (its 6 others wait for the grace period too)
    assert len(open_store(store).list(prefix)) == 20 + 2 + 1
    before = [(i.step, i.object) for i in lh.Api(store).run(run.id).media()]
    collect_garbage(store)  # the merges are younger than the grace period: nothing goes
    assert len(open_store(store).list(prefix)) == 23
    monkeypatch.setenv("LAUNCHHELM_COMPACTION_GRACE", "0")
    collect_garbage(store)
    # numbered from 0, or from the helper's base where the helper process stored them (launchhelm.media._handoff)
    base = HANDOFF_BASE if run._media.handed else 0
    assert open_store(store).list(prefix) == [f"{run.session_id}/{base:08d}-{base + 19:08d}.parquet"]
    assert [(i.step, i.object) for i in lh.Api(store).run(run.id).media()] == before
    assert [i.step for i in lh.Api(store).run(run.id).media()] == list(range(20))
