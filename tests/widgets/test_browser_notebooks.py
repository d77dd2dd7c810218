"""The notebooks in notebooks/, opened and run in a real JupyterLab 4 (and
Notebook 7) in headless Chromium, checked for what a person sees there: the
rewind label, the abandoned attempt as a visible dimmed line over the redone
steps after the toggle, every axis label whole inside its chart, the picker's
confirmation, the evaluation table's states, the tunables applied; plus a
chart streaming 10,000 points in 200 batches with none lost. A screenshot of
every widget is saved under the test's temporary folder (the paths are
printed: ``pytest -s`` shows them)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
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
from lhtest import ROOT

import launchhelm as lh

pytestmark = browser_marks()

WAIT_MS = 120_000
QUICKSTART_LABEL = "Resumed from step 40 after reaching 110"

# Every code cell has run (an execution count) and the kernel is idle again; any error output is returned.
NOTEBOOK_DONE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  if (!kernel || kernel.status !== 'idle') return null;
  const cells = panel.content.widgets.filter((c) => c.model.type === 'code');
  if (!cells.every((c) => c.model.executionCount)) return null;
  const errors = [];
  for (const c of cells) {
    for (const o of c.model.outputs.toJSON()) {
      if (o.output_type === 'error') errors.push(o.ename + ': ' + o.evalue);
    }
  }
  return {errors, cells: cells.length};
}"""

# Each axis label's box lies inside its chart's SVG and inside the output area showing it (nothing clipped).
CLIPPED_LABELS = """(chart) => {
  const svg = chart.querySelector('svg');
  const area = chart.closest('.jp-OutputArea-output') || chart;
  const s = svg.getBoundingClientRect();
  const a = area.getBoundingClientRect();
  const bad = [];
  let count = 0;
  for (const t of svg.querySelectorAll('g.role-axis-label text')) {
    const r = t.getBoundingClientRect();
    if (!t.textContent) continue;
    count += 1;
    const inside = (b) =>
      r.left >= b.left - 0.5 && r.right <= b.right + 0.5 && r.top >= b.top - 0.5 && r.bottom <= b.bottom + 0.5;
    const box = (b) => [b.left, b.right, b.top, b.bottom].map(Math.round).join(',');
    if (!inside(s) || !inside(a)) bad.push(`${t.textContent} at ${box(r)}; svg ${box(s)}; output ${box(a)}`);
  }
  return {count, bad};
}"""


@pytest.fixture(scope="module")
def store(notebooks_store: str) -> str:
    """Where the shipped notebooks, which name no store, keep their runs: the server's default."""
    return notebooks_store


@pytest.fixture(scope="module")
def server(jupyter: JupyterServer) -> Iterator[JupyterServer]:
    """The shared server, with the shipped notebooks copied into its root."""
    for item in (ROOT / "notebooks").iterdir():
        if item.suffix in (".ipynb", ".py") and item.name != "conftest.py":
            shutil.copy(item, jupyter.root / item.name)
    yield jupyter
    jupyter.shutdown_kernels()


def run_notebook(page: Any, server: JupyterServer, name: str, app: str = "lab") -> None:
    open_notebook(page, server, name, app=app)
    run_all(page)
    page.wait_for_timeout(1000)  # let the run start before asking whether it is done
    done = page.wait_for_function(NOTEBOOK_DONE, timeout=WAIT_MS * 3, polling=500).json_value()
    assert done["errors"] == [], done["errors"]


def screenshots(page: Any, folder: Path, name: str) -> list[Path]:
    """A PNG of every LaunchHelm widget on the page (for a person to look at)."""
    saved = []
    # the roots only: a widget's own sections (CompareChart's media section) are in its picture
    widgets = page.locator(
        ".launchhelm-panel, .launchhelm:not(.launchhelm-panel .launchhelm):not(.launchhelm .launchhelm)"
    )
    for i in range(widgets.count()):
        path = folder / f"{name}-{i}.png"
        widgets.nth(i).scroll_into_view_if_needed()
        widgets.nth(i).screenshot(path=str(path))
        saved.append(path)
    print("screenshots:", *saved, sep="\n  ")
    return saved


def check_axis_labels(page: Any) -> None:
    charts = page.locator(".lh-chart")
    for i in range(charts.count()):
        chart = charts.nth(i)
        if not chart.is_visible():
            continue
        chart.scroll_into_view_if_needed()
        found = chart.evaluate(CLIPPED_LABELS)
        assert found["count"] > 0 and found["bad"] == [], (i, found)


def test_the_quickstart_notebook_in_jupyterlab(page: Any, server: JupyterServer, store: str, tmp_path: Path) -> None:
    run_notebook(page, server, "quickstart.ipynb")
    page.wait_for_selector(f".lh-chart svg text:text-is('{QUICKSTART_LABEL}')", timeout=WAIT_MS)
    # the picker of section 3 (also the panel's, on its hidden tab), still live: its choice of step 40 was used
    # by the resume and the run is closed, so the green confirmation has become one plain line of history
    page.wait_for_selector(".lh-picker .lh-earlier", state="attached", timeout=WAIT_MS)
    for text in page.locator(".lh-picker .lh-earlier").all_text_contents():
        assert text.startswith("Chosen earlier: step 40 (already used by a resume"), text
    assert page.locator(".lh-picker .lh-confirmation").count() == 0
    table = page.locator(".lh-evaluations").last
    table.locator("tr.lh-evaluation[data-state='done']").nth(4).wait_for(timeout=WAIT_MS)
    assert table.locator("tr.lh-evaluation").count() == 5

    # the chart of section 5: tick "Show the abandoned attempt" and see a dimmed line over steps 41-110
    chart = page.locator(".lh-chart", has=page.locator("text=train/loss")).first
    chart.scroll_into_view_if_needed()
    chart.get_by_label("Show the abandoned attempt").check()
    abandoned = chart.locator("g.mark-line.role-mark.abandoned_0_marks path")
    abandoned.first.wait_for(timeout=WAIT_MS)
    line = chart.locator("g.mark-line.role-mark.line_0_marks path").first
    rule = chart.locator("g.mark-rule.role-mark.rewind_rule_0_marks line").first
    style = abandoned.first.evaluate(
        "e => { const s = getComputedStyle(e); return {opacity: Number(s.opacity) * Number(s.strokeOpacity),"
        " dash: e.getAttribute('stroke-dasharray'), stroke: e.getAttribute('stroke'),"
        " width: e.getAttribute('stroke-width')}; }"
    )
    assert style["opacity"] >= 0.5 and style["dash"] and style["stroke"] == "#7f7f7f", style
    assert float(style["width"]) >= 2
    gone, whole, at = abandoned.first.bounding_box(), line.bounding_box(), rule.bounding_box()
    # from the rewind's rule (step 40) to about step 110 of 160: over the redone steps, not a speck
    assert abs(gone["x"] - at["x"]) < 6
    assert gone["width"] > 0.35 * whole["width"]
    assert chart.locator(".lh-legend-abandoned").is_visible()  # named beside the toggle
    assert len(screenshots(page, tmp_path, "quickstart")) >= 5
    check_axis_labels(page)


def test_the_evaluate_notebook_in_jupyterlab(page: Any, server: JupyterServer, store: str, tmp_path: Path) -> None:
    run_notebook(page, server, "evaluate.ipynb")
    table = page.locator(".lh-evaluations").first
    rows = table.locator("tr.lh-evaluation")
    rows.nth(2).wait_for(timeout=WAIT_MS)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.lh-evaluations')][0]"
        ".querySelectorAll(\"tr.lh-evaluation[data-state='done']\").length === 3",
        timeout=WAIT_MS,
    )
    assert "accuracy" in table.inner_text()
    (run_id,) = lh.Api(store).run_ids("evaluate")
    retried = [e for e in lh.Api(store).run(run_id).evaluations() if e.step == 20]
    assert retried[0].attempts == 2 and retried[0].state == "done"
    screenshots(page, tmp_path, "evaluate")
    check_axis_labels(page)


def test_the_tunables_notebook_in_notebook7(page: Any, server: JupyterServer, store: str, tmp_path: Path) -> None:
    run_notebook(page, server, "tunables.ipynb", app="notebook")
    details = page.locator(".lh-details").first
    details.wait_for(timeout=WAIT_MS)
    # the Details tab's field shows the lr in force after the notebook's changes
    page.wait_for_function(
        "() => document.querySelector(\".lh-details input.lh-tunable[name='lr']\").value === '0.01'", timeout=WAIT_MS
    )
    (run_id,) = lh.Api(store).run_ids("tunables")
    run = lh.Api(store).run(run_id)
    assert run.tunables["lr"] == 0.01 and run.status == "resumable" and len(run.checkpoints()) == 1
    screenshots(page, tmp_path, "tunables")
    check_axis_labels(page)


def test_a_chart_streams_10000_points_in_200_batches_none_lost(
    page: Any, server: JupyterServer, store: str, tmp_path: Path
) -> None:
    run = lh.init("stream", store=store, flush_interval=3600)
    try:
        write_notebook(
            server.root / "stream.ipynb",
            [
                "from launchhelm.widgets import RunChart\n"
                f"chart = RunChart({run.id!r}, store={store!r}, interval=0.2, max_points=20_000)\n"
                "chart"
            ],
        )
        for step in range(50):  # the first batch: the chart opens with its panel (a run without metrics
            run.log({"loss": 1.0 / (step + 1)}, step=step)  # shows a placeholder, re-embedded at the first key)
        run.flush()
        open_notebook(page, server, "stream.ipynb")
        run_all(page)
        chart = page.locator(".lh-chart")
        page.wait_for_selector(".lh-chart[data-points='50']", timeout=WAIT_MS)
        for batch in range(1, 200):  # 199 more flushed batches of 50 points while the chart is shown
            for step in range(batch * 50, batch * 50 + 50):
                run.log({"loss": 1.0 / (step + 1)}, step=step)
            run.flush()
            time.sleep(0.02)
        page.wait_for_selector(".lh-chart[data-points='10000']", timeout=WAIT_MS)
        dots = page.locator(".lh-chart g.mark-symbol.role-mark.points_0_marks path")
        xs = dots.evaluate_all("els => els.map(e => e.getAttribute('transform'))")
        assert len(xs) == 10_000 and len(set(xs)) == 10_000  # every point once: none lost, none twice
        assert chart.get_attribute("data-embeds") == "1"  # streamed into the view, never re-embedded
        screenshots(page, tmp_path, "stream")
    finally:
        run.finish()
