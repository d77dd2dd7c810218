"""Fixtures of the widget tests: real runs in local stores.

``stopped_run``: a plain (non-torch) run written by a child process that
checkpoints, has its tunable changed, and is SIGKILLed: fast. The
``widget_runs`` store holds PyTorch runs killed and resumed for real
(:mod:`widget_runs`): built once per session, copied per test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from widget_runs import StoppedRun, WidgetRuns, build_stopped_run, build_store, copy_runs


@pytest.fixture(scope="module", autouse=True)
def no_system_samples_unless_asked() -> Iterator[None]:
    """Runs made by the widget tests (and the notebook servers' kernels, started after this per
    module) sample the machine only when a test asks (``system_metrics=``): a sample 15 s into a
    long browser test would add the ``system`` section's panels mid-way, and these tests count
    panels and points."""
    saved = os.environ.get("LAUNCHHELM_SYSTEM_METRICS")
    os.environ["LAUNCHHELM_SYSTEM_METRICS"] = "off"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("LAUNCHHELM_SYSTEM_METRICS", None)
        else:
            os.environ["LAUNCHHELM_SYSTEM_METRICS"] = saved


@pytest.fixture
def stopped_run(tmp_path: Path) -> StoppedRun:
    return build_stopped_run(tmp_path)


@pytest.fixture(scope="session")
def widget_runs_template(tmp_path_factory: pytest.TempPathFactory) -> WidgetRuns:
    return build_store(tmp_path_factory.mktemp("widget-runs") / "store")


@pytest.fixture
def widget_runs(widget_runs_template: WidgetRuns, tmp_path: Path) -> WidgetRuns:
    """A private copy of the PyTorch runs' store (tests may choose and retry in it)."""
    return copy_runs(widget_runs_template, tmp_path)


# -- the browser tests' shared fixtures: one Chromium and one Jupyter server for them all ----------
# (they run on one xdist worker: jupyter_browser.browser_marks groups them)
@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium, one per test session."""
    from jupyter_browser import chromium

    with chromium() as b:
        yield b


@pytest.fixture(scope="session")
def notebooks_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The server's kernels' default store (``LAUNCHHELM_STORE``): notebooks that name no store use it."""
    return str(tmp_path_factory.mktemp("notebooks-store"))


@pytest.fixture(scope="session")
def jupyter(tmp_path_factory: pytest.TempPathFactory, notebooks_store: str) -> Iterator[Any]:
    """One JupyterLab (it serves Notebook 7 too) for every browser test; each test writes its own notebook
    into ``root`` under a name of its own, and its kernels sample the machine only when asked."""
    from jupyter_browser import serving

    env = {"LAUNCHHELM_STORE": notebooks_store, "LAUNCHHELM_SYSTEM_METRICS": "off"}
    with serving(tmp_path_factory.mktemp("notebooks"), tmp_path_factory.mktemp("jupyter-home"), env=env) as server:
        yield server


@pytest.fixture(scope="module")
def server(jupyter: Any) -> Iterator[Any]:
    """The shared server, its kernels shut down after each module."""
    yield jupyter
    jupyter.shutdown_kernels()


@pytest.fixture
def page(request: pytest.FixtureRequest, browser: Any, server: Any) -> Iterator[Any]:
    """A fresh page on the module's ``server`` (``VIEWPORT = (width, height)`` in the module sizes it);
    no LaunchHelm or Vega error may reach it."""
    from jupyter_browser import watched_page

    width, height = getattr(request.module, "VIEWPORT", (1280, 1600))
    with watched_page(browser, server, width, height) as tab:
        yield tab
