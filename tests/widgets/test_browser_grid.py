"""Panels people can scan, in a real JupyterLab 4 and Notebook 7 in headless Chromium: a
run with more than 12 metrics shows them in a grid, one collapsible section
per key prefix, with a filter box; every time in the run's panel reads as a
person reads it (local time, how long ago, durations), never raw epoch
numbers or ISO strings; and the saved picture a notebook keeps for viewers
without a kernel is hidden while the live widget draws.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from jupyter_browser import (
    JupyterServer,
    browser_marks,
    open_notebook,
    run_all,
    write_notebook,
)

import launchhelm as lh

pytestmark = browser_marks()

WAIT_MS = 60_000
#: 15 metrics, logged in this order: sections train, perf, metrics (no prefix), then eval (scores go last).
SECTIONS = {
    "train": ["train/loss", "train/accuracy", "train/lr", "train/grad_norm", "train/tokens_per_s"],
    "perf": ["perf/step_time", "perf/data_time", "perf/memory", "perf/throughput"],
    "metrics": ["epoch", "loss_scale", "samples"],
    "eval": ["eval/accuracy", "eval/loss", "eval/f1"],
}
KEYS = [k for keys in SECTIONS.values() for k in keys]
#: "14:03:07 (3 min ago)": today's local time, then how long ago.
HUMAN_TIME = r"\d{2}:\d{2}:\d{2} \((just now|\d+ (s|min) ago)\)"


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("grid-store")
    store = str(folder / "store")
    artifact = folder / "weights.bin"
    artifact.write_bytes(b"\0" * 1024)
    # two launches of one job (auto_resume): the Details tab lists both attempts
    first = lh.init("grid", store=store, config={"lr": 0.1}, flush_interval=3600, run_id="gridjob", auto_resume=True)
    for step in range(20):
        first.log({key: float(i + 1) / (step + 1) for i, key in enumerate(KEYS)}, step=step)
    first.finish(close_run=False)
    with lh.init("grid", store=store, flush_interval=3600, run_id="gridjob", auto_resume=True) as run:
        for step in range(20, 40):
            run.log({key: float(i + 1) / (step + 1) for i, key in enumerate(KEYS)}, step=step)
        checkpoint = run.checkpoint(str(artifact), step=20)
        run.flush()
        run_id = run.id
    lh.Api(store).run(run_id).evaluate(checkpoint)  # queued: its row says when
    return store, run_id


def _visible_keys(page: Any) -> list[str]:
    return list(
        page.locator(".launchhelm-panel .lh-chart .lh-panel").evaluate_all(
            # checkVisibility: also false inside a closed <details> (content-visibility: hidden)
            "els => els.filter(e => e.checkVisibility()).map(e => e.dataset.key)"
        )
    )


@pytest.mark.parametrize("app", ["lab", "notebook"], ids=["jupyterlab", "notebook7"])
def test_a_run_with_many_metrics_is_a_grid_of_sections_filterable_with_times_people_read(
    page: Any, server: JupyterServer, grid_run: tuple[str, str], tmp_path: Path, app: str
) -> None:
    store, run_id = grid_run
    name = f"grid-{app}.ipynb"
    write_notebook(server.root / name, [f"import launchhelm as lh\nlh.Api({store!r}).run({run_id!r})"])
    open_notebook(page, server, name, app=app)
    run_all(page)
    chart = page.wait_for_selector(
        f".launchhelm-panel .lh-chart[data-panels='{len(KEYS)}'][data-messages]", timeout=WAIT_MS
    )
    assert chart is not None
    page.wait_for_function(
        "() => Number(document.querySelector('.launchhelm-panel .lh-chart').dataset.points) >= 40 * 15",
        timeout=WAIT_MS,
    )

    caption = page.inner_text(".launchhelm-panel .lh-chart .lh-caption")
    assert re.fullmatch(f"closed · furthest step 39 · last point {HUMAN_TIME}", caption), caption
    # one section per prefix, in the order the metrics were logged (scores last), each with its panels
    sections = page.locator(".launchhelm-panel .lh-chart details.lh-section")
    assert sections.evaluate_all("els => els.map(e => e.dataset.section)") == list(SECTIONS)
    for name, keys in SECTIONS.items():
        section = page.locator(f".launchhelm-panel .lh-chart details.lh-section[data-section='{name}']")
        assert section.locator(".lh-panel").evaluate_all("els => els.map(e => e.dataset.key)") == keys
        assert section.locator("summary").inner_text().strip() == f"{name} ({len(keys)})"
        assert section.locator(".lh-panel svg").count() == len(keys)  # a drawn view per panel
    # a grid, not a column: the first two train panels side by side, the same height on the page
    first, second = (page.locator(f".lh-panel[data-key='{k}']").bounding_box() for k in SECTIONS["train"][:2])
    assert abs(first["y"] - second["y"]) < 2 and second["x"] > first["x"] + first["width"] - 2
    page.locator(".launchhelm-panel .lh-chart").screenshot(path=str(tmp_path / f"grid-{app}.png"))
    print("screenshot:", tmp_path / f"grid-{app}.png")

    # more than 12 metrics: a filter box; words narrow the panels, sections without a match disappear
    box = page.locator(".launchhelm-panel .lh-chart-filter")
    assert box.is_visible()
    box.fill("loss")
    assert _visible_keys(page) == ["train/loss", "loss_scale", "eval/loss"]
    assert not page.locator("details.lh-section[data-section='perf']").is_visible()
    assert page.locator(".launchhelm-panel .lh-filter-count").inner_text() == "3 of 15 panels"
    box.fill("")
    assert _visible_keys(page) == KEYS

    # collapsing a section hides its panels, and only those
    page.locator("details.lh-section[data-section='train'] > summary").click()
    assert page.locator("details.lh-section[data-section='train']").evaluate("e => e.open") is False
    assert _visible_keys(page) == [k for k in KEYS if not k.startswith("train/")]
    page.locator("details.lh-section[data-section='train'] > summary").click()
    assert _visible_keys(page) == KEYS
    assert page.locator(".lh-panel[data-key='train/loss'] svg").bounding_box()["width"] > 200  # drawn full width

    # the saved picture of the panel (for viewers without a kernel) is hidden while the live one draws
    fallback = page.locator(".launchhelm-static-fallback")
    assert fallback.count() == 1
    assert not fallback.is_visible(), fallback.evaluate(
        "e => e.outerHTML.slice(0, 300) + ' || ' + e.closest('.jp-OutputArea-child').outerHTML.slice(0, 300)"
    )

    # times as people read them, in every tab
    tabs = page.locator(".launchhelm-panel .lm-TabBar-tab")
    tabs.nth(1).click()  # Checkpoints
    saved = page.wait_for_selector(".launchhelm-panel .lh-picker td.lh-saved", state="visible", timeout=WAIT_MS)
    assert saved is not None and re.fullmatch(HUMAN_TIME, saved.inner_text().strip()), saved.inner_text()
    tabs.nth(2).click()  # Evaluations
    detail = page.wait_for_selector(".launchhelm-panel .lh-evaluations td.lh-detail", state="visible")
    assert detail is not None and re.fullmatch(f"queued at {HUMAN_TIME}", detail.inner_text().strip())
    tabs.nth(3).click()  # Details
    page.wait_for_selector(".launchhelm-panel .lh-details", state="visible", timeout=WAIT_MS)
    created = page.inner_text(".launchhelm-panel .lh-details td.lh-fact-created").strip()
    beat = page.inner_text(".launchhelm-panel .lh-details td.lh-fact-last-heartbeat").strip()
    took = page.inner_text(".launchhelm-panel .lh-details td.lh-fact-duration").strip()
    assert re.fullmatch(HUMAN_TIME, created) and re.fullmatch(HUMAN_TIME, beat), (created, beat)
    assert re.fullmatch(r"\d+ s|\d+ min( \d+ s)?", took), took
    attempts = page.locator(".launchhelm-panel .lh-details ol.lh-attempts li").all_inner_texts()
    assert len(attempts) == 2 and "explicit job gridjob" in attempts[0], attempts
    assert "finished at step 19; relaunched" in attempts[0] and "finished at step 39" in attempts[1], attempts
    # the exact time is one hover away
    title = page.locator(".launchhelm-panel .lh-details td.lh-fact-created time").get_attribute("title")
    assert title and str(lh.Api(store).run(run_id).name) not in title and re.search(r"\d{4}", title)
    for tab in range(4):
        tabs.nth(tab).click()
        text = page.inner_text(".launchhelm-panel")
        assert not re.search(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}", text), text  # no ISO timestamps
        assert not re.search(r"\b\d{10,}\b", text), text  # no epoch seconds or nanoseconds


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A run whose session sampled the machine every 0.2 s while it logged 30 steps, rewound once."""
    store = str(tmp_path_factory.mktemp("system-store") / "store")
    with lh.init("system", store=store, system_metrics=0.2, capture_console=False) as run:
        for step in range(30):
            run.log({"train/loss": 1.0 / (step + 1)}, step=step)
            time.sleep(0.05)
        run.flush()
        run_id = run.id
    return store, run_id


@pytest.mark.parametrize("app", ["lab", "notebook"], ids=["jupyterlab", "notebook7"])
def test_the_machines_samples_are_a_system_section_on_wall_time(
    page: Any, server: JupyterServer, sampled_run: tuple[str, str], tmp_path: Path, app: str
) -> None:
    store, run_id = sampled_run
    system = [k for k in lh.Api(store).run(run_id).history(stream="system").columns if k.startswith("system/")]
    assert "system/cpu_percent" in system and "system/memory_rss_bytes" in system
    name = f"system-{app}.ipynb"
    write_notebook(
        server.root / name, [f"from launchhelm.widgets import RunChart\nRunChart({run_id!r}, store={store!r})"]
    )
    open_notebook(page, server, name, app=app)
    run_all(page)
    page.wait_for_selector(f".lh-chart[data-panels='{1 + len(system)}'][data-messages]", timeout=WAIT_MS)
    sections = page.locator(".lh-chart details.lh-section")
    assert sections.evaluate_all("els => els.map(e => e.dataset.section)") == ["train", "system"]  # the machine last
    panel = page.locator(".lh-panel[data-key='system/cpu_percent']")
    panel.locator("svg text:text-is('wall time')").wait_for(timeout=WAIT_MS)  # its x axis: time, not step
    assert page.locator(".lh-panel[data-key='train/loss'] svg text:text-is('step')").count() == 1
    # every sample is a point of its line, and the axis reads clock times ("14:03:05"), not epoch numbers
    samples = len(lh.Api(store).run(run_id).history(stream="system").dropna(subset=["system/cpu_percent"]))
    dots = panel.locator("g.mark-symbol.role-mark path")
    page.wait_for_function(
        f"() => document.querySelectorAll(\".lh-panel[data-key='system/cpu_percent'] g.mark-symbol.role-mark path\")"
        f".length === {samples}",
        timeout=WAIT_MS,
    )
    assert dots.count() == samples >= 3
    ticks = panel.locator("g.role-axis-label text").all_text_contents()
    assert any(re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?( ?[AP]M)?", t) for t in ticks), ticks
    page.locator(".lh-chart").screenshot(path=str(tmp_path / f"system-{app}.png"))
    print("screenshot:", tmp_path / f"system-{app}.png")
