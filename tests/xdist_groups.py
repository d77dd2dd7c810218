"""Make ``--dist loadgroup`` group again under pytest 9.2 (a pytest plugin, loaded by tests/conftest.py).

pytest-xdist 3.8 marks a test's group by appending ``@group`` to the test's id on the worker
(``item._nodeid = ...``, xdist/remote.py), and its scheduler keeps the tests sharing a suffix on one
worker. pytest 9.2 keeps a node's id in ``Node._id`` (a ``NodeId``) and no longer reads ``_nodeid``,
so the suffix is lost and every test becomes a group of its own: the browser tests then start a
JupyterLab and a Chromium on every worker, and a module's module-scoped fixtures (a torchrun job, a
store of killed runs) are built on several workers. This hook, run after xdist's, applies the same
suffix where pytest reads it; where xdist's own assignment worked, the id already ends with it and
nothing changes.
"""

from __future__ import annotations

import pytest


def group_suffix(item: pytest.Item) -> str:
    """``@name`` (names joined by ``_``, sorted), exactly as xdist spells it; ``""`` without a group."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "@" + "_".join(sorted(names)) if names else ""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers of a --dist loadgroup run
        return
    for item in items:
        suffix = group_suffix(item)
        if not suffix or item.nodeid.endswith(suffix):
            continue
        if not hasattr(item, "_id"):
            raise RuntimeError(f"cannot mark {item.nodeid}'s xdist group: this pytest keeps no Node._id")
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]
