"""A real Jupyter server and headless Chromium for the browser tests.

As measured in shared/notes/browser-testing.md: Debian's Chromium driven by
Playwright for Python (``executable_path=/usr/bin/chromium``, never a
downloaded browser), a server on 127.0.0.1 with a free port, no token, and
``JUPYTER_*`` folders of its own, so nothing depends on the machine's
Jupyter set-up. One server serves both JupyterLab (``/lab/tree/NAME``) and
Notebook 7 (``/notebooks/NAME``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class JupyterServer:
    """``jupyter lab`` on 127.0.0.1 serving ``root``, with its own config, data and runtime folders."""

    def __init__(self, root: Path, home: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        for name in ("config", "data", "runtime"):
            (home / name).mkdir(parents=True, exist_ok=True)
        (home / "config" / "jupyter_server_config.json").write_text(
            json.dumps(
                {"LabApp": {"expose_app_in_browser": True}, "JupyterNotebookApp": {"expose_app_in_browser": True}}
            )
        )
        self.env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTER_PLATFORM_DIRS": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.log = home / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90) -> None:
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--ServerApp.token=",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.port_retries=0",
            "--LabApp.expose_app_in_browser=True",
            "--allow-root",
        ]
        with open(self.log, "wb") as out:
            self._proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.root)
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/api/status", timeout=2)
                return
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"jupyter lab did not start:\n{self.log.read_text()[-3000:]}") from None
                time.sleep(0.25)

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def shutdown_kernels(self) -> None:
        """Shut every kernel down (each test opens its own notebook and kernel)."""
        with urllib.request.urlopen(f"{self.url}/api/kernels", timeout=10) as answer:
            kernels = json.load(answer)
        for kernel in kernels:
            request = urllib.request.Request(f"{self.url}/api/kernels/{kernel['id']}", method="DELETE")
            try:
                urllib.request.urlopen(request, timeout=10)
            except OSError:
                pass


def write_notebook(path: Path, cells: Sequence[str]) -> Path:
    """A notebook whose code cells are ``cells``, for the python3 kernel."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, str(path))
    return path


@contextmanager
def chromium() -> Iterator[Any]:
    """A Playwright browser on Debian's Chromium (no download)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


# JavaScript run in the page -------------------------------------------------
LAB_KERNEL_IDLE = """() => {
  const app = window.jupyterapp;
  const widget = app && app.shell && app.shell.currentWidget;
  const kernel = widget && widget.sessionContext && widget.sessionContext.session
      && widget.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle' && kernel.connectionStatus === 'connected';
}"""

RUN_ALL = "() => window.jupyterapp.commands.execute('notebook:run-all-cells')"

EXECUTE = """async (code) => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const future = kernel.requestExecute({code, store_history: false});
  let out = '';
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === 'stream') out += msg.content.text;
    if (msg.header.msg_type === 'error') out += msg.content.ename + ': ' + msg.content.evalue;
  };
  await future.done;
  return out;
}"""


def open_notebook(page: Any, server: JupyterServer, name: str, *, app: str = "lab", timeout: float = 120) -> None:
    """Open ``name`` in JupyterLab (``app="lab"``) or Notebook 7 (``"notebook"``) and wait for an idle kernel."""
    # ?reset: JupyterLab would otherwise reopen the previous test's notebooks from its workspace
    path = f"/lab/tree/{name}?reset" if app == "lab" else f"/notebooks/{name}"
    page.goto(server.url + path, wait_until="domcontentloaded", timeout=timeout * 1000)
    page.wait_for_function(LAB_KERNEL_IDLE, timeout=timeout * 1000, polling=250)


def run_all(page: Any) -> None:
    """Run every cell (JupyterLab's and Notebook 7's command)."""
    page.evaluate(RUN_ALL)


def execute(page: Any, code: str) -> str:
    """Run ``code`` in the notebook's kernel; return what it printed (and any error)."""
    return str(page.evaluate(EXECUTE, code))


# What every browser test module shares -------------------------------------------
def browser_marks() -> list[Any]:
    """``pytestmark`` of a browser test module: slow, browser, and skipped only without Chromium outside CI."""
    import pytest

    return [
        pytest.mark.slow,
        pytest.mark.browser,
        # one xdist worker runs them all, on one JupyterLab and one Chromium (tests/widgets/conftest.py)
        pytest.mark.xdist_group("browser"),
        pytest.mark.skipif(
            not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
            reason="needs /usr/bin/chromium (scripts/test.sh installs it)",
        ),
    ]


@contextmanager
def serving(root: Path, home: Path, env: dict[str, str] | None = None) -> Iterator[JupyterServer]:
    """A started :class:`JupyterServer`, stopped on the way out."""
    jupyter = JupyterServer(root, home, env=env)
    jupyter.start()
    try:
        yield jupyter
    finally:
        jupyter.stop()


@contextmanager
def watched_page(browser: Any, server: JupyterServer | None, width: int = 1280, height: int = 1600) -> Iterator[Any]:
    """A fresh page of ``browser``; on the way out its kernels are shut down and no LaunchHelm or
    Vega error may have reached the page."""
    context = browser.new_context(viewport={"width": width, "height": height})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield tab
    finally:
        context.close()
        if server is not None:
            server.shutdown_kernels()
    assert not [e for e in errors if "launchhelm" in e.lower() or "vega" in e.lower()], errors
