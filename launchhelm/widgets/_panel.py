"""``RunPanel``: a run's page in a notebook, as tabs.

Charts (:class:`RunChart`), Checkpoints (the "Resume…" :class:`ResumePicker`),
Evaluations (:class:`EvaluationTable`), Details (:class:`RunDetails`) and
Logs (:class:`RunLogs`, what the process printed) and Media (:class:`MediaPanel`:
images, tables and histograms).
A :class:`launchhelm.Run` or :class:`launchhelm.RunHandle` left as a cell's
last expression displays as this panel.
"""

from __future__ import annotations

import html
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import ipywidgets

from launchhelm._api import Api, RunHandle
from launchhelm._types import RunLike
from launchhelm.widgets._base import Reusable, StoreArg, resolve_run, run_key
from launchhelm.widgets._chart import RunChart
from launchhelm.widgets._details import RunDetails, RunLogs
from launchhelm.widgets._evaluations import EvaluationTable
from launchhelm.widgets._media import MediaPanel
from launchhelm.widgets._picker import ResumePicker

if TYPE_CHECKING:
    from marimo import Html

__all__ = ["TAB_TITLES", "RunPanel"]

#: The panel's tabs, in order.
TAB_TITLES = ("Charts", "Checkpoints", "Evaluations", "Details", "Logs", "Media")


class RunPanel(Reusable[tuple[Api, RunHandle]], ipywidgets.VBox):  # type: ignore[misc]
    """A run's panel: tabs Charts, Checkpoints ("Resume…"), Evaluations, Details, Logs, Media.

    Showing the same run again (re-running the cell) shows the same panel:
    its widgets and their pollers are reused, never duplicated.

    Parameters
    ----------
    run_or_id:
        A :class:`launchhelm.Run`, a :class:`launchhelm.RunHandle` or a run id.
    store:
        Store URL or path for a run id.
    keys:
        Metric keys for the Charts tab (default: all).

    Attributes
    ----------
    chart, picker, evaluations, details, logs, media:
        The tabs' widgets.

    Examples
    --------
    >>> from launchhelm.widgets import RunPanel
    >>> RunPanel(run_id)          # doctest: +SKIP
    """

    @classmethod
    def _reuse_key(
        cls,
        run_or_id: RunLike | str,
        store: StoreArg = None,
        keys: Sequence[str] | str | None = None,
        **_: object,
    ) -> tuple[tuple[Hashable, ...], tuple[Api, RunHandle]]:
        api, handle = resolve_run(run_or_id, store)
        chosen = (keys,) if isinstance(keys, str) else (tuple(keys) if keys is not None else None)
        return run_key(cls, api, handle, chosen), (api, handle)

    def __init__(
        self, run_or_id: RunLike | str, store: StoreArg = None, keys: Sequence[str] | str | None = None
    ) -> None:
        if self._reused():
            return
        api, handle = self._resolved
        self._handle: RunHandle = handle
        self.chart = RunChart(handle, keys=keys)
        self.picker = ResumePicker(handle)
        self.evaluations = EvaluationTable(handle)
        self.details = RunDetails(handle)
        self.logs = RunLogs(handle)
        self.media = MediaPanel(handle)
        tabs = ipywidgets.Tab(children=list(self._tabs()))
        tabs.titles = TAB_TITLES
        self.tabs = tabs
        # the store only on hover: a long (or temporary) path would push the run's name out of sight
        self._header_html = (
            f"<div class='lh-panel-header' title='store {html.escape(api.store.url, quote=True)}'>"
            f"<b>{html.escape(handle.name)}</b> <code>{html.escape(handle.id)}</code> · "
            f"project {html.escape(handle.project)}</div>"
        )
        header = ipywidgets.HTML(self._header_html)
        super().__init__(children=[header, tabs])
        self.add_class("launchhelm-panel")

    def _tabs(self) -> tuple[ipywidgets.DOMWidget, ...]:
        return (self.chart, self.picker, self.evaluations, self.details, self.logs, self.media)

    @property
    def run(self) -> RunHandle:
        """The run shown."""
        return self._handle

    def __repr__(self) -> str:
        return f"<launchhelm.widgets.RunPanel {self._handle.project}/{self._handle.id}>"

    def _display_(self) -> Html:
        """How marimo shows the panel (it draws anywidgets, not ipywidgets' Tab): header and tabs, each live."""
        import marimo as mo

        tabs = dict(zip(TAB_TITLES, self._tabs(), strict=True))
        return mo.vstack([mo.Html(self._header_html), mo.ui.tabs(tabs)])

    def _repr_mimebundle_(self, **kwargs: object) -> dict[str, object] | None:
        from launchhelm.widgets._static import split_fallback

        data: dict[str, object] | None = super()._repr_mimebundle_(**kwargs)  # ipywidgets': a dict or None
        if not isinstance(data, dict):
            return data
        children = self._tabs()
        try:
            svg = self.chart.static_svg() or ""
            parts = [self._header_html, svg]
            for widget in children[1:]:
                parts.extend(widget.static_mimebundle().values())
            static = {"text/html": "<div class='launchhelm-static-panel'>" + "".join(parts) + "</div>"}
        except Exception:  # the saved picture is a nicety: the live panel shows regardless
            static = {}
        # hidden as soon as any of its tabs hears from the kernel
        return split_fallback(data, static, [w.model_id for w in children], alt=repr(self))

    def close(self) -> None:
        """Close the panel and its tabs' widgets (stopping their pollers)."""
        for child in self._tabs():
            child.close()
        self.tabs.close()
        self._forget()
        super().close()
