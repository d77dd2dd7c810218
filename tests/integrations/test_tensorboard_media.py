"""TensorBoard's images, figures and histograms: LaunchHelm keeps exactly what torch's writer writes.

What a user would notice if these failed: a picture logged with
``add_image``/``add_images``/``add_figure`` through ``launchhelm.tensorboard``
(or imported from torch's event files) whose pixels differ from the ones
TensorBoard shows for the same script, or a histogram with other buckets.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import numpy as np
import pytest
from lhtest import run_python

import launchhelm as lh
from launchhelm.importers import import_tensorboard

SCRIPT = """
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from torch.utils.tensorboard import SummaryWriter

torch.manual_seed(0)
writer = SummaryWriter(sys.argv[1])
for step in range(3):
    writer.add_image("chw_float", torch.rand(3, 20, 30), step)
    writer.add_image("hwc_uint8", (torch.rand(16, 12, 3) * 255).to(torch.uint8), step, dataformats="HWC")
    writer.add_image("hw", torch.rand(10, 8), step, dataformats="HW")
    writer.add_images("batch", torch.rand(10, 3, 8, 6), step)
    writer.add_images("grey_batch", torch.rand(3, 1, 8, 6), step)
    fig = plt.figure(figsize=(2, 1.5), dpi=50)
    plt.plot([0, 1, step])
    writer.add_figure("figure", fig, step)
    writer.add_histogram("weights", torch.randn(1000) * (step + 1), step)
    writer.add_scalar("loss", 1.0 / (step + 1), step)
writer.close()
"""

IMAGE_TAGS = ["batch", "chw_float", "figure", "grey_batch", "hw", "hwc_uint8"]


def _torch_event_file(
    logdir: Path,
) -> tuple[dict[str, list[tuple[int, np.ndarray]]], dict[str, list[tuple[int, list[float], list[float]]]]]:
    """Every image (decoded) and histogram torch's writer put in its event file, read with TensorBoard itself."""
    import PIL.Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"images": 0, "histograms": 0, "scalars": 0})
    acc.Reload()
    images = {}
    for tag in acc.Tags()["images"]:
        images[tag] = [
            (event.step, np.array(PIL.Image.open(io.BytesIO(event.encoded_image_string)))) for event in acc.Images(tag)
        ]
    histograms = {}
    for tag in acc.Tags()["histograms"]:
        histograms[tag] = [
            (event.step, list(event.histogram_value.bucket), list(event.histogram_value.bucket_limit))
            for event in acc.Histograms(tag)
        ]
    return images, histograms


def _check_same(handle: lh.RunHandle, images: dict, histograms: dict) -> None:
    items = handle.media()
    assert sorted({i.key for i in items if i.kind == "image"}) == IMAGE_TAGS
    assert sorted(images) == IMAGE_TAGS
    for tag in IMAGE_TAGS:
        ours = [(i.step, i.load()) for i in items if i.key == tag]
        assert [s for s, _ in ours] == [s for s, _ in images[tag]] == [0, 1, 2]
        for (step, mine), (_, theirs) in zip(ours, images[tag], strict=True):
            assert mine.shape == theirs.shape, (tag, step)
            np.testing.assert_array_equal(mine, theirs, err_msg=f"{tag} at step {step}")
    ours_h = [i for i in items if i.key == "weights"]
    assert [i.step for i in ours_h] == [s for s, _, _ in histograms["weights"]] == [0, 1, 2]
    for item, (_, bucket, limits) in zip(ours_h, histograms["weights"], strict=True):
        counts, edges = item.load()
        assert counts.tolist() == bucket[1:]
        assert edges.tolist() == limits


@pytest.mark.slow
def test_summary_writer_media_store_the_pixels_torchs_writer_writes_and_the_import_agrees(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    torch_dir, ours_dir = tmp_path / "torch" / "exp", tmp_path / "ours" / "exp"
    done = run_python(SCRIPT, str(torch_dir))
    assert done.returncode == 0, done.stderr
    line = "from torch.utils.tensorboard import SummaryWriter\n"
    swapped = textwrap.dedent(SCRIPT).replace(line, "from launchhelm.tensorboard import SummaryWriter\n")
    done = run_python(swapped, str(ours_dir), LAUNCHHELM_STORE=store, LAUNCHHELM_SYSTEM_METRICS="false")
    assert done.returncode == 0, done.stderr
    assert "accepted but not stored" not in done.stderr
    images, histograms = _torch_event_file(torch_dir)

    api = lh.Api(store)
    [run_id] = api.runs("ours")["id"].tolist()
    _check_same(api.run(str(run_id)), images, histograms)

    result = import_tensorboard(torch_dir, "imported", store=store, progress=False)
    [imported] = result.run_ids
    handle = api.run(imported)
    _check_same(handle, images, histograms)
    assert handle.history()["loss"].tolist() == pytest.approx([1.0, 0.5, 1 / 3])
    # the same pixels are the same objects, whichever way they came
    ours = {(i.key, i.step): i.size for i in api.run(str(run_id)).media() if i.kind == "image"}
    assert ours == {(i.key, i.step): i.size for i in handle.media() if i.kind == "image"}


def test_bad_images_are_refused_naming_the_tag(tmp_path: Path) -> None:
    from launchhelm.tensorboard import SummaryWriter

    store = str(tmp_path / "store")
    with SummaryWriter(str(tmp_path / "runs" / "bad"), store=store, capture_console=False) as writer:
        with pytest.raises(ValueError, match=r"'img'.*dataformats"):
            writer.add_image("img", np.zeros((3, 4, 5)), 0, dataformats="HW")
        with pytest.raises(ValueError, match=r"'img'.*NaN"):
            writer.add_image("img", np.full((3, 4, 5), np.nan), 0)
        with pytest.raises(ValueError, match=r"'w'.*NaN"):
            writer.add_histogram("w", np.array([1.0, np.nan]), 0)
        writer.add_image("img", np.ones((3, 4, 5)), 1)
    items = lh.Api(store).run(writer.run_id).media()
    assert [(i.key, i.step) for i in items] == [("img", 1)]
    np.testing.assert_array_equal(items[0].load(), np.full((4, 5, 3), 255, np.uint8))
