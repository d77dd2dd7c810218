"""``pytest -p nbval --nbval-lax notebooks/``: every notebook here, top to bottom, against a temporary store.

The store is made before nbval starts a kernel, and handed to the kernels
(and the training and worker subprocesses they start) by ``LAUNCHHELM_STORE``,
so a test run never writes to ``~/.launchhelm``.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_made: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    store = tempfile.mkdtemp(prefix="launchhelm-notebooks-")
    _made.append(store)
    os.environ["LAUNCHHELM_STORE"] = store
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def pytest_unconfigure(config: pytest.Config) -> None:
    for store in _made:
        shutil.rmtree(store, ignore_errors=True)
