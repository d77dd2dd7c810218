"""``RunsTable``: a project's runs as a live table; ticking runs compares them.

One row per run: name, status with its sentence, furthest step, created
("3 min ago", local time on hover), duration, rewinds, the latest value of
each metric, config and tunable values. Sorted by any column (click its
header), filtered by text and by status, with a column picker once there
are many columns. Ticking runs draws them side by side in the
:class:`CompareChart` below the table, with their config diff.

The table re-reads :meth:`Api.runs` every ``interval`` seconds while a run
is running (slower otherwise): summaries and the row index only, a few
requests whatever the project's size (``docs/storage.md``, "runs table").
The browser sorts and filters the rows it holds; the kernel knows the same
choices (they are traits), so :meth:`RunsTable.visible_rows` is what a
person sees.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, cast

import ipywidgets
import traitlets

from launchhelm._api import Api
from launchhelm._exceptions import InvalidArgumentError, InvalidTypeError
from launchhelm._runlog._events import validate_project
from launchhelm._views._humanize import ago, duration, local_time
from launchhelm._views._runs import (
    DEFAULT_EXTRA_COLUMNS,
    STATUSES,
    cell_text,
    cell_value,
    filter_rows,
    sort_rows,
    table_columns,
    table_rows,
)
from launchhelm.widgets._base import LiveWidget, Reusable, StoreArg, front_end
from launchhelm.widgets._compare import CompareChart
from launchhelm.widgets._messages import RunsTableState, TableColumn, TableRow, synced_dict
from launchhelm.widgets._static import table_html

if TYPE_CHECKING:
    from marimo import Html

__all__ = ["RunsTable", "RunsTableView"]


class _SelectionChange(TypedDict):
    """What traitlets hands an observer of ``selected``."""

    name: str
    old: list[str]
    new: list[str]
    owner: object
    type: str


class RunsTableView(LiveWidget[tuple[Api, str]]):
    """The table part of :class:`RunsTable` (the anywidget); its traits are what the person chose."""

    state = synced_dict(RunsTableState)
    sort_by = traitlets.Unicode("created").tag(sync=True)
    descending = traitlets.Bool(True).tag(sync=True)
    query = traitlets.Unicode("").tag(sync=True)
    statuses = traitlets.List(traitlets.Unicode()).tag(sync=True)
    hidden = traitlets.List(traitlets.Unicode()).tag(sync=True)
    selected = traitlets.List(traitlets.Unicode()).tag(sync=True)

    @classmethod
    def _reuse_key(cls, api: Api, project: str, **_: object) -> tuple[tuple[Hashable, ...], tuple[Api, str]]:
        return (cls.__qualname__, api.store.url, project), (api, project)

    def __init__(self, api: Api, project: str, *, interval: float = 2.0, extra_columns: int) -> None:
        if self._reused():
            return
        self._esm, self._css, self.missing_front_end = front_end("runs_table.js")
        super().__init__(interval=interval)
        self._setup_live()
        self._api = api
        self.project = project
        self._extra_columns = extra_columns
        self._known_columns: set[str] = set()
        self.refresh()

    def is_active(self) -> bool:
        return any(r["status"] == "running" for r in self.state.get("rows", []))

    def refresh(self) -> None:
        """Re-read the project's rows (summaries and the row index: a few requests)."""
        with self._lock:
            now = time.time()
            frame = self._api.runs(self.project)
            # views._runs builds them (shared with the command line); these are their shapes
            columns = cast("list[TableColumn]", table_columns(frame))
            extra = [c["id"] for c in columns if c["kind"] != "base"]
            fresh = [c for c in extra if c not in self._known_columns]
            if fresh:
                # columns seen for the first time: past the first few, hidden until picked
                room = max(0, self._extra_columns - len([c for c in self._known_columns if c not in self.hidden]))
                hide = fresh[room:]
                self._known_columns.update(fresh)
                if hide:
                    self.hidden = [*self.hidden, *hide]
            rows = cast("list[TableRow]", table_rows(frame, now))
            state: RunsTableState = {
                "project": self.project,
                "store": self._api.store.url,
                "columns": columns,
                "rows": rows,
                "now": now,
                "picker": len(extra) > self._extra_columns,
            }
            known = {r["id"] for r in rows}
            if any(r not in known for r in self.selected):
                self.selected = [r for r in self.selected if r in known]
            if state != self.state:
                self.state = state


class RunsTable(Reusable[Api], ipywidgets.VBox):  # type: ignore[misc]
    """A project's runs as a live table; tick runs to compare them below it.

    Columns: name, status (with its sentence on hover), furthest step,
    created ("3 min ago"; local time on hover), duration, rewinds, then the
    latest value of each metric, config and tunable values. Click a header
    to sort by it (again: the other way); type in "Filter runs…" to keep the
    rows whose name, id or values contain the words (``lr=0.001`` matches a
    config or tunable); tick statuses to keep only those. Past
    ``extra_columns`` metric/config/tunable columns, "Columns…" picks which
    show. Ticking runs draws them in :attr:`compare`, a
    :class:`CompareChart`, with their config diff. Live while runs run.

    Parameters
    ----------
    project:
        The project whose runs to show.
    store:
        Store URL or path (default ``$LAUNCHHELM_STORE``, else ``~/.launchhelm``).
    interval:
        Seconds between reads of the store while a run is running.
    extra_columns:
        Metric, config and tunable columns shown at first (the rest via "Columns…").

    Attributes
    ----------
    table:
        The table widget (its traits: ``sort_by``, ``descending``, ``query``,
        ``statuses``, ``hidden``, ``selected``).
    compare:
        The :class:`CompareChart` of the ticked runs.

    Examples
    --------
    >>> from launchhelm.widgets import RunsTable
    >>> table = RunsTable("quickstart")      # doctest: +SKIP
    >>> table.select([run_a, run_b])         # as ticking both   # doctest: +SKIP
    """

    @classmethod
    def _reuse_key(
        cls, project: str, store: StoreArg = None, *, extra_columns: int = DEFAULT_EXTRA_COLUMNS, **_: object
    ) -> tuple[tuple[Hashable, ...], Api]:
        if isinstance(extra_columns, bool) or not isinstance(extra_columns, int) or extra_columns < 0:
            raise InvalidArgumentError(f"extra_columns={extra_columns!r}: give how many columns to show, 0 or more")
        if not isinstance(project, str):
            raise InvalidTypeError(f"RunsTable({project!r}): give a project name (a string)")
        validate_project(project)
        api = Api(store)
        return (cls.__qualname__, api.store.url, project), api

    def __init__(
        self,
        project: str,
        store: StoreArg = None,
        *,
        interval: float = 2.0,
        extra_columns: int = DEFAULT_EXTRA_COLUMNS,
    ) -> None:
        if self._reused():
            return
        api: Api = self._resolved
        self.project = project
        try:
            self.table = RunsTableView(api, project, interval=interval, extra_columns=extra_columns)
            self.table._forget()  # belongs to this table alone
            self.compare = CompareChart(project, runs=[], store=api, interval=interval)
            self.compare._forget()
        except Exception:
            self._forget()
            raise
        self.table.observe(self._on_selection, names=["selected"])
        super().__init__(children=[self.table, self.compare])
        self.add_class("launchhelm-runs")

    def __repr__(self) -> str:
        return f"<launchhelm.widgets.RunsTable {self.project}>"

    def _display_(self) -> Html:
        """How marimo shows it (it draws anywidgets, not ipywidgets' VBox): the table above the comparison."""
        import marimo as mo

        return mo.vstack([self.table, self.compare])

    def _on_selection(self, change: _SelectionChange) -> None:
        try:
            self.compare.set_runs(list(change["new"]))
        except Exception as exc:  # shown in the table: a tick must never kill the comm
            self.table.error = f"comparing {', '.join(change['new'])}: {type(exc).__name__}: {exc}"

    # -- what a person does, from code ----------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """Every row held (one per run, newest first)."""
        return [dict(row) for row in self.table.state.get("rows", [])]

    def visible_rows(self) -> list[dict[str, Any]]:
        """The rows shown, filtered and sorted as chosen (what the browser draws)."""
        shown = filter_rows(self.rows(), self.table.query, self.table.statuses)
        return sort_rows(shown, self.table.sort_by, self.table.descending)

    def columns(self) -> list[TableColumn]:
        """The columns shown (the column picker's choice)."""
        hidden = set(self.table.hidden)
        return [c for c in self.table.state.get("columns", []) if c["id"] not in hidden]

    def sort(self, column: str, descending: bool = False) -> None:
        """Sort by ``column`` (``"step"``, ``"metric.loss"``, ``"config.lr"``...), as clicking its header."""
        known = [c["id"] for c in self.table.state.get("columns", [])]
        if column not in known:
            raise InvalidArgumentError(f"sort({column!r}): no such column; the columns are {', '.join(known)}")
        self.table.sort_by = column
        self.table.descending = bool(descending)

    def filter(self, text: str = "", statuses: Sequence[str] | str = ()) -> None:
        """Keep the rows matching ``text`` whose status is in ``statuses`` (none: any), as the filter box does."""
        if isinstance(statuses, str):
            statuses = [statuses]
        unknown = [s for s in statuses if s not in STATUSES]
        if unknown:
            raise InvalidArgumentError(f"statuses {unknown}: a run's status is one of {', '.join(STATUSES)}")
        if not isinstance(text, str):
            raise InvalidTypeError(f"filter(text={text!r}): give the words to look for as a string")
        self.table.query = text
        self.table.statuses = list(statuses)

    def select(self, run_ids: Sequence[str]) -> None:
        """Tick these runs (their comparison draws below the table), as the checkboxes do."""
        known = {r["id"] for r in self.rows()}
        unknown = [r for r in run_ids if r not in known]
        if unknown:
            raise InvalidArgumentError(
                f"select({list(run_ids)}): {', '.join(unknown)} not in project {self.project!r}; "
                f"its runs: {', '.join(sorted(known)) or 'none yet'}"
            )
        self.table.selected = list(dict.fromkeys(run_ids))

    @property
    def selected(self) -> list[str]:
        """The ticked runs."""
        return list(self.table.selected)

    def refresh(self) -> None:
        """Re-read the runs now (the table also does every ``interval`` seconds while it is shown)."""
        self.table.refresh()

    # -- saved notebooks --------------------------------------------------------
    def static_html(self, now: float | None = None) -> str:
        """The table as it stood, as an HTML table (inline styles), then the comparison if runs are ticked."""
        now = time.time() if now is None else now
        columns = self.columns()
        body = []
        for row in self.visible_rows():
            cells = []
            for column in columns:
                value = cell_value(row, column["id"])
                if column["id"] == "created":
                    value = f"{local_time(value)} ({ago(value, now)})"
                elif column["id"] == "duration":
                    value = duration(value)
                elif column["id"] == "status":
                    value = f"{row['status']}: {row['sentence']}"
                cells.append(cell_text(value))
            body.append(cells)
        caption = f"Runs of project {self.project} ({len(body)} of {len(self.rows())} shown)"
        parts = [table_html([c["label"] for c in columns], body, caption, "runs")]
        if self.selected:
            parts.extend(self.compare.static_mimebundle().values())
        return "<div class='launchhelm-static-runs'>" + "".join(parts) + "</div>"

    def _repr_mimebundle_(self, **kwargs: object) -> dict[str, object] | None:
        data: dict[str, object] | None = super()._repr_mimebundle_(**kwargs)  # ipywidgets': a dict or None
        if not isinstance(data, dict):
            return data
        try:
            data["text/html"] = self.static_html()
        except Exception:  # the saved picture is a nicety: the live table shows regardless
            pass
        return data

    def close(self) -> None:
        """Close the table and its comparison (stopping their pollers)."""
        for part in (getattr(self, "table", None), getattr(self, "compare", None)):
            if part is not None:
                part.close()
        self._forget()
        super().close()
