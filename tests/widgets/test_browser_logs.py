"""The run panel's Logs tab in a real JupyterLab 4 and Notebook 7, in headless Chromium.

A training process (a real child, not the kernel) prints; the notebook shows
its run's panel; on the Logs tab, a line the process prints after the page is
up appears within a few seconds, the log stays scrolled to its bottom, and
what it printed before is there, in order, in monospace.
"""

from __future__ import annotations

import secrets
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
from lhtest import spawn

pytestmark = browser_marks()
VIEWPORT = (1280, 1400)  # the page fixture's size (tests/widgets/conftest.py)

WAIT_MS = 60_000
#: "Within a few seconds": the process flushes every 0.3 s, the tab polls every second.
LIVE_WITHIN_S = 8.0

TRAINER = """
import os, sys, time
import launchhelm as lh
run = lh.init("logs", store=sys.argv[1], flush_interval=0.3)
print(run.id, flush=True)
for i in range(300):
    print(f"warm-up line {i}", flush=True)
go, stop, token = sys.argv[2], sys.argv[3], sys.argv[4]
while not os.path.exists(go):
    time.sleep(0.05)
print(f"printed while the page watched: {token}", flush=True)
while not os.path.exists(stop):
    time.sleep(0.05)
run.finish()
"""


@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_the_logs_tab_shows_a_line_a_training_process_prints_within_seconds(
    page: Any, server: JupyterServer, tmp_path: Path, app: str
) -> None:
    store = str(tmp_path / "store")
    go, stop, token = tmp_path / "go", tmp_path / "stop", secrets.token_hex(6)
    child = spawn(TRAINER, store, str(go), str(stop), token)
    try:
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()
        name = f"logs-{app}.ipynb"
        write_notebook(
            server.root / name,
            [f"from launchhelm.widgets import RunPanel\nRunPanel({run_id!r}, store={store!r})"],
        )
        open_notebook(page, server, name, app=app)
        run_all(page)
        page.wait_for_selector(".launchhelm-panel", timeout=WAIT_MS)
        page.locator(".launchhelm-panel .lm-TabBar-tab", has_text="Logs").click()
        log = ".launchhelm-panel .lh-logs .lh-log"
        page.wait_for_selector(f"{log} .lh-line:text-is('warm-up line 299')", state="visible", timeout=WAIT_MS)
        lines = page.locator(f"{log} .lh-line").all_text_contents()
        assert lines[:301] == [run_id] + [f"warm-up line {i}" for i in range(300)]
        assert page.locator(log).evaluate("e => getComputedStyle(e).fontFamily").lower().find("mono") >= 0

        go.touch()  # the process prints now, while the page watches
        started = time.monotonic()
        page.wait_for_selector(
            f"{log} .lh-line:text-is('printed while the page watched: {token}')", timeout=int(LIVE_WITHIN_S * 1000)
        )
        elapsed = time.monotonic() - started
        assert elapsed < LIVE_WITHIN_S
        # it was at the bottom, so it follows: the new line is in view
        gap = page.locator(log).evaluate("e => e.scrollHeight - e.scrollTop - e.clientHeight")
        assert gap < 8, gap
        assert page.locator(log).evaluate("e => e.scrollHeight > e.clientHeight")  # 302 lines overflow it
        stop.touch()
        assert child.wait(30) == 0
        page.wait_for_selector(".launchhelm-panel .lh-logs[data-status='closed']", timeout=WAIT_MS)
        assert page.locator(f"{log} .lh-line").count() == 302  # each line once
    finally:
        stop.touch()
        if child.poll() is None:
            child.kill()
        child.wait()
