"""The one door from the core to the presentation layer.

A :class:`launchhelm.Run` or :class:`launchhelm.RunHandle` left as a cell's
last expression shows its run panel, but the core must not import the widgets
(they sit above it and import the query API). The core calls the hook here;
the hook finds the presentation module by name when a notebook first asks, so
``import launchhelm`` stays free of IPython and anywidget and the import graph
keeps pointing down.
"""

from __future__ import annotations

import importlib
from typing import Protocol, cast

from launchhelm._types import RunLike

__all__ = ["PRESENTATION", "RunLike", "marimo_display", "run_mimebundle"]

#: The module that draws runs: ``run_mimebundle(run)`` and ``run_display(run)``.
PRESENTATION = "launchhelm.widgets._display"


class _Presentation(Protocol):
    """What the presentation module offers (``launchhelm.widgets._display``)."""

    def run_mimebundle(self, run: RunLike) -> dict[str, object]: ...

    def run_display(self, run: RunLike) -> object: ...


def _presentation() -> _Presentation:
    return cast("_Presentation", importlib.import_module(PRESENTATION))


def run_mimebundle(run: RunLike) -> dict[str, object]:
    """The run's notebook display: its panel in a Jupyter kernel, else its text repr."""
    try:
        presentation = _presentation()
    except ImportError:  # the widgets extra is not installed
        return {"text/plain": repr(run)}
    return dict(presentation.run_mimebundle(run))


def marimo_display(run: RunLike) -> object:
    """What marimo shows for a run (it asks for ``_display_``): the live run panel."""
    return _presentation().run_display(run)
