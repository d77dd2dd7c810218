"""Notebook widgets: charts with rewinds marked, the "Resume…" picker, the
evaluation table and a run's panel.

Needs the ``widgets`` extra (``pip install 'launchhelm[widgets]'``)::

    from launchhelm.widgets import RunChart, ResumePicker, EvaluationTable, RunPanel

    RunChart(run_id, keys=["train/loss"])   # one panel per key, x = step
    ResumePicker(run_id)                    # choose what load_checkpoint("resume") restores
    EvaluationTable("quickstart")           # each checkpoint's evaluation
    RunPanel(run_id)                        # all of them as tabs, plus Details
    MediaPanel(run_id)                      # images under one step slider, tables, histograms
    RunsTable("quickstart")                 # the project's runs; tick some to compare them
    CompareChart("quickstart", runs=[a, b]) # runs side by side, with their config diff

A :class:`launchhelm.Run` or :class:`launchhelm.RunHandle` left as a cell's
last expression shows as its :class:`RunPanel`; ``%load_ext launchhelm``
adds the ``%launchhelm`` magic. The names are imported on first use, so
``import launchhelm.widgets`` pulls in neither anywidget nor altair.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launchhelm.widgets._chart import RunChart
    from launchhelm.widgets._compare import CompareChart
    from launchhelm.widgets._details import RunDetails, RunLogs
    from launchhelm.widgets._evaluations import EvaluationTable
    from launchhelm.widgets._media import MediaPanel
    from launchhelm.widgets._panel import RunPanel
    from launchhelm.widgets._picker import ResumePicker
    from launchhelm.widgets._runs_table import RunsTable

__all__ = [
    "CompareChart",
    "EvaluationTable",
    "MediaPanel",
    "ResumePicker",
    "RunChart",
    "RunDetails",
    "RunLogs",
    "RunPanel",
    "RunsTable",
]

_WHERE = {
    "CompareChart": "launchhelm.widgets._compare",
    "EvaluationTable": "launchhelm.widgets._evaluations",
    "MediaPanel": "launchhelm.widgets._media",
    "ResumePicker": "launchhelm.widgets._picker",
    "RunChart": "launchhelm.widgets._chart",
    "RunDetails": "launchhelm.widgets._details",
    "RunLogs": "launchhelm.widgets._details",
    "RunPanel": "launchhelm.widgets._panel",
    "RunsTable": "launchhelm.widgets._runs_table",
}


def __getattr__(name: str) -> type:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'launchhelm.widgets' has no attribute {name!r}")
    try:
        module = importlib.import_module(where)
    except ImportError as exc:
        raise ImportError(
            f"launchhelm.widgets.{name} needs the widgets extra: pip install 'launchhelm[widgets]' ({exc})"
        ) from exc
    value: type = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
