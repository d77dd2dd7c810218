"""The runs table and the comparison in a real JupyterLab 4 and Notebook 7, in headless Chromium.

A person sorts by clicking a header, filters by typing and by status,
ticks two runs, and sees them side by side: two lines in every panel (one
per run, in the run's colour) and both runs' rewinds as rules, with the
config diff beside it. The runs are real PyTorch runs, each rewound by a
real ``load_checkpoint``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from jupyter_browser import (
    JupyterServer,
    browser_marks,
    execute,
    open_notebook,
    run_all,
    write_notebook,
)
from rewound_runs import BACK_TO, REACHED, rewound_run

pytestmark = browser_marks()
VIEWPORT = (1400, 1800)  # the page fixture's size (tests/widgets/conftest.py)

WAIT_MS = 60_000
ROWS = ".lh-runs-table tr.lh-run"
#: Vega draws one path per run in a panel's line layer, one line per rewind in its rule layer.
LINES = ".lh-compare g.mark-line.role-mark.line_{i}_marks path"
RULES = ".lh-compare g.mark-rule.role-mark.rewind_rule_{i}_marks line"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    pytest.importorskip("torch")
    store = str(tmp_path_factory.mktemp("runs-table") / "store")
    ids = {"store": store}
    ids["alpha"] = rewound_run(store, "cmp", "alpha", 0.1)
    time.sleep(0.01)
    ids["beta"] = rewound_run(store, "cmp", "beta", 0.01, close=False, tunables={"clip": 0.5})
    time.sleep(0.01)
    ids["gamma"] = rewound_run(store, "cmp", "gamma", 0.001, end=30)
    return ids


def _names(page: Any) -> list[str]:
    return list(page.locator(f"{ROWS} td.lh-name b").all_text_contents())


def _wait(page: Any, what: Any, expected: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (found := what()) != expected:
        assert time.monotonic() < deadline, f"found {found!r}, expected {expected!r}"
        time.sleep(0.2)


def _count(page: Any, selector: str) -> int:
    return int(page.locator(selector).count())


def _tick_two_and_check_the_comparison(page: Any, runs: dict[str, str]) -> None:
    for name in ("alpha", "beta"):
        page.locator(f"{ROWS}[data-run='{runs[name]}'] input.lh-select").check()
    page.wait_for_selector(".lh-compare[data-points]", timeout=WAIT_MS)
    for i in (0, 1):  # train/loss and acc: a line per ticked run, both runs' rewinds
        _wait(page, lambda i=i: _count(page, LINES.format(i=i)), 2)
        _wait(page, lambda i=i: _count(page, RULES.format(i=i)), 2)
    colours = page.locator(LINES.format(i=0)).evaluate_all("els => els.map(e => e.getAttribute('stroke'))")
    assert len(set(colours)) == 2  # each run its colour
    legend = page.locator(".lh-compare g.mark-text.role-legend-label text").all_text_contents()
    assert legend == ["alpha", "beta"]
    diff = page.locator(".lh-compare .lh-config-diff tr.lh-diff-row")
    assert diff.evaluate_all("els => els.map(e => e.dataset.key)") == ["config.lr", "tunable.clip"]
    assert page.locator(".lh-compare").get_attribute("data-rewinds") == "2"


def test_the_runs_table_sorts_filters_and_ticking_two_runs_compares_them_in_jupyterlab(
    page: Any, server: JupyterServer, runs: dict[str, str]
) -> None:
    write_notebook(
        server.root / "runs.ipynb",
        ["%load_ext launchhelm", f"table = %launchhelm runs cmp --store {runs['store']}\ntable"],
    )
    open_notebook(page, server, "runs.ipynb")
    run_all(page)
    page.wait_for_selector(ROWS, timeout=WAIT_MS)
    _wait(page, lambda: _names(page), ["gamma", "beta", "alpha"])  # newest first
    first = page.locator(ROWS).first
    assert "ago" in first.locator("td.lh-created").inner_text() or "just now" in first.inner_text()
    assert first.locator("td.lh-created").get_attribute("title").startswith("20")  # local time on hover

    # sort: click a header, click again for the other way
    page.locator(".lh-runs-table th[data-column='name']").click()
    _wait(page, lambda: _names(page), ["alpha", "beta", "gamma"])
    page.locator(".lh-runs-table th[data-column='name']").click()
    _wait(page, lambda: _names(page), ["gamma", "beta", "alpha"])
    page.locator(".lh-runs-table th[data-column='step']").click()
    _wait(page, lambda: _names(page)[0], "gamma")  # 30 steps before 50
    # the kernel knows the choice too (the browser sends changes one at a time: wait for the last)
    _wait(page, lambda: execute(page, "print(table.table.sort_by, table.table.descending)").strip(), "step False")

    # filter by text (a config value by its short name), then by status
    page.get_by_label("Filter runs").fill("lr=0.01")
    _wait(page, lambda: _names(page), ["beta"])
    page.get_by_label("Filter runs").fill("")
    _wait(page, lambda: len(_names(page)), 3)
    page.locator(".lh-status-filter[data-status='closed'] input").check()
    _wait(page, lambda: sorted(_names(page)), ["alpha", "gamma"])
    assert "resumable (1)" in page.locator(".lh-status-filter[data-status='resumable']").inner_text()
    page.locator(".lh-status-filter[data-status='closed'] input").uncheck()
    _wait(page, lambda: len(_names(page)), 3)

    _tick_two_and_check_the_comparison(page, runs)
    _wait(
        page,
        lambda: execute(page, "print(sorted(table.selected), table.compare.runs)").strip(),
        f"{sorted([runs['alpha'], runs['beta']])} {[runs['alpha'], runs['beta']]}",
    )
    rewinds = execute(page, "print([(r['label'], r['to_step'], r['reached']) for r in table.compare.rewinds()])")
    assert rewinds.strip() == str([("alpha", BACK_TO, REACHED), ("beta", BACK_TO, REACHED)])

    # smoothing and the wall-time axis re-draw the same two lines
    page.locator(".lh-compare input.lh-smooth").check()
    _wait(page, lambda: _count(page, ".lh-compare g.mark-line.role-mark.raw_0_marks path"), 2)
    page.locator(".lh-compare select.lh-x-axis").select_option("time")
    page.wait_for_selector(".lh-compare svg text:text-is('wall time')", timeout=WAIT_MS)  # the x axis' title
    _wait(page, lambda: _count(page, LINES.format(i=0)), 2)
    _wait(page, lambda: _count(page, RULES.format(i=0)), 2)
    _wait(page, lambda: execute(page, "print(table.compare.x_axis, table.compare.smooth)").strip(), "time True")


def test_notebook7_shows_the_runs_table_and_the_comparison(
    page: Any, server: JupyterServer, runs: dict[str, str]
) -> None:
    write_notebook(
        server.root / "runs7.ipynb",
        [f"from launchhelm.widgets import RunsTable\nRunsTable('cmp', store={runs['store']!r})"],
    )
    open_notebook(page, server, "runs7.ipynb", app="notebook")
    run_all(page)
    page.wait_for_selector(ROWS, timeout=WAIT_MS)
    _wait(page, lambda: len(_names(page)), 3)
    page.locator(".lh-runs-table th[data-column='name']").click()
    _wait(page, lambda: _names(page), ["alpha", "beta", "gamma"])
    page.get_by_label("Filter runs").fill("GAMMA")
    _wait(page, lambda: _names(page), ["gamma"])
    page.get_by_label("Filter runs").fill("")
    _wait(page, lambda: len(_names(page)), 3)
    _tick_two_and_check_the_comparison(page, runs)

    # live: a run another process starts shows up running, then closed once it finishes
    import launchhelm as lh

    run = lh.init("cmp", name="delta", store=runs["store"])
    try:
        page.wait_for_selector(f"{ROWS}[data-run='{run.id}'][data-status='running']", timeout=WAIT_MS)
    finally:
        run.finish()
    page.wait_for_selector(f"{ROWS}[data-run='{run.id}'][data-status='closed']", timeout=WAIT_MS)
