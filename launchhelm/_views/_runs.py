"""What the runs table and ``launchhelm compare`` show, without the widgets extra.

Rows of :meth:`Api.runs` as a person reads them (times as "3 min ago",
durations, the status with its sentence), sorting and filtering them, the
config diff between runs, and the text ``launchhelm compare`` prints. The
widgets (:class:`launchhelm.widgets.RunsTable`, ``CompareChart``), the
``%launchhelm runs`` magic and the command line share these, so each says
the same thing. Stdlib only at import time.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from launchhelm._types import JSONValue
from launchhelm._views._humanize import ago, duration, local_time, status_sentence, when

if TYPE_CHECKING:
    import pandas as pd

    from launchhelm._api import Api

__all__ = [
    "BASE_COLUMNS",
    "DIFF_PREFIXES",
    "STATUSES",
    "cell_text",
    "cell_value",
    "compare_text",
    "config_diff",
    "filter_rows",
    "readable_runs",
    "row_detail",
    "sort_rows",
    "table_columns",
    "table_rows",
    "text_table",
]

#: Prefixes of the run-row columns the config diff compares.
DIFF_PREFIXES = ("config.", "tunable.")
#: The statuses a run can have, in the order the status filter lists them.
STATUSES = ("running", "hung", "stopped", "restart loop", "resumable", "closed")
#: Row columns that only say more about a status; tables show them as one ``detail`` sentence.
DETAIL_COLUMNS = ("hang", "hang_since", "restart_loop", "last_ending", "last_detail")
#: Columns every table has: (id, label).
BASE_COLUMNS = (
    ("name", "Name"),
    ("status", "Status"),
    ("step", "Step"),
    ("created", "Created"),
    ("duration", "Duration"),
    ("rewinds", "Rewinds"),
    ("restarts", "Restarts"),
)
_BASE_IDS = tuple(c for c, _ in BASE_COLUMNS)
#: Metric, config and tunable columns shown before the column picker hides the rest.
DEFAULT_EXTRA_COLUMNS = 10
#: Row-frame prefixes, in the order their columns come.
_PREFIXES = (("metric.", "metric"), ("config.", "config"), ("tunable.", "tunable"))

#: A table row, or any mapping with its keys (the widgets hold them as plain dicts).
RowT = TypeVar("RowT", bound=Mapping[str, object])


class RunsTableRow(TypedDict):
    """One row of :func:`table_rows`: a run as the runs table shows it."""

    id: str
    name: str
    status: str
    sentence: str
    #: what the status alone does not say (where a hung run is, why a relaunch was refused), in ``sentence`` too
    detail: str
    step: JSONValue
    created: float | None
    last_heartbeat: float | None
    duration: float | None
    sessions: JSONValue
    rewinds: JSONValue
    #: sessions a scheduler's relaunch started (None: a row written before they were counted)
    restarts: JSONValue
    #: every ``metric.``/``config.``/``tunable.`` column's value (None: missing)
    values: dict[str, JSONValue]


def _epoch(value: Any) -> float | None:  # a pandas cell: Timestamp, NaT, a number or None
    """A timestamp (pandas, or epoch seconds) as epoch seconds; None for none."""
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        try:
            import pandas as pd

            if pd.isna(value):
                return None
        except (TypeError, ValueError):
            pass
        return float(value.timestamp())
    number = float(value)
    return number if math.isfinite(number) else None


def _plain(value: object) -> JSONValue:
    """A cell value as JSON carries it: NaN is None, numpy scalars are numbers, objects their JSON."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str, bytes)):
        try:
            value = getattr(value, "item")()  # noqa: B009 (hasattr above: an attribute any object may have)
        except (ValueError, AttributeError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, dict)):
        try:
            plain: JSONValue = json.loads(json.dumps(value, default=str))
            return plain
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def table_columns(frame: pd.DataFrame) -> list[dict[str, str]]:
    """The table's columns: the base ones, then each ``metric.``, ``config.`` and ``tunable.`` column."""
    columns = [{"id": c, "label": label, "kind": "base"} for c, label in BASE_COLUMNS]
    for prefix, kind in _PREFIXES:
        for name in frame.columns:
            if str(name).startswith(prefix):
                columns.append({"id": str(name), "label": str(name)[len(prefix) :], "kind": kind})
    return columns


def _text(value: object) -> str:
    plain = _plain(value)
    return plain if isinstance(plain, str) else ""


def row_detail(record: Mapping[Any, object], now: float | None = None) -> str:
    """:func:`_status_detail` of a row of :meth:`Api.runs` (or ``RunHandle.summary()``)."""
    return _status_detail(record, time.time() if now is None else now)


def _status_detail(record: Mapping[Any, object], now: float) -> str:
    """What the status alone does not say: where a hung run is and since when, why a relaunch was refused,
    how the last attempt of a stopped or resumable run ended."""
    if record.get("status") == "hung":
        since = _plain(record.get("hang_since"))
        detail = _text(record.get("hang"))
        return detail + (f"; hung since {when(float(since), now)}" if isinstance(since, (int, float)) else "")
    if record.get("status") == "restart loop":
        return _text(record.get("restart_loop")) + "; choose a checkpoint to resume from to clear it"
    ending = _text(record.get("last_ending"))
    if ending:
        detail = _text(record.get("last_detail"))
        return f"its last attempt ended {ending}" + (f" ({detail})" if detail else "")
    return ""


def table_rows(frame: pd.DataFrame, now: float | None = None) -> list[RunsTableRow]:
    """:meth:`Api.runs`' frame as the table's rows (JSON-ready).

    Each row: ``id``, ``name``, ``status``, ``sentence`` ("stopped without
    ending its session (crashed or killed); resume it; last heartbeat 3 min
    ago"), ``step``, ``created`` and ``last_heartbeat`` (epoch seconds),
    ``duration`` (seconds from creation to the last heartbeat, or to now
    while running), ``sessions``, ``rewinds``, and ``values``: every
    ``metric.``/``config.``/``tunable.`` column's value (None: missing).
    """
    now = time.time() if now is None else now
    extra = [c for c in frame.columns if str(c).startswith(tuple(p for p, _ in _PREFIXES))]
    rows: list[RunsTableRow] = []
    for record in frame.to_dict("records"):
        created = _epoch(record.get("created"))
        beat = _epoch(record.get("last_heartbeat"))
        status = str(record.get("status"))
        end = now if status == "running" else beat
        detail = _status_detail(record, now)
        rows.append(
            {
                "id": str(record["id"]),
                "name": str(record.get("name")),
                "status": status,
                "sentence": status_sentence(status, beat, now, detail=detail),
                "detail": detail,
                "step": _plain(record.get("step")),
                "created": created,
                "last_heartbeat": beat,
                "duration": (end - created) if end is not None and created is not None else None,
                "sessions": _plain(record.get("sessions")),
                "rewinds": _plain(record.get("rewinds")),
                "restarts": _plain(record.get("restarts")),
                "values": {str(c): _plain(record.get(c)) for c in extra},
            }
        )
    return rows


def cell_value(row: Mapping[str, object], column: str) -> Any:  # the caller formats it by column
    """A row's value in ``column`` (a base column or a ``metric.``/``config.``/``tunable.`` one)."""
    if column in _BASE_IDS:
        return row.get(column)
    values = row.get("values", {})
    return values.get(column) if isinstance(values, Mapping) else None


def cell_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def filter_rows(rows: Iterable[RowT], query: str = "", statuses: Sequence[str] = ()) -> list[RowT]:
    """Rows whose status is among ``statuses`` (none given: any) and whose text contains every word of ``query``.

    A row's text is its name, id, status and sentence, and each of its
    values as ``column=value`` (``lr=0.001`` and ``config.lr=0.001`` both
    match), case-insensitively.
    """
    words = query.lower().split()
    chosen = set(statuses)
    out = []
    for row in rows:
        if chosen and row.get("status") not in chosen:
            continue
        if words:
            parts = [str(row.get("name", "")), str(row.get("id", "")), str(row.get("status", ""))]
            parts.append(str(row.get("sentence", "")))
            values = row.get("values", {})
            for column, value in values.items() if isinstance(values, Mapping) else ():
                column = str(column)
                text = cell_text(value)
                parts.append(f"{column}={text}")
                parts.append(f"{column.split('.', 1)[-1]}={text}")
            haystack = "\n".join(parts).lower()
            if not all(word in haystack for word in words):
                continue
        out.append(row)
    return out


def sort_rows(rows: Iterable[RowT], column: str, descending: bool = False) -> list[RowT]:
    """Rows sorted by ``column``: numbers as numbers, text as text; empty cells last either way."""
    present: list[RowT] = []
    missing: list[RowT] = []
    for row in rows:
        (missing if cell_value(row, column) is None else present).append(row)

    def key(row: RowT) -> tuple[int, float | str]:
        value = cell_value(row, column)
        if isinstance(value, bool):
            return (0, int(value))
        if isinstance(value, (int, float)):
            return (0, value)
        return (1, cell_text(value).lower())

    return sorted(present, key=key, reverse=descending) + missing


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # arrays and odd objects: compare their text
        return repr(a) == repr(b)


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


class ConfigDiff(TypedDict):
    """A key whose value differs between runs, and its value in each (None: the run has none)."""

    key: str
    values: list[object]


def config_diff(rows: Sequence[Mapping[str, object]]) -> list[ConfigDiff]:
    """The ``config.`` and ``tunable.`` keys whose values differ between ``rows`` (runs-table rows).

    Returns one entry per such key, sorted: ``{"key": "config.lr", "values":
    [value in each row, None where the run has no such key]}``. A key one
    run lacks counts as differing. With fewer than two rows nothing differs.
    """
    if len(rows) < 2:
        return []
    keys = sorted({k for row in rows for k in row if k.startswith(DIFF_PREFIXES)})
    diff: list[ConfigDiff] = []
    for key in keys:
        values = [None if _missing(row.get(key)) else row.get(key) for row in rows]
        first = values[0]
        if any(not _same(first, v) for v in values[1:]):
            diff.append({"key": key, "values": values})
    return diff


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell (numbers right-aligned)."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def numeric(text: str) -> bool:
        try:
            float(text)
        except ValueError:
            return False
        return True

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if numeric(c) else c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def readable_runs(frame: pd.DataFrame, now: float | None = None) -> pd.DataFrame:
    """:meth:`Api.runs`' frame for display: ``created`` as local time with "(3 min ago)", ``last_heartbeat``
    as "3 min ago", a ``duration`` column ("1 h 12 min") after ``created``; everything else unchanged."""
    now = time.time() if now is None else now
    shown = frame.copy()
    rows = table_rows(frame, now)
    if "created" in shown.columns:
        shown["created"] = [f"{local_time(r['created'])} ({ago(r['created'], now)})" for r in rows]
        shown.insert(shown.columns.get_loc("created") + 1, "duration", [duration(r["duration"]) for r in rows])
    if "last_heartbeat" in shown.columns:
        shown["last_heartbeat"] = [ago(r["last_heartbeat"], now) for r in rows]
    # the status's own columns (where a run hung, why a relaunch was refused) as one sentence
    shown = shown.drop(columns=[c for c in DETAIL_COLUMNS if c in shown.columns])
    if any(r["detail"] for r in rows) and "status" in shown.columns:
        shown["detail"] = [r["detail"] for r in rows]  # last: the columns before keep their places
    result: pd.DataFrame = shown
    return result


def compare_text(api: Api, run_ids: Sequence[str], keys: Sequence[str] | None = None, now: float | None = None) -> str:
    """What ``launchhelm compare RUN RUN ...`` prints: the runs' latest values side by side, then their config diff.

    Parameters
    ----------
    api:
        The :class:`launchhelm.Api` of the store.
    run_ids:
        Two or more run ids (repeats are dropped).
    keys:
        Metric keys to show (default: every metric any of the runs logged).

    Raises
    ------
    InvalidArgumentError
        Fewer than two runs, or a key none of them logged.
    RunNotFoundError
        A run id not in the store.
    """
    from concurrent.futures import ThreadPoolExecutor

    from launchhelm._exceptions import InvalidArgumentError

    chosen = list(dict.fromkeys(run_ids))
    if len(chosen) < 2:
        raise InvalidArgumentError(
            f"compare needs two runs or more, got {', '.join(chosen) or 'none'}: launchhelm compare RUN RUN [RUN ...]"
        )
    now = time.time() if now is None else now
    handles = [api.run(r) for r in chosen]  # an unknown id fails here, before any table
    with ThreadPoolExecutor(max_workers=min(16, len(handles))) as pool:
        summaries = list(pool.map(lambda h: h.summary(), handles))
    logged = sorted({k[len("metric.") :] for row in summaries for k in row if k.startswith("metric.")})
    if keys:
        unknown = [k for k in keys if k not in logged]
        if unknown:
            raise InvalidArgumentError(
                f"--keys {','.join(unknown)}: none of these runs logged it; "
                f"their metrics: {', '.join(logged) or 'none'}"
            )
        shown = list(keys)
    else:
        shown = logged
    names = [str(row["name"]) for row in summaries]
    header = ["", *[f"{name} ({row['id']})" for name, row in zip(names, summaries, strict=True)]]
    lines: list[list[str]] = []
    projects = {str(h.project) for h in handles}
    if len(projects) > 1:
        lines.append(["project", *[str(h.project) for h in handles]])
    for row in summaries:
        row["_created"], row["_beat"] = _epoch(row.get("created")), _epoch(row.get("last_heartbeat"))
    lines.append(["status", *[str(row["status"]) for row in summaries]])
    lines.append(["step", *[cell_text(_plain(row["step"])) for row in summaries]])
    lines.append(["created", *[f"{local_time(row['_created'])} ({ago(row['_created'], now)})" for row in summaries]])
    spans = []
    for row in summaries:
        end = now if row["status"] == "running" else row["_beat"]
        spans.append(duration(end - row["_created"]) if end is not None and row["_created"] is not None else "-")
    lines.append(["duration", *spans])
    lines.append(["rewinds", *[cell_text(_plain(row["rewinds"])) for row in summaries]])
    for key in shown:
        lines.append([key, *[cell_text(_plain(row.get(f"metric.{key}"))) or "-" for row in summaries]])
    out = ["latest values:", text_table(header, lines)]
    diff = config_diff(summaries)
    if diff:
        out += ["", "config diff:"]
        out.append(text_table(header, [[d["key"], *[cell_text(_plain(v)) or "-" for v in d["values"]]] for d in diff]))
    else:
        out += ["", "config diff: none (their config and tunables agree)"]
    return "\n".join(out)
