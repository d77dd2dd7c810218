"""The widgets in marimo (the version pinned in pyproject.toml), driven by
headless Chromium: ``marimo run --headless`` serves a notebook as an app with
every cell run. A person sees the chart's rewind label, new points streaming
in, the picker's "Choose" recording the choice, the table's "Try again"
re-queueing a failed evaluation, and the run panel's tabs; and each notebook
in notebooks/, converted with ``marimo convert`` (its ``%`` magics become
comments there), runs and shows its widgets."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_browser import browser_marks
from lhtest import ROOT, child_env
from media_runs import END, HOSTILE_CAPTION, HOSTILE_CELL, IMAGE_KEYS, media_run
from widget_runs import FAILED_STEP, RESUMED_CRASH_AT, RESUMED_FROM, WidgetRuns

import launchhelm as lh

pytestmark = browser_marks()

LABEL = f"Resumed from step {RESUMED_FROM} after reaching {RESUMED_CRASH_AT}"
WAIT_MS = 60_000
MARIMO_VERSION = "0.25.2"


def marimo_app(cells: list[str]) -> str:
    """A marimo notebook whose cells are ``cells`` (each cell's last line is what it shows)."""
    parts = ["import marimo", "", "app = marimo.App()", ""]
    for code in cells:
        body = "\n".join("    " + line for line in code.splitlines())
        parts += ["", "@app.cell", "def _():", body, "    return", ""]
    parts += ["", 'if __name__ == "__main__":', "    app.run()", ""]
    return "\n".join(parts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MarimoApp:
    """``marimo run --headless`` on one notebook file."""

    def __init__(self, path: Path, home: Path, env: dict[str, str] | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = (path.parent / f"{path.stem}-marimo.log").open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "marimo",
                "run",
                "--headless",
                "--no-token",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                str(path),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=child_env(HOME=str(home), MARIMO_SKIP_UPDATE_CHECK="1", **(env or {})),
            cwd=path.parent,
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, "marimo run exited"
            try:
                urllib.request.urlopen(self.url, timeout=2).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "marimo run did not answer"
                time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture
def show(browser: Any, tmp_path: Path) -> Iterator[Any]:
    apps: list[MarimoApp] = []
    contexts: list[Any] = []
    errors: list[str] = []

    def open_app(cells: list[str]) -> Any:
        path = tmp_path / f"app{len(apps)}.py"
        path.write_text(marimo_app(cells), encoding="utf-8")
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        app = MarimoApp(path, home)
        apps.append(app)
        context = browser.new_context(viewport={"width": 1280, "height": 1600})
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(app.url, wait_until="domcontentloaded")
        return page

    try:
        yield open_app
    finally:
        for context in contexts:
            context.close()
        for app in apps:
            app.stop()
    assert not [e for e in errors if "launchhelm" in e.lower() or "vega" in e.lower()], errors


def test_marimo_is_the_pinned_version() -> None:
    import marimo

    assert marimo.__version__ == MARIMO_VERSION


def test_in_marimo_the_chart_draws_the_rewind_and_streams_new_points(
    show: Any, widget_runs: WidgetRuns, tmp_path: Path
) -> None:
    store = widget_runs.store
    run = lh.init("live", store=store, flush_interval=0.2)
    try:
        for step in range(50):
            run.log({"loss": 1.0 / (step + 1)}, step=step)
        run.flush()
        page = show(
            [
                "from launchhelm.widgets import RunChart as _Chart\n"
                f"_Chart({widget_runs.resumed!r}, keys=['train/loss'], store={store!r})",
                f"from launchhelm.widgets import RunChart as _Chart\n_Chart({run.id!r}, store={store!r}, interval=0.3)",
            ]
        )
        page.wait_for_selector(f".lh-chart svg text:text-is('{LABEL}')", timeout=WAIT_MS)
        live = page.locator(".lh-chart").nth(1)
        dots = live.locator("g.mark-symbol.role-mark.points_0_marks path")
        _wait(lambda: dots.count() == 50, "the first 50 points")
        for step in range(50, 300):  # another writer while the chart is shown
            run.log({"loss": 1.0 / (step + 1)}, step=step)
        run.flush()
        _wait(lambda: dots.count() == 300, "the streamed points")
        assert live.get_attribute("data-embeds") == "1"  # streamed into the view, not re-embedded
        page.screenshot(path=str(tmp_path / "marimo-charts.png"), full_page=True)
        print(f"screenshot: {tmp_path / 'marimo-charts.png'}")
    finally:
        run.finish()


def test_in_marimo_the_picker_chooses_and_the_table_tries_again(
    show: Any, widget_runs: WidgetRuns, tmp_path: Path
) -> None:
    store = widget_runs.store
    page = show(
        [
            f"from launchhelm.widgets import ResumePicker\nResumePicker({widget_runs.stopped!r}, store={store!r})",
            "from launchhelm.widgets import EvaluationTable\n"
            f"EvaluationTable({widget_runs.resumed!r}, store={store!r})",
        ]
    )
    page.wait_for_selector(".lh-picker tr.lh-checkpoint", timeout=WAIT_MS)
    page.locator(".lh-picker tr.lh-checkpoint[data-step='64']").get_by_role("button", name="Choose").click()
    confirmation = page.wait_for_selector(".lh-picker .lh-confirmation", timeout=WAIT_MS)
    assert confirmation is not None
    assert confirmation.inner_text().startswith('Chosen: the next load_checkpoint("resume") restores step 64')
    chosen = lh.Api(store).run(widget_runs.stopped).resume_checkpoint()
    assert chosen is not None and chosen.step == 64

    failed = page.locator(".lh-evaluations tr.lh-evaluation[data-state='failed']")
    failed.wait_for(timeout=WAIT_MS)
    evaluation = next(e for e in lh.Api(store).run(widget_runs.resumed).evaluations() if e.step == FAILED_STEP)
    failed.get_by_role("button", name="Try again").click()
    page.wait_for_selector(
        f".lh-evaluations tr.lh-evaluation[data-checkpoint='{evaluation.checkpoint}'][data-state='queued']",
        timeout=WAIT_MS,
    )
    assert lh.Api(store).evaluation(evaluation.id).state == "queued"
    page.screenshot(path=str(tmp_path / "marimo-picker-table.png"), full_page=True)
    print(f"screenshot: {tmp_path / 'marimo-picker-table.png'}")


def test_in_marimo_the_run_panel_shows_its_tabs(show: Any, widget_runs: WidgetRuns) -> None:
    page = show(
        [f"from launchhelm.widgets import RunPanel\nRunPanel({widget_runs.resumed!r}, store={widget_runs.store!r})"]
    )
    page.wait_for_selector(f".lh-chart svg text:text-is('{LABEL}')", timeout=WAIT_MS)
    tab = page.get_by_role("tab", name="Details")
    tab.click()
    page.wait_for_selector(".lh-details", state="visible", timeout=WAIT_MS)
    assert "closed: finish() closed it" in page.inner_text(".lh-details")


def test_in_marimo_a_run_handle_as_a_cells_last_expression_shows_its_panel(show: Any, widget_runs: WidgetRuns) -> None:
    page = show([f"import launchhelm as lh\nlh.Api({widget_runs.store!r}).run({widget_runs.resumed!r})"])
    page.wait_for_selector(f".lh-chart svg text:text-is('{LABEL}')", timeout=WAIT_MS)
    page.get_by_role("tab", name="Details").click()
    page.wait_for_selector(".lh-details", state="visible", timeout=WAIT_MS)
    assert "closed: finish() closed it" in page.inner_text(".lh-details")


def test_in_marimo_the_runs_table_ticks_two_runs_into_a_comparison(show: Any, tmp_path: Path) -> None:
    """RunsTable is an ipywidgets box, which marimo does not draw: it shows the table and the comparison
    itself (``_display_``), and a tick in the browser reaches the kernel and draws both runs."""
    pytest.importorskip("torch")
    from rewound_runs import rewound_run

    store = str(tmp_path / "store")
    alpha = rewound_run(store, "cmp", "alpha", 0.1)
    beta = rewound_run(store, "cmp", "beta", 0.01)
    page = show([f"from launchhelm.widgets import RunsTable\nRunsTable('cmp', store={store!r})"])
    rows = ".lh-runs-table tr.lh-run"
    page.wait_for_selector(rows, timeout=WAIT_MS)
    _wait(lambda: page.locator(f"{rows} td.lh-name b").all_text_contents() == ["beta", "alpha"], "both rows")
    for run_id in (alpha, beta):
        page.locator(f"{rows}[data-run='{run_id}'] input.lh-select").check()
    page.wait_for_selector(".lh-compare[data-points]", timeout=WAIT_MS)
    lines = page.locator(".lh-compare g.mark-line.role-mark.line_0_marks path")
    _wait(lambda: lines.count() == 2, "a line per ticked run")
    assert page.locator(".lh-compare").get_attribute("data-rewinds") == "2"
    page.screenshot(path=str(tmp_path / "marimo-runs-table.png"), full_page=True)
    print(f"screenshot: {tmp_path / 'marimo-runs-table.png'}")


def test_in_marimo_the_media_tab_moves_every_key_and_shows_both_attempts(show: Any, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run_id = media_run(store)
    page = show([f"from launchhelm.widgets import MediaPanel\nMediaPanel({run_id!r}, store={store!r})"])
    media = page.locator(".lh-media")
    pictures = ".lh-media-card[data-key='{key}'] figure.lh-media-pic"
    for key in IMAGE_KEYS:
        media.locator(f".lh-media-card[data-key='{key}'][data-step='{END}']").wait_for(timeout=WAIT_MS)
    # step 8 was redone: both attempts, the abandoned one dimmed
    assert media.locator(".lh-media-abandoned").count() == 3  # samples x2, val/grid
    for step in (3, 2):  # one slider moves every image key
        media.locator(".lh-media-slider").fill(str(step - 1))
        for key in IMAGE_KEYS:
            media.locator(f".lh-media-card[data-key='{key}'][data-step='{step}']").wait_for(timeout=WAIT_MS)
    assert media.locator(pictures.format(key="samples") + " figcaption").all_text_contents() == [
        "step 2 attempt 0 #0",
        "step 2 attempt 0 #1",
    ]
    # text from the store stays text
    assert media.locator(pictures.format(key="val/grid") + " figcaption").all_text_contents() == [HOSTILE_CAPTION]
    cell = media.locator(".lh-media-table[data-key='completions'][data-step='2'] td", has_text="<script>")
    cell.wait_for(timeout=WAIT_MS)
    assert cell.inner_text() == HOSTILE_CELL
    assert media.locator("script, img[src='x'], td b").count() == 0
    assert page.evaluate("() => window.__lh_pwned === undefined")
    media.locator(".lh-media-histograms svg g.mark-rect.role-mark path").first.wait_for(timeout=WAIT_MS)
    page.screenshot(path=str(tmp_path / "marimo-media.png"), full_page=True)
    print(f"screenshot: {tmp_path / 'marimo-media.png'}")


@pytest.fixture
def show_file(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """Serve a marimo notebook file with ``marimo run`` and open it; yields the opener."""
    apps: list[MarimoApp] = []
    contexts: list[Any] = []

    def open_file(path: Path, env: dict[str, str]) -> Any:
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        app = MarimoApp(path, home, env)  # the app's kernel gets the store from its environment
        apps.append(app)
        context = browser.new_context(viewport={"width": 1280, "height": 1600})
        contexts.append(context)
        page = context.new_page()
        page.goto(app.url, wait_until="domcontentloaded")
        return page

    try:
        yield open_file
    finally:
        for context in contexts:
            context.close()
        for app in apps:
            app.stop()


def converted(name: str, folder: Path) -> Path:
    """notebooks/NAME.ipynb as a marimo notebook (``marimo convert``), beside its helper scripts."""
    for helper in (ROOT / "notebooks").glob("*.py"):
        if helper.name != "conftest.py":
            shutil.copy(helper, folder / helper.name)
    out = folder / f"{name}_marimo.py"
    done = subprocess.run(
        [sys.executable, "-m", "marimo", "convert", str(ROOT / "notebooks" / f"{name}.ipynb"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out


def _done_rows(page: Any) -> int:
    return int(page.locator(".lh-evaluations tr.lh-evaluation[data-state='done']").count())


def _lr_field(page: Any) -> str:
    field = page.locator(".lh-details input.lh-tunable[name='lr']")
    return str(field.first.input_value()) if field.count() else ""


# What a person sees once each notebook has run in marimo. Playwright's locators, not
# document.querySelector: marimo draws each anywidget inside a shadow root.
SEEN_IN_MARIMO: dict[str, Any] = {
    "quickstart": lambda page: (
        page.locator(".lh-chart svg text:text-is('Resumed from step 40 after reaching 110')").count() > 0
        and _done_rows(page) >= 5
    ),
    "evaluate": lambda page: (
        _done_rows(page) >= 3 and page.locator(".lh-chart svg text:text-is('eval/accuracy')").count() > 0
    ),
    "tunables": lambda page: _lr_field(page) == "0.01",
}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", sorted(SEEN_IN_MARIMO))
def test_each_notebook_runs_in_marimo(show_file: Any, tmp_path: Path, name: str) -> None:
    store = tmp_path / "store"
    page = show_file(converted(name, tmp_path), {"LAUNCHHELM_STORE": str(store)})
    # the notebook's own cells assert as they go; here, what a person sees once it has run
    _wait(lambda: SEEN_IN_MARIMO[name](page), f"{name} to have run and shown its widgets", timeout=240)
    (run_id,) = lh.Api(str(store)).run_ids(name)
    run = lh.Api(str(store)).run(run_id)
    if name == "quickstart":
        assert [r.describe() for r in run.rewinds()] == ["Resumed from step 40 after reaching 110"]
    elif name == "evaluate":
        retried = next(e for e in run.evaluations() if e.step == 20)
        assert retried.state == "done" and retried.attempts == 2
    else:
        assert run.tunables["lr"] == 0.01 and len(run.checkpoints()) == 1
    page.screenshot(path=str(tmp_path / f"marimo-{name}.png"), full_page=True)
    print(f"screenshot: {tmp_path / f'marimo-{name}.png'}")


def _wait(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)
