"""A notebook saved after running still shows its widgets where no kernel
runs (GitHub, nbviewer, ``jupyter nbconvert --to html``): each widget's MIME
bundle carries a static fallback made in the kernel (the chart as SVG, the
tables as HTML). And where an install lacks the front end, the cell shows one
line saying how to get it, not a traceback."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest
from widget_runs import FAILURE, RESUMED_CRASH_AT, RESUMED_FROM, WidgetRuns

WIDGET = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"

CELLS = [
    "from launchhelm.widgets import EvaluationTable, ResumePicker, RunChart, RunPanel\nimport launchhelm as lh",
    "RunChart(RESUMED, keys=['train/loss'], store=STORE)",
    "ResumePicker(STOPPED, store=STORE)",
    "EvaluationTable('widgets', store=STORE)",
    "lh.Api(STORE).run(STOPPED)",
]


def execute(notebook_cells: list[str], folder: Path, widget_state: bool = False) -> Path:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in notebook_cells])
    # widget_state=False: saved as JupyterLab saves by default, outputs without the widgets' live state;
    # True: as with "Save Widget State Automatically" on (metadata.widgets holds every model's state)
    NotebookClient(
        notebook,
        timeout=180,
        kernel_name="python3",
        store_widget_state=widget_state,
        resources={"metadata": {"path": str(folder)}},
    ).execute()
    path = folder / "saved.ipynb"
    nbformat.write(notebook, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("widget_state", [False, True], ids=["without-widget-state", "with-widget-state"])
def test_nbconvert_html_of_an_executed_notebook_shows_the_chart_and_the_tables(
    widget_runs: WidgetRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, widget_state: bool
) -> None:
    import nbformat

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    setup = f"STORE, RESUMED, STOPPED = {widget_runs.store!r}, {widget_runs.resumed!r}, {widget_runs.stopped!r}"
    saved = execute([setup, *CELLS], tmp_path, widget_state)
    notebook = nbformat.read(saved, as_version=4)
    state = notebook.metadata.get("widgets", {}).get(STATE, {}).get("state", {})
    views = [o.data[WIDGET]["model_id"] for c in notebook.cells for o in c.outputs if WIDGET in o.get("data", {})]
    assert len(views) == 4
    # with the state saved, nbconvert draws these outputs as widget views (which need JS), nothing else
    assert all(v in state for v in views) if widget_state else not state
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(saved), "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    page = (tmp_path / "saved.html").read_text(encoding="utf-8")
    cells = re.split(r'<div[^>]+class="jp-Cell jp-CodeCell', page)[1:]
    assert len(cells) == 6
    chart, picker, table, panel = cells[2:]
    # the chart: an SVG picture (nbconvert inlines it as an <img>) with its panel title, rewind label and line
    (encoded,) = re.findall(r'<img [^>]*src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', chart)
    chart = base64.b64decode(encoded).decode("utf-8")
    assert chart.startswith("<svg") and ">train/loss<" in chart
    assert f"Resumed from step {RESUMED_FROM} after reaching {RESUMED_CRASH_AT}" in chart
    assert re.search(r'aria-roledescription="line mark" d="M[\d.,LM-]{200,}', chart)  # a drawn line
    # the picker, as it stood: how the run ended and its checkpoints with the steps each leaves to redo
    assert "stopped without ending its session" in picker
    for step in ("96", "64", "32"):
        assert f">{step}<" in picker
    assert "before the last control change" in picker
    # the evaluation table: the failed row's message and the done row's score
    assert "failed" in table and FAILURE in table and "accuracy" in table and ">done<" in table
    # a run left as a cell's last expression: its panel, chart and tables together
    assert "<svg" in panel and "stopped without ending its session" in panel and "Details" in panel
    if widget_state:  # the views are there too, for a page that loads the widget manager
        assert sum(f'<script type="{WIDGET}">' in cell for cell in cells[2:]) == 4


MISSING = """
import launchhelm.widgets._base as base
base.STATIC = base.STATIC.parent / "no-such-static"
from launchhelm.widgets import ResumePicker, RunChart
"""


@pytest.mark.slow
def test_without_the_front_end_a_widget_shows_one_line_saying_how_to_get_it(
    widget_runs: WidgetRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    setup = f"STORE, RESUMED, STOPPED = {widget_runs.store!r}, {widget_runs.resumed!r}, {widget_runs.stopped!r}"
    cells = [
        setup,
        MISSING,
        "chart = RunChart(RESUMED, store=STORE)\nchart",
        "ResumePicker(STOPPED, store=STORE)",
        "print('launchhelm-missing-front-end' in chart._esm, 'bash js/build.sh' in chart._esm)",
        "del chart\nimport gc\n_ = gc.collect()",
    ]
    import nbformat

    notebook = nbformat.read(execute(cells, tmp_path), as_version=4)
    for cell in notebook.cells[2:4]:
        # the saved picture, then the view with its one line: no stream of warnings, no error
        fallback, output = cell.outputs
        assert fallback.output_type == "display_data" and "launchhelm-static-fallback" in fallback.data["text/html"]
        assert output.output_type == "execute_result"
        text = output.data["text/plain"]
        assert text.startswith("LaunchHelm's widget front end is missing from this install (")
        assert "bash js/build.sh" in text and "\n" not in text
        assert WIDGET in output.data
    assert notebook.cells[4].outputs[0].text == "True True\n"  # the view draws that line in the cell
    assert notebook.cells[5].outputs == []  # nothing from __del__
    assert all(o.output_type != "error" for c in notebook.cells for o in c.outputs)


def test_outside_a_kernel_the_fallback_joins_the_views_bundle_and_in_one_it_is_tagged_for_the_live_view() -> None:
    from launchhelm.widgets._static import fallback_html, split_fallback

    view = {WIDGET: {"model_id": "m1"}, "text/plain": "<chart>"}
    # marimo, a terminal: nothing published, one bundle as before
    assert split_fallback(view, {"image/svg+xml": "<svg/>"}, ["m1"]) == {**view, "image/svg+xml": "<svg/>"}
    block = fallback_html({"image/svg+xml": "<svg/>", "text/html": "<table></table>"}, ["m1", "m2"], alt="a chart")
    assert block is not None
    assert block.startswith(
        "<div class='launchhelm-static-fallback' data-lh-static='m1 m2'><img src='data:image/svg+xml;base64,"
    )
    assert block.endswith("<table></table></div>") and "alt='a chart'" in block
    assert fallback_html({}, ["m1"]) is None
