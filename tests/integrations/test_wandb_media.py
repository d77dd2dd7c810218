"""A diffusers-style script with ``import launchhelm.wandb as wandb``: its pictures and tables come back exact.

What a user would notice if these failed: the validation images a diffusion
run logs (``wandb.Image`` lists of PIL images with captions) or its
completions table missing from the run, or read back with other pixels or
cells than the script logged.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from lhtest import make_store_url, run_python

import launchhelm as lh

#: How diffusers' training scripts log validation samples (log_validation), plus a TRL-style completions table.
DIFFUSERS_STYLE = """
import json, sys
import numpy as np
from PIL import Image
import launchhelm.wandb as wandb

rng = np.random.default_rng(0)
run = wandb.init(project="diffusion", config={"lr": 1e-4})
prompts = ["a photo of a <b>cat</b>", "an astronaut riding a horse"]
kept = {}
for epoch in range(3):
    for i in range(4):
        wandb.log({"train_loss": 1.0 / (epoch * 4 + i + 1)})
    images = [Image.fromarray(rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)) for _ in prompts]
    kept[epoch] = [np.asarray(img).tolist() for img in images]
    samples = [wandb.Image(img, caption=f"{i}: {p}") for i, (img, p) in enumerate(zip(images, prompts))]
    wandb.log({"validation": samples})
table = wandb.Table(columns=["prompt", "completion", "reward", "ok", "image"])
table.add_data("2+2=", "4", 1.0, True, wandb.Image(np.full((8, 8, 3), 200, dtype=np.uint8)))
table.add_data("<script>alert(1)</script>", "", -0.5, False, None)
table.add_data("long", "x" * 1000, 0, None, None)
wandb.log({"completions": table, "hist": wandb.Histogram(np_histogram=([1, 2, 3], [0.0, 1.0, 2.0, 3.0]))})
print("RUN", run.id)
print("IMAGES", json.dumps(kept))
wandb.finish()
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_diffusers_style_script_reads_back_pixel_exact_and_cell_exact(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = make_store_url(backend, tmp_path, request)
    done = run_python(DIFFUSERS_STYLE, LAUNCHHELM_STORE=store, LAUNCHHELM_SYSTEM_METRICS="false")
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.split(" ", 1)[0] in ("RUN", "IMAGES"))
    run_id, logged = lines["RUN"], json.loads(lines["IMAGES"])
    assert "skipped" not in done.stderr

    handle = lh.Api(store).run(run_id)
    validation = handle.media("validation")
    # W&B's implicit steps: 4 loss rows then the images, per epoch
    assert [(i.step, i.index) for i in validation] == [(s, n) for s in (4, 9, 14) for n in (0, 1)]
    assert [i.caption for i in validation[:2]] == ["0: a photo of a <b>cat</b>", "1: an astronaut riding a horse"]
    for item in validation:
        epoch = (item.step - 4) // 5
        np.testing.assert_array_equal(item.load(), np.asarray(logged[str(epoch)][item.index], dtype=np.uint8))
    [completions] = handle.media("completions")
    frame = completions.load()
    assert list(frame.columns) == ["prompt", "completion", "reward", "ok", "image"]
    assert frame["prompt"].tolist() == ["2+2=", "<script>alert(1)</script>", "long"]
    assert frame["completion"].tolist() == ["4", "", "x" * 1000]
    assert frame["reward"].tolist() == [1.0, -0.5, 0]
    assert [type(v) for v in frame["reward"]] == [float, float, int]  # cell for cell, not coerced
    assert frame["ok"].tolist() == [True, False, None]
    np.testing.assert_array_equal(frame["image"][0], np.full((8, 8, 3), 200, dtype=np.uint8))
    assert frame["image"][1] is None
    [hist] = handle.media("hist")
    counts, edges = hist.load()
    assert counts.tolist() == [1, 2, 3] and edges.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert handle.history()["train_loss"].dropna().size == 12


def test_wandb_images_scale_floats_as_wandb_does_and_bad_ones_are_refused(tmp_path: Path) -> None:
    import launchhelm.wandb as wandb

    store = str(tmp_path / "store")
    run = wandb.init(project="p", store=store, capture_console=False, system_metrics=False)
    try:
        signed = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
        wandb.log({"signed": wandb.Image(signed), "unit": wandb.Image(np.full((2, 2), 0.5))})
        with pytest.raises(lh.InvalidMediaError, match="bad"):
            wandb.log({"loss": 1.0, "bad": wandb.Image(np.zeros((2, 2, 7), dtype=np.uint8))})
        with pytest.raises(TypeError, match="bad_table"):
            wandb.log({"bad_table": wandb.Table(columns=["a"], data=[[object()]])})
    finally:
        wandb.finish()
    handle = lh.Api(store).run(run.id)
    items = {i.key: i for i in handle.media()}
    assert sorted(items) == ["signed", "unit"]
    expected = ((signed + 1.0) / 2.0 * 255).astype(np.int32).clip(0, 255).astype(np.uint8)
    np.testing.assert_array_equal(items["signed"].load()[:, :, 0], expected)
    np.testing.assert_array_equal(items["unit"].load()[:, :, 0], np.full((2, 2), 127, np.uint8))
    assert "loss" not in handle.history().columns  # nothing of the refused row


@pytest.mark.slow
def test_the_same_script_under_real_wandb_offline_logs_the_same_steps_keys_and_pixels(tmp_path: Path) -> None:
    # W&B's own package, offline, runs the script unchanged but for the import; its run imported back
    # (launchhelm import wandb) has the same images at the same steps as the launchhelm.wandb run
    store = str(tmp_path / "store")
    ours = run_python(DIFFUSERS_STYLE, LAUNCHHELM_STORE=store, LAUNCHHELM_SYSTEM_METRICS="false")
    assert ours.returncode == 0, ours.stderr
    real_script = DIFFUSERS_STYLE.replace("import launchhelm.wandb as wandb\n", "import wandb\n")
    real = run_python(
        real_script, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true", WANDB_CONSOLE="off"
    )
    assert real.returncode == 0, real.stderr
    from launchhelm.importers import import_wandb

    [imported] = import_wandb(tmp_path / "wandb", "real", store=store, progress=False).run_ids
    run_id = next(line.split(" ", 1)[1] for line in ours.stdout.splitlines() if line.startswith("RUN "))
    mine, theirs = lh.Api(store).run(run_id), lh.Api(store).run(imported)

    def images(handle: lh.RunHandle) -> list[tuple[str, int, int, str | None]]:
        return [(i.key, i.step, i.index, i.caption) for i in handle.media() if i.kind == "image"]

    assert images(theirs) == images(mine)
    for a, b in zip(
        [i for i in mine.media() if i.kind == "image"], [i for i in theirs.media() if i.kind == "image"], strict=True
    ):
        np.testing.assert_array_equal(a.load(), b.load())
    assert [(i.key, i.step) for i in theirs.media("hist")] == [(i.key, i.step) for i in mine.media("hist")]
